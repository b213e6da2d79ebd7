package spawner

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
)

// TestAFloodingServerIsStopped: a server that sends the pool requests (or notifications)
// unasked, faster than any honest one, fails the call in flight as a protocol violation and
// is stopped; a few pings are fine.
func TestAFloodingServerIsStopped(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs)

	t.Run("a few pings are answered", func(t *testing.T) {
		s := spawn(t, r, hostSpec(fixture, "--runtime-tools"))
		res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "flood", Arguments: map[string]any{"n": serverRequestBurst / 2}})
		require.NoError(t, err)
		require.False(t, res.IsError)
		require.NoError(t, s.Ping(t.Context()))
		require.NoError(t, s.Err())
	})
	for _, tt := range []struct {
		method string
		n      int
		reason string
	}{
		{"ping", 100_000, "requests to the client faster than"},
		{"no/such/method", 100_000, "requests to the client faster than"},
		{"notifications/tools/list_changed", serverNotificationBurst * 3, "notifications faster than"},
	} {
		t.Run(tt.method, func(t *testing.T) {
			s := spawn(t, r, hostSpec(fixture, "--runtime-tools"))
			_, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "flood", Arguments: map[string]any{"n": tt.n, "method": tt.method}})
			require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
			require.ErrorContains(t, err, tt.reason)
			require.False(t, IsTooLarge(err))
			select {
			case <-s.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("the flooding server's session did not end")
			}
			require.Equal(t, ClassProtocolViolation, ClassOf(s.Err()))
			require.Eventually(t, func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				_, open := r.sessions[s]
				return !open
			}, 30*time.Second, 50*time.Millisecond, "the spawner stops a flooding server itself")
		})
	}
}

// TestUnansweredRequestsAreBounded: a stdio server that sends requests and stops reading the
// answers holds a goroutine per request in the SDK; past maxUnansweredRequests the
// connection ends. An answer written, even one that failed, frees its place.
func TestUnansweredRequestsAreBounded(t *testing.T) {
	inner := &scriptedConn{writes: make(chan jsonrpc.Message, maxUnansweredRequests*2)}
	for i := range maxUnansweredRequests + 1 {
		inner.reads = append(inner.reads, &jsonrpc.Request{ID: mustID(t, i), Method: "ping"})
	}
	g := newTrafficGuard()
	g.requests = rate.NewLimiter(rate.Inf, 0) // this test is about the answers, not the rate
	c := &guardedConn{Connection: inner, g: g}
	ctx := t.Context()
	for range maxUnansweredRequests {
		_, err := c.Read(ctx)
		require.NoError(t, err)
	}
	require.NoError(t, c.Write(ctx, &jsonrpc.Response{ID: mustID(t, 0)}))
	inner.reads = append(inner.reads, &jsonrpc.Request{ID: mustID(t, 100), Method: "ping"})
	_, err := c.Read(ctx)
	require.NoError(t, err, "an answer written frees a place")
	require.Nil(t, g.violation())

	_, err = c.Read(ctx)
	require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
	require.ErrorContains(t, err, "without reading the answers")
	require.NotNil(t, g.violation())
	select {
	case <-g.breached:
	default:
		t.Fatal("the breach is signalled to the session's monitor")
	}
}

func mustID(t *testing.T, i int) jsonrpc.ID {
	id, err := jsonrpc.MakeID(fmt.Sprintf("r%d", i))
	require.NoError(t, err)
	return id
}

// scriptedConn reads a fixed list of messages and records what is written.
type scriptedConn struct {
	reads  []jsonrpc.Message
	writes chan jsonrpc.Message
}

func (c *scriptedConn) Read(context.Context) (jsonrpc.Message, error) {
	m := c.reads[0]
	c.reads = c.reads[1:]
	return m, nil
}

func (c *scriptedConn) Write(_ context.Context, m jsonrpc.Message) error {
	c.writes <- m
	return nil
}

func (c *scriptedConn) Close() error      { return nil }
func (c *scriptedConn) SessionID() string { return "" }
