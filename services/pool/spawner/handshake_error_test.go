package spawner

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
)

// exitedProcess is a local server that has exited with code by the time its handshake's
// failure is classified.
type exitedProcess struct{ code int }

func (p exitedProcess) Gone() <-chan struct{}                          { c := make(chan struct{}); close(c); return c }
func (p exitedProcess) Death(context.Context) *Error                   { return nil }
func (p exitedProcess) Stop(context.Context, *mcp.ClientSession) error { return nil }
func (p exitedProcess) WaitExited(context.Context, time.Duration) bool { return true }
func (p exitedProcess) ExitStatus() (int, bool)                        { return p.code, true }
func (p exitedProcess) DescribeExit(context.Context) string {
	return fmt.Sprintf("exited with status %d", p.code)
}

// TestAServerThatOutlivedTheHandshakeTimedOut: a server that ran the whole handshake timeout
// and exited once the client gave up (closing its stdin, as the SDK does) timed out; it did not
// exit before the handshake, however fast it exited after. One that exited before the
// deadline (the client saw its stream end) did.
func TestAServerThatOutlivedTheHandshakeTimedOut(t *testing.T) {
	spec := &Spec{ServerRef: "x", Transport: TransportStdio, Command: "/bin/x", HandshakeTimeout: time.Second}
	classify := func(err error, code int) Class {
		return ClassOf(handshakeError(t.Context(), err, exitedProcess{code: code}, &stdoutFilter{}, newTail(1024, nil), spec))
	}
	require.Equal(t, ClassHandshakeTimeout, classify(fmt.Errorf("initialize: %w", context.DeadlineExceeded), 0))
	require.Equal(t, ClassExitedBeforeHandshake, classify(errors.New("initialize: connection closed: EOF"), 0))
	require.Equal(t, ClassCommandNotFound, classify(fmt.Errorf("initialize: %w", context.DeadlineExceeded), exitNotFound), "a command that could not run says so, whenever it is seen")
	require.Equal(t, ClassNotMCPServer, classify(fmt.Errorf("calling %q: %w", "initialize", &jsonrpc.Error{Code: -32601, Message: "method not found"}), 0), "an error answer is an answer, however soon it exited after")
}

// TestACommandThatEchoesTheClientIsNotAnMCPServer: `cat` answers initialize with the client's
// own request (JSON-RPC, but not an answer), and exits only when the client, given up on it,
// closes its stdin: it is not an MCP server; it did not exit before the handshake. A real
// process on the host.
func TestACommandThatEchoesTheClientIsNotAnMCPServer(t *testing.T) {
	cat, err := exec.LookPath("cat")
	require.NoError(t, err)
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs)
	for range 3 {
		_, err = r.Spawn(t.Context(), withHandshake(hostSpec(cat), 10e9))
		require.Equal(t, ClassNotMCPServer, ClassOf(err), "%v", err)
		require.ErrorContains(t, err, "the server's answer to initialize was not MCP, and it exited (exited with status 0): it is not an MCP server")
	}
}
