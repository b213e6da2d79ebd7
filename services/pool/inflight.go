package pool

import (
	"context"
	"errors"
	"sync"
)

// errShuttingDown refuses a call that arrives while the pool closes.
var errShuttingDown = errors.New("pool: this pool is shutting down: retry on another pool host, or after it restarts (the run is kept)")

// inflight counts the calls in progress, so Close can refuse new ones and wait for the rest
// before it closes the spool their records go to.
type inflight struct {
	mu      sync.Mutex
	n       int
	closing bool
	idle    chan struct{} // closed when closing and n reaches 0
}

func newInflight() *inflight { return &inflight{idle: make(chan struct{})} }

// enter counts one more call, unless the pool is closing.
func (f *inflight) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing {
		return false
	}
	f.n++
	return true
}

func (f *inflight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.closing && f.n == 0 {
		close(f.idle)
	}
}

// closed reports whether the pool has begun to close: calls already past enter are refused
// before they start a server (see session).
func (f *inflight) closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closing
}

// close refuses new calls from now on.
func (f *inflight) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing {
		return
	}
	f.closing = true
	if f.n == 0 {
		close(f.idle)
	}
}

// wait waits until the calls in progress have finished, or ctx ends.
func (f *inflight) wait(ctx context.Context) error {
	select {
	case <-f.idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
