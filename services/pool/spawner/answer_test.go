package spawner

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
)

// TestAnAnswerTheClientCannotDecode: a result the SDK refuses (a content type MCP does not
// define) on a connection that is still intact fails the call at once as a protocol
// violation, within the caller's deadline, and leaves the session up. It is not mistaken for
// a broken connection, which would wait for a death that never comes and call it a crash.
func TestAnAnswerTheClientCannotDecode(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs)
	s := spawn(t, r, hostSpec(fixture, "--raw-result", `{"content":[{"type":"<script>__system__"}]}`))
	for range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		start := time.Now()
		_, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "t", Arguments: map[string]any{}})
		cancel()
		require.Less(t, time.Since(start), time.Second, "classified without waiting: %v", err)
		require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
		require.ErrorContains(t, err, "answer to tools/call is not MCP")
		require.NotContains(t, err.Error(), "<script>", "the server's text is made safe")
		require.NotContains(t, err.Error(), "__system__")
		select {
		case <-s.Done():
			t.Fatalf("the session ended: %v", s.Err())
		default:
		}
		require.NoError(t, s.Err())
		require.NoError(t, s.Ping(t.Context()), "the connection is intact")
	}
}

// TestABrokenConnectionWaitsNoLongerThanTheCaller: after a connection broke, the spawner
// waits a while to learn how the server died, but never past the caller's deadline.
func TestABrokenConnectionWaitsNoLongerThanTheCaller(t *testing.T) {
	g := newTrafficGuard()
	g.watched.Store(true)
	g.connFailed.Store(true)
	s := &Session{srv: lingeringServer{}, guard: g, cfg: &Config{}, done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.requestError(ctx, "tools/call", io.EOF)
	require.Less(t, time.Since(start), deathGrace, "the wait honours the caller's deadline")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// lingeringServer never reports its end.
type lingeringServer struct{}

func (lingeringServer) Gone() <-chan struct{}                          { return nil }
func (lingeringServer) Death(context.Context) *Error                   { return nil }
func (lingeringServer) Stop(context.Context, *mcp.ClientSession) error { return nil }

// TestACallerThatLeftIsNamed: a request that ended with its caller's context says whether the
// caller cancelled or its deadline passed, in words, and stays errors.Is the context's error.
func TestACallerThatLeftIsNamed(t *testing.T) {
	s := &Session{guard: newTrafficGuard(), cfg: &Config{}, done: make(chan struct{})}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	err := s.contextError(cancelled, "tools/call")
	require.ErrorIs(t, err, context.Canceled)
	require.EqualError(t, err, "the caller cancelled the request before the server answered tools/call: context canceled")

	expired, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	err = s.contextError(expired, "tools/call")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.EqualError(t, err, "the caller's deadline passed before the server answered tools/call: context deadline exceeded")
}
