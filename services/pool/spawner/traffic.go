package spawner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/time/rate"
)

// What a server may send the pool unasked. The SDK answers each server-to-client request
// (ping; roots, sampling and elicitation are refused, since the pool advertises none) on a
// goroutine of its own, and that goroutine lives until the answer is written: a server that
// floods requests, above all one that stops reading its stdin meanwhile, would grow the
// pool by a goroutine per request. Past these bounds the server is stopped as a protocol
// violation.
const (
	// Requests: a keep-alive ping every few seconds is normal; a hundred at once is not.
	serverRequestRate  = 10
	serverRequestBurst = 100
	// maxUnansweredRequests bounds the server's requests whose answers are not yet written
	// (stdio servers, whose connection the pool sees message by message). It is above the
	// burst, so a burst never meets it: only a server that stops reading its answers does.
	maxUnansweredRequests = 128
	// Notifications (progress, log messages, list_changed) cost the pool no goroutine, only
	// decoding: chatty servers are fine, a flood is not.
	serverNotificationRate  = 1000
	serverNotificationBurst = 10000
	// maxOpenRequests bounds the ids of the pool's own requests a stdio connection remembers
	// until they are answered, which is how an answer to a request the pool never sent (or one
	// answered already) is told apart. A request the client gave up on (a call that timed out
	// or was cancelled) stays remembered: the server may still answer it, legitimately, and
	// the SDK drops that late answer. Past the bound the oldest are forgotten; from then on an
	// answer the connection does not expect is metered like a notification, not refused.
	maxOpenRequests = 1024
)

// trafficGuard enforces those bounds for one session and records the first breach.
type trafficGuard struct {
	requests      *rate.Limiter
	notifications *rate.Limiter
	unanswered    atomic.Int64
	// watched: a guardedConn sees every read and write of the session's connection (stdio).
	watched atomic.Bool
	// streamEnded: the server's stdout (a stdio server's stream) ended or failed.
	streamEnded atomic.Bool
	// connFailed: a read or a write of the watched connection failed.
	connFailed atomic.Bool

	// progress routes the server's progress reports to the calls they belong to (progress.go).
	progress progressRoutes

	once     sync.Once
	breached chan struct{}
	// onBreach, once the session is built, marks it broken from the goroutine that found
	// the breach, before the request that breach fails returns: a next call must not be
	// handed the session in the moment before its monitor runs.
	onBreach atomic.Pointer[func(*Error)]
	err      *Error
}

func newTrafficGuard() *trafficGuard {
	return &trafficGuard{
		requests:      rate.NewLimiter(serverRequestRate, serverRequestBurst),
		notifications: rate.NewLimiter(serverNotificationRate, serverNotificationBurst),
		breached:      make(chan struct{}),
	}
}

// breach records the first violation; the session's monitor stops the server.
func (g *trafficGuard) breach(format string, args ...any) *Error {
	return g.record(newError(ClassProtocolViolation, format, args...))
}

// record records e as the violation unless one was recorded first, and returns the first.
func (g *trafficGuard) record(e *Error) *Error {
	g.once.Do(func() {
		g.err = e
		close(g.breached)
		if f := g.onBreach.Load(); f != nil {
			(*f)(e)
		}
	})
	return g.err
}

// violation is the recorded breach, or nil.
func (g *trafficGuard) violation() *Error {
	select {
	case <-g.breached:
		return g.err
	default:
		return nil
	}
}

// connIntact reports whether the session's connection is known to be intact: it is watched,
// and neither its stream nor any read or write of it failed. A request that failed on an
// intact connection was refused by the client itself (an answer it could not decode).
func (g *trafficGuard) connIntact() bool {
	return g.watched.Load() && !g.streamEnded.Load() && !g.connFailed.Load()
}

// admit meters one message the server sent unasked.
func (g *trafficGuard) admit(notification bool) *Error {
	if v := g.violation(); v != nil {
		return v
	}
	if notification {
		if !g.notifications.Allow() {
			return g.breach("the server sent notifications faster than %d a second (burst %d)", serverNotificationRate, serverNotificationBurst)
		}
	} else if !g.requests.Allow() {
		return g.breach("the server sent requests to the client faster than %d a second (burst %d)", serverRequestRate, serverRequestBurst)
	}
	return nil
}

// admitLate meters an answer that may be a late one to a request the connection forgot.
func (g *trafficGuard) admitLate() *Error {
	if v := g.violation(); v != nil {
		return v
	}
	if !g.notifications.Allow() {
		return g.breach("the server sent answers to requests the client no longer awaits faster than %d a second (burst %d)", serverNotificationRate, serverNotificationBurst)
	}
	return nil
}

// middleware meters a remote server's messages, which the pool sees only once the SDK
// decoded them (a request for a method the SDK does not know is answered before it).
func (g *trafficGuard) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if v := g.admit(strings.HasPrefix(method, "notifications/")); v != nil {
			return nil, v
		}
		return next(ctx, method, req)
	}
}

// methodCallTool is the method of a tool call.
const methodCallTool = "tools/call"

// stdioTransport is the MCP client's connection to a local server: it reads the messages the
// stdout filter passes on and writes to the server's stdin, metering what the server sends
// unasked and counting its requests until their answers are written. It is the pool's own
// rather than the SDK's newline-delimited one, so that a large message is held once, in the
// buffer the filter read it into, and an answer to tools/call reaches its caller as the bytes
// the server wrote (CallToolRaw). A remote connection cannot be replaced (the SDK needs its
// own type to track the HTTP session): the middleware meters it instead.
type stdioTransport struct {
	st      *Stdio
	stdin   io.WriteCloser
	g       *trafficGuard
	secrets []string
	callCap int
}

func (t *stdioTransport) Connect(context.Context) (mcp.Connection, error) {
	t.g.watched.Store(true)
	return &guardedConn{st: t.st, stdin: t.stdin, g: t.g, secrets: t.secrets, callCap: t.callCap, open: t.st.requests}, nil
}

type guardedConn struct {
	st      *Stdio
	stdin   io.WriteCloser
	g       *trafficGuard
	secrets []string
	callCap int
	open    *openRequests

	writeMu   sync.Mutex
	closeOnce sync.Once
	closeErr  error
}

func (c *guardedConn) SessionID() string { return "" }

// Read passes on nothing past a bound; the error ends the connection.
func (c *guardedConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.st.life.Done():
		return nil, io.EOF
	case m, ok := <-c.st.messages:
		if !ok {
			return nil, c.streamEnded(c.st.filter.ended())
		}
		return c.receive(m)
	}
}

// receive checks one message the filter passed on.
func (c *guardedConn) receive(m inMessage) (jsonrpc.Message, error) {
	if m.skipped != nil {
		id, err := idFromRaw(m.skipped.id)
		if err != nil || !id.IsValid() {
			return nil, c.decodeError(fmt.Errorf("an answer too large to read names no request: %v", err))
		}
		if _, v := c.answered(id); v != nil {
			return nil, v
		}
		// Only the request it answers fails, and the stream goes on at the next line.
		return &jsonrpc.Response{ID: id, Error: m.skipped.err}, nil
	}
	msg, err := decodeLine(m)
	if err != nil {
		m.hold.free()
		return nil, c.decodeError(err)
	}
	if resp, ok := msg.(*jsonrpc.Response); ok {
		return c.answer(resp, m)
	}
	m.hold.free()
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		return msg, nil
	}
	if v := c.g.admit(!req.IsCall()); v != nil {
		return nil, v
	}
	if jsonValues(req.Params, maxMessageValues) > maxMessageValues {
		// The server sent it unasked.
		return nil, c.g.record(tooLarge("the server sent a request or notification that holds more than %d JSON values", maxMessageValues))
	}
	if req.IsCall() && c.g.unanswered.Add(1) > maxUnansweredRequests {
		return nil, c.g.breach("the server sent more than %d requests to the client without reading the answers", maxUnansweredRequests)
	}
	if req.Method == methodProgress {
		// Here, in the stream's order, rather than in the SDK's handler, which may run after
		// the call's answer was handed over: a call's last reports would then be lost.
		var p mcp.ProgressNotificationParams
		if json.Unmarshal(req.Params, &p) == nil {
			c.g.progress.deliver(&p)
		}
	}
	return msg, nil
}

// methodProgress is the method of a progress report.
const methodProgress = "notifications/progress"

// errAnsweredRaw stands in, for the SDK, for an answer to tools/call handed to its caller raw:
// the SDK returns an error answer as it is, where it would decode even an empty result (two
// decoder buffers of 32 KiB per call). CallToolRaw recognises it and returns the raw answer.
var errAnsweredRaw = errors.New("spawner: the answer went to its caller as the server wrote it")

// answer checks an answer against the request it answers. An answer to a CallToolRaw call
// goes to that call as the server wrote it, with the budget it holds; the SDK sees
// errAnsweredRaw in its place and decodes nothing.
func (c *guardedConn) answer(resp *jsonrpc.Response, m inMessage) (jsonrpc.Message, error) {
	// An answer nobody awaits costs the SDK nothing but decoding, which is how a flood of
	// them held a call past its timeout: it is refused, or metered when it may be late.
	req, v := c.answered(resp.ID)
	if v != nil {
		m.hold.free()
		return nil, v
	}
	// What fails here was read whole, within the stream's bounds, and nothing else in the
	// stream is amiss: only the request it answers fails, without being decoded.
	if req.method == methodCallTool && len(m.line) > c.callCap {
		m.hold.free()
		e := tooLarge("the server's answer is %d bytes, more than %d", len(m.line), c.callCap)
		e.Limit, e.Size = int64(c.callCap), int64(len(m.line))
		return &jsonrpc.Response{ID: resp.ID, Error: e}, nil
	}
	if jsonValues(resp.Result, maxMessageValues) > maxMessageValues {
		m.hold.free()
		return &jsonrpc.Response{ID: resp.ID, Error: tooLarge("the server's answer holds more than %d JSON values", maxMessageValues)}, nil
	}
	if req.ticket != nil && resp.Error == nil && req.ticket.give(resp.Result, m.hold) {
		resp.Result, resp.Error = nil, errAnsweredRaw
		return resp, nil
	}
	m.hold.free()
	return resp, nil
}

// decodeLine decodes one message. An answer's result is neither decoded nor copied here: it is
// the part of the line its envelope located (the filter checked that the line is valid JSON;
// the result is decoded once, by whoever reads it). A large line's envelope was followed as
// it arrived; a small one's is found with one scan, which costs far less than the SDK's
// decoder (a 32 KiB buffer per message, and the result copied). Anything else is decoded by
// the SDK.
func decodeLine(m inMessage) (jsonrpc.Message, error) {
	e := m.env
	if e == nil {
		e = &envelope{}
		e.feed(m.line)
	}
	if e.answer() && e.hasResult && !e.hasError && e.resultEnd > e.resultStart {
		if id, err := idFromRaw(e.id); err == nil && id.IsValid() {
			return &jsonrpc.Response{ID: id, Result: m.line[e.resultStart:e.resultEnd:e.resultEnd]}, nil
		}
	}
	return jsonrpc.DecodeMessage(m.line)
}

// idFromRaw is a request id from its JSON. The ids the pool's client sends are small
// integers: those are read without a decode (one per answer), anything else as json reads it.
func idFromRaw(raw []byte) (jsonrpc.ID, error) {
	if n, ok := smallInt(raw); ok {
		return jsonrpc.MakeID(float64(n))
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return jsonrpc.ID{}, err
	}
	return jsonrpc.MakeID(v)
}

// smallInt reads raw as a JSON integer of at most 15 digits, which a float64 (what json
// decodes a number to) holds exactly.
func smallInt(raw []byte) (int64, bool) {
	digits := raw
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 15 || digits[0] == '0' && len(digits) > 1 {
		return 0, false
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if len(digits) < len(raw) {
		n = -n
	}
	return n, true
}

// streamEnded is what ends the connection when the server's output ended or failed: the
// server's death, classified as ever (an EOF is also the client's own close of the
// connection), and none of it a decoding error.
func (c *guardedConn) streamEnded(err error) error {
	c.g.streamEnded.Store(true)
	// Set before the SDK learns of the error, so before it retires any call with it.
	c.g.connFailed.Store(true)
	return err
}

// decodeError is what ends the connection when a message cannot be decoded. The stdout filter
// passes only lines that are JSON objects with "jsonrpc":"2.0", but a message asks more (an id
// on a response, a valid id and method): one that lacks it breaks the protocol, the server is
// stopped, and the calls in flight fail as that violation.
func (c *guardedConn) decodeError(err error) error {
	c.g.connFailed.Store(true)
	return c.g.breach("the server wrote a JSON-RPC message the client cannot decode (%s)", safeText(err.Error(), c.secrets, 200))
}

// answered checks an answer against the requests the pool sent and has not had answered, and
// returns the request it answers.
func (c *guardedConn) answered(id jsonrpc.ID) (openRequest, *Error) {
	req, expected, forgot := c.open.answered(id)
	switch {
	case expected:
		return req, nil
	case forgot:
		return req, c.g.admitLate()
	default:
		return req, c.g.breach("the server answered a request the client did not send, or answered one twice")
	}
}

// Write counts an answer once it is written (or failed): until then it holds a goroutine.
func (c *guardedConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
		// Before it is written: its answer may be read before the write returns.
		var t *callTicket
		if req.Method == methodCallTool {
			t, _ = ctx.Value(ticketKey{}).(*callTicket)
		}
		c.open.expect(req.ID, req.Method, t)
	}
	data, err := jsonrpc.EncodeMessage(msg)
	if err == nil {
		c.writeMu.Lock()
		_, err = c.stdin.Write(append(data, '\n'))
		c.writeMu.Unlock()
	}
	if err != nil && ctx.Err() == nil {
		// Before the SDK retires the request whose write failed.
		c.g.connFailed.Store(true)
	}
	if _, ok := msg.(*jsonrpc.Response); ok {
		c.g.unanswered.Add(-1)
	}
	return err
}

// Close closes the server's stdin and the client's side of its output.
func (c *guardedConn) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.stdin.Close()
		c.st.closeClient()
	})
	return c.closeErr
}

// openRequests are the pool's requests on one stdio connection that await an answer: what
// tells an answer to a request the pool never sent (or one answered already) apart, what the
// stdout filter bounds an answer by before it is read whole, and where an answer to a
// CallToolRaw call goes.
type openRequests struct {
	mu   sync.Mutex
	byID map[jsonrpc.ID]openRequest
	sent uint64
	// calls counts the tools/call requests among them.
	calls int
	// forgot: byID overflowed, and some ids left it unanswered.
	forgot bool
}

type openRequest struct {
	seq    uint64
	method string
	ticket *callTicket
}

// expect records a request of the pool's, before it is written.
func (o *openRequests) expect(id jsonrpc.ID, method string, t *callTicket) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.byID == nil {
		o.byID = make(map[jsonrpc.ID]openRequest)
	}
	o.sent++
	o.byID[id] = openRequest{seq: o.sent, method: method, ticket: t}
	if method == methodCallTool {
		o.calls++
	}
	if len(o.byID) <= maxOpenRequests {
		return
	}
	// Rare (a server that leaves a thousand requests unanswered): a scan is cheap enough.
	var oldest jsonrpc.ID
	first := uint64(math.MaxUint64)
	for k, r := range o.byID {
		if r.seq < first {
			oldest, first = k, r.seq
		}
	}
	o.remove(oldest)
	o.forgot = true
}

// answered takes the request id answers off the list: expected says whether it was on it,
// forgot whether requests left it unanswered (so that the answer may be a late one).
func (o *openRequests) answered(id jsonrpc.ID) (req openRequest, expected, forgot bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	req, expected = o.byID[id]
	if expected {
		o.remove(id)
	}
	return req, expected, o.forgot
}

func (o *openRequests) remove(id jsonrpc.ID) {
	if o.byID[id].method == methodCallTool {
		o.calls--
	}
	delete(o.byID, id)
}

// method is the method of the open request id, or "".
func (o *openRequests) method(id jsonrpc.ID) string {
	if o == nil {
		return ""
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.byID[id].method
}

// onlyCalls reports whether requests are open and every one of them is a tool call: an answer
// can then only be a tool's result.
func (o *openRequests) onlyCalls() bool {
	if o == nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.byID) > 0 && o.calls == len(o.byID)
}

// callTicket is where the answer to one CallToolRaw call goes: the result as the server wrote
// it, and the budget it holds until its caller releases it.
type callTicket struct {
	mu   sync.Mutex
	raw  json.RawMessage
	hold hold
	done bool
}

// ticketKey carries a call's ticket in the context the SDK writes its request with.
type ticketKey struct{}

// give hands the ticket its answer, unless its call has returned already (it gave up): the
// caller then frees what the answer holds.
func (t *callTicket) give(raw json.RawMessage, h hold) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return false
	}
	t.raw, t.hold = raw, h
	return true
}

// attach gives the ticket a reservation its answer holds (a remote server's body), unless its
// call has returned already: the reservation is then freed.
func (t *callTicket) attach(h hold) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		h.free()
		return
	}
	t.hold.b = h.b
	t.hold.n += h.n
}

// take ends the call's wait for an answer and returns what it got.
func (t *callTicket) take() (json.RawMessage, hold) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	raw, h := t.raw, t.hold
	t.raw, t.hold = nil, hold{}
	return raw, h
}
