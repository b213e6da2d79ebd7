package spawner

import (
	"context"
	"sync"
	"time"
)

// noticeWait is how long a request given up on is followed to the notice of it (go-sdk's bound
// on sending notifications/cancelled, notifyCancellationTimeout).
const noticeWait = 5 * time.Second

// callMark follows one request of a session (bound makes one for each) from its start to the
// notice the MCP client sends the server when the request is given up on: go-sdk sends
// notifications/cancelled on a goroutine of its own, after the request has returned, under a
// context that keeps the request's values, so the remote transport finds the mark on it.
type callMark struct {
	ctx     context.Context // the request's: done once it is given up on
	abandon func()          // gives the request up, as the session's stop does
	release func()
	once    sync.Once
	noticed chan struct{} // closed once the notice was sent
}

type callMarkKey struct{}

func markOf(ctx context.Context) *callMark {
	m, _ := ctx.Value(callMarkKey{}).(*callMark)
	return m
}

// isNotice reports whether a request made under ctx is the notice that the request m follows
// was given up on: that request is done, and this one, made under a context detached from it,
// is not (the given-up request's own sending, or a retry of it, is done too).
func (m *callMark) isNotice(ctx context.Context) bool {
	return m.ctx.Err() != nil && ctx.Err() == nil
}

func (m *callMark) notice() { m.once.Do(func() { close(m.noticed) }) }

// calls is the requests a session has in flight, and those it gave up on whose notice has not
// gone out yet.
type calls struct {
	mu      sync.Mutex
	marks   map[*callMark]struct{}
	changed chan struct{} // closed and replaced at every change
	stopped bool          // every request is given up on as it starts
}

func newCalls() *calls {
	return &calls{marks: map[*callMark]struct{}{}, changed: make(chan struct{})}
}

// track follows the request that ctx starts, which cause ends when the session gives it up;
// done is called when the request returns, then the mark's release.
func (c *calls) track(ctx context.Context, cause error) (context.Context, *callMark) {
	ctx, cancel := context.WithCancelCause(ctx)
	m := &callMark{noticed: make(chan struct{}), abandon: func() { cancel(cause) }, release: func() { cancel(nil) }}
	ctx = context.WithValue(ctx, callMarkKey{}, m)
	m.ctx = ctx
	c.mu.Lock()
	c.marks[m] = struct{}{}
	stopped := c.stopped
	c.mu.Unlock()
	if stopped {
		m.abandon()
	}
	return ctx, m
}

// abandonAll gives up every request running now and every one that starts later; on a nil
// calls (a session whose requests are not followed) it does nothing.
func (c *calls) abandonAll() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.stopped = true
	marks := make([]*callMark, 0, len(c.marks))
	for m := range c.marks {
		marks = append(marks, m)
	}
	c.mu.Unlock()
	for _, m := range marks {
		m.abandon()
	}
}

// done is called as the request m follows returns. One given up on stays followed until its
// notice went out, within noticeWait.
func (c *calls) done(m *callMark) {
	if m.ctx.Err() == nil {
		c.forget(m)
		return
	}
	t := time.AfterFunc(noticeWait, func() { c.forget(m) })
	go func() {
		<-m.noticed
		t.Stop()
		c.forget(m)
	}()
}

func (c *calls) forget(m *callMark) {
	m.notice() // ends done's goroutine when noticeWait passed first
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.marks[m]; ok {
		delete(c.marks, m)
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// pending returns the marks followed now, those of requests still running (not given up on)
// apart, and a channel closed at the next change.
func (c *calls) pending() (running, givenUp []*callMark, changed <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for m := range c.marks {
		if m.ctx.Err() == nil {
			running = append(running, m)
		} else {
			givenUp = append(givenUp, m)
		}
	}
	return running, givenUp, c.changed
}

// settle waits until no request is running, or until timer t fires; it reports whether none
// is.
func (c *calls) settle(t <-chan time.Time) bool {
	for {
		running, _, changed := c.pending()
		if len(running) == 0 {
			return true
		}
		select {
		case <-changed:
		case <-t:
			return false
		}
	}
}

// awaitNotices waits until every request given up on has had its notice sent, or until timer
// t fires.
func (c *calls) awaitNotices(t <-chan time.Time) {
	_, givenUp, _ := c.pending()
	for _, m := range givenUp {
		select {
		case <-m.noticed:
		case <-t:
			return
		}
	}
}

// stopCalls is how a session's stop ends its calls before it closes the MCP client (whose
// Close refuses to send a notice once no request is in flight): the requests still running
// get d to finish; those left are given up on, as a caller gives one up, so the client tells
// the server (notifications/cancelled, and their HTTP requests end); and their notices, like
// those of requests given up on just before, get d to go out.
func (s *Session) stopCalls(d time.Duration) {
	t := time.NewTimer(d)
	settled := s.inflight.settle(t.C)
	t.Stop()
	if !settled {
		s.inflight.abandonAll()
	}

	t = time.NewTimer(d)
	defer t.Stop()
	s.inflight.awaitNotices(t.C)
}
