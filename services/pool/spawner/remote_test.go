package spawner

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// remoteServer starts an in-process go-sdk server over TLS on loopback and
// records the headers of every request it receives.
type recordedHeaders struct {
	mu  sync.Mutex
	all []http.Header
}

func (r *recordedHeaders) add(h http.Header) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, h.Clone())
}

func (r *recordedHeaders) values(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, h := range r.all {
		out = append(out, h.Values(name)...)
	}
	return out
}

func startRemote(t *testing.T, sse bool) (*httptest.Server, *recordedHeaders) {
	t.Helper()
	server := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "greet", Description: "Say hello."},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			Name string `json:"name"`
		}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "hello " + in.Name}}}, nil, nil
		})
	var h http.Handler
	if sse {
		h = mcp.NewSSEHandler(func(*http.Request) *mcp.Server { return server }, nil)
	} else {
		h = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	}
	rec := &recordedHeaders{}
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r.Header)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts, rec
}

func trusting(ts *httptest.Server) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ts.Certificate())
	return pool
}

func remoteRouter(t *testing.T, roots *x509.CertPool) *Router {
	t.Helper()
	r, err := New(Config{RootCAs: roots})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close(context.Background())) })
	return r
}

func remoteSpec(transport, url string) Spec {
	return Spec{
		ServerRef: "remote", Transport: transport, URL: url, Purpose: PurposeDiscovery,
		Headers:          map[string]string{"X-API-Key": "key-0123456789"},
		HandshakeTimeout: 5 * time.Second,
	}
}

func TestRemote(t *testing.T) {
	for _, tt := range []struct {
		transport string
		sse       bool
	}{{TransportStreamableHTTP, false}, {TransportSSE, true}} {
		t.Run(tt.transport, func(t *testing.T) {
			ts, rec := startRemote(t, tt.sse)
			r := remoteRouter(t, trusting(ts))
			s := spawn(t, r, remoteSpec(tt.transport, ts.URL))
			tools, err := s.ListTools(t.Context())
			require.NoError(t, err)
			require.Equal(t, []string{"greet"}, toolNames(tools))
			res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "greet", Arguments: map[string]any{"name": "pool"}})
			require.NoError(t, err)
			require.Equal(t, "hello pool", res.Content[0].(*mcp.TextContent).Text)

			keys := rec.values("X-Api-Key")
			require.NotEmpty(t, keys)
			for _, k := range keys {
				require.Equal(t, "key-0123456789", k, "every request carries the resolved header")
			}
			require.NoError(t, s.Close(t.Context()))
			<-s.Done()
			require.NoError(t, s.Err())
		})
	}
}

// TestRemoteOutlivesHandshakeTimeout: the handshake deadline bounds only the
// handshake (go-sdk's SSE client would otherwise end its stream with it).
func TestRemoteOutlivesHandshakeTimeout(t *testing.T) {
	for _, tt := range []struct {
		transport string
		sse       bool
	}{{TransportStreamableHTTP, false}, {TransportSSE, true}} {
		t.Run(tt.transport, func(t *testing.T) {
			ts, _ := startRemote(t, tt.sse)
			spec := remoteSpec(tt.transport, ts.URL)
			// Long enough for a handshake on a loaded machine; the point is what comes after.
			spec.HandshakeTimeout = 2 * time.Second
			s := spawn(t, remoteRouter(t, trusting(ts)), spec)
			time.Sleep(2 * spec.HandshakeTimeout)
			require.NoError(t, s.Err())
			_, err := s.ListTools(t.Context())
			require.NoError(t, err)
		})
	}
}

func TestRemoteServerGoneIsCrashed(t *testing.T) {
	ts, _ := startRemote(t, true)
	s := spawn(t, remoteRouter(t, trusting(ts)), remoteSpec(TransportSSE, ts.URL))
	ts.CloseClientConnections()
	ts.Close()
	select {
	case <-s.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Done was not closed after the server went away")
	}
	require.Equal(t, ClassCrashed, ClassOf(s.Err()))
}

func TestRemoteUntrustedCertificate(t *testing.T) {
	ts, rec := startRemote(t, false)
	r := remoteRouter(t, nil) // system roots: the test server's certificate is not among them
	_, err := r.Spawn(t.Context(), remoteSpec(TransportStreamableHTTP, ts.URL))
	require.Equal(t, ClassTLSFailure, ClassOf(err), "%v", err)
	require.Contains(t, err.Error(), "unknown authority")
	require.Empty(t, rec.values("X-Api-Key"), "no secret is sent to an untrusted server")
}

func TestRemoteConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	r := remoteRouter(t, nil)
	_, err = r.Spawn(t.Context(), remoteSpec(TransportStreamableHTTP, "https://"+addr+"/mcp"))
	require.Equal(t, ClassConnectionRefused, ClassOf(err), "%v", err)
	require.Contains(t, err.Error(), addr)
}

// urlCanary stands for a credential in a URL's query.
const urlCanary = "canary-url-91d4"

func TestRemoteRefusals(t *testing.T) {
	r := remoteRouter(t, nil)
	tests := []struct {
		name string
		mut  func(*Spec)
		says string
	}{
		{name: "plain http to a public host", mut: func(s *Spec) { s.URL = "http://mcp.example.com/mcp?api_key=" + urlCanary },
			says: "must use https: plain http is allowed only to loopback addresses"},
		{name: "not a URL", mut: func(s *Spec) { s.URL = "::" }},
		{name: "not absolute", mut: func(s *Spec) { s.URL = "mcp.example.com/mcp?api_key=" + urlCanary }, says: "not an absolute https URL"},
		{name: "ftp", mut: func(s *Spec) { s.URL = "ftp://example.com" }},
		{name: "reserved header", mut: func(s *Spec) { s.Headers = map[string]string{"Host": "evil"} }},
		{name: "session header", mut: func(s *Spec) { s.Headers = map[string]string{"Mcp-Session-Id": "x"} }},
		{name: "header injection", mut: func(s *Spec) { s.Headers = map[string]string{"X-Key": "a\r\nX-Other: b"} }},
		{name: "bad header name", mut: func(s *Spec) { s.Headers = map[string]string{"X Key": "a"} }},
		{name: "env on remote", mut: func(s *Spec) { s.Env = map[string]string{"A": "b"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := remoteSpec(TransportStreamableHTTP, "https://mcp.example.com/mcp")
			tt.mut(&s)
			_, err := r.Spawn(t.Context(), s)
			require.Equal(t, ClassInvalidSpec, ClassOf(err), "%v", err)
			require.NotContains(t, err.Error(), "a\r\nX-Other")
			require.NotContains(t, err.Error(), urlCanary, "the refusal quotes the URL's query value")
			require.Contains(t, err.Error(), tt.says)
		})
	}
}

func TestRemoteDoesNotFollowRedirects(t *testing.T) {
	target, rec := startRemote(t, false)
	redirect := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirect.Close)
	roots := trusting(target)
	roots.AddCert(redirect.Certificate())
	r := remoteRouter(t, roots)
	_, err := r.Spawn(t.Context(), remoteSpec(TransportStreamableHTTP, redirect.URL))
	require.Equal(t, ClassNotMCPServer, ClassOf(err), "%v", err)
	require.Contains(t, err.Error(), "HTTP 307")
	require.Empty(t, rec.values("X-Api-Key"), "the secret header never follows a redirect")
}

// TestRemoteBoundsResponseBodies: go-sdk reads a JSON response whole; the
// spawner cuts it off at the message limit.
func TestRemoteBoundsResponseBodies(t *testing.T) {
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{"pad":"`))
		chunk := make([]byte, 64<<10)
		for i := range chunk {
			chunk[i] = 'x'
		}
		for range 64 { // 4 MiB
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		_, _ = w.Write([]byte(`"}}`))
	}))
	t.Cleanup(ts.Close)
	r, err := New(Config{RootCAs: trusting(ts), MaxMessageBytes: 1 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close(context.Background())) })
	_, err = r.Spawn(t.Context(), remoteSpec(TransportStreamableHTTP, ts.URL))
	require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
	require.Contains(t, err.Error(), "larger than the message limit")
}

// TestRemoteStaysOnTheRegisteredOrigin: an SSE server names the endpoint the client posts
// to; one that names another origin gets a protocol violation, and that origin no request.
func TestRemoteStaysOnTheRegisteredOrigin(t *testing.T) {
	other, rec := startRemote(t, false)
	hostile := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "event: endpoint\ndata: %s/admin/internal\n\n", other.URL)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(hostile.Close)
	roots := trusting(other)
	roots.AddCert(hostile.Certificate())
	r := remoteRouter(t, roots)
	_, err := r.Spawn(t.Context(), remoteSpec(TransportSSE, hostile.URL))
	require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
	require.Contains(t, err.Error(), "another origin")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Empty(t, rec.all, "the other origin received nothing")
}

func TestOriginMakesDefaultPortsExplicit(t *testing.T) {
	parse := func(s string) *url.URL {
		u, err := url.Parse(s)
		require.NoError(t, err)
		return u
	}
	require.Equal(t, origin(parse("https://MCP.example.com/mcp")), origin(parse("https://mcp.example.com:443/messages")))
	require.NotEqual(t, origin(parse("https://mcp.example.com/mcp")), origin(parse("http://mcp.example.com/mcp")))
	require.NotEqual(t, origin(parse("https://mcp.example.com/mcp")), origin(parse("https://mcp.example.com:8443/mcp")))
	require.NotEqual(t, origin(parse("https://mcp.example.com/mcp")), origin(parse("https://evil.example.com/mcp")))
}

// A connection failure quotes the URL, as a *url.Error does, only masked: a short query
// value (below the length secretsOf masks derived forms at) is a credential all the same.
func TestRemoteConnectErrorMasksTheURL(t *testing.T) {
	const short = "k3y-9z" // 6 bytes
	spec := remoteSpec(TransportStreamableHTTP, "https://mcp.example.com/mcp?api_key="+short)
	u, err := checkRemoteURL(spec.URL)
	require.NoError(t, err)
	rt := &remoteTransport{err: &url.Error{Op: "Post", URL: spec.URL, Err: errors.New("connection reset by peer")}}
	got := remoteError(t.Context(), errors.New("connect failed"), rt, u, &spec)
	require.Equal(t, ClassSpawnFailed, ClassOf(got), "%v", got)
	require.NotContains(t, got.Error(), short)
	require.Contains(t, got.Error(), "https://mcp.example.com/mcp?api_key=********")
}

// TestCheckHeadersRefusesOneNameTwice: a registration stored before the registry refused two
// spellings of one header would have the pool send either value, by the map's order.
func TestCheckHeadersRefusesOneNameTwice(t *testing.T) {
	for range 20 {
		_, err := checkHeaders(map[string]string{"Authorization": "one", "authorization": "two"})
		require.Equal(t, ClassInvalidSpec, ClassOf(err))
		require.ErrorContains(t, err, "header Authorization is given twice")
	}
	h, err := checkHeaders(map[string]string{"authorization": "one", "X-Api-Key": "two"})
	require.NoError(t, err)
	require.Equal(t, "one", h.Get("Authorization"))
	_, err = checkHeaders(map[string]string{"mcp-session-id": "x"})
	require.ErrorContains(t, err, "header Mcp-Session-Id is set by the client")
}

// TestRemoteAnswersAreCountedAndCapped: a remote server's answer to a tool call is counted in
// the result budget from before it is read until its caller releases it; one the budget has
// no room for fails its call as too large for the budget, the connection intact; one past the
// registration's cap fails as too large.
func TestRemoteAnswersAreCountedAndCapped(t *testing.T) {
	server := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "blob", Description: "Answer with n bytes."},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			Bytes int `json:"bytes"`
		}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", in.Bytes)}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{JSONResponse: true})
	ts := httptest.NewTLSServer(h)
	t.Cleanup(ts.Close)
	budget, err := NewBudget(4<<20, 100*time.Millisecond)
	require.NoError(t, err)
	r, err := New(Config{RootCAs: trusting(ts), ResultBudget: budget})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close(context.Background())) })
	spec := remoteSpec(TransportStreamableHTTP, ts.URL)
	spec.MaxResultBytes = 1 << 20
	s := spawn(t, r, spec)
	blob := func(n int) *mcp.CallToolParams {
		return &mcp.CallToolParams{Name: "blob", Arguments: map[string]any{"bytes": n}}
	}

	ans, err := s.CallToolRaw(t.Context(), blob(300_000))
	require.NoError(t, err)
	require.Nil(t, ans.Raw, "the SDK decoded it")
	require.Len(t, ans.Result.Content[0].(*mcp.TextContent).Text, 300_000)
	require.Greater(t, budget.InUse(), int64(300_000), "counted until released")
	ans.Release()
	require.Zero(t, budget.InUse())

	release, err := budget.Reserve(t.Context(), 4<<20)
	require.NoError(t, err)
	_, err = s.CallToolRaw(t.Context(), blob(300_000))
	var e *Error
	require.ErrorAs(t, err, &e)
	require.True(t, e.TooLarge && e.OverBudget, "%v", err)
	release()
	ans, err = s.CallToolRaw(t.Context(), blob(10))
	require.NoError(t, err, "the connection stays")
	ans.Release()

	_, err = s.CallToolRaw(t.Context(), blob(2<<20))
	require.True(t, IsTooLarge(err), "%v", err)
	require.ErrorAs(t, err, &e)
	require.Equal(t, int64(1<<20), e.Limit)
	require.Zero(t, budget.InUse())
}

// TestRemoteScopeChallenge: a server's 403 with a Bearer insufficient_scope challenge to a call
// is that call's error, naming the scope the challenge asks for (and the origin, never the
// credentials); the connection stays, so the session's other requests go on.
func TestRemoteScopeChallenge(t *testing.T) {
	ts, _ := startRemote(t, false)
	inner := ts.Config.Handler
	ts.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if strings.Contains(string(body), `"tools/call"`) {
			w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope", scope="tickets.write tickets.read", error_description="needs write"`)
			http.Error(w, `{"error":"insufficient_scope"}`, http.StatusForbidden)
			return
		}
		inner.ServeHTTP(w, r)
	})
	r := remoteRouter(t, trusting(ts))
	s := spawn(t, r, remoteSpec(TransportStreamableHTTP, ts.URL))
	for range 2 {
		_, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "greet", Arguments: map[string]any{"name": "pool"}})
		var e *Error
		require.ErrorAs(t, err, &e)
		require.True(t, e.InsufficientScope, "%v", err)
		require.Equal(t, http.StatusForbidden, e.HTTPStatus)
		require.Equal(t, []string{"tickets.write", "tickets.read"}, e.Scope)
		require.Contains(t, e.Message, "for want of scope")
		require.NotContains(t, e.Message, "key-0123456789")
	}
	tools, err := s.ListTools(t.Context())
	require.NoError(t, err, "the connection stays")
	require.Equal(t, []string{"greet"}, toolNames(tools))
}
