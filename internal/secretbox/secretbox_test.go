package secretbox

import (
	"os"
	"path/filepath"
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
