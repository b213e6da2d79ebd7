package pool

import (
	"math"
	"sync"
	"time"
)

// The pool judges time by two clocks. The wall clock (s.now) gives the times it stores, sends
// and shows: a token's or an approval's expiry, a run's start. The monotonic clock (s.elapsed)
// gives the deadlines it keeps in memory; a step of the wall clock (an NTP correction, an
// operator fixing a wrong date) does not move it, and it stands still while the host is
// suspended. A lifetime with a stored expiry is held to both, and ends at whichever comes first:
// a step forward, or a host that slept, ends it early (its stored expiry has passed), and a step
// back never lengthens it.

// noLimit is lifetimeOf's limit for a span bounded by nothing but what was stored.
const noLimit = time.Duration(math.MaxInt64)

// lifetime is something's life as this process judges it: its stored wall-clock expiry, and
// the monotonic reading at which it ends whatever the wall clock says.
type lifetime struct {
	expire time.Time
	end    time.Duration
}

// lifetimeOf is the lifetime of something stored as made at created and expiring at expire,
// as this process first sees it: at most expire-created from now, and at most limit, by the
// monotonic clock. So a time stored ahead of this clock (the clock was set back since it was
// written, or the writer's clock runs ahead) never gives more than the span it was written
// with, however far ahead it is.
func (s *Service) lifetimeOf(created, expire time.Time, limit time.Duration) lifetime {
	left := min(expire.Sub(s.now()), expire.Sub(created), limit)
	return lifetime{expire: expire, end: s.elapsed() + max(left, 0)}
}

// over says whether l has ended, by either clock.
func (s *Service) over(l lifetime) bool {
	return !s.now().Before(l.expire) || s.elapsed() >= l.end
}

// elapsed is the monotonic clock: the time since the service opened.
func (s *Service) elapsed() time.Duration {
	if s.cfg.Elapsed != nil {
		return s.cfg.Elapsed()
	}
	return time.Since(s.opened)
}

// lifetimes keeps the lifetimes of stored things this process has judged (agent tokens), by id,
// so their monotonic deadlines outlast each read of the store.
type lifetimes struct {
	mu sync.Mutex
	m  map[string]lifetime
}

// get returns id's lifetime, judging it from what the store holds (lifetimeOf) the first time,
// and again when the store's expiry changed.
func (l *lifetimes) get(s *Service, id string, created, expire time.Time, limit time.Duration) lifetime {
	l.mu.Lock()
	defer l.mu.Unlock()
	got, ok := l.m[id]
	if !ok || !got.expire.Equal(expire) {
		got = s.lifetimeOf(created, expire, limit)
		if l.m == nil {
			l.m = make(map[string]lifetime)
		}
		l.m[id] = got
	}
	return got
}

// forget drops ids (deleted from the store).
func (l *lifetimes) forget(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		delete(l.m, id)
	}
}

// prune drops the lifetimes that have ended by both clocks, so the map holds no more than the
// things still stored. One that ended by one clock only is kept: judged afresh, it would get a
// new monotonic deadline.
func (l *lifetimes) prune(s *Service) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, got := range l.m {
		if !s.now().Before(got.expire) && s.elapsed() >= got.end {
			delete(l.m, id)
		}
	}
}
