package tests

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
)

// TestHostileKeyFilesAgainstTheRealBinaries: ringfenced started with a named pipe as its
// secrets key file exits at once naming the file and the fix (it waited for a writer for
// ever); `secrets-key rotate` of a directory says to name the key file itself; a key file
// that is a link into data_dir is rotated where it points, the link kept and both named, and
// no key is ever printed.
func TestHostileKeyFilesAgainstTheRealBinaries(t *testing.T) {
	dataDir := t.TempDir()
	pipe := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, syscall.Mkfifo(pipe, 0o600))
	env := []string{
		"RINGFENCE_DATA_DIR=" + dataDir,
		"RINGFENCE_GRPC_ADDR=" + testutil.FreeAddr(t),
		"RINGFENCE_HTTP_ADDR=" + testutil.FreeAddr(t),
		"RINGFENCE_BOOTSTRAP_ADMIN_KEY=" + adminKey,
		"RINGFENCE_SECRETS_KEY_FILE=" + pipe,
	}
	r := runCmd(t, nil, env, bin("ringfenced"))
	require.Positive(t, r.Code, "the start is refused, not left waiting: %s", r.Stderr)
	require.Contains(t, r.Stderr, "secretbox: key file "+pipe+" is not a regular file")
	require.Contains(t, r.Stderr, "name it (secrets_key_file, or --file)")

	r = runCmd(t, nil, nil, bin("ringfenced"), "secrets-key", "rotate", "--file", dataDir)
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "secretbox: key file "+dataDir+" is a directory: name the key file itself (secrets_key_file, or --file), e.g. "+filepath.Join(dataDir, "secrets.key"))

	key := strings.Repeat("5e", 32)
	kept := filepath.Join(t.TempDir(), "ringfence.key")
	require.NoError(t, os.WriteFile(kept, []byte(key+"\n"), 0o600))
	link := filepath.Join(dataDir, "secrets.key")
	require.NoError(t, os.Symlink(kept, link))
	r = runCmd(t, nil, []string{"RINGFENCE_DATA_DIR=" + dataDir}, bin("ringfence-registry"), "secrets-key", "rotate")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, kept+" (where the link "+link+" points): a new key is its first line (2 keys now)")
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	require.NotZero(t, fi.Mode()&os.ModeSymlink, "the link is kept")
	data, err := os.ReadFile(kept)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Equal(t, []string{key}, lines[1:])
	require.NotContains(t, r.Stdout+r.Stderr, lines[0])
	require.NotContains(t, r.Stdout+r.Stderr, key)
}
