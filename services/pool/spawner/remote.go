package spawner

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/ringfence/ringfence/internal/mcpserver"
)

// Bounds of the remote back end's HTTP client. There is no overall request
// timeout: a standalone SSE stream lives as long as the session, and calls
// are bounded by their contexts.
const (
	remoteDialTimeout      = 10 * time.Second
	remoteTLSTimeout       = 10 * time.Second
	remoteIdleTimeout      = 90 * time.Second
	remoteMaxHeaderBytes   = 1 << 20
	remoteReconnectRetries = 2
	maxHeaderValueLen      = 8 << 10
)

// Remote is the back end of streamable HTTP and SSE servers: no process at all, an HTTPS
// client that adds the registration's resolved headers and talks to its origin only.
type Remote struct {
	cfg Config
}

var _ Backend = (*Remote)(nil)

// NewRemote returns the remote back end.
func NewRemote(cfg Config) (*Remote, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	return &Remote{cfg: cfg}, nil
}

// Name is "remote".
func (rb *Remote) Name() string { return "remote" }

// Serves streamable HTTP and SSE servers.
func (rb *Remote) Serves(transport string) bool {
	return transport == TransportStreamableHTTP || transport == TransportSSE
}

// Preflight has nothing to check: a remote server is reached when a session starts.
func (rb *Remote) Preflight(context.Context) (Report, error) { return Report{}, nil }

// Sweep has nothing to remove.
func (rb *Remote) Sweep(context.Context) (int, error) { return 0, nil }

// Close has nothing to release: each session's connections end with it.
func (rb *Remote) Close(context.Context) error { return nil }

// Spawn connects to the server.
func (rb *Remote) Spawn(ctx context.Context, spec *Spec, kit *Kit) (*Session, error) {
	u, err := checkRemoteURL(spec.URL)
	if err != nil {
		return nil, err
	}
	headers, err := checkHeaders(spec.Headers)
	if err != nil {
		return nil, err
	}
	base := &http.Transport{
		// No proxy from the environment: where secrets go is decided by the
		// registration's URL alone.
		Proxy:                  nil,
		DialContext:            (&net.Dialer{Timeout: remoteDialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:        &tls.Config{RootCAs: rb.cfg.RootCAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    remoteTLSTimeout,
		IdleConnTimeout:        remoteIdleTimeout,
		MaxResponseHeaderBytes: remoteMaxHeaderBytes,
		ForceAttemptHTTP2:      true,
	}
	// The session's own lifetime: it ends in stop, not with the handshake, and ending it
	// ends every request still open.
	life, endLife := context.WithCancel(context.WithoutCancel(ctx))
	guard := newTrafficGuard()
	callCap := resultCap(spec)
	rt := &remoteTransport{base: base, origin: origin(u), headers: headers, maxBody: int64(rb.cfg.MaxMessageBytes), maxAnswer: int64(callCap),
		budget: rb.cfg.ResultBudget, guard: guard, life: life}
	maxEvent := max(rb.cfg.MaxMessageBytes, callCap)
	hc := &http.Client{
		Transport: rt,
		// Redirects are not followed: the headers carry secrets meant for
		// one origin.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	var transport mcp.Transport
	if spec.Transport == TransportSSE {
		transport = &detachedTransport{
			inner: &mcp.SSEClientTransport{Endpoint: u.String(), HTTPClient: hc, MaxEventSize: maxEvent},
			life:  life, end: endLife,
		}
	} else {
		transport = &mcp.StreamableClientTransport{Endpoint: u.String(), HTTPClient: hc, MaxRetries: remoteReconnectRetries, MaxEventSize: maxEvent}
	}
	cs, err := connect(ctx, spec, transport, guard)
	if err != nil {
		endLife()
		base.CloseIdleConnections()
		return nil, remoteError(ctx, err, rt, u, spec)
	}
	srv := &remoteServer{base: base, rt: rt, endLife: endLife, closeTimeout: rb.cfg.CloseTimeout, closed: make(chan struct{})}
	go func() {
		_ = cs.Wait()
		close(srv.closed)
	}()
	return newSession(kit.r, spec, srv, cs, guard, nil), nil
}

// checkRemoteURL applies the registry's rule again (mcpserver.CheckRemoteURL: https, and http
// only to a loopback address, since header and query values are secrets), so a registration
// stored before the rule, or an ad-hoc spec, cannot send them in clear.
func checkRemoteURL(raw string) (*url.URL, error) {
	u, err := mcpserver.CheckRemoteURL(raw)
	if err != nil {
		return nil, newError(ClassInvalidSpec, "the server URL %s", err.Error())
	}
	return u, nil
}

func checkHeaders(in map[string]string) (http.Header, error) {
	if len(in) > maxHeaders {
		return nil, newError(ClassInvalidSpec, "%d headers given, at most %d are allowed", len(in), maxHeaders)
	}
	h := http.Header{}
	for name, value := range in {
		canon := http.CanonicalHeaderKey(name)
		if !validHeaderName(name) {
			return nil, newError(ClassInvalidSpec, "header name %s is not a valid HTTP token", clipQuote(name))
		}
		if mcpserver.ReservedHeader(canon) {
			return nil, newError(ClassInvalidSpec, "header %s is set by the client and cannot be configured", canon)
		}
		// The registry refuses two spellings of one name; one stored before it did would
		// leave which value is sent to the map's order.
		if _, dup := h[canon]; dup {
			return nil, newError(ClassInvalidSpec, "header %s is given twice, in different cases: keep one", canon)
		}
		if len(value) > maxHeaderValueLen || mcpserver.HeaderValueHasControl(value) {
			return nil, newError(ClassInvalidSpec, "the value of header %s is longer than %d bytes or contains control characters", canon, maxHeaderValueLen)
		}
		h.Set(canon, value)
	}
	return h, nil
}

func validHeaderName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// remoteTransport sends requests only to the registration's own origin, adds
// its headers to them, bounds response bodies that are not event streams
// (go-sdk reads them whole: the answer to a tool call by the registration's
// result cap, any other by the message bound), and remembers the first
// transport-level error, which the go-sdk client reports only as text.
type remoteTransport struct {
	base    http.RoundTripper
	origin  string
	headers http.Header
	maxBody int64
	// maxAnswer bounds the body that answers a tool call (a request made by CallToolRaw), and
	// budget, when set, counts it from before it is read until its caller releases it.
	maxAnswer int64
	budget    *Budget
	// guard is the session's: the requests the server has not answered yet (the pool's
	// answers to its requests are requests too, over HTTP) are bounded like a stdio
	// server's unread answers.
	guard      *trafficGuard
	unanswered atomic.Int64
	// life is the session's: a request still open when it ends (a call the server never
	// answers, a stream) is cancelled, so stopping a session never waits on the server.
	life context.Context

	mu       sync.Mutex
	err      error
	status   int
	tooLarge atomic.Bool
	// overLimit is the bound of the body that was too large.
	overLimit atomic.Int64
}

// origin is scheme://host:port with the scheme's default port made explicit.
func origin(u *url.URL) string {
	scheme, port := strings.ToLower(u.Scheme), u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// errOtherOrigin refuses a request the server steered elsewhere.
var errOtherOrigin = errors.New("spawner: the server named an endpoint on another origin than the registered URL")

func (t *remoteTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// An SSE server names the endpoint the client posts to: a hostile one could
	// otherwise make the pool host send requests anywhere it can reach (SSRF).
	if origin(req.URL) != t.origin {
		if req.Body != nil {
			req.Body.Close()
		}
		t.mu.Lock()
		if t.err == nil {
			t.err = errOtherOrigin
		}
		t.mu.Unlock()
		return nil, fmt.Errorf("%w (%s): refused", errOtherOrigin, origin(req.URL))
	}
	if t.unanswered.Add(1) > maxUnansweredRequests {
		t.unanswered.Add(-1)
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, t.guard.breach("the server left more than %d requests to it unanswered", maxUnansweredRequests)
	}
	defer t.unanswered.Add(-1)
	if m := markOf(req.Context()); m != nil && m.isNotice(req.Context()) {
		// The notice that a request was given up on: the session's stop waits until it is
		// sent.
		defer m.notice()
	}
	ctx, cancel := context.WithCancel(req.Context())
	stopLife := context.AfterFunc(t.life, cancel)
	end := func() { stopLife(); cancel() }
	req = req.Clone(ctx)
	for k, v := range t.headers {
		req.Header[k] = v
	}
	resp, err := t.base.RoundTrip(req)
	if resp != nil && resp.StatusCode == http.StatusForbidden {
		if scope, ok := scopeChallenge(resp.Header); ok {
			// The request was refused, not served: an error rather than a response, so the MCP
			// client keeps the connection and the caller finds the challenge in the error.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			end()
			e := newError(ClassSpawnFailed, "%s refused the request for want of scope (HTTP 403 insufficient_scope; it asks for %s)", t.origin, orNone(strings.Join(scope, " ")))
			e.HTTPStatus, e.InsufficientScope, e.Scope = http.StatusForbidden, true, scope
			t.mu.Lock()
			if t.err == nil {
				t.err = e
			}
			t.mu.Unlock()
			return nil, e
		}
	}
	switch {
	case resp == nil:
		end()
	case strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		resp.Body = &endingBody{ReadCloser: resp.Body, end: end}
	default:
		limit := t.maxBody
		if ticket, call := req.Context().Value(ticketKey{}).(*callTicket); call {
			limit = t.maxAnswer
			if rerr := t.reserve(ctx, ticket, resp.ContentLength); rerr != nil {
				resp.Body.Close()
				end()
				return nil, rerr
			}
		}
		resp.Body = &endingBody{ReadCloser: &limitedBody{rc: resp.Body, left: limit, over: &t.tooLarge, limit: limit, overLimit: &t.overLimit}, end: end}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil && t.err == nil {
		t.err = err
	}
	if resp != nil && resp.StatusCode >= 300 && t.status == 0 {
		t.status = resp.StatusCode
	}
	return resp, err
}

// scopeChallenge reads a 403's WWW-Authenticate: whether it is a Bearer insufficient_scope
// challenge (RFC 6750 section 3.1), and the scope it names (none when it names none, or names
// it beyond mcpserver.ScopeList's bounds).
func scopeChallenge(h http.Header) (scope []string, ok bool) {
	challenges, err := oauthex.ParseWWWAuthenticate(h.Values("WWW-Authenticate"))
	if err != nil {
		return nil, false
	}
	for _, c := range challenges {
		if c.Scheme == "bearer" && c.Params["error"] == "insufficient_scope" {
			return mcpserver.ScopeTokens(c.Params["scope"]), true
		}
	}
	return nil, false
}

func orNone(s string) string {
	if s == "" {
		return "none it names"
	}
	return s
}

// reserve counts the body that answers a tool call in the result budget before the MCP client
// reads it (it reads such a body whole): up to the result cap, or its length when the server
// said it, unless that is small. The call's ticket holds the reservation until its caller
// releases it. A body the budget has no room for within its wait is not read: the call fails
// as too large for the budget, and the connection stays.
func (t *remoteTransport) reserve(ctx context.Context, ticket *callTicket, length int64) error {
	if t.budget == nil || (length >= 0 && length <= budgetThreshold) {
		return nil
	}
	n := t.maxAnswer
	if length > 0 {
		n = min(n, length)
	}
	got, err := t.budget.acquire(ctx, n)
	switch {
	case errors.Is(err, errNoRoom):
		e := tooLarge("the pool's budget for results in flight (%d bytes) had no room for the server's answer within %s", t.budget.limit, t.budget.wait)
		e.Limit, e.OverBudget = t.budget.limit, true
		return e
	case err != nil:
		return err
	}
	ticket.attach(hold{b: t.budget, n: got})
	return nil
}

// endingBody releases its request's context when the body is closed.
type endingBody struct {
	io.ReadCloser
	end func()
}

func (b *endingBody) Close() error {
	err := b.ReadCloser.Close()
	b.end()
	return err
}

// errBodyTooLarge ends a response larger than the message bound.
var errBodyTooLarge = errors.New("spawner: response body larger than the message limit")

type limitedBody struct {
	rc        io.ReadCloser
	left      int64
	limit     int64
	over      *atomic.Bool
	overLimit *atomic.Int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly the limit from a longer one.
		var one [1]byte
		if n, _ := b.rc.Read(one[:]); n > 0 {
			b.overLimit.Store(b.limit)
			b.over.Store(true)
			return 0, errBodyTooLarge
		}
		return b.rc.Read(p)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }

func (t *remoteTransport) failure() (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.status, t.err
}

func remoteError(ctx context.Context, err error, rt *remoteTransport, u *url.URL, spec *Spec) error {
	if ctx.Err() != nil {
		return fmt.Errorf("spawner: handshake: %w", ctx.Err())
	}
	var e *Error
	if errors.As(err, &e) {
		return e // already classified (a bound connect enforces)
	}
	where := u.Scheme + "://" + u.Host
	status, terr := rt.failure()
	var (
		certErr     *tls.CertificateVerificationError
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		invalidErr  x509.CertificateInvalidError
		recordErr   tls.RecordHeaderError
		alertErr    tls.AlertError
		dnsErr      *net.DNSError
	)
	switch {
	case rt.tooLarge.Load():
		return tooLarge("%s answered with a body larger than the message limit", where)
	case errors.As(terr, &e) && e.InsufficientScope:
		return e
	case errors.Is(terr, errOtherOrigin):
		return newError(ClassProtocolViolation, "%s named an endpoint on another origin; the pool talks only to the registered URL's", where)
	case terr != nil && errors.Is(terr, syscall.ECONNREFUSED):
		return newError(ClassConnectionRefused, "nothing accepts connections at %s", where)
	case terr != nil && (errors.As(terr, &certErr) || errors.As(terr, &unknownAuth) || errors.As(terr, &hostErr) || errors.As(terr, &invalidErr)):
		return newError(ClassTLSFailure, "the certificate of %s is not trusted: %s", where, clip(tlsReason(terr), 200))
	case terr != nil && (errors.As(terr, &recordErr) || errors.As(terr, &alertErr)):
		return newError(ClassTLSFailure, "the TLS handshake with %s failed", where)
	case terr != nil && errors.As(terr, &dnsErr):
		return newError(ClassSpawnFailed, "the host of %s cannot be resolved", where)
	case terr != nil && isTimeout(terr), errors.Is(err, context.DeadlineExceeded):
		return newError(ClassHandshakeTimeout, "%s did not answer initialize within %s", where, spec.HandshakeTimeout)
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		e := newError(ClassSpawnFailed, "%s refused the configured credentials (HTTP %d)", where, status)
		e.HTTPStatus = status
		return e
	case status >= 300:
		return newError(ClassNotMCPServer, "%s answered HTTP %d to initialize: it is not an MCP endpoint of this transport", where, status)
	case terr != nil:
		return newError(ClassSpawnFailed, "connect to %s: %s", where, safeText(maskURLIn(terr.Error(), spec.URL, u), secretsOf(spec), 200))
	}
	return newError(ClassNotMCPServer, "%s did not answer initialize as an MCP server", where)
}

// maskURLIn replaces the server's URL in an error's text (a *url.Error quotes it whole) by
// its masked form: secretsOf masks query values only from 8 bytes on, and a short one is a
// credential all the same.
func maskURLIn(text, raw string, u *url.URL) string {
	for _, form := range []string{raw, u.String(), u.Redacted()} {
		if form != "" {
			text = strings.ReplaceAll(text, form, mcpserver.MaskURL(form))
		}
	}
	return text
}

func tlsReason(err error) string {
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	switch {
	case errors.As(err, &unknownAuth):
		return "signed by an unknown authority"
	case errors.As(err, &hostErr):
		return "not valid for this host name"
	}
	return "invalid certificate"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// detachedTransport runs the inner transport's Connect under the session's
// lifetime instead of the handshake's: go-sdk's SSE client issues its
// hanging GET with the context given to Connect, so a handshake deadline
// would otherwise end the session as soon as the handshake returned. The
// handshake still bounds Connect itself.
type detachedTransport struct {
	inner mcp.Transport
	life  context.Context
	end   context.CancelFunc
}

func (t *detachedTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	type result struct {
		conn mcp.Connection
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := t.inner.Connect(t.life)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		return r.conn, r.err
	case <-ctx.Done():
		t.end() // makes the inner Connect return
		if r := <-ch; r.conn != nil {
			_ = r.conn.Close()
		}
		return nil, ctx.Err()
	}
}

// remoteServer is a connection to a remote server.
type remoteServer struct {
	rt           *remoteTransport
	endLife      context.CancelFunc
	base         *http.Transport
	closeTimeout time.Duration
	closed       chan struct{}
	// stopCalls is the session's.
	stopCalls func(time.Duration)
}

func (s *remoteServer) stopCallsWith(stop func(time.Duration)) { s.stopCalls = stop }

func (s *remoteServer) Gone() <-chan struct{} { return s.closed }

// Death: the SDK's client cannot skip a body it could not read whole, so a body past its
// bound ends the connection; the call it answered fails as too large.
func (s *remoteServer) Death(context.Context) *Error {
	if s.rt.tooLarge.Load() {
		limit := s.rt.overLimit.Load()
		e := tooLarge("the server answered with a body larger than %d bytes; the connection was ended", limit)
		e.Limit, e.Size = limit, limit+1
		return e
	}
	return newError(ClassCrashed, "the connection to the remote server closed")
}

func (s *remoteServer) Stop(_ context.Context, cs *mcp.ClientSession) error {
	// Calls in flight have the graceful bound to finish; past it, they are given up on as a
	// caller gives one up, so the server hears of it (notifications/cancelled) before the
	// client closes: go-sdk's Close sends no notice once no request is in flight, and ending
	// the session's life cuts every request, so the server would work on for nobody.
	if s.stopCalls != nil {
		s.stopCalls(s.closeTimeout)
	}
	done := closeClient(cs, s.closeTimeout)
	// Past the graceful bound (go-sdk's Close waits for calls in flight, and for the server to
	// answer DELETE), ending the session's life cancels every request still open; then Close
	// returns, and no goroutine outlives the session.
	s.endLife()
	<-done
	<-s.closed
	s.base.CloseIdleConnections()
	return nil
}
