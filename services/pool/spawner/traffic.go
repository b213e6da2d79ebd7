package spawner

import (
	"context"
	"errors"
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

// guardedTransport meters a stdio server's messages as they are read, and counts its
// requests until their answers are written. A remote connection cannot be wrapped (the SDK
// needs its own type to track the HTTP session): the middleware meters it instead.
type guardedTransport struct {
	inner   *mcp.IOTransport
	g       *trafficGuard
	secrets []string
}

// newGuardedTransport wraps t, watching its stream: a read that fails while the stream is
// still up failed on the client's side, in decoding.
func newGuardedTransport(t *mcp.IOTransport, g *trafficGuard, secrets []string) guardedTransport {
	watched := *t
	watched.Reader = &watchedStream{ReadCloser: t.Reader, g: g}
	return guardedTransport{inner: &watched, g: g, secrets: secrets}
}

func (t guardedTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	t.g.watched.Store(true)
	return &guardedConn{Connection: c, g: t.g, secrets: t.secrets}, nil
}

// watchedStream records that a server's stdout ended or failed.
type watchedStream struct {
	io.ReadCloser
	g *trafficGuard
}

func (s *watchedStream) Read(p []byte) (int, error) {
	n, err := s.ReadCloser.Read(p)
	if err != nil {
		s.g.streamEnded.Store(true)
	}
	return n, err
}

type guardedConn struct {
	mcp.Connection
	g       *trafficGuard
	secrets []string

	mu sync.Mutex // Write and Read run on different goroutines
	// open holds the ids of the pool's requests not yet answered (see maxOpenRequests), each
	// with the order it was sent in.
	open map[jsonrpc.ID]uint64
	sent uint64
	// forgot: open overflowed, and some ids left it unanswered.
	forgot bool
}

// Read passes on nothing past a bound; the error ends the connection.
func (c *guardedConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err != nil {
		return nil, c.readError(ctx, err)
	}
	if resp, ok := msg.(*jsonrpc.Response); ok {
		// An answer nobody awaits costs the SDK nothing but decoding, which is how a flood of
		// them held a call past its timeout: it is refused, or metered when it may be late.
		if v := c.answered(resp.ID); v != nil {
			return nil, v
		}
		if jsonValues(resp.Result, maxMessageValues) > maxMessageValues {
			// The answer was read whole, within the byte bound, and nothing else in the
			// stream is amiss: only the request it answers fails, without being decoded.
			return &jsonrpc.Response{ID: resp.ID, Error: tooLarge("the server's answer holds more than %d JSON values", maxMessageValues)}, nil
		}
		return msg, nil
	}
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
	return msg, nil
}

// readError is what ends the connection when a read failed. The stdout filter passes only
// lines that are JSON objects with "jsonrpc":"2.0", but the SDK's decoder asks more of a
// message (an id on a response, a valid id and method): one it refuses ends the connection
// while the server runs on, and the SDK retires the calls in flight with its own error (a
// JSON-RPC -32600 for a response without an id, which would pass for the server's answer).
// Such a message breaks the protocol: the server is stopped, and the calls fail as that
// violation. A stream that ended or failed is the server's death, classified as ever, and an
// EOF also the client's own close of the connection (or a truncated stream): none of them is
// a decoding error.
func (c *guardedConn) readError(ctx context.Context, err error) error {
	// Set before the SDK learns of the error, so before it retires any call with it.
	c.g.connFailed.Store(true)
	var rpcErr *jsonrpc.Error
	switch {
	case ctx.Err() != nil, errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return err
	case c.g.streamEnded.Load() && !errors.As(err, &rpcErr):
		return err
	}
	return c.g.breach("the server wrote a JSON-RPC message the client cannot decode (%s)", safeText(err.Error(), c.secrets, 200))
}

// answered checks an answer against the requests the pool sent and has not had answered.
func (c *guardedConn) answered(id jsonrpc.ID) *Error {
	c.mu.Lock()
	_, expected := c.open[id]
	delete(c.open, id)
	forgot := c.forgot
	c.mu.Unlock()
	switch {
	case expected:
		return nil
	case forgot:
		return c.g.admitLate()
	default:
		return c.g.breach("the server answered a request the client did not send, or answered one twice")
	}
}

// expect records a request of the pool's, before it is written: its answer may be read
// before the write returns.
func (c *guardedConn) expect(id jsonrpc.ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open == nil {
		c.open = make(map[jsonrpc.ID]uint64)
	}
	c.sent++
	c.open[id] = c.sent
	if len(c.open) <= maxOpenRequests {
		return
	}
	// Rare (a server that leaves a thousand requests unanswered): a scan is cheap enough.
	var oldest jsonrpc.ID
	first := uint64(math.MaxUint64)
	for k, n := range c.open {
		if n < first {
			oldest, first = k, n
		}
	}
	delete(c.open, oldest)
	c.forgot = true
}

// Write counts an answer once it is written (or failed): until then it holds a goroutine.
func (c *guardedConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
		c.expect(req.ID)
	}
	err := c.Connection.Write(ctx, msg)
	if err != nil && ctx.Err() == nil {
		// Before the SDK retires the request whose write failed.
		c.g.connFailed.Store(true)
	}
	if _, ok := msg.(*jsonrpc.Response); ok {
		c.g.unanswered.Add(-1)
	}
	return err
}
