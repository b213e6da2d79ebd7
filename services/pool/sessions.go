package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// session is one MCP server process (or remote connection) of one run. It is spawned by the
// first call that needs it; concurrent first calls wait for that one spawn.
type session struct {
	ref string
	// inline is set for an agent's inline server (the deprecated path): it is started from the
	// graph's own definition instead of a registration.
	inline *mcpserver.Resolved
	ready  chan struct{} // closed when the spawn finished, successfully or not
	// cancelSpawn gives up the spawn in flight: the run paused or ended.
	cancelSpawn context.CancelFunc
	sess        *spawner.Session
	reg         *mcpserver.Resolved
	err         error
	start       time.Time
	// renew is, for a server that signs each user in, the life of the user's token it was
	// started with until its refresh is due (renewLife): the run's next call then starts a
	// fresh session, with the refreshed token. Nil for any other.
	renew *lifetime
	// signIn is, for a server that signs each user in, whose token the session carries
	// (oauth_stepup.go); scopeRefused is set once the server refused that token for want of
	// scope: the run's next call then starts a fresh session, with the user's newest token.
	signIn       *sessionSignIn
	scopeRefused atomic.Bool

	// warm: the session came from the pool's warm set (warm.go): started before its run,
	// taken by the run's first call to the server. unwarm is closed when it leaves the set.
	warm   bool
	unwarm chan struct{}
	// refillDue is set when the session is taken from the warm set; the call that took it
	// starts the replacement once it has its answer (callTool).
	refillDue atomic.Bool
	// handedOver marks a run's placeholder whose place a warm session took (takeOrSpawn):
	// callers that waited on it look again.
	handedOver bool
	// keepSlot: the session's place under pool.max_sessions was handed to a run when it was
	// evicted from the warm set, so stopping it does not give the place back.
	keepSlot bool

	calls atomic.Int64
	// announce, once the session serves a run, tells the run's listeners (the MCP front door)
	// that the server said its tools changed.
	announce atomic.Pointer[func()]
	// stopped is set when stopping begins; stopMu is held until it has ended (see stop).
	stopped atomic.Bool
	stopMu  sync.Mutex

	// The live listing, for drift checks: tool name -> hash of the live declaration. An
	// inline session, which has no pins, keeps the declarations themselves as the screen saw
	// them (liveTools), with the findings about the listing as a whole.
	listMu          sync.Mutex
	live            mcpgate.Listing
	liveTools       map[string]discovery.Tool
	listingFindings []discovery.Finding
	// kept is, for a session that carries a user's token, the live listing last held up to
	// the user's stored listing (keepListing): a listing that has not changed since is not
	// compared again. Under listMu.
	kept mcpgate.Listing
	// listedAt is when the listing was taken (unix nanoseconds): atomic, so reporting it never
	// waits on listMu, which a slow relist holds. listedMono is the same moment by the
	// monotonic clock (clock.go), which the drift check also judges its age by: a wall clock
	// set back must not keep a listing fresh.
	listedAt   atomic.Int64
	listedMono atomic.Int64
	// stale is set by notifications/tools/list_changed; the next call re-lists. The
	// notification itself never lists, so a storm of them costs nothing; a session that
	// carries a user's sign-in lists soon after in the background (soon), bounded.
	stale atomic.Bool
	// soon lists the tools again in the background after tools/list_changed, for a session
	// that carries a user's sign-in (listSoon); nil for any other. Set before the server is
	// started, never changed after.
	soon *listSoon
}

func (s *session) isReady() bool {
	select {
	case <-s.ready:
		return true
	default:
		return false
	}
}

func (s *session) listedTime() time.Time { return time.Unix(0, s.listedAt.Load()) }

// listingAge is the age of sess's live listing by the clock that says it is older (clock.go).
func (s *Service) listingAge(sess *session) time.Duration {
	return max(s.now().Sub(sess.listedTime()), s.elapsed()-time.Duration(sess.listedMono.Load()))
}

var errTooManySessions = errors.New("pool: this host's session limit (pool.max_sessions) is reached: end finished runs or raise RINGFENCE_POOL__MAX_SESSIONS")

// session returns the run's session for ref, spawning it on first use. Two concurrent first
// calls spawn once. A session that died is replaced by the next call that needs it. inline is
// nil for a registered server, which is resolved from the registry by ref.
//
// Once the pool has begun to close, it refuses (errShuttingDown): a call that was already past
// the in-flight gate then (waiting on the registry, say) must not start a server, nor be
// dispatched, while the pool stops every session. It checks under r.mu, which Close takes
// after it began to close, so a session added before the check is one Close stops.
//
// A registered server's first session in the run is taken from the warm set when one waits
// that the registration would start exactly so now (takeOrSpawn); otherwise it is spawned.
// Concurrent first calls wait for that one take as for a spawn. A spawn that finds
// pool.max_sessions reached takes the place of the oldest warm session.
func (s *Service) session(ctx context.Context, r *run, ref string, inline *mcpserver.Resolved) (*session, error) {
	// held is a place under pool.max_sessions this call took over from an evicted warm
	// session, until a spawn uses it.
	held := false
	defer func() {
		if held {
			s.liveSessions.Add(-1)
		}
	}()
	for {
		r.mu.Lock()
		if s.inflight.closed() {
			r.mu.Unlock()
			return nil, errShuttingDown
		}
		if r.rec.State != StateRunning {
			st := r.rec.State
			r.mu.Unlock()
			return nil, fmt.Errorf("%w (it is %s)", errRunNotRunning, st)
		}
		sess, ok := r.sessions[ref]
		if !ok {
			// A warm session carries its own place under pool.max_sessions; a spawn needs one.
			warm := inline == nil && s.warm.hasReady(ref)
			if !warm && !held && !s.takeSessionSlot() {
				victim := s.warm.evict()
				r.mu.Unlock()
				if victim == nil {
					return nil, errTooManySessions
				}
				s.metrics.warmDiscarded.WithLabelValues(discardEvicted).Inc()
				s.stop(victim) // keeps its place, for this call
				held = true
				continue
			}
			// The spawn (or the take) runs in the background: it outlives this caller, since
			// others may come to wait for it, and each caller waits with its own context. Only
			// the run moving on cancels it.
			sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			sess = &session{ref: ref, inline: inline, ready: make(chan struct{}), cancelSpawn: cancel}
			r.sessions[ref] = sess
			r.mu.Unlock()
			if warm {
				go s.takeOrSpawn(sctx, r, sess)
			} else {
				held = false
				s.countMiss(inline, ref)
				go s.spawnSession(sctx, r, sess)
			}
		} else {
			r.mu.Unlock()
		}
		select {
		case <-sess.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if sess.handedOver {
			continue // a warm session took the place: the next turn finds it
		}
		if sess.err != nil {
			s.forget(r, sess)
			return nil, ownCopy(sess.err)
		}
		if sess.stopped.Load() {
			// Being stopped (after a failed ping or relist; its Close takes a moment): the
			// next turn starts a fresh one rather than use it.
			s.forget(r, sess)
			continue
		}
		select {
		case <-sess.sess.Done():
			// The server died since (a crash, a limit): the next call gets a fresh one.
			s.forget(r, sess)
			s.stop(sess)
			continue
		default:
		}
		if sess.scopeRefused.Load() || sess.renew != nil && s.over(*sess.renew) || s.tokenReplaced(ctx, sess) {
			// The user's token is due for a refresh, lacks a scope the server asked for, or
			// was replaced (the user signed in again): a fresh session carries the newest.
			s.forget(r, sess)
			s.stop(sess)
			continue
		}
		if sess.announce.Load() == nil {
			f := func() { s.toolsChanged(r.id, "", ref) }
			sess.announce.CompareAndSwap(nil, &f)
		}
		return sess, nil
	}
}

// toolsChanged is the session's answer to the server's notifications/tools/list_changed: its
// listing is taken again before the next call (drift), and the run's listeners are told. A
// session that carries a user's sign-in also lists again soon, in the background (listSoon),
// without waiting for a call.
func (sess *session) toolsChanged() {
	sess.stale.Store(true)
	sess.soon.kick(sess)
	if f := sess.announce.Load(); f != nil {
		(*f)()
	}
}

// Bounds of listing a session's tools again in the background (listSoon): the first listing
// begins listSoonSettle after the notification that asked for it, so a burst is listed once,
// and the listings of one session begin at least listSoonSpacing apart. With at most one in
// flight, a storm of notifications costs a session at most one tools/list a second. Variables
// so that a test can stretch them.
var (
	listSoonSettle  = 50 * time.Millisecond
	listSoonSpacing = time.Second
	// listSoonPoll is how often a background listing looks again whether a call, which holds
	// the session's listing while it reads or takes it, has let go of it.
	listSoonPoll = 10 * time.Millisecond
)

// listSoon keeps a user's stored listing current between calls (seed 003: "as does a server's
// tools/list_changed notification while the session is open"). For a session that carries a
// user's sign-in, tools/list_changed has the session list its tools again soon, in the
// background, so that keepListing brings the user's stored listing, and with it what the
// user's runs offer (their listeners are told), up to date without the run calling the server
// again: an agent with no other call to make to it would otherwise never be offered a tool the
// server starts declaring. One goroutine at most lists per session; notifications while it
// waits are listed by it, and those while it lists make it list once more, after
// listSoonSpacing. Its listing is bounded by the registration's client_session_timeout, as a
// call's listing again is; one that fails is logged and leaves the session stale, so the run's
// next call lists again (and stops a server that cannot be listed), as without it. The
// session's stop ends it (its context) and waits for it, so it never outlives the session nor
// writes after it.
//
// Any other session lists only when a call needs it: its listing serves nothing but the drift
// check of the run's next call, which lists first when the server announced a change, and what
// its runs offer comes from the pins, which a listing does not change. Listing in the
// background would cost a tools/list per burst of notifications for nothing.
type listSoon struct {
	svc    *Service
	ctx    context.Context // ended by the session's stop
	cancel context.CancelFunc
	wg     sync.WaitGroup // the listing goroutine, while it runs

	mu      sync.Mutex
	running bool      // a goroutine waits to list or lists
	again   bool      // a notification came while it listed: it lists once more
	closed  bool      // the session stops or failed to start: nothing more begins
	last    time.Time // when the last background listing began
}

func (s *Service) newListSoon(ctx context.Context) *listSoon {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return &listSoon{svc: s, ctx: ctx, cancel: cancel}
}

// kick asks for a listing soon: it starts the goroutine, or has the one running list once more.
func (l *listSoon) kick(sess *session) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
	case l.running:
		l.again = true
	default:
		l.running = true
		l.wg.Add(1)
		go l.svc.listInBackground(sess)
	}
}

// end ends the goroutine, if one runs, and waits for it; nothing begins after. The session's
// stop calls it, as does a spawn that failed.
func (l *listSoon) end() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
}

// done says whether the goroutine ends after a listing: it does, unless a notification came
// while it listed.
func (l *listSoon) done() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || !l.again {
		l.running = false
		return true
	}
	l.again = false
	return false
}

// listInBackground is listSoon's goroutine: once the session has started, it waits out the
// bounds, takes the session's listing (never blocking the session's stop, which may hold it)
// and lists again, while the server is still announced stale.
func (s *Service) listInBackground(sess *session) {
	l := sess.soon
	defer l.wg.Done()
	select {
	case <-sess.ready:
	case <-l.ctx.Done():
		return
	}
	if sess.err != nil {
		return // the session never started; its spawn ended l
	}
	for {
		l.mu.Lock()
		wait := max(listSoonSettle, time.Until(l.last.Add(listSoonSpacing)))
		l.mu.Unlock()
		if !sleepCtx(l.ctx, wait) || !lockCtx(l.ctx, &sess.listMu) {
			return
		}
		l.mu.Lock()
		l.last, l.again = time.Now(), false
		l.mu.Unlock()
		// A call listed since the notification (it held the listing meanwhile): nothing to do.
		if sess.stale.Load() {
			s.relistSoon(l.ctx, sess)
		}
		sess.listMu.Unlock()
		if l.done() {
			return
		}
	}
}

// relistSoon is the background listing: bounded by the registration's client_session_timeout,
// as a call's listing again is. A failure leaves the session stale, for the run's next call.
// The caller holds sess.listMu.
func (s *Service) relistSoon(ctx context.Context, sess *session) {
	lctx, cancel := context.WithTimeoutCause(ctx, sess.reg.SessionTimeout(), errRelistTimeout)
	defer cancel()
	err := s.relist(lctx, sess, relistBackground)
	if err == nil {
		return
	}
	sess.stale.Store(true)
	switch {
	case ctx.Err() != nil: // the session stops
	case sess.scopeRefused.Load():
		// The refusal carries the authorization URL, which no log holds.
		s.log.Warn("a server refused to list its tools again after tools/list_changed for want of a scope of the user's token: the run's next call starts a fresh session", "server", sess.ref)
	default:
		if errors.Is(context.Cause(lctx), errRelistTimeout) {
			err = fmt.Errorf("%w (%s)", errRelistTimeout, sess.reg.SessionTimeout())
		}
		s.log.Warn("a server's tools could not be listed again after tools/list_changed: the user's stored listing stays as it was until the run's next call lists again", "server", sess.ref, "err", err)
	}
}

// sleepCtx waits d, or until ctx ends: false then.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// lockCtx locks mu, or gives up when ctx ends first: false then. It polls (listSoonPoll), so
// that whoever holds mu may end ctx and wait for the caller.
func lockCtx(ctx context.Context, mu *sync.Mutex) bool {
	for !mu.TryLock() {
		if !sleepCtx(ctx, listSoonPoll) {
			return false
		}
	}
	return true
}

// takeSessionSlot counts one more live session, unless the host's limit is reached: one
// compare-and-swap, so concurrent first calls in different runs cannot both take the last.
func (s *Service) takeSessionSlot() bool {
	for {
		n := s.liveSessions.Load()
		if n >= int64(s.cfg.MaxSessions) {
			return false
		}
		if s.liveSessions.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// ownCopy gives each caller waiting on one failed spawn its own refusal, since each writes
// its call id and attempt into it.
func ownCopy(err error) error {
	if ref, ok := err.(*RefusedError); ok {
		c := *ref
		return &c
	}
	return err
}

// resolveTimeout bounds asking the registry for a registration when a session starts.
const resolveTimeout = 10 * time.Second

// errRunMovedOn is a spawn that was given up because its run paused or ended meanwhile.
var errRunMovedOn = fmt.Errorf("%w: it was paused or ended while the server started", errRunNotRunning)

// givenUp is why a spawn was given up: the pool began to close (shutting_down), or else the
// run paused or ended.
func (s *Service) givenUp() error {
	if s.inflight.closed() {
		return refusal(reasonShuttingDown, errShuttingDown)
	}
	return errRunMovedOn
}

// spawnSession resolves the registration, spawns the server and takes its first listing.
// Whatever happens, sess.ready is closed, and a session whose run moved on meanwhile (paused,
// ended: stopSessions cancels sctx) is stopped rather than leaked. The registry is asked
// within resolveTimeout; the spawner bounds the rest by its start and handshake timeouts.
func (s *Service) spawnSession(sctx context.Context, r *run, sess *session) {
	defer close(sess.ready)
	failed := func(err error) {
		sess.soon.end()
		if sctx.Err() != nil || s.inflight.closed() {
			err = s.givenUp()
		}
		sess.err = err
		s.liveSessions.Add(-1)
	}
	reg := sess.inline
	if reg == nil {
		rctx, cancel := context.WithTimeout(sctx, resolveTimeout)
		var err error
		reg, err = s.cfg.Registry.ResolveRegistration(rctx, sess.ref)
		cancel()
		if err != nil {
			failed(refusal(reasonForRegistryErr(err), err))
			return
		}
	}
	if reg.Transport == mcpserver.TransportStdio && !s.stdio {
		failed(refusal(reasonIsolationRequired, errIsolationRequired))
		return
	}
	if reg.OAuth != nil && sess.inline == nil {
		// The run's user's token, and no other's: without one, the call is refused with the URL
		// the user signs in at.
		authed, err := s.runBearer(sctx, r, sess, reg)
		if err != nil {
			failed(err)
			return
		}
		reg = authed
		// runBearer noted whose sign-in the session carries: its tools/list_changed keeps the
		// user's stored listing current (listSoon).
		sess.soon = s.newListSoon(sctx)
	}
	// The registry may have taken a while: no container is started once the pool closes.
	if s.inflight.closed() || sctx.Err() != nil {
		failed(s.givenUp())
		return
	}
	spec := specFor(reg, spawner.PurposeRun, r.id.ID)
	spec.OnToolListChanged = sess.toolsChanged
	sp, err := s.spawner.Spawn(sctx, spec)
	if err != nil {
		if scoped := s.answerScopeChallenge(sctx, sess, err); scoped != nil {
			failed(refusal(reasonSignInRequired, scoped))
			return
		}
		if reg.OAuth != nil && refusedToken(err) {
			failed(s.dropRefusedToken(sctx, r, reg))
			return
		}
		failed(spawnRefusal(err))
		return
	}
	sess.sess, sess.reg, sess.start = sp, reg, time.Now()
	s.metrics.sessionsSpawned.Inc()
	if err := s.relist(sctx, sess, relistSetup); err != nil {
		sess.err = err
		if sctx.Err() != nil {
			sess.err = s.givenUp()
		}
		s.stop(sess)
		return
	}
	r.mu.Lock()
	current := r.sessions[sess.ref] == sess
	r.mu.Unlock()
	if !current {
		s.stop(sess)
		sess.err = s.givenUp()
		return
	}
	s.watchers.Go(func() { s.watch(r, sess) })
}

// watch gives back a session's place under pool.max_sessions as soon as its server dies on its
// own (a crash, the memory limit), rather than when the run next calls that server or ends:
// other runs on the host would be refused meanwhile. It forgets the session, so the run's next
// call starts a fresh one, and stops it (the stopped flag makes that happen once, whoever
// gets there first). Done is closed too when the session is stopped normally, so the watch
// always ends with its session.
func (s *Service) watch(r *run, sess *session) {
	<-sess.sess.Done()
	if sess.stopped.Load() {
		return // stopped by its run, its ping or relist, or the pool's Close
	}
	s.forget(r, sess)
	s.stop(sess)
}

// forget removes sess from its run if it is still the run's session for its ref.
func (s *Service) forget(r *run, sess *session) {
	r.mu.Lock()
	if r.sessions[sess.ref] == sess {
		delete(r.sessions, sess.ref)
	}
	r.mu.Unlock()
}

// stop closes a session exactly once. Whoever calls it returns once the session is closed and
// its place given back, also when another got there first (its watch, say, while a call found
// the server dead), so a caller that goes on to spawn a fresh one finds the place free.
func (s *Service) stop(sess *session) {
	if sess.sess == nil {
		return
	}
	sess.stopMu.Lock()
	defer sess.stopMu.Unlock()
	if !sess.stopped.CompareAndSwap(false, true) {
		return
	}
	// A background listing in flight is ended, and waited for: it never writes the user's
	// listing after the session stopped.
	sess.soon.end()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sess.sess.Close(ctx); err != nil {
		s.log.Warn("closing a session failed", "server", sess.ref, "err", err)
	}
	if !sess.keepSlot {
		s.liveSessions.Add(-1)
	}
	s.metrics.sessionsStopped.Inc()
}

// stopSessions stops detached sessions. A spawn still in flight is given up (the spawner
// removes what it started), so a run ends without waiting out a slow handshake.
func (s *Service) stopSessions(sessions map[string]*session) {
	var wg sync.WaitGroup
	for _, sess := range sessions {
		wg.Go(func() {
			if !sess.isReady() {
				sess.cancelSpawn()
			}
			<-sess.ready
			s.stop(sess)
		})
	}
	wg.Wait()
}

// relist takes the live listing and hashes every declaration. The first listing (setup) is
// part of client setup (relistSetup), bounded like the handshake by client_session_timeout. For a server
// that signs each user in, the listing then replaces the user's stored one when it changed
// (keepListing): so the first call of a run's session, and the session's listing in the
// background soon after the server's tools/list_changed (listSoon), keep what the user's runs
// offer current.
func (s *Service) relist(ctx context.Context, sess *session, kind relistKind) error {
	sess.stale.Store(false) // before listing, so a notification during the listing is kept
	list := sess.sess.ListTools
	if kind == relistSetup {
		list = sess.sess.SetupListTools
	}
	tools, err := list(ctx)
	if err != nil {
		if kind == relistBackground {
			// No caller waits for the listing to be given a sign-in's URL, and beginning one
			// would replace the sign-in the user may be completing (one authorization URL is
			// good at a time): a scope challenge only marks the session, and the run's next
			// call begins the sign-in.
			sess.refusedForScope(err)
			return spawnRefusal(err)
		}
		if scoped := s.answerScopeChallenge(ctx, sess, err); scoped != nil {
			return refusal(reasonSignInRequired, scoped)
		}
		return spawnRefusal(err)
	}
	// A declaration that cannot be hashed, or a name listed twice (it has no one live
	// declaration), never passes for a pin.
	live := mcpgate.ListingOf(tools)
	if sess.inline != nil {
		// Nothing about an inline server's tools was screened at import: screen the listing
		// as discovery does.
		listing, err := Screen(sess.reg, tools, sess.sess)
		if err != nil {
			return spawnRefusal(err)
		}
		sess.liveTools = make(map[string]discovery.Tool, len(listing.Tools))
		for _, t := range listing.Tools {
			sess.liveTools[t.Name] = t
		}
		sess.listingFindings = listing.Findings
	}
	sess.live = live
	sess.listedAt.Store(s.now().UnixNano())
	sess.listedMono.Store(int64(s.elapsed()))
	s.metrics.listings.Inc()
	// What the server declares to the run's user now is what the user's runs offer (seed 003:
	// a call's listing keeps the stored listing current).
	s.keepListing(ctx, sess, tools)
	return nil
}

// relistKind says who takes a session's listing (relist).
type relistKind int

const (
	relistAgain      relistKind = iota // for a call, or a warm session handed over
	relistSetup                        // the first, part of client setup
	relistBackground                   // listSoon's, after tools/list_changed: no caller waits
)

// errRelistTimeout is the cause of a re-listing that outlived the registration's bound.
var errRelistTimeout = errors.New("the re-listing outlived client_session_timeout")

// listing is the session's live listing for the live gates, re-listed first when it is older
// than drift_max_age or the server announced a change.
func (s *Service) listing(ctx context.Context, sess *session) (liveListing, error) {
	sess.listMu.Lock()
	defer sess.listMu.Unlock()
	if err := s.refreshListing(ctx, sess); err != nil {
		return liveListing{}, err
	}
	return liveListing{hashes: sess.live, tools: sess.liveTools, findings: sess.listingFindings, safe: sess.sess.SafeText}, nil
}

// refreshListing re-lists when the listing is older than drift_max_age or the server announced
// a change. A server that cannot be listed any more (it stopped answering, or answers garbage)
// is stopped, so the run's next call starts a fresh one instead of failing the same way. The
// listing is held to the registration's client_session_timeout, as the first one was at the
// handshake, whatever the caller's deadline, shorter or longer: a server that hangs on
// tools/list would otherwise hold sess.listMu, and fail every call as canceled, for as long as
// each caller waits. The caller holds sess.listMu.
func (s *Service) refreshListing(ctx context.Context, sess *session) error {
	if !sess.stale.Load() && s.cfg.DriftMaxAge != 0 && s.listingAge(sess) <= s.cfg.DriftMaxAge {
		return nil
	}
	// Not the caller's context: a caller whose deadline is shorter than the bound would end
	// the listing first, and the wedged session would be kept. A caller that leaves waits out
	// the bound at most.
	bound := sess.reg.SessionTimeout()
	lctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), bound, errRelistTimeout)
	defer cancel()
	err := s.relist(lctx, sess, relistAgain)
	timedOut := err != nil && errors.Is(context.Cause(lctx), errRelistTimeout)
	if timedOut {
		msg := fmt.Sprintf("the server did not answer tools/list within %s (client_session_timeout) when its tools were listed again for the drift check; it was stopped, and the run's next call starts a fresh one", bound)
		ref := refusal(reasonSpawnFailed, errors.New(msg))
		ref.Server = &discovery.Failure{Class: string(spawner.ClassTimeout), Message: msg, StderrTail: sess.sess.StderrTail()}
		err = ref
	}
	// A scope challenge's refusal carries the authorization URL, which no log holds; its
	// session is replaced at the run's next call.
	if err != nil && (timedOut || ctx.Err() == nil) && !sess.scopeRefused.Load() {
		s.log.Warn("a server's tools could not be listed again: stopping it; the run's next call starts a fresh one", "server", sess.ref, "err", err)
		s.stop(sess)
	}
	return err
}
