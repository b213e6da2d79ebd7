package secretbox

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSealOpenAndKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.key")
	box, err := LoadOrCreate(path)
	require.NoError(t, err)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	sealed := box.Seal([]byte("canary"), []byte("ctx-a"))
	require.NotContains(t, string(sealed), "canary")
	plain, err := box.Open(sealed, []byte("ctx-a"))
	require.NoError(t, err)
	require.Equal(t, "canary", string(plain))

	_, err = box.Open(sealed, []byte("ctx-b"))
	require.ErrorIs(t, err, ErrOpen, "a sealed value moved to another record does not open")
	sealed[len(sealed)-1] ^= 1
	_, err = box.Open(sealed, []byte("ctx-a"))
	require.ErrorIs(t, err, ErrOpen, "tampering is detected")

	again, err := LoadOrCreate(path)
	require.NoError(t, err)
	plain, err = again.Open(box.Seal([]byte("x"), nil), nil)
	require.NoError(t, err, "the key file is reused, not regenerated")
	require.Equal(t, "x", string(plain))

	other, err := LoadOrCreate(filepath.Join(t.TempDir(), "other.key"))
	require.NoError(t, err)
	_, err = other.Open(box.Seal([]byte("x"), nil), nil)
	require.ErrorIs(t, err, ErrOpen)

	require.NoError(t, os.Chmod(path, 0o644))
	_, err = LoadOrCreate(path)
	require.ErrorContains(t, err, "chmod 600")
}

func writeKeys(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	return path
}

// TestSeveralKeysFirstSealsEveryOneOpens: a key file of several lines seals with its first key
// and opens with any; Reseal moves a value sealed under a later key to the first.
func TestSeveralKeysFirstSealsEveryOneOpens(t *testing.T) {
	a, b := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	onlyA, err := LoadOrCreate(writeKeys(t, a))
	require.NoError(t, err)
	sealedA := onlyA.Seal([]byte("canary"), []byte("ctx"))

	path := writeKeys(t, "# rotated", b, "", "  "+a+"  ")
	both, err := LoadOrCreate(path)
	require.NoError(t, err)
	require.Equal(t, 2, both.Keys())
	require.Equal(t, path, both.Path())
	plain, err := both.Open(sealedA, []byte("ctx"))
	require.NoError(t, err, "a later key opens")
	require.Equal(t, "canary", string(plain))

	sealedB := both.Seal([]byte("canary"), []byte("ctx"))
	_, err = onlyA.Open(sealedB, []byte("ctx"))
	require.ErrorIs(t, err, ErrOpen, "the first key seals, not the second")
	onlyB, err := LoadOrCreate(writeKeys(t, b))
	require.NoError(t, err)
	_, err = onlyB.Open(sealedB, []byte("ctx"))
	require.NoError(t, err)

	same, resealed, err := both.Reseal(sealedB, []byte("ctx"))
	require.NoError(t, err)
	require.False(t, resealed, "a value the first key opens stays as it is")
	require.Equal(t, sealedB, same)
	moved, resealed, err := both.Reseal(sealedA, []byte("ctx"))
	require.NoError(t, err)
	require.True(t, resealed)
	plain, err = onlyB.Open(moved, []byte("ctx"))
	require.NoError(t, err, "re-sealed under the first key")
	require.Equal(t, "canary", string(plain))
	_, _, err = onlyB.Reseal(sealedA, []byte("ctx"))
	require.ErrorIs(t, err, ErrOpen)
}

// TestBadKeyLinesAreRefusedByLine: a malformed, repeated or missing key stops the start naming
// the line and the fix, never the key.
func TestBadKeyLinesAreRefusedByLine(t *testing.T) {
	a, b := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	_, err := LoadOrCreate(writeKeys(t, b, "# old", a[:60]))
	require.ErrorContains(t, err, "line 3 is not a key")
	require.NotContains(t, err.Error(), a[:60])
	require.NotContains(t, err.Error(), b)

	_, err = LoadOrCreate(writeKeys(t, a, b, a))
	require.ErrorContains(t, err, "line 3 repeats the key of line 1: remove one of the two lines")
	require.NotContains(t, err.Error(), a)

	_, err = LoadOrCreate(writeKeys(t, "# nothing here", ""))
	require.ErrorContains(t, err, "holds no key")
}

// TestRotatePutsANewKeyFirst: Rotate writes a new key as the first line and keeps every line
// after it, mode 0600; what the old key sealed still opens, and the new key seals.
func TestRotatePutsANewKeyFirst(t *testing.T) {
	a := strings.Repeat("a1", 32)
	path := writeKeys(t, "# the old one", a)
	old, err := LoadOrCreate(path)
	require.NoError(t, err)
	sealed := old.Seal([]byte("canary"), nil)

	n, err := Rotate(path)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	require.Len(t, lines, 3)
	require.Len(t, lines[0], 64)
	require.Equal(t, []string{"# the old one", a}, lines[1:])
	_, err = os.Stat(path + ".rotate")
	require.ErrorIs(t, err, os.ErrNotExist)

	box, err := LoadOrCreate(path)
	require.NoError(t, err)
	_, err = box.Open(sealed, nil)
	require.NoError(t, err)
	_, err = old.Open(box.Seal([]byte("x"), nil), nil)
	require.ErrorIs(t, err, ErrOpen, "the new key seals")

	_, err = Rotate(filepath.Join(t.TempDir(), "missing.key"))
	require.ErrorContains(t, err, "no key file at")
}

// TestAKeyFileAsEditorsSaveItOpens: a key file saved on Windows (a UTF-8 byte order mark, CRLF
// line ends) or with blanks after a key holds the same keys, and a rotation of it keeps them.
func TestAKeyFileAsEditorsSaveItOpens(t *testing.T) {
	a, b := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	path := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(path, []byte("\ufeff"+a+" \r\n"+b+"\t\r\n"), 0o600))
	box, err := LoadOrCreate(path)
	require.NoError(t, err)
	require.Equal(t, 2, box.Keys())
	want, err := NewKeys(mustHex(t, a), mustHex(t, b))
	require.NoError(t, err)
	_, err = box.Open(want.Seal([]byte("x"), nil), nil)
	require.NoError(t, err, "the first line's key is a, the byte order mark aside")

	n, err := Rotate(path)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	rotated, err := LoadOrCreate(path)
	require.NoError(t, err)
	_, err = rotated.Open(want.Seal([]byte("x"), nil), nil)
	require.NoError(t, err, "a and b still open after the rotation")
}

// TestRotateThatCannotWriteSaysToRotateACopy: a key file where the rotation cannot write its new
// file (a read-only mount, a directory of another user) is left as it was, and the error says
// how to rotate anyway: a copy, rotated with --file, put in place as the file is deployed.
func TestRotateThatCannotWriteSaysToRotateACopy(t *testing.T) {
	a := strings.Repeat("a1", 32)
	path := writeKeys(t, a)
	// The rotation's file aside cannot be made: a directory that is not empty holds its name.
	require.NoError(t, os.MkdirAll(filepath.Join(path+".rotate", "x"), 0o700))
	_, err := Rotate(path)
	require.ErrorContains(t, err, "rotate a copy where you may write (cp "+path+" rotated.key, then `secrets-key rotate --file rotated.key` of ringfenced, ringfence-registry or ringfence-pool)")
	require.ErrorContains(t, err, "the key file is unchanged")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, a+"\n", string(data))
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

// TestRotateKeepsTheKeyFilesOwner: root rotating the key file of a server that runs as its own
// user leaves the new file that user's, as the old one was, so the server still reads it at
// its next start. (Only root can give a file away; anyone else owns what they rotate.)
func TestRotateKeepsTheKeyFilesOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root rotates a file another user owns")
	}
	path := writeKeys(t, strings.Repeat("a1", 32))
	require.NoError(t, os.Chown(path, 65534, 65534))
	_, err := Rotate(path)
	require.NoError(t, err)
	o, ok := fileOwner(path)
	require.True(t, ok)
	require.Equal(t, owner{65534, 65534}, o)
}

// TestTwoRotationsAtOnceLoseNoKey: a rotation that starts while another holds the key file
// between its read and its write is refused, saying so, and the first one's key is in the file:
// without the lock the second would write its own key first, and the first one's rename would
// then drop it (with what a start in between sealed under it).
func TestTwoRotationsAtOnceLoseNoKey(t *testing.T) {
	a := strings.Repeat("a1", 32)
	path := writeKeys(t, a)

	read, release := make(chan struct{}), make(chan struct{})
	afterRead = func() {
		afterRead = nil // the second rotation runs on without stopping
		close(read)
		<-release
	}
	t.Cleanup(func() { afterRead = nil })
	first := make(chan error, 1)
	go func() {
		_, err := Rotate(path)
		first <- err
	}()
	<-read // the first rotation has read the file and not written it yet

	_, err := Rotate(path)
	close(release)
	require.ErrorContains(t, err, "another secrets-key rotate of "+path+" is running")
	require.ErrorContains(t, err, "the key file is unchanged")
	require.NoError(t, <-first)

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	require.Len(t, lines, 2, "one new key, then the old one")
	require.Equal(t, a, lines[1])

	n, err := Rotate(path)
	require.NoError(t, err, "once the first has ended, the next rotation runs")
	require.Equal(t, 3, n)
}
