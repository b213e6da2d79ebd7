package spawner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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

// TestAnUndecodableMessageStopsTheServer: a line the stdout filter passes (a JSON object with
// "jsonrpc":"2.0") that the SDK's decoder refuses ends the connection while the server runs on.
// The call in flight fails as the protocol violation it is (never as a JSON-RPC error the
// server did not send), the server is stopped at once, and the session refuses what follows
// with the same violation instead of dispatching into a closed connection.
func TestAnUndecodableMessageStopsTheServer(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs)
	for _, line := range []string{
		`{"jsonrpc":"2.0"}`,                     // a response without an id
		`{"jsonrpc":"2.0","id":{},"result":{}}`, // an id of no JSON-RPC type
		`{"jsonrpc":"2.0","id":1,"method":7}`,   // a method that is not a string
	} {
		t.Run(line, func(t *testing.T) {
			s := spawn(t, r, hostSpec(fixture, "--runtime-tools"))
			_, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "raw", Arguments: map[string]any{"line": line}})
			require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
			require.ErrorContains(t, err, "cannot decode")
			var rpcErr *jsonrpc.Error
			require.False(t, errors.As(err, &rpcErr), "the server sent no JSON-RPC error: %v", err)
			requireStoppedFor(t, s, "cannot decode")
			require.Eventually(t, func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				_, open := r.sessions[s]
				return !open
			}, 30*time.Second, 50*time.Millisecond, "the spawner stops the server itself")

			start := time.Now()
			_, err = s.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "next"}})
			require.Equal(t, ClassProtocolViolation, ClassOf(err), "the next call is refused with the violation: %v", err)
			require.Less(t, time.Since(start), deathTimeout, "without waiting for a death")
		})
	}
}

// TestUnansweredRequestsAreBounded: a stdio server that sends requests and stops reading the
// answers holds a goroutine per request in the SDK; past maxUnansweredRequests the
// connection ends. An answer written, even one that failed, frees its place.
func TestUnansweredRequestsAreBounded(t *testing.T) {
	g := newTrafficGuard()
	g.requests = rate.NewLimiter(rate.Inf, 0) // this test is about the answers, not the rate
	c, push := scriptedConn(t, g)
	for i := range maxUnansweredRequests + 1 {
		push(&jsonrpc.Request{ID: mustID(t, i), Method: "ping"})
	}
	ctx := t.Context()
	for range maxUnansweredRequests {
		_, err := c.Read(ctx)
		require.NoError(t, err)
	}
	require.NoError(t, c.Write(ctx, &jsonrpc.Response{ID: mustID(t, 0)}))
	push(&jsonrpc.Request{ID: mustID(t, 100), Method: "ping"})
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

// TestAnswersNobodyAwaits: a stdio connection passes an answer only to a request the pool sent
// and has not had answered. One to a request it never sent, or a second one, is a breach: the
// SDK would drop it, but only after decoding it, and a flood of them held a call past its
// timeout. A late answer to a request the client gave up on is legitimate; past
// maxOpenRequests unanswered requests such answers are metered like notifications.
func TestAnswersNobodyAwaits(t *testing.T) {
	ctx := t.Context()
	answer := func(id jsonrpc.ID) *jsonrpc.Response { return &jsonrpc.Response{ID: id, Result: json.RawMessage(`{}`)} }
	newConn := func() (*guardedConn, func(...jsonrpc.Message)) { return scriptedConn(t, newTrafficGuard()) }

	t.Run("expected answers pass, once each", func(t *testing.T) {
		c, push := newConn()
		for _, id := range []int{1, 2} {
			require.NoError(t, c.Write(ctx, &jsonrpc.Request{ID: intID(t, id), Method: "tools/call"}))
		}
		require.NoError(t, c.Write(ctx, &jsonrpc.Request{Method: "notifications/cancelled"}))
		push(answer(intID(t, 2)), answer(intID(t, 1)), answer(intID(t, 1)))
		for range 2 {
			_, err := c.Read(ctx)
			require.NoError(t, err, "answers come in any order")
		}
		_, err := c.Read(ctx)
		require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
		require.ErrorContains(t, err, "answered one twice")
		require.NotNil(t, c.g.violation())
	})
	t.Run("an answer to a request never sent", func(t *testing.T) {
		for _, id := range []jsonrpc.ID{intID(t, 7), mustID(t, 9)} {
			c, push := newConn()
			require.NoError(t, c.Write(ctx, &jsonrpc.Request{ID: intID(t, 1), Method: "tools/call"}))
			push(answer(id))
			_, err := c.Read(ctx)
			require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
			require.ErrorContains(t, err, "did not send")
		}
	})
	t.Run("past the bound, unexpected answers are metered", func(t *testing.T) {
		c, push := newConn()
		for i := range maxOpenRequests + 1 {
			require.NoError(t, c.Write(ctx, &jsonrpc.Request{ID: intID(t, i+1), Method: "tools/call"}))
		}
		// Request 1 was forgotten; its late answer passes, and so does the newest's.
		push(answer(intID(t, 1)), answer(intID(t, maxOpenRequests+1)))
		for range 2 {
			_, err := c.Read(ctx)
			require.NoError(t, err)
		}
		for i := range serverNotificationBurst * 2 {
			push(answer(mustID(t, i)))
		}
		var err error
		for i := 0; err == nil && i < serverNotificationBurst*2; i++ {
			_, err = c.Read(ctx)
		}
		require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
		require.ErrorContains(t, err, "no longer awaits faster than")
	})
}

// TestAServerThatAnswersUnaskedIsStopped: a stdio server that answers a request the pool never
// sent is stopped as a protocol violation; a server that answers a call after the client gave
// up on it (go-sdk servers do) is not.
func TestAServerThatAnswersUnaskedIsStopped(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs)

	t.Run("unsolicited", func(t *testing.T) {
		s := spawn(t, r, hostSpec(fixture, "--runtime-tools"))
		start := time.Now()
		_, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "raw", Arguments: map[string]any{
			"line": `{"jsonrpc":"2.0","id":"bogus","result":{}}`, "n": 200_000}})
		require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
		require.ErrorContains(t, err, "did not send")
		require.Less(t, time.Since(start), 10*time.Second)
		requireStoppedFor(t, s, "did not send")
	})
	t.Run("late", func(t *testing.T) {
		s := spawn(t, r, hostSpec(fixture, "--runtime-tools"))
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		_, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "sleep", Arguments: map[string]any{"ms": 60_000}})
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		// The server learns of the cancellation and answers the call anyway.
		require.Eventually(t, func() bool { return strings.Contains(s.StderrTail(), "sleep canceled by the client") },
			10*time.Second, 20*time.Millisecond)
		require.NoError(t, s.Ping(t.Context()))
		res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "still here"}})
		require.NoError(t, err)
		require.False(t, res.IsError)
		require.NoError(t, s.Err())
	})
}

// intID is an id as the SDK numbers its requests (MakeID reads JSON numbers as float64).
func intID(t *testing.T, i int) jsonrpc.ID {
	id, err := jsonrpc.MakeID(float64(i))
	require.NoError(t, err)
	return id
}

func mustID(t *testing.T, i int) jsonrpc.ID {
	id, err := jsonrpc.MakeID(fmt.Sprintf("r%d", i))
	require.NoError(t, err)
	return id
}

// scriptedConn is a stdio connection under g whose server's output is what push hands it;
// what the connection writes is discarded.
func scriptedConn(t *testing.T, g *trafficGuard) (*guardedConn, func(...jsonrpc.Message)) {
	st := &Stdio{messages: make(chan inMessage, 4*serverNotificationBurst), requests: &openRequests{},
		life: context.Background(), endLife: func() {}, general: DefaultMaxMessageBytes, callCap: DefaultMaxResultBytes}
	c := &guardedConn{st: st, stdin: discardCloser{}, g: g, callCap: st.callCap, open: st.requests}
	push := func(msgs ...jsonrpc.Message) {
		for _, m := range msgs {
			line, err := jsonrpc.EncodeMessage(m)
			require.NoError(t, err)
			st.messages <- inMessage{line: line}
		}
	}
	return c, push
}

type discardCloser struct{}

func (discardCloser) Write(p []byte) (int, error) { return len(p), nil }
func (discardCloser) Close() error                { return nil }

// TestARemoteServerThatFloodsIsStopped: the same bounds hold over HTTP. A server that pings
// the pool faster than any honest one is stopped by the rate; one that sends requests for
// methods the client does not know (answered before any middleware sees them) and never
// acknowledges the answers the pool posts back is stopped by the bound on unanswered requests.
func TestARemoteServerThatFloodsIsStopped(t *testing.T) {
	t.Run("pings", func(t *testing.T) {
		server := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "1"}, nil)
		mcp.AddTool(server, &mcp.Tool{Name: "pingflood", Description: "Ping the client many times at once."},
			func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				// Bounded: once the pool cuts the stream, no answer is coming.
				ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				var wg sync.WaitGroup
				for range serverRequestBurst * 3 {
					wg.Go(func() { _ = req.Session.Ping(ctx, nil) })
				}
				wg.Wait()
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
			})
		// SSE: one stream carries everything (go-sdk's streamable client opens no stream for
		// requests unrelated to a call).
		ts := httptest.NewTLSServer(mcp.NewSSEHandler(func(*http.Request) *mcp.Server { return server }, nil))
		t.Cleanup(ts.Close)
		s := spawn(t, remoteRouter(t, trusting(ts)), remoteSpec(TransportSSE, ts.URL))
		_, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "pingflood", Arguments: map[string]any{}})
		require.Error(t, err)
		requireStoppedFor(t, s, "requests to the client faster than")
	})
	t.Run("unanswered requests", func(t *testing.T) {
		ts := httptest.NewTLSServer(floodingSSEServer(maxUnansweredRequests + 50))
		t.Cleanup(ts.Close)
		s := spawn(t, remoteRouter(t, trusting(ts)), remoteSpec(TransportSSE, ts.URL))
		requireStoppedFor(t, s, "requests to it unanswered")
	})
}

func requireStoppedFor(t *testing.T, s *Session, reason string) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the flooding server's session did not end")
	}
	require.Equal(t, ClassProtocolViolation, ClassOf(s.Err()), "%v", s.Err())
	require.ErrorContains(t, s.Err(), reason)
}

// floodingSSEServer speaks just enough MCP over SSE to complete the handshake, then sends n
// requests for a method no client knows and never acknowledges the answers posted back.
func floodingSSEServer(n int) http.Handler {
	events := make(chan string, n+8)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			fmt.Fprintf(w, "event: endpoint\ndata: https://%s/post\n\n", r.Host)
			w.(http.Flusher).Flush()
			for {
				select {
				case e := <-events:
					fmt.Fprintf(w, "event: message\ndata: %s\n\n", e)
					w.(http.Flusher).Flush()
				case <-r.Context().Done():
					return
				}
			}
		}
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.NewDecoder(r.Body).Decode(&msg)
		switch msg.Method {
		case "":
			<-r.Context().Done() // an answer to one of its requests: never acknowledged
			return
		case "initialize":
			events <- fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%q,"capabilities":{"tools":{}},"serverInfo":{"name":"flood","version":"1"}}}`, msg.ID, ProtocolVersion)
		case "notifications/initialized":
			for i := range n {
				events <- fmt.Sprintf(`{"jsonrpc":"2.0","id":"flood-%d","method":"x/flood"}`, i)
			}
		default:
			if len(msg.ID) > 0 {
				events <- fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"method not found"}}`, msg.ID)
			}
		}
		w.WriteHeader(http.StatusAccepted)
	})
}

// TestABreachEndsTheSessionBeforeTheCallReturns: a call failed by a breach returns only once
// the session is marked done, with the breach as its error; a caller that checks Done before
// its next call (the pool does) is never handed the broken session in the moment before its
// monitor runs.
func TestABreachEndsTheSessionBeforeTheCallReturns(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs)
	for i := range 5 {
		s := spawn(t, r, hostSpec(fixture, "--runtime-tools"))
		_, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "raw", Arguments: map[string]any{"line": `{"jsonrpc":"2.0","id":"bogus","result":{}}`, "n": 1}})
		require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
		select {
		case <-s.Done():
		default:
			t.Fatalf("attempt %d: the call returned before the session was marked done", i)
		}
		require.ErrorContains(t, s.Err(), "did not send")
	}
}

// FuzzIDFromRawIsTheDecoder: an id read without a decode (smallInt) is the id json's decode
// gives, and whatever smallInt leaves to json is read as before.
func FuzzIDFromRawIsTheDecoder(f *testing.F) {
	for _, s := range []string{"0", "7", "-3", "-0", "42", "123456789012345", "-123456789012345", "1234567890123456", "01", "1.5", "1e3", "-", "", `"abc"`, `"7"`, "null", " 7", "7 "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, gotErr := idFromRaw(raw)
		var v any
		wantErr := json.Unmarshal(raw, &v)
		var want jsonrpc.ID
		if wantErr == nil {
			want, wantErr = jsonrpc.MakeID(v)
		}
		if (gotErr == nil) != (wantErr == nil) || got != want {
			t.Fatalf("idFromRaw(%q) = %v, %v; the decoder gives %v, %v", raw, got, gotErr, want, wantErr)
		}
	})
}
