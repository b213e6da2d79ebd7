package spawner

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type noCloseWrite struct{}

func (noCloseWrite) CloseWrite() error { return nil }

// TestStdinWritesAreBounded: a write to a server that has stopped reading its stdin fails
// once its bound passes instead of blocking the session for good.
func TestStdinWritesAreBounded(t *testing.T) {
	server, pool := net.Pipe() // synchronous: a write waits for a read that never comes
	t.Cleanup(func() { server.Close(); pool.Close() })
	w := stdinWriter{conn: pool, closer: noCloseWrite{}, timeout: 10 * time.Millisecond}
	_, err := w.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}` + "\n"))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Contains(t, err.Error(), "has not read its stdin")

	go func() { buf := make([]byte, 64); _, _ = server.Read(buf) }()
	w.timeout = time.Minute // the reader may be scheduled late on a loaded machine
	_, err = w.Write([]byte("read\n"))
	require.NoError(t, err, "a server that reads is written to as before")
}
