package spawner

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// Budget bounds the bytes of large messages the pool holds at once, across every session of
// a Router: the tool results in flight above all. A message that outgrows budgetThreshold
// while it is read reserves its bound (the registration's result cap for an answer to
// tools/call) before it is read further, waiting for room; once it is read whole the
// reservation shrinks to its size, and an answer to tools/call keeps it until the pool has
// turned the answer into its result (ToolAnswer.Release). Smaller messages are not counted:
// they are read whole in one chunk of the stream.
//
// Waiting is first come, first served, and never longer than the budget's wait: a message
// that finds no room by then is skipped, its call failing as too large.
type Budget struct {
	limit int64
	wait  time.Duration
	sem   *semaphore.Weighted
	used  atomic.Int64
	peak  atomic.Int64
	// waited counts reservations that found no room at once.
	waited atomic.Int64
}

// DefaultBudgetWait bounds how long a call or a message waits for room in a Budget.
const DefaultBudgetWait = 10 * time.Second

// budgetThreshold: a message up to this size is read without a reservation.
const budgetThreshold = 64 << 10

// NewBudget returns a budget of limit bytes (at least 1 MiB) whose reservations wait at most
// wait (0: DefaultBudgetWait).
func NewBudget(limit int64, wait time.Duration) (*Budget, error) {
	if limit < 1<<20 {
		return nil, fmt.Errorf("spawner: a result budget of %d bytes is too small to hold a result: give at least 1 MiB", limit)
	}
	if wait <= 0 {
		wait = DefaultBudgetWait
	}
	return &Budget{limit: limit, wait: wait, sem: semaphore.NewWeighted(limit)}, nil
}

// Limit is the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// InUse is the bytes reserved now.
func (b *Budget) InUse() int64 { return b.used.Load() }

// Peak is the most bytes ever reserved at once.
func (b *Budget) Peak() int64 { return b.peak.Load() }

// Waited is how many reservations had to wait for room.
func (b *Budget) Waited() int64 { return b.waited.Load() }

// errNoRoom is a reservation that found no room within the budget's wait.
var errNoRoom = errors.New("spawner: no room in the result budget")

// acquire reserves n bytes (at most the budget's size), waiting for room up to the budget's
// wait or until ctx ends. It returns how many bytes it reserved.
func (b *Budget) acquire(ctx context.Context, n int64) (int64, error) {
	n = min(n, b.limit)
	if !b.sem.TryAcquire(n) {
		b.waited.Add(1)
		wctx, cancel := context.WithTimeoutCause(ctx, b.wait, errNoRoom)
		defer cancel()
		if err := b.sem.Acquire(wctx, n); err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, errNoRoom
		}
	}
	used := b.used.Add(n)
	for p := b.peak.Load(); used > p && !b.peak.CompareAndSwap(p, used); p = b.peak.Load() {
	}
	return n, nil
}

// release gives back n reserved bytes.
func (b *Budget) release(n int64) {
	if n <= 0 {
		return
	}
	b.used.Add(-n)
	b.sem.Release(n)
}

// Reserve reserves n bytes for a caller that holds a large message of its own (a back end
// reading a stream the Kit does not), waiting for room as the sessions' reservations do. It
// returns ErrNoRoom when none came within the budget's wait, or ctx's error; release gives the
// bytes back.
func (b *Budget) Reserve(ctx context.Context, n int64) (release func(), err error) {
	got, err := b.acquire(ctx, n)
	if errors.Is(err, errNoRoom) {
		return nil, ErrNoRoom
	}
	if err != nil {
		return nil, err
	}
	h := &hold{b: b, n: got}
	return h.free, nil
}

// awaitRoom waits, as a reservation would, until n bytes are free, and takes nothing: the
// admission of a call whose answer may take n bytes.
func (b *Budget) awaitRoom(ctx context.Context, n int64) error {
	got, err := b.acquire(ctx, n)
	if err != nil {
		return err
	}
	b.release(got)
	return nil
}

// hold is a reservation in a Budget that can shrink and be handed on; the zero value (or one
// of a nil Budget) holds nothing.
type hold struct {
	b *Budget
	n int64
}

// shrink gives back what the hold has beyond n bytes.
func (h *hold) shrink(n int64) {
	if h.b != nil && h.n > n {
		h.b.release(h.n - n)
		h.n = n
	}
}

// free gives back everything the hold has.
func (h *hold) free() { h.shrink(0) }
