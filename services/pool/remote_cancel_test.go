package pool

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
)

// sleepyRemote is a remote MCP server (go-sdk, streamable HTTP over loopback) whose tool sleep
// holds its call until the call's context at the server is cancelled: it counts the calls that
// began and the ones whose context ended, which is what a client's abandonment must reach.
type sleepyRemote struct {
	url       string
	started   atomic.Int64
	cancelled atomic.Int64
}

func startSleepyRemote(t *testing.T, transport string) *sleepyRemote {
	t.Helper()
	r := &sleepyRemote{}
	// Ends the handlers no cancellation reached, so none outlives the test.
	over := make(chan struct{})
	server := mcp.NewServer(&mcp.Implementation{Name: "sleepy", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "sleep", Description: "Sleep until cancelled."},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct {
			Label string `json:"label,omitempty"`
		}) (*mcp.CallToolResult, any, error) {
			r.started.Add(1)
			select {
			case <-ctx.Done():
				r.cancelled.Add(1)
				return nil, nil, ctx.Err()
			case <-over:
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "slept"}}}, nil, nil
			}
		})
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	if transport == "sse" {
		h = mcp.NewSSEHandler(func(*http.Request) *mcp.Server { return server }, nil)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(func() {
		close(over)
		ts.CloseClientConnections() // the pool's session may still hold its standalone stream
		ts.Close()
	})
	r.url = ts.URL + "/mcp"
	return r
}

// remoteCancelHarness is a pool with the sleepy remote server registered as rs (streamable
// HTTP, its calls bounded by timeout) and imported by agent a of a started run.
func remoteCancelHarness(t *testing.T, timeout time.Duration) (*harness, *sleepyRemote, string) {
	return remoteCancelHarnessOver(t, "streamable_http", timeout)
}

func remoteCancelHarnessOver(t *testing.T, transport string, timeout time.Duration) (*harness, *sleepyRemote, string) {
	t.Helper()
	h := newHarness(t, harnessOpts{noImage: true})
	srv := startSleepyRemote(t, transport)
	h.server("rs", func(r *registryv1.CreateServerRequest) {
		r.Command, r.Transport, r.Url = "", transport, srv.url
		callTimeout(timeout)(r)
	})
	h.publish("g", []string{"a"}, []imp{{"rs", "a", []string{"sleep"}}}, nil)
	return h, srv, h.start("g")
}

// callSleeps starts n calls of rs__sleep on run under ctx and returns their errors' channel.
func callSleeps(h *harness, ctx context.Context, run string, n int) <-chan error {
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := h.pool.CallTool(ctx, CallRequest{RunID: run, Agent: "a", Tool: "rs__sleep", Arguments: []byte(`{}`)})
			errs <- err
		}()
	}
	return errs
}

func requireAllFail(t *testing.T, errs <-chan error, n int) {
	t.Helper()
	for range n {
		require.Error(t, <-errs)
	}
}

// requireCancelledAtServer waits until every one of the n calls that began at the server saw
// its context end: the pool's abandonment reached the server's tool handler.
func requireCancelledAtServer(t *testing.T, srv *sleepyRemote, n int64, how string) {
	t.Helper()
	if !assert.Eventually(t, func() bool { return srv.cancelled.Load() == n }, 30*time.Second, 10*time.Millisecond) {
		t.Fatalf("%s: the remote server's handler is cancelled for each of the %d calls, and %d of the %d that started were", how, n, srv.cancelled.Load(), srv.started.Load())
	}
}

func requireStarted(t *testing.T, srv *sleepyRemote, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return srv.started.Load() == n }, 30*time.Second, 10*time.Millisecond,
		"the remote server's handler began each of the %d calls", n)
}

// TestRemoteCallPastItsDeadlineIsCancelledAtTheServer: a call to a remote server that the pool
// abandons at its tool_call_timeout is cancelled at the server (notifications/cancelled), so
// the tool stops working for nobody; so are eight abandoned at once on one session.
func TestRemoteCallPastItsDeadlineIsCancelledAtTheServer(t *testing.T) {
	for _, n := range []int{1, 8} {
		t.Run(map[int]string{1: "one", 8: "eight at once"}[n], func(t *testing.T) {
			h, srv, run := remoteCancelHarness(t, 500*time.Millisecond)
			errs := callSleeps(h, h.ctx, run, n)
			requireCancelledAtServer(t, srv, int64(n), "the calls' deadline passed")
			for range n {
				requireFailed(t, <-errs, failureTimeout)
			}
			require.Equal(t, int64(n), srv.started.Load())
		})
	}
}

// TestRemoteCallTheCallerCancelsIsCancelledAtTheServer: a caller that gives up on a dispatched
// call to a remote server (a gRPC client cancelling, a front door client sending
// notifications/cancelled) cancels it at the server too, also while other calls hold the
// session's connections (the standalone SSE stream and eight calls in flight).
func TestRemoteCallTheCallerCancelsIsCancelledAtTheServer(t *testing.T) {
	for _, busy := range []int{0, 8} {
		t.Run(map[int]string{0: "alone", 8: "eight calls in flight"}[busy], func(t *testing.T) {
			h, srv, run := remoteCancelHarness(t, 10*time.Minute) // the calls' own timeout never fires
			hold, release := context.WithCancel(h.ctx)
			held := callSleeps(h, hold, run, busy)
			requireStarted(t, srv, int64(busy))

			ctx, cancel := context.WithCancel(h.ctx)
			errs := callSleeps(h, ctx, run, 1)
			requireStarted(t, srv, int64(busy+1))
			cancel()
			requireCancelledAtServer(t, srv, 1, "the caller cancelled")
			requireFailed(t, <-errs, failureCanceled)

			release()
			requireCancelledAtServer(t, srv, int64(busy+1), "the held calls' callers cancelled")
			requireAllFail(t, held, busy)
		})
	}
}

// TestRemoteCallInFlightWhenItsSessionStopsIsCancelledAtTheServer: calls in flight on a remote
// server's session when the session is stopped (its run ends) are cancelled at the server,
// over streamable HTTP and over SSE.
func TestRemoteCallInFlightWhenItsSessionStopsIsCancelledAtTheServer(t *testing.T) {
	for _, tt := range []struct {
		name, transport string
		n               int
	}{{"one", "streamable_http", 1}, {"eight at once", "streamable_http", 8}, {"sse", "sse", 1}} {
		t.Run(tt.name, func(t *testing.T) {
			n := tt.n
			h, srv, run := remoteCancelHarnessOver(t, tt.transport, 10*time.Minute)
			errs := callSleeps(h, h.ctx, run, n)
			requireStarted(t, srv, int64(n))
			var wg sync.WaitGroup
			wg.Go(func() {
				_, err := h.pool.EndRun(h.ctx, run, "default", StateCompleted, "done")
				require.NoError(t, err)
			})
			requireCancelledAtServer(t, srv, int64(n), "the run ended")
			requireAllFail(t, errs, n)
			wg.Wait()
		})
	}
}

// TestADeafRemoteServerCannotHoldItsSessionsStop: a remote server whose tool never returns,
// which never answers the notifications/cancelled sent for its calls nor the session's DELETE
// (each request held open until the test ends), cannot hold the stop of its session (docs:
// runtime.md): the run's end gives the calls in flight their grace, gives them up, lets the
// notices go out (the server got one for each call) and returns while the server still holds
// them, and the calls fail as given up by the stop.
func TestADeafRemoteServerCannotHoldItsSessionsStop(t *testing.T) {
	const n = 4
	over := make(chan struct{})
	var started, notices, held atomic.Int64
	server := mcp.NewServer(&mcp.Implementation{Name: "deaf", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "sleep", Description: "Sleep, whatever the client says."},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			started.Add(1)
			<-over
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "slept"}}}, nil, nil
		})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	hold := func() {
		held.Add(1)
		defer held.Add(-1)
		<-over
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			hold()
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if bytes.Contains(body, []byte(`"notifications/cancelled"`)) {
			notices.Add(1)
			hold()
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		handler.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		close(over)
		ts.CloseClientConnections()
		ts.Close()
	})

	h := newHarness(t, harnessOpts{noImage: true})
	h.server("rs", func(r *registryv1.CreateServerRequest) {
		r.Command, r.Transport, r.Url = "", "streamable_http", ts.URL+"/mcp"
		callTimeout(10 * time.Minute)(r) // only the stop ends the calls
	})
	h.publish("g", []string{"a"}, []imp{{"rs", "a", []string{"sleep"}}}, nil)
	run := h.start("g")
	errs := callSleeps(h, h.ctx, run, n)
	require.Eventually(t, func() bool { return started.Load() == n }, 30*time.Second, 10*time.Millisecond)

	ended := make(chan error, 1)
	go func() {
		_, err := h.pool.EndRun(h.ctx, run, "default", StateCompleted, "done")
		ended <- err
	}()
	select {
	case err := <-ended:
		require.NoError(t, err)
	case <-time.After(2 * time.Minute): // far past the stop's bounds: a hang, not a slow stop
		t.Fatalf("the run's end is held by a server that answers nothing (%d notices held)", notices.Load())
	}
	require.EqualValues(t, n, notices.Load(), "the server was told of each call given up")
	require.NotZero(t, held.Load(), "the server still holds what it never answered")
	for range n {
		err := <-errs
		requireFailed(t, err, failureCrashed)
		require.ErrorContains(t, err, "the session was stopped before the server answered tools/call")
	}
}
