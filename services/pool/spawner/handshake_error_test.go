package spawner

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
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
}
