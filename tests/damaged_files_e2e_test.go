package tests

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
)

// TestADamagedDataFileStopsTheStart: ringfenced started over a data directory one of whose
// bbolt files was emptied, cut short or overwritten in part exits with an error that names
// the file and the fix. It neither panics nor starts with an empty store, and it leaves the
// file as it was for the investigation.
func TestADamagedDataFileStopsTheStart(t *testing.T) {
	d := startDaemon(t, "ringfenced", "RINGFENCE_BOOTSTRAP_ADMIN_KEY="+adminKey)
	r := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"),
		"servers", "add", "fx", "--command", "mcpfixture", "--grant", "process_spawn")
	require.Equal(t, 0, r.Code, r.Stderr)
	d.stop()

	page := os.Getpagesize()
	for _, file := range []string{"registry.db", "publisher.db", "pool.db", "audit.db"} {
		for _, tc := range []struct {
			name   string
			damage func(path string) error
			want   string
		}{
			{"emptied", func(path string) error { return os.Truncate(path, 0) }, " is empty (0 bytes), which no crash leaves: it was truncated; restore it from a backup (docs/operations.md#backups)"},
			{"cut short", func(path string) error { return os.Truncate(path, int64(page)) }, " is damaged (file size too small"},
			{"overwritten", func(path string) error {
				// Both meta pages and the pages after them: nothing of the file is readable.
				f, err := os.OpenFile(path, os.O_WRONLY, 0)
				if err != nil {
					return err
				}
				defer f.Close()
				_, err = f.WriteAt(bytes.Repeat([]byte{0xA5}, 4*page), 0)
				return err
			}, " is damaged (invalid database): stop every server on this data directory, keep the file aside for investigation and restore the data directory from a backup (docs/operations.md#backups)"},
		} {
			t.Run(file+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				// cp -a keeps the modes (os.CopyFS would leave secrets.key readable by others).
				require.Equal(t, 0, runCmd(t, nil, nil, "cp", "-a", d.DataDir+"/.", dir).Code)
				path := filepath.Join(dir, file)
				require.NoError(t, tc.damage(path))
				before, err := os.ReadFile(path)
				require.NoError(t, err)
				r := runCmd(t, nil, []string{"RINGFENCE_DATA_DIR=" + dir, "RINGFENCE_GRPC_ADDR=" + testutil.FreeAddr(t),
					"RINGFENCE_HTTP_ADDR=" + testutil.FreeAddr(t), "RINGFENCE_BOOTSTRAP_ADMIN_KEY=" + adminKey}, bin("ringfenced"))
				require.Equal(t, 1, r.Code, "ringfenced started over a damaged %s:\n%s%s", file, r.Stdout, r.Stderr)
				logs := r.Stdout + r.Stderr
				require.Contains(t, logs, `msg="ringfenced cannot start"`)
				require.Contains(t, logs, path+tc.want)
				require.NotContains(t, logs, "goroutine ", "a panic")
				after, err := os.ReadFile(path)
				require.NoError(t, err)
				require.Equal(t, before, after, "the damaged file is left as it was")
			})
		}
	}
}
