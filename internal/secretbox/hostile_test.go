package secretbox

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRotateFollowsALinkToTheKeyFile: a key file kept elsewhere and linked into data_dir (a
// file the deployment manages, shared by the binaries of one host) is rotated where it is: the
// link stays a link, and the file it points at holds the new key first. Replacing the link
// with a file of its own would leave the managed file without the key that seals from the next
// start, and the next deployment of it would lose every value sealed since.
func TestRotateFollowsALinkToTheKeyFile(t *testing.T) {
	a := strings.Repeat("a1", 32)
	kept := writeKeys(t, a)
	link := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.Symlink(kept, link))

	n, err := Rotate(link)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	require.NotZero(t, fi.Mode()&os.ModeSymlink, "the link is kept")
	data, err := os.ReadFile(kept)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 2, "the file the link points at is rotated")
	require.Equal(t, a, lines[1])
	target, err := Target(link)
	require.NoError(t, err)
	require.Equal(t, kept, target)
	box, err := LoadOrCreate(link)
	require.NoError(t, err)
	require.Equal(t, 2, box.Keys())
}

// TestHostileKeyFilesAreRefusedByName: a key file path that names a directory, a named pipe,
// a device, a huge file, a binary one, one of 10,000 keys, one with a key of the wrong length,
// or a link to nothing is refused at start and by a rotation with an error that names the file
// and the fix, never with a panic, a hang or a key's bytes; a refused rotation leaves the file
// as it was.
func TestHostileKeyFilesAreRefusedByName(t *testing.T) {
	key := strings.Repeat("c3", 32)
	dir := t.TempDir()
	mk := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	fifo := filepath.Join(dir, "pipe.key")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	huge := mk("huge.key", nil)
	require.NoError(t, os.Truncate(huge, 64<<20)) // sparse: 64 MiB of NULs
	var many strings.Builder
	for i := range 10000 {
		many.WriteString(strings.Repeat("0", 56) + hex8(i) + "\n")
	}
	devLink := filepath.Join(dir, "dev.key")
	require.NoError(t, os.Symlink(os.DevNull, devLink))
	dangling := filepath.Join(dir, "dangling.key")
	require.NoError(t, os.Symlink(filepath.Join(dir, "gone", "secrets.key"), dangling))

	for _, tc := range []struct {
		name, path string
		want       []string
	}{
		{"directory", dir, []string{"is a directory", "name the key file itself", filepath.Join(dir, "secrets.key")}},
		{"named pipe", fifo, []string{"is not a regular file", "name it"}},
		{"device", devLink, []string{"is not a regular file"}},
		{"huge", huge, []string{"is 67108864 bytes, more than a key file holds", "name the key file the data was sealed with"}},
		{"binary with a NUL", mk("nul.key", []byte(key[:30]+"\x00"+key[31:]+"\n")), []string{"line 1 is not a key"}},
		{"wrong length", mk("short.key", []byte(key+"c3\n")), []string{"line 1 is not a key", "64 hex characters (32 bytes)"}},
		{"10,000 keys", mk("many.key", []byte(many.String())), []string{"holds more than 100 keys", "line 101", "the other lines can go"}},
		{"a link to nothing", dangling, []string{"is a link to " + filepath.Join(dir, "gone", "secrets.key") + ", which does not exist", "restore the key file it points at"}},
	} {
		var before []byte
		if fi, err := os.Lstat(tc.path); err == nil && fi.Mode().IsRegular() && fi.Size() < 1<<20 {
			before, _ = os.ReadFile(tc.path)
		}
		for op, call := range map[string]func(string) error{
			"start":  func(p string) error { _, err := LoadOrCreate(p); return err },
			"rotate": func(p string) error { _, err := Rotate(p); return err },
		} {
			done := make(chan error, 1)
			go func() { done <- call(tc.path) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatalf("%s of a %s key file never returns", op, tc.name)
			}
			require.Error(t, err, "%s: %s", op, tc.name)
			msg := err.Error()
			require.Contains(t, msg, tc.path, "%s: %s: the message names the file", op, tc.name)
			for _, w := range tc.want {
				require.Contains(t, msg, w, "%s: %s", op, tc.name)
			}
			require.NotContains(t, msg, key[:16], "%s: %s: no key bytes", op, tc.name)
			require.NotContains(t, msg, "\x00")
		}
		if before != nil {
			after, err := os.ReadFile(tc.path)
			require.NoError(t, err)
			require.Equal(t, before, after, "%s: a refused rotation leaves the file as it was", tc.name)
		}
	}
}

// TestRotateStopsAtMaxKeys: a rotation that would make the file hold more than MaxKeys is
// refused, saying to let a start re-seal and remove the freed lines first; the file is
// unchanged. A file of MaxKeys keys still opens.
func TestRotateStopsAtMaxKeys(t *testing.T) {
	lines := make([]string, MaxKeys)
	for i := range lines {
		lines[i] = strings.Repeat("0", 56) + hex8(i)
	}
	path := writeKeys(t, lines...)
	box, err := LoadOrCreate(path)
	require.NoError(t, err)
	require.Equal(t, MaxKeys, box.Keys())
	_, err = Rotate(path)
	require.ErrorContains(t, err, "holds 100 keys, the most a key file may: start the server so it re-seals under the first key, remove the lines its log says can go, then rotate (the key file is unchanged)")
	box, err = LoadOrCreate(path)
	require.NoError(t, err)
	require.Equal(t, MaxKeys, box.Keys())
}

// hex8 is i as 8 hex digits.
func hex8(i int) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 8)
	for k := 7; k >= 0; k-- {
		out[k] = digits[i&0xf]
		i >>= 4
	}
	return string(out)
}
