package spawner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// deathGrace bounds how long the spawner waits for an exit status once a
// server's stream broke: the stream ends a moment before the engine or the
// kernel reports the exit.
const deathGrace = 2 * time.Second

// deathTimeout bounds the whole classification of a death (exit status,
// then the engine's events for an OOM kill).
const deathTimeout = deathGrace + eventsTimeout

// Server is what a back end runs for one session: a container, a process, a pod or a
// connection. The Session monitors it and stops it when it closes.
type Server interface {
	// Gone is closed when the server can no longer serve: it exited, its output stream ended
	// or its connection closed.
	Gone() <-chan struct{}
	// Death classifies how it ended; called once, after Gone is closed.
	Death(ctx context.Context) *Error
	// Stop tears it down, gracefully first and then by force, and returns only when
	// everything the back end started has ended. cs may be nil (the handshake failed). It
	// must finish even when ctx is done.
	Stop(ctx context.Context, cs *mcp.ClientSession) error
}

// Session is one connected MCP server.
type Session struct {
	ref      string
	srv      Server
	cs       *mcp.ClientSession
	guard    *trafficGuard
	tail     *tail
	cfg      *Config
	secrets  []string
	log      *slog.Logger
	onClose  func(*Session)
	maxTools int
	// maxListingBytes bounds one whole tools/list, re-encoded.
	maxListingBytes int
	// setupTimeout is the spec's HandshakeTimeout, which also bounds the first listing.
	setupTimeout time.Duration
	// callCap bounds an answer to tools/call; budget is the Router's, or nil.
	callCap int
	budget  *Budget

	done        chan struct{}
	doneOnce    sync.Once
	stopMonitor chan struct{}
	monitorDone chan struct{}

	mu  sync.Mutex
	err *Error

	closing   atomic.Bool
	closeOnce sync.Once
	closeErr  error

	// inflight follows the session's requests (bound makes them) when its back end's Stop
	// gives up on calls still running as a caller does, so the MCP client tells the server (a
	// remote server); nil otherwise.
	inflight *calls
}

// callStopper is a Server whose Stop ends the calls in flight itself before it closes the MCP
// client (a remote server: nothing else would tell it to stop working on them); newSession
// gives it the session's stopCalls.
type callStopper interface {
	stopCallsWith(stop func(time.Duration))
}

func newSession(r *Router, spec *Spec, srv Server, cs *mcp.ClientSession, g *trafficGuard, t *tail) *Session {
	s := &Session{
		ref:             spec.ServerRef,
		srv:             srv,
		cs:              cs,
		guard:           g,
		tail:            t,
		cfg:             &r.cfg,
		secrets:         secretsOf(spec),
		log:             r.log,
		maxTools:        r.cfg.MaxTools,
		maxListingBytes: r.cfg.MaxListingBytes,
		setupTimeout:    spec.HandshakeTimeout,
		callCap:         resultCap(spec),
		budget:          r.cfg.ResultBudget,
		done:            make(chan struct{}),
		stopMonitor:     make(chan struct{}),
		monitorDone:     make(chan struct{}),
		onClose:         r.forget,
	}
	// Only a back end that stops its calls itself needs them followed: a local server's calls
	// end with its process, and following them would cost every call of the hot path.
	if c, ok := srv.(callStopper); ok {
		s.inflight = newCalls()
		c.stopCallsWith(s.stopCalls)
	}
	broken := s.broken
	g.onBreach.Store(&broken)
	go s.monitor()
	return s
}

func (s *Session) monitor() {
	defer close(s.monitorDone)
	select {
	case <-s.srv.Gone():
	case <-s.guard.breached:
		s.stopForViolation()
		return
	case <-s.stopMonitor:
		return
	}
	if !s.closing.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), deathTimeout)
		e := s.srv.Death(ctx)
		cancel()
		e.StderrTail = s.StderrTail()
		s.mu.Lock()
		s.err = e
		s.mu.Unlock()
		s.log.Warn("spawner: MCP server died", "server", s.ref, "class", string(e.Class), "reason", e.Message)
	}
	s.markDone()
}

// broken records a breach as the session's error and marks it done. The guard calls it as the
// breach is found (and the monitor again, for one found before the session was built).
func (s *Session) broken(v *Error) {
	e := *v
	e.StderrTail = s.StderrTail()
	s.mu.Lock()
	if s.err == nil {
		s.err = &e
	}
	s.mu.Unlock()
	s.markDone()
}

// stopForViolation ends a server that broke the bounds on what it may send unasked: it is
// hostile, so it is stopped now rather than left to the session's owner.
func (s *Session) stopForViolation() {
	e := s.guard.violation()
	s.broken(e)
	s.log.Warn("spawner: stopping an MCP server that broke a protocol bound", "server", s.ref, "class", string(e.Class), "reason", e.Message)
	// Its calls in flight fail with the violation now, with no grace to finish.
	s.inflight.abandonAll()
	// Close waits for this monitor to return.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), deathTimeout+s.cfg.CloseTimeout)
		defer cancel()
		_ = s.Close(ctx)
	}()
}

func (s *Session) markDone() { s.doneOnce.Do(func() { close(s.done) }) }

// ServerRef is the registration this session runs.
func (s *Session) ServerRef() string { return s.ref }

// Done is closed when the server is gone: it died on its own (Err says why)
// or Close ended it.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the server runs and after Close; once Done is closed
// because the server died on its own, it is an *Error (class crashed, or
// protocol_violation when the stream broke a bound).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		return nil
	}
	return s.err
}

// StderrTail is the end of what the server wrote to stderr, and the stdout
// lines that were not JSON-RPC, with every secret value masked.
func (s *Session) StderrTail() string {
	if s.tail == nil {
		return ""
	}
	return s.tail.String()
}

// maxPageCursorLen bounds a tools/list cursor a server may hand back.
const maxPageCursorLen = 4 << 10

// ListTools returns every tool the server offers, following every page. It
// refuses more than the configured number of tools, a cursor that repeats and
// an oversized cursor (protocol_violation). Without a deadline on ctx it is
// bounded by Config.ListTimeout.
func (s *Session) ListTools(ctx context.Context) ([]*mcp.Tool, error) {
	ctx, cancel := s.bound(ctx, s.cfg.ListTimeout, "tools/list")
	defer cancel()
	var tools []*mcp.Tool
	var size int
	seen := map[string]bool{}
	params := &mcp.ListToolsParams{}
	for page := 0; ; page++ {
		if page > s.maxTools {
			return nil, s.violation("tools/list went on for more than %d pages", s.maxTools)
		}
		res, err := s.cs.ListTools(ctx, params)
		if err != nil {
			return nil, s.requestError(ctx, "tools/list", err)
		}
		tools = append(tools, res.Tools...)
		if len(tools) > s.maxTools {
			return nil, s.violation("the server offers more than %d tools", s.maxTools)
		}
		for _, t := range res.Tools {
			b, _ := json.Marshal(t)
			size += len(b)
		}
		if size > s.maxListingBytes {
			return nil, s.violation("tools/list declared more than %d bytes of tools", s.maxListingBytes)
		}
		next := res.NextCursor
		if next == "" {
			return tools, nil
		}
		if len(next) > maxPageCursorLen {
			return nil, s.violation("tools/list returned a cursor longer than %d bytes", maxPageCursorLen)
		}
		if seen[next] {
			return nil, s.violation("tools/list returned a cursor it had returned before")
		}
		seen[next] = true
		params = &mcp.ListToolsParams{Cursor: next}
	}
}

// SetupListTools is ListTools for the first listing after the handshake. That listing is part
// of client setup, so like initialize it is bounded by the spec's HandshakeTimeout (the
// registration's client_session_timeout): a server that never lists fails fast, as
// handshake_timeout, instead of holding its callers for the list timeout.
func (s *Session) SetupListTools(ctx context.Context) ([]*mcp.Tool, error) {
	d := s.setupTimeout
	ctx, cancel := context.WithTimeoutCause(ctx, d, newError(ClassHandshakeTimeout,
		"the server did not answer its first tools/list within %s (client_session_timeout bounds initialize and the first listing)", d))
	defer cancel()
	return s.ListTools(ctx)
}

// CallTool runs one tool call. A JSON-RPC error answer is returned wrapped
// (errors.As finds a *jsonrpc.Error whose message is the SafeText of the
// server's, and which has no data); a server that died during the call
// gives an *Error of class crashed, and an answer that is not MCP one of class
// protocol_violation (the session stays). Without a deadline on ctx it is bounded
// by Config.CallTimeout.
func (s *Session) CallTool(ctx context.Context, params *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	ctx, cancel := s.bound(ctx, s.cfg.CallTimeout, "tools/call")
	defer cancel()
	defer s.withProgress(ctx, params)()
	res, err := s.cs.CallTool(ctx, params)
	if err != nil {
		return nil, s.requestError(ctx, "tools/call", err)
	}
	return res, nil
}

// ToolAnswer is a tool call's answer. Raw is its result as the server wrote it, where the
// session reads the server's stream itself (a local server): nothing has decoded it, so its
// consumer decodes it once (mcpgate.ProcessRawResult). Otherwise (a remote server) Result is
// the result as the MCP client decoded it.
type ToolAnswer struct {
	Raw    json.RawMessage
	Result *mcp.CallToolResult
	hold   hold
}

// Release gives back the answer's share of the result budget: call it once the answer is
// turned into what the caller gets. It may be called more than once.
func (a *ToolAnswer) Release() { a.hold.free() }

// CallToolRaw is CallTool for a caller that decodes the result itself: the answer of a local
// server comes raw, held to the registration's result cap while it is read and counted in the
// result budget until Release (a remote server's comes decoded, its body held to the cap and
// counted from before it is read). An answer past the cap (or one the budget had no room for)
// fails the call with an *Error whose TooLarge is set; the session goes on.
func (s *Session) CallToolRaw(ctx context.Context, params *mcp.CallToolParams) (*ToolAnswer, error) {
	ctx, cancel := s.bound(ctx, s.cfg.CallTimeout, "tools/call")
	defer cancel()
	defer s.withProgress(ctx, params)()
	t := &callTicket{}
	res, err := s.cs.CallTool(context.WithValue(ctx, ticketKey{}, t), params)
	raw, h := t.take()
	if raw != nil && errors.Is(err, errAnsweredRaw) {
		return &ToolAnswer{Raw: raw, hold: h}, nil
	}
	if err != nil {
		h.free()
		return nil, s.requestError(ctx, "tools/call", err)
	}
	if raw != nil {
		return &ToolAnswer{Raw: raw, hold: h}, nil
	}
	return &ToolAnswer{Result: res, hold: h}, nil
}

// ErrNoRoom is a call that found no room for its answer in the result budget within the
// budget's wait.
var ErrNoRoom = errors.New("spawner: the result budget has no room for another answer")

// AwaitResultRoom waits, within the budget's wait, until the result budget has room for an
// answer as large as this server's cap, and takes nothing: the admission of a call before it
// is sent. It returns ErrNoRoom when none came, or ctx's error.
func (s *Session) AwaitResultRoom(ctx context.Context) error {
	if s.budget == nil {
		return nil
	}
	if err := s.budget.awaitRoom(ctx, int64(s.callCap)); err != nil {
		if errors.Is(err, errNoRoom) {
			return ErrNoRoom
		}
		return err
	}
	return nil
}

// Ping asks the server to answer an MCP ping: whether it still answers at all, after a call
// timed out. Without a deadline on ctx it is bounded by Config.ListTimeout.
func (s *Session) Ping(ctx context.Context) error {
	ctx, cancel := s.bound(ctx, s.cfg.ListTimeout, "ping")
	defer cancel()
	if err := s.cs.Ping(ctx, nil); err != nil {
		return s.requestError(ctx, "ping", err)
	}
	return nil
}

// bound applies the spawner's own limit when the caller set no deadline; its
// expiry is recognisable as a ClassTimeout cause. The session's stop may give the request up
// (Session.stopCalls), with a ClassCrashed cause.
func (s *Session) bound(ctx context.Context, d time.Duration, op string) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); ok {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithTimeoutCause(ctx, d, newError(ClassTimeout, "the server did not answer %s within %s", op, d))
	}
	if s.inflight == nil {
		return ctx, cancel
	}
	ctx, m := s.inflight.track(ctx, newError(ClassCrashed, "the session was stopped before the server answered %s", op))
	return ctx, func() {
		s.inflight.done(m) // before release: a request that returned was not given up on
		m.release()
		cancel()
	}
}

func (s *Session) violation(format string, args ...any) *Error {
	e := newError(ClassProtocolViolation, format, args...)
	e.StderrTail = s.StderrTail()
	return e
}

// requestError turns a failed request into what the caller can act on.
func (s *Session) requestError(ctx context.Context, op string, err error) error {
	// A bound the spawner enforces on the stream explains the failure first. When it ends the
	// connection, the SDK retires the requests in flight with the error that ended it (or with
	// its own, a JSON-RPC error among them): only the breach says what happened.
	if e := s.breachError(err); e != nil {
		return e
	}
	var rpcErr *jsonrpc.Error
	if errors.As(err, &rpcErr) && ctx.Err() == nil {
		if op == "tools/call" {
			// The message is the server's own text: only its safe form goes on, and its
			// data never does.
			safe := &jsonrpc.Error{Code: rpcErr.Code, Message: s.SafeText(rpcErr.Message)}
			if rpcErr.Code == mcp.CodeMissingRequiredClientCapabilities {
				safe.Data = requiredCapabilities(rpcErr.Data)
			}
			return fmt.Errorf("spawner: the server answered tools/call with error %d: %w", rpcErr.Code, safe)
		}
		return s.violation("%s was answered with error %d: %s", op, rpcErr.Code, safeText(rpcErr.Message, s.secrets, 200))
	}
	if ctx.Err() != nil {
		return s.contextError(ctx, op)
	}
	if s.refusedAnswer(err) {
		// The server is up and answered, and the client could not decode the answer (a content
		// type MCP does not define, say). That breaks the protocol, not the tool's declared
		// output schema: output_invalid is the pool's verdict on a result it could read, and
		// this one never got that far. The connection is intact, so the session stays.
		return s.violation("the server's answer to %s is not MCP: %s", op, safeText(err.Error(), s.secrets, 200))
	}
	// The connection broke: wait briefly to learn whether the server died,
	// and report how, but no longer than the caller waits.
	t := time.NewTimer(deathTimeout + time.Second)
	defer t.Stop()
	select {
	case <-s.done:
	case <-t.C:
	case <-ctx.Done():
		return s.contextError(ctx, op)
	}
	if e := s.Err(); e != nil {
		return e
	}
	e := newError(ClassCrashed, "the connection to the server broke during %s", op)
	e.StderrTail = s.StderrTail()
	return e
}

// requiredCapabilities is the data of a MissingRequiredClientCapabilities error (-32021) with
// nothing of the server's own text: the names of the standard client capabilities it says it
// requires, each as an empty object.
func requiredCapabilities(data json.RawMessage) json.RawMessage {
	var d struct {
		Required map[string]json.RawMessage `json:"requiredCapabilities"`
	}
	if json.Unmarshal(data, &d) != nil {
		return nil
	}
	out := map[string]any{}
	for _, name := range []string{"sampling", "elicitation", "roots"} {
		if _, ok := d.Required[name]; ok {
			out[name] = struct{}{}
		}
	}
	b, _ := json.Marshal(map[string]any{"requiredCapabilities": out})
	return b
}

// contextError is a request that ended with its context.
func (s *Session) contextError(ctx context.Context, op string) error {
	// A bound the spawner set (its own timeouts, the setup bound) says which it was.
	if cause, ok := context.Cause(ctx).(*Error); ok {
		e := *cause
		e.StderrTail = s.StderrTail()
		return &e
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("the caller's deadline passed before the server answered %s: %w", op, ctx.Err())
	}
	return fmt.Errorf("the caller cancelled the request before the server answered %s: %w", op, ctx.Err())
}

// refusedAnswer reports whether a request failed although its connection is intact and the
// session neither ended nor is closing: the client refused the server's answer.
func (s *Session) refusedAnswer(err error) bool {
	if !s.guard.connIntact() || s.closing.Load() || errors.Is(err, mcp.ErrConnectionClosed) {
		return false
	}
	select {
	case <-s.done:
		return false
	case <-s.srv.Gone():
		return false
	default:
		return true
	}
}

// breachError is the violation that failed a request, if one did: the error itself (what a
// guarded read returned, or the bound that refused the answer), or the breach the guard
// recorded.
func (s *Session) breachError(err error) *Error {
	var e *Error
	if !errors.As(err, &e) {
		if e = s.guard.violation(); e == nil {
			return nil
		}
	}
	c := *e
	c.StderrTail = s.StderrTail()
	return &c
}

// Close stops the server: it ends the MCP session (which closes the
// server's stdin), waits a bounded time for it to exit, then forces it. It
// is idempotent, safe to call concurrently, and always finishes within the
// spawner's bounds even when ctx is already done.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		s.closeErr = s.srv.Stop(ctx, s.cs)
		s.inflight.abandonAll()
		close(s.stopMonitor)
		<-s.monitorDone
		s.markDone()
		if s.onClose != nil {
			s.onClose(s)
		}
	})
	return s.closeErr
}

// closeClient ends an MCP client session within d. It reports whether it
// finished; if not, the goroutine finishes once the back end closes the
// transport, and done is closed then.
func closeClient(cs *mcp.ClientSession, d time.Duration) (done <-chan struct{}) {
	ch := make(chan struct{})
	if cs == nil {
		close(ch)
		return ch
	}
	go func() {
		_ = cs.Close()
		close(ch)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
	return ch
}

// connect runs the MCP handshake over transport within the spec's handshake timeout, under
// g, the guard that bounds what the server sends unasked for the session's whole life. A
// handshake that failed because the server broke those bounds fails as that violation.
// valueless is a context's deadline and cancellation without its values, for the handshake. A
// session is started by a call, which may come in through the MCP front door, whose go-sdk
// server puts the calling client's protocol version in the request's context; the go-sdk
// client reads it from there for a request made before initialize has answered, and would
// send the front door client's Mcp-Protocol-Version upstream with initialize, which a server
// refuses (400).
type valueless struct{ context.Context }

func (valueless) Value(any) any { return nil }

func connect(ctx context.Context, spec *Spec, transport mcp.Transport, g *trafficGuard) (*mcp.ClientSession, error) {
	hctx, cancel := context.WithTimeout(valueless{ctx}, spec.HandshakeTimeout)
	defer cancel()
	client := newClient(spec, g)
	if _, stdio := transport.(*stdioTransport); !stdio {
		client.AddReceivingMiddleware(g.middleware)
	}
	version := ProtocolVersion
	if _, streamable := transport.(*mcp.StreamableClientTransport); streamable {
		// Over streamable HTTP every request is answered, so the SDK's newest version may ask
		// server/discover first (2026-07-28, which a stateless server needs) and fall back to
		// initialize when the server does not know it.
		version = ""
	}
	cs, err := client.Connect(hctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		if v := g.violation(); v != nil {
			return nil, v
		}
		return nil, err
	}
	return cs, nil
}
