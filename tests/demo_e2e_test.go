package tests

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
)

// TestASecondDemoIsToldWhatItNeeds: make run a second time while a demo runs on the same ports
// (which holds their data directory's lock too) is told that something listens there and to
// pick other ports, not to give it another RINGFENCE_DATA_DIR, with which it would only meet the
// ports next; a demo given a data directory another one holds is told to give it its own.
func TestASecondDemoIsToldWhatItNeeds(t *testing.T) {
	script := filepath.Join(bins.root, "scripts", "demo.sh")
	dataDir := filepath.Join(t.TempDir(), "demo-data")
	lock, err := os.OpenFile(dataDir+".lock", os.O_CREATE|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB), "the running demo's lock")
	running, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer running.Close()

	r := runCmd(t, nil, []string{
		"RINGFENCE_GRPC_ADDR=" + running.Addr().String(), "RINGFENCE_HTTP_ADDR=" + testutil.FreeAddr(t),
		"RINGFENCE_DATA_DIR=" + dataDir,
	}, script)
	require.Equal(t, 1, r.Code, r.Stdout+r.Stderr)
	require.Contains(t, r.Stderr, "demo: something already listens on "+running.Addr().String()+" (a demo still running?)")
	require.Contains(t, r.Stderr, "pick other ports with RINGFENCE_GRPC_ADDR and RINGFENCE_HTTP_ADDR")
	require.NotContains(t, r.Stderr, "RINGFENCE_DATA_DIR")

	r = runCmd(t, nil, []string{
		"RINGFENCE_GRPC_ADDR=" + testutil.FreeAddr(t), "RINGFENCE_HTTP_ADDR=" + testutil.FreeAddr(t),
		"RINGFENCE_DATA_DIR=" + dataDir,
	}, script)
	require.Equal(t, 1, r.Code, r.Stdout+r.Stderr)
	require.Contains(t, r.Stderr, "demo: another demo is using "+dataDir)
	require.Contains(t, r.Stderr, "give this one a RINGFENCE_DATA_DIR of its own")
}
