package spawner

import (
	"context"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Progress of a tool call, as its server reports it (notifications/progress), passed on to
// whoever made the call: the MCP front door relays it to its client. A session is shared by
// the run's agents, so a call's progress token is the session's own, never the caller's: a
// caller cannot name (or spoof) another caller's call, and the server's reports of one call
// reach that call's caller alone.

// Progress is one report of a call's progress. Message is the server's text, made safe as
// everything a server writes is (SafeText: the session's secrets masked).
type Progress struct {
	Progress, Total float64
	Message         string
}

type progressKey struct{}

// WithProgress returns ctx with fn as the receiver of the progress of the tool calls made with
// it (CallTool, CallToolRaw). fn runs on a goroutine of its own, one report at a time; reports
// that come faster than fn takes them are dropped (progress is advisory), so a slow receiver
// never holds up the server's stream.
func WithProgress(ctx context.Context, fn func(Progress)) context.Context {
	return context.WithValue(ctx, progressKey{}, fn)
}

// ProgressFrom is the receiver WithProgress put in ctx, or nil: a pool host that forwards a
// call to the run's owner relays the owner's reports to it.
func ProgressFrom(ctx context.Context) func(Progress) {
	fn, _ := ctx.Value(progressKey{}).(func(Progress))
	return fn
}

// progressQueue is how many reports wait for a slow receiver before more are dropped.
const progressQueue = 16

// ProgressRelay hands reports to a receiver on a goroutine of its own, one at a time; reports
// that come while progressQueue wait are dropped, so a slow receiver never holds up the sender
// and never makes it queue without bound. A pool host that forwards a call relays the owner's
// reports through one, as a session relays its server's.
type ProgressRelay struct {
	ch   chan Progress
	done chan struct{}
}

// NewProgressRelay starts a relay to fn; Close ends it.
func NewProgressRelay(fn func(Progress)) *ProgressRelay {
	r := &ProgressRelay{ch: make(chan Progress, progressQueue), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for u := range r.ch {
			fn(u)
		}
	}()
	return r
}

// Deliver queues a report, or drops it when the queue is full. It never blocks, and must not
// be called once Close was.
func (r *ProgressRelay) Deliver(u Progress) {
	select {
	case r.ch <- u:
	default:
	}
}

// Close ends the relay once the reports queued have been handed over.
func (r *ProgressRelay) Close() {
	close(r.ch)
	<-r.done
}

// progressRoutes maps the progress tokens of a session's calls in flight to their relays.
type progressRoutes struct {
	mu     sync.Mutex
	next   uint64
	routes map[string]*ProgressRelay
}

// open registers a call's receiver and returns the token to send with the call, and closeFn,
// which ends the delivery once the call has its answer (and waits for fn's last report).
func (p *progressRoutes) open(fn func(Progress), safe func(string) string) (token string, closeFn func()) {
	relay := NewProgressRelay(func(u Progress) {
		u.Message = safe(u.Message)
		fn(u)
	})
	p.mu.Lock()
	p.next++
	token = "rf-progress-" + strconv.FormatUint(p.next, 10)
	if p.routes == nil {
		p.routes = make(map[string]*ProgressRelay)
	}
	p.routes[token] = relay
	p.mu.Unlock()
	return token, func() {
		p.mu.Lock()
		delete(p.routes, token) // deliver finds it no more: nothing is queued after Close
		p.mu.Unlock()
		relay.Close()
	}
}

// deliver passes a server's progress report to the call it names, if one is in flight; an
// unknown token (a call that ended, a token the server made up) is dropped, and so is a report
// its receiver has no room for.
func (p *progressRoutes) deliver(params *mcp.ProgressNotificationParams) {
	token, ok := params.ProgressToken.(string)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if relay, ok := p.routes[token]; ok {
		relay.Deliver(Progress{Progress: params.Progress, Total: params.Total, Message: params.Message})
	}
}

// withProgress sets a call's progress token when ctx carries a receiver, and returns what ends
// the delivery (a no-op without one).
func (s *Session) withProgress(ctx context.Context, params *mcp.CallToolParams) func() {
	fn := ProgressFrom(ctx)
	if fn == nil {
		return func() {}
	}
	token, closeFn := s.guard.progress.open(fn, s.SafeText)
	params.SetProgressToken(token)
	return closeFn
}
