package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// Warm containers. A registration may ask the pool to keep some of its containers ready
// (prewarm): created, started, past the MCP handshake and listed, but never given a call. A
// run's first call to the server takes one instead of waiting for a cold start, and the pool
// starts another in the background. The rules that keep this as isolated as a cold start:
//
//   - Single use: a warm session serves the one run that takes it, and stops as every session
//     does (run end, pause, failure). It never goes back to the set.
//   - Exactly what a cold start would make: it is taken only when the registration, resolved
//     afresh for the taking call (secrets included), would start the same spec at the same
//     revision (sameStart); the container profile is the spawner's, whoever asks. Any other is
//     discarded, as the poll of the registry discards those of a registration that changed.
//   - Alive and listed when taken: its listing is taken again as it is handed over; one that
//     does not answer is discarded and the call starts a server of its own. The drift check
//     still runs on every call, against the calling run's own pins.
//   - Counted: each holds a place under pool.max_sessions (a run that needs the place takes
//     it, stopping the oldest warm session), all together at most pool.max_warm, and each lives
//     at most pool.warm_max_age.
//   - Labelled purpose=warm with no run (labels cannot change after creation): the sweep of a
//     restarted pool removes them as it removes every container with the pool's label; the
//     run that took one is in the audit record of each call it served (warm_session).

// WarmSource lists the registrations that ask for warm containers: the registry in-process, or
// peers.Registry over the internal plane.
type WarmSource interface {
	WarmTargets(ctx context.Context) ([]mcpserver.WarmTarget, error)
}

// Defaults of the warm settings.
const (
	// DefaultMaxWarm is pool.max_warm's default.
	DefaultMaxWarm = 16
	// DefaultWarmMaxAge is pool.warm_max_age's default: no warm container lives for days.
	DefaultWarmMaxAge = 10 * time.Minute
	// defaultWarmRefresh is how often the registry is asked which registrations want warm
	// containers, and the sets are checked.
	defaultWarmRefresh = 2 * time.Second
	warmPollTimeout    = 10 * time.Second
	// A registration whose warm start fails is tried again after a delay that doubles from
	// warmRetryMin to warmRetryMax, so a broken server does not start containers in a loop.
	warmRetryMin = time.Second
	warmRetryMax = time.Minute
)

// Why a warm session was discarded (ringfence_pool_warm_discarded_total{reason}).
const (
	discardStale    = "stale"    // its registration changed (revision, spec) since it started
	discardExpired  = "expired"  // it waited longer than pool.warm_max_age
	discardDead     = "dead"     // its server died, or did not answer when it was taken
	discardUnwanted = "unwanted" // its registration no longer asks for as many (or any)
	discardEvicted  = "evicted"  // a run needed its place under pool.max_sessions
)

// warmSet holds the pool's warm sessions per server ref, oldest first.
type warmSet struct {
	mu       sync.Mutex
	targets  map[string]mcpserver.WarmTarget // as the last poll found them
	polledAt time.Time                       // when the last poll that answered began
	ready    map[string][]*session
	starting map[string]int
	retry    map[string]warmRetry
	closed   bool
	pollErr  string // the last poll's error, logged once until it changes

	kick chan struct{} // wakes the keeper: a session was taken or went away
	// stops counts discarded sessions being stopped in the background; it is only added to
	// under mu while the set is open, so closeWarm's wait sees every one.
	stops sync.WaitGroup
}

type warmRetry struct {
	revision int64
	after    time.Time
	delay    time.Duration
}

func newWarmSet() *warmSet {
	return &warmSet{
		targets: map[string]mcpserver.WarmTarget{}, ready: map[string][]*session{}, starting: map[string]int{},
		retry: map[string]warmRetry{}, kick: make(chan struct{}, 1),
	}
}

// wake asks the keeper to refill now rather than at its next tick.
func (w *warmSet) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// wanted reports whether ref asks for warm containers (as last polled).
func (w *warmSet) wanted(ref string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.targets[ref]
	return ok
}

// hasReady reports whether a warm session of ref waits.
func (w *warmSet) hasReady(ref string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ready[ref]) > 0
}

// count is the number of warm sessions that wait.
func (w *warmSet) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, l := range w.ready {
		n += len(l)
	}
	return n
}

// status is what the set holds of each ref.
func (w *warmSet) status(refs []string) map[string]mcpserver.WarmStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]mcpserver.WarmStatus, len(refs))
	for _, ref := range refs {
		out[ref] = mcpserver.WarmStatus{Ready: len(w.ready[ref]), Starting: w.starting[ref]}
	}
	return out
}

// leave removes sess from the set if it is still there, and reports whether it was: whoever
// removes it owns it (to hand over, or to stop). Must hold w.mu.
func (w *warmSet) leave(sess *session) bool {
	list := w.ready[sess.ref]
	i := slices.Index(list, sess)
	if i < 0 {
		return false
	}
	list = slices.Delete(list, i, i+1)
	if len(list) == 0 {
		delete(w.ready, sess.ref)
	} else {
		w.ready[sess.ref] = list
	}
	close(sess.unwarm)
	return true
}

// discarded is a warm session removed from the set, and why.
type discarded struct {
	sess   *session
	reason string
}

// take removes and returns the oldest warm session of ref that reg would start exactly as it
// stands now, or nil. Those it finds dead or started from another registration are removed
// and returned to be stopped.
func (w *warmSet) take(ref string, reg *mcpserver.Resolved) (*session, []discarded) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var gone []discarded
	for _, sess := range slices.Clone(w.ready[ref]) {
		switch {
		case isDone(sess):
			w.leave(sess)
			gone = append(gone, discarded{sess, discardDead})
		case !sameStart(sess.reg, reg):
			w.leave(sess)
			gone = append(gone, discarded{sess, discardStale})
		default:
			w.leave(sess)
			return sess, gone
		}
	}
	return nil, gone
}

// evict removes the oldest warm session of any ref and hands its place under
// pool.max_sessions to the caller: stopping it does not give the place back (keepSlot).
func (w *warmSet) evict() *session {
	w.mu.Lock()
	defer w.mu.Unlock()
	var oldest *session
	for _, list := range w.ready {
		if len(list) > 0 && (oldest == nil || list[0].start.Before(oldest.start)) {
			oldest = list[0]
		}
	}
	if oldest != nil {
		w.leave(oldest)
		oldest.keepSlot = true
	}
	return oldest
}

func isDone(sess *session) bool {
	select {
	case <-sess.sess.Done():
		return true
	default:
		return false
	}
}

// sameStart reports whether a session started from a was started exactly as b would start
// one now: the same registration revision, and the same spec (command, arguments, env and
// header values in clear, handshake bound). The container profile is the spawner's alone.
func sameStart(a, b *mcpserver.Resolved) bool {
	return a.Ref == b.Ref && a.Revision == b.Revision && a.CreateTime.Equal(b.CreateTime) &&
		a.Transport == b.Transport && a.Command == b.Command && slices.Equal(a.Args, b.Args) &&
		maps.Equal(a.Env, b.Env) && a.URL == b.URL && maps.Equal(a.HeaderValues, b.HeaderValues) &&
		a.SessionTimeout() == b.SessionTimeout()
}

// share divides limit warm sessions among the targets: one each in ref order, then a second
// each, and so on, up to each target's prewarm.
func share(targets map[string]mcpserver.WarmTarget, limit int) map[string]int {
	refs := slices.Sorted(maps.Keys(targets))
	out := make(map[string]int, len(refs))
	for total, round := 0, 1; total < limit; round++ {
		grew := false
		for _, ref := range refs {
			if total < limit && targets[ref].Prewarm >= round {
				out[ref]++
				total++
				grew = true
			}
		}
		if !grew {
			break
		}
	}
	return out
}

// keepWarm keeps the warm sets until ctx ends: every WarmRefresh, and whenever a warm session
// is taken or goes away, it asks the registry which registrations want warm containers,
// discards what no longer fits and starts what is missing.
func (s *Service) keepWarm(ctx context.Context) {
	t := time.NewTicker(s.cfg.WarmRefresh)
	defer t.Stop()
	for {
		s.reconcileWarm(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.warm.kick:
		}
	}
}

// reconcileWarm is one turn of keepWarm.
func (s *Service) reconcileWarm(ctx context.Context) {
	w := s.warm
	began := time.Now()
	pctx, cancel := context.WithTimeout(ctx, warmPollTimeout)
	targets, err := s.cfg.Warm.WarmTargets(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	s.notePoll(err)
	if err == nil {
		w.targets = make(map[string]mcpserver.WarmTarget, len(targets))
		for _, t := range targets {
			w.targets[t.Ref] = t
		}
		w.polledAt = began
	}
	var gone []discarded
	now := time.Now()
	for _, ref := range slices.Collect(maps.Keys(w.ready)) {
		t, wanted := w.targets[ref]
		for _, sess := range slices.Clone(w.ready[ref]) {
			reason := ""
			switch {
			case !wanted:
				reason = discardUnwanted
			case isDone(sess):
				reason = discardDead
			// A session started after the poll began may be of a newer revision than it saw.
			case sess.reg.Revision != t.Revision && sess.start.Before(w.polledAt):
				reason = discardStale
			case now.Sub(sess.start) > s.cfg.WarmMaxAge:
				reason = discardExpired
			}
			if reason != "" {
				w.leave(sess)
				gone = append(gone, discarded{sess, reason})
			}
		}
	}
	want := share(w.targets, s.cfg.MaxWarm)
	for ref, list := range w.ready {
		for i := 0; i < len(list)-want[ref]; i++ { // the oldest go first
			gone = append(gone, discarded{list[i], discardUnwanted})
		}
	}
	for _, g := range gone {
		w.leave(g.sess) // a no-op for those left above
	}
	for ref, r := range w.retry {
		if t, ok := w.targets[ref]; !ok || t.Revision != r.revision {
			delete(w.retry, ref) // a changed registration is tried again at once
		}
	}
	var starts []string
	for _, ref := range slices.Sorted(maps.Keys(want)) {
		// One start at a time per server: a refill is gentle on the host, and a server that
		// fails to start fails once per delay.
		if w.starting[ref] > 0 || len(w.ready[ref]) >= want[ref] || now.Before(w.retry[ref].after) {
			continue
		}
		if !s.takeSessionSlot() {
			break // pool.max_sessions is reached: runs come first
		}
		w.starting[ref]++
		starts = append(starts, ref)
	}
	w.mu.Unlock()
	s.discard(gone...)
	for _, ref := range starts {
		s.warmWork.Go(func() { s.startWarm(ctx, ref) })
	}
}

// notePoll logs a failed poll of the registry once, until it changes or recovers. Must hold
// s.warm.mu.
func (s *Service) notePoll(err error) {
	w := s.warm
	switch {
	case err == nil && w.pollErr != "":
		s.log.Info("the registry answers again: warm containers are kept", "servers", len(w.targets))
		w.pollErr = ""
	case err != nil && err.Error() != w.pollErr:
		w.pollErr = err.Error()
		s.log.Warn("the registry could not be asked which servers want warm containers; the warm sets are kept as they are and checked again at every run's first call", "err", err)
	}
}

// startWarm starts one warm session of ref, which reconcileWarm counted as starting and for
// which it took a place under pool.max_sessions.
func (s *Service) startWarm(ctx context.Context, ref string) {
	w := s.warm
	sess, err := s.prepareWarm(ctx, ref)
	w.mu.Lock()
	w.starting[ref]--
	if w.starting[ref] == 0 {
		delete(w.starting, ref)
	}
	switch {
	case err != nil:
		w.mu.Unlock()
		if ctx.Err() == nil {
			s.warmFailed(ref, err)
		}
		return
	case w.closed || sess.reg.Prewarm == 0:
		w.mu.Unlock()
		s.stop(sess)
		return
	}
	w.ready[ref] = append(w.ready[ref], sess)
	delete(w.retry, ref)
	w.mu.Unlock()
	s.metrics.warmRefills.WithLabelValues(ref, "ready").Inc()
	s.warmWork.Go(func() { s.watchWarm(sess) })
	w.wake() // the next one of this server, if more are wanted
}

// prepareWarm resolves ref and starts its server as a run's first call would, then takes its
// listing, which must hash. The place under pool.max_sessions taken for it is given back on
// failure (by stop, once the server started).
func (s *Service) prepareWarm(ctx context.Context, ref string) (*session, error) {
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	reg, err := s.cfg.Registry.ResolveRegistration(rctx, ref)
	cancel()
	if err == nil && reg.Transport != mcpserver.TransportStdio {
		err = fmt.Errorf("the registration's transport is %s: only stdio servers are kept warm", reg.Transport)
	}
	if err != nil {
		s.liveSessions.Add(-1)
		return nil, err
	}
	sess := &session{ref: ref, ready: make(chan struct{}), warm: true, unwarm: make(chan struct{})}
	close(sess.ready)
	spec := specFor(reg, spawner.PurposeWarm, "")
	spec.OnToolListChanged = sess.toolsChanged
	sp, err := s.spawner.Spawn(ctx, spec)
	if err != nil {
		s.liveSessions.Add(-1)
		return nil, err
	}
	sess.sess, sess.reg, sess.start = sp, reg, time.Now()
	s.metrics.sessionsSpawned.Inc()
	err = s.relist(ctx, sess, relistSetup)
	if err == nil {
		err = hashable(sess.live)
	}
	if err != nil {
		s.stop(sess)
		return nil, err
	}
	return sess, nil
}

// hashable refuses a listing that no pin could match: a declaration that cannot be hashed, or
// a name listed twice. Pins differ from graph to graph, so a warm session is checked against
// them where they are known, by the drift check of every call it serves.
func hashable(live mcpgate.Listing) error {
	var bad []string
	for name, h := range live {
		if strings.HasPrefix(h, mcpgate.NotHashable) || h == mcpgate.ListedTwice {
			bad = append(bad, name)
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return fmt.Errorf("its listing holds declarations no pin can match (they cannot be hashed, or are listed twice): %s", listed(bad))
	}
	return nil
}

// warmFailed counts a failed warm start and holds the server's next one off.
func (s *Service) warmFailed(ref string, err error) {
	s.metrics.warmRefills.WithLabelValues(ref, "failed").Inc()
	w := s.warm
	w.mu.Lock()
	r := w.retry[ref]
	r.revision = w.targets[ref].Revision
	r.delay = min(max(2*r.delay, warmRetryMin), warmRetryMax)
	r.after = time.Now().Add(r.delay)
	w.retry[ref] = r
	w.mu.Unlock()
	var refused *RefusedError
	if errors.As(err, &refused) && refused.Server != nil {
		err = fmt.Errorf("%s: %s", refused.Server.Class, refused.Server.Message)
	}
	s.log.Warn("a warm container could not be started; runs start this server cold meanwhile", "server", ref, "retry_in", r.delay, "err", err)
}

// watchWarm replaces a warm session whose server dies while it waits. It ends when the session
// leaves the set (taken, or discarded).
func (s *Service) watchWarm(sess *session) {
	select {
	case <-sess.unwarm:
		return
	case <-sess.sess.Done():
	}
	s.warm.mu.Lock()
	mine := s.warm.leave(sess)
	s.warm.mu.Unlock()
	if mine {
		s.discard(discarded{sess, discardDead})
		s.warm.wake()
	}
}

// discard stops warm sessions removed from the set, in the background (the caller may be a
// run's call), or at once once the set is closed.
func (s *Service) discard(gone ...discarded) {
	w := s.warm
	for _, g := range gone {
		s.metrics.warmDiscarded.WithLabelValues(g.reason).Inc()
		w.mu.Lock()
		closed := w.closed
		if !closed {
			w.stops.Add(1)
		}
		w.mu.Unlock()
		if closed {
			s.stop(g.sess)
			continue
		}
		go func() {
			defer w.stops.Done()
			s.stop(g.sess)
		}()
	}
}

// takeWarm hands a run a warm session of ref, if one waits that the registration, resolved
// now as a cold start would resolve it, would start exactly so. Its listing is taken again
// first, bounded by client_session_timeout: a server that died or stopped answering while it
// waited is discarded, never handed out. nil means none: the caller starts one cold.
func (s *Service) takeWarm(ctx context.Context, ref string) *session {
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	reg, err := s.cfg.Registry.ResolveRegistration(rctx, ref)
	cancel()
	if err != nil {
		return nil // the cold start asks again, and says why it cannot start
	}
	for {
		sess, gone := s.warm.take(ref, reg)
		s.discard(gone...)
		if len(gone) > 0 {
			s.warm.wake()
		}
		if sess == nil {
			return nil
		}
		if err := s.freshen(ctx, sess); err != nil {
			s.discard(discarded{sess, discardDead})
			s.warm.wake()
			continue
		}
		sess.refillDue.Store(true) // the taking call wakes the keeper once it has its answer
		return sess
	}
}

// takeOrSpawn fills a run's placeholder p (see session) with a warm session, or, when none
// that fits is ready after all, spawns one into p as a first call would. Concurrent first calls
// of the run wait on p: a warm session takes p's place (p is handed over, and they look again),
// so parallel first calls share one warm container, as they share one spawn.
func (s *Service) takeOrSpawn(sctx context.Context, r *run, p *session) {
	if w := s.takeWarm(sctx, p.ref); w != nil {
		r.mu.Lock()
		mine := r.sessions[p.ref] == p && !s.inflight.closed() && r.rec.State == StateRunning
		if mine {
			r.sessions[p.ref] = w
			s.metrics.warmHits.WithLabelValues(p.ref).Inc()
			s.watchers.Go(func() { s.watch(r, w) })
		}
		r.mu.Unlock()
		if !mine { // the run paused or ended meanwhile: single use, so it is stopped
			s.stop(w)
			s.warm.wake()
			p.err = s.givenUp()
		}
		p.handedOver = mine
		close(p.ready)
		return
	}
	if !s.takeSessionSlot() {
		victim := s.warm.evict()
		if victim == nil {
			p.err = errTooManySessions
			if sctx.Err() != nil || s.inflight.closed() {
				p.err = s.givenUp()
			}
			close(p.ready)
			return
		}
		s.metrics.warmDiscarded.WithLabelValues(discardEvicted).Inc()
		s.stop(victim) // keeps its place, for this spawn
	}
	s.countMiss(nil, p.ref)
	s.spawnSession(sctx, r, p)
}

// countMiss counts a first call of a run to a server that asks for warm sessions and starts one
// cold.
func (s *Service) countMiss(inline *mcpserver.Resolved, ref string) {
	if inline == nil && s.warm.wanted(ref) {
		s.metrics.warmMisses.WithLabelValues(ref).Inc()
	}
}

// freshen takes a warm session's listing again as it is handed over: it proves the server
// alive and answering, and it is the listing the call's drift check reads.
func (s *Service) freshen(ctx context.Context, sess *session) error {
	if isDone(sess) {
		return errors.New("the server died")
	}
	sess.listMu.Lock()
	defer sess.listMu.Unlock()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sess.reg.SessionTimeout())
	defer cancel()
	return s.relist(lctx, sess, relistAgain)
}

// WarmStatus reports, per ref, the warm sessions ready and starting: for the registry's
// GetServer and ListServers (registry.WarmReporter; over the internal plane, GetWarmStatus).
func (s *Service) WarmStatus(_ context.Context, refs []string) (map[string]mcpserver.WarmStatus, error) {
	return s.warm.status(refs), nil
}

// closeWarm stops keeping warm sessions: the keeper and the starts in flight end (a start
// given up removes what it began), and every warm session is stopped. The runs' sessions,
// warm ones taken included, are not touched.
func (s *Service) closeWarm() {
	w := s.warm
	w.mu.Lock()
	w.closed = true
	var all []*session
	for _, list := range w.ready {
		all = append(all, list...)
	}
	for _, sess := range all {
		w.leave(sess)
	}
	w.mu.Unlock()
	s.warmCancel()
	s.warmWork.Wait()
	var wg sync.WaitGroup
	for _, sess := range all {
		wg.Go(func() { s.stop(sess) })
	}
	wg.Wait()
	w.stops.Wait()
}
