package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/mcpgate"
	"github.com/ringfence/ringfence/mcpgate/capability"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// Run states.
const (
	StateRunning   = "running"
	StatePaused    = "paused"
	StateCompleted = "completed"
	StateFailed    = "failed"
)

// run is one run of a published graph version on this pool. Its sessions belong to it alone:
// no process is ever shared between runs.
type run struct {
	// id is the run's identity, copied from rec when the run is built and never changed, so
	// it is read without the lock (rec is replaced whole, under mu, on every state change).
	id  runIdentity
	rec store.Run

	// version is loaded on first use after a restart; it never changes afterwards (published
	// versions are immutable).
	loadOnce sync.Once
	version  *graph.Version
	index    *graph.Index
	loadErr  error

	mu           sync.Mutex
	sessions     map[string]*session // by server ref; replaced wholesale on pause and end
	lastActivity time.Time
	calls        int64
	attempts     map[string]int32 // call id -> attempts so far (bounded)
	effective    map[string]agentCaps
	// surfaces holds each agent's tools and settings as agentsurface read them from the
	// version, once per run (agenttools.go).
	surfaces map[string]*agentsurface.Agent
	// approvals are the run's calls that asked a person first (approvals.go), oldest first:
	// at most one pending, which holds every new call of the run until it is decided.
	approvals []*approvalView

	// busy counts calls in flight, so the idle reaper never ends a run mid-call.
	busy atomic.Int64
}

// runIdentity is what never changes about a run.
type runIdentity struct {
	ID, Tenant, GraphID string
	Version             int64
	// User is the subject the run acts for; empty for none.
	User string
}

// newRun builds the in-memory run for rec, as started, restored or read back ended.
func newRun(rec store.Run) *run {
	return &run{
		id:  runIdentity{ID: rec.ID, Tenant: rec.Tenant, GraphID: rec.GraphID, Version: rec.Version, User: rec.User},
		rec: rec, sessions: make(map[string]*session), attempts: make(map[string]int32),
		effective: make(map[string]agentCaps), surfaces: make(map[string]*agentsurface.Agent), calls: rec.Calls, lastActivity: rec.LastActivity,
	}
}

// agentCaps is an agent's effective set, as the graph rules and mcpgate read it.
type agentCaps struct {
	eff  capability.Effective
	caps mcpgate.Capabilities
}

// begin counts a call by agent to the run and takes the snapshot its gates read; done ends
// the call. busy is taken under the run's lock, as the idle reaper checks it (end), so a run
// is either ended before this call or seen busy by the reaper, never ended under it.
func (r *run) begin(callID, agent string) (snap runSnapshot, done func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.busy.Add(1)
	r.touch()
	r.calls++
	snap = runSnapshot{id: r.id, state: r.rec.State, attempt: r.nextAttempt(callID),
		selected: r.rec.SelectedServers, approvals: r.approvalViews()}
	if names := r.rec.LoadedTools[agent]; len(names) > 0 {
		snap.loaded = make(map[string]bool, len(names))
		for _, n := range names {
			snap.loaded[n] = true
		}
	}
	return snap, func() {
		// The idle clock starts again when a call ends: a run whose long call just returned
		// is not abandoned.
		r.mu.Lock()
		r.touch()
		r.busy.Add(-1)
		r.mu.Unlock()
	}
}

// maxTrackedCallIDs bounds the per-run attempt counters.
const maxTrackedCallIDs = 10000

// nextAttempt numbers one more attempt of callID. Must hold r.mu.
func (r *run) nextAttempt(callID string) int32 {
	if len(r.attempts) >= maxTrackedCallIDs {
		clear(r.attempts)
	}
	r.attempts[callID]++
	return r.attempts[callID]
}

func newRunID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "run-" + hex.EncodeToString(b)
}

// Errors of the run lifecycle.
var (
	errRunNotFound   = errors.New("pool: no run")
	errRunExists     = errors.New("pool: a run with this id already exists in this tenant: pick another run id, or omit it to have one generated")
	errRunNotRunning = errors.New("pool: the run is not running")
	errRunNotPaused  = errors.New("pool: the run is not paused")
	errRunEnded      = errors.New("pool: the run has ended")
	errTooManyRuns   = errors.New("pool: this host's run limit (pool.max_runs) is reached: end finished runs or raise RINGFENCE_POOL__MAX_RUNS")
	errVersionGone   = errors.New("pool: the graph version is not published (or not in your tenant)")
)

// runKey names a run: a run id is unique within its tenant, so that no tenant can learn which
// ids another uses, or take one first.
type runKey struct{ tenant, id string }

// keyOf is the key of the run rec describes.
func keyOf(rec store.Run) runKey { return runKey{rec.Tenant, rec.ID} }

// runs holds the runs this pool hosts.
type runs struct {
	mu    sync.Mutex
	byKey map[runKey]*run
	// starting holds ids a StartRun has taken but not yet stored: not visible to lookup
	// (nothing may act on a run the store has not accepted), but taken for another start.
	starting map[runKey]bool
	count    int // running or paused, and starting
}

// StartRun starts a run of a published version (0 means the latest). Nothing is spawned.
// selected are the servers a user picked: the run keeps those that an agent of the graph
// uses, which narrow what each agent sees (agenttools.go), and the answer lists the others as
// ignored.
func (s *Service) StartRun(ctx context.Context, tenant, graphID string, version int64, runID string, selected ...string) (*RunInfo, error) {
	return s.StartRunFor(ctx, RunStart{Tenant: tenant, GraphID: graphID, Version: version, RunID: runID, Selected: selected})
}

// RunStart is what StartRunFor starts.
type RunStart struct {
	Tenant, GraphID string
	Version         int64
	RunID           string
	// User is the subject the run acts for: servers that sign each user in get this user's
	// token (docs/oauth.md). The caller asserts it; empty acts for nobody.
	User     string
	Selected []string
}

// StartRunFor is StartRun with the run's user.
func (s *Service) StartRunFor(ctx context.Context, rs RunStart) (*RunInfo, error) {
	tenant, graphID, version, runID, selected := orDefaultTenant(rs.Tenant), rs.GraphID, rs.Version, rs.RunID, rs.Selected
	if rs.User != "" {
		if err := ValidateUser("user", rs.User); err != nil {
			return nil, err
		}
	}
	if runID == "" {
		runID = newRunID()
	}
	if err := validateRunID(runID); err != nil {
		return nil, err
	}
	if err := checkSelection(selected); err != nil {
		return nil, err
	}
	if host, err := s.place(ctx); err != nil {
		return nil, err
	} else if host != "" {
		return nil, &elsewhereError{host: host}
	}
	v, err := s.cfg.Versions.PublishedVersion(ctx, tenant, graphID, version)
	if err != nil {
		return nil, versionErr(err)
	}
	ix := graph.NewIndex(v.Graph)
	kept, ignored := selection(ix, selected)
	now := time.Now().UTC()
	r := newRun(store.Run{ID: runID, Tenant: tenant, GraphID: graphID, Version: v.Version, State: StateRunning, StartTime: now, LastActivity: now,
		SelectedServers: kept, Host: s.host, User: rs.User})
	r.loadOnce.Do(func() { r.version, r.index = v, ix })

	s.runs.mu.Lock()
	if s.runs.count >= s.cfg.MaxRuns {
		s.runs.mu.Unlock()
		return nil, errTooManyRuns
	}
	key := keyOf(r.rec)
	if _, ok := s.runs.byKey[key]; ok || s.runs.starting[key] {
		s.runs.mu.Unlock()
		return nil, errRunExists
	}
	s.runs.starting[key] = true
	s.runs.count++
	s.runs.mu.Unlock()

	// The run becomes visible only once the store has it: an id an ended run still holds
	// (ended runs live in the store only) is refused here, before anyone can act on it.
	err = s.runStore.CreateRun(ctx, r.rec)
	s.runs.mu.Lock()
	delete(s.runs.starting, key)
	if err != nil {
		s.runs.count--
	} else {
		r.lastActivity = time.Now() // the idle clock starts when the run can be used
		s.runs.byKey[key] = r
	}
	s.runs.mu.Unlock()
	if err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil, errRunExists
		}
		return nil, err
	}
	s.metrics.runsStarted.Inc()
	info := r.info()
	info.IgnoredServers = ignored
	return info, nil
}

// versionErr says why a version cannot be run in the publisher's own words (which name the
// graph and the command that fixes it), without the prefixes of each layer it came through.
func versionErr(err error) error {
	if !isNotFound(err) {
		return err
	}
	why := strings.TrimPrefix(err.Error(), graph.ErrNotPublished.Error())
	why = strings.TrimPrefix(strings.TrimPrefix(why, ": "), "publisher: ")
	if why == "" {
		why = "publish it first, or check the graph id and version"
	}
	return fmt.Errorf("%w: %s", errVersionGone, why)
}

// lookup finds one of tenant's runs ("" is the default tenant).
//
// Only running and paused runs stay in memory; an ended run is read back from the store as a
// detached, read-only copy, so a host that ran many runs holds none of their graphs and
// maps, and a call to an ended run still says it ended.
func (s *Service) lookup(ctx context.Context, id, tenant string) (*run, error) {
	key := runKey{orDefaultTenant(tenant), id}
	s.runs.mu.Lock()
	r, ok := s.runs.byKey[key]
	s.runs.mu.Unlock()
	if ok {
		return r, nil
	}
	rec, err := s.runStore.GetRun(ctx, key.tenant, key.id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	switch {
	case err == nil && s.hosts != nil && rec.Active() && rec.Host != s.host:
		return nil, &elsewhereError{host: rec.Host}
	case err == nil && s.hosts != nil && rec.Active():
		// This host's, but not in memory: it dropped its runs when it lost its lease, and the
		// run was not failed meanwhile.
		return s.adopt(ctx, rec)
	case err != nil || (rec.State != StateCompleted && rec.State != StateFailed):
		return nil, fmt.Errorf("%w %q in tenant %q (a key bound to no tenant names the run's tenant, or acts for %q)", errRunNotFound, id, key.tenant, auth.DefaultTenant)
	}
	return newRun(rec), nil
}

// adopt puts a run of this host's that the store holds into memory, as restoreRuns does at
// start, unless another request did first.
func (s *Service) adopt(ctx context.Context, rec store.Run) (*run, error) {
	r, err := s.restored(ctx, rec)
	if err != nil {
		return nil, err
	}
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	if have, ok := s.runs.byKey[keyOf(rec)]; ok {
		return have, nil
	}
	if s.runs.starting[keyOf(rec)] {
		// StartRun stored it and has yet to show it: nothing acts on it before then.
		return nil, fmt.Errorf("%w %q in tenant %q (it is starting)", errRunNotFound, rec.ID, rec.Tenant)
	}
	s.runs.byKey[keyOf(rec)] = r
	s.runs.count++
	return r, nil
}

// load makes sure the run's version is in memory (after a restart it is fetched on first use).
func (s *Service) load(ctx context.Context, r *run) error {
	r.loadOnce.Do(func() {
		v, err := s.cfg.Versions.PublishedVersion(ctx, r.id.Tenant, r.id.GraphID, r.id.Version)
		if err != nil {
			r.loadErr = versionErr(err)
			return
		}
		r.version, r.index = v, graph.NewIndex(v.Graph)
	})
	return r.loadErr
}

// PauseRun stops the run's sessions; calls are refused until it resumes.
func (s *Service) PauseRun(ctx context.Context, id, tenant string) (*RunInfo, error) {
	r, err := s.lookup(ctx, id, tenant)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.rec.State != StateRunning {
		st := r.rec.State
		r.mu.Unlock()
		if st == StatePaused {
			return nil, fmt.Errorf("%w: it is paused already (ResumeRun, ringfence runs resume, runs it again)", errRunNotRunning)
		}
		return nil, fmt.Errorf("%w (it is %s)", errRunNotRunning, st)
	}
	r.lastActivity = time.Now() // the paused clock starts
	rec := r.rec
	rec.State = StatePaused
	rec.Calls, rec.LastActivity = r.calls, r.lastActivity
	if err := s.runStore.PutRun(ctx, rec); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	r.rec = rec
	old := r.takeSessions()
	r.mu.Unlock()
	s.stopSessions(old)
	return r.info(), nil
}

// ResumeRun lets a paused run call again; its next calls get fresh sessions. A run that failed
// because its pool host was lost (several hosts on etcd) is re-homed: placed on a live host,
// running again there, with fresh sessions.
func (s *Service) ResumeRun(ctx context.Context, id, tenant string) (*RunInfo, error) {
	r, err := s.lookup(ctx, id, tenant)
	if err != nil {
		return nil, err
	}
	if s.hosts != nil && r.rec.State == StateFailed && r.rec.HostLost != "" {
		return s.rehome(ctx, r.rec)
	}
	r.mu.Lock()
	if r.rec.State != StatePaused {
		st := r.rec.State
		r.mu.Unlock()
		return nil, fmt.Errorf("%w (it is %s)", errRunNotPaused, st)
	}
	rec := r.rec
	rec.State = StateRunning
	if err := s.runStore.PutRun(ctx, rec); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	r.rec = rec
	r.lastActivity = time.Now()
	r.mu.Unlock()
	return r.info(), nil
}

// rehome takes a run whose host was lost onto the host placement picks: this one, or the
// request goes there.
func (s *Service) rehome(ctx context.Context, lost store.Run) (*RunInfo, error) {
	if host, err := s.place(ctx); err != nil {
		return nil, err
	} else if host != "" {
		return nil, &elsewhereError{host: host}
	}
	key := keyOf(lost)
	s.runs.mu.Lock()
	if s.runs.count >= s.cfg.MaxRuns {
		s.runs.mu.Unlock()
		return nil, errTooManyRuns
	}
	if _, ok := s.runs.byKey[key]; ok || s.runs.starting[key] {
		s.runs.mu.Unlock()
		return nil, fmt.Errorf("%w (it is being resumed)", errRunNotPaused)
	}
	s.runs.starting[key] = true
	s.runs.count++
	s.runs.mu.Unlock()
	// The run starts afresh here: approvals this host kept from an earlier life of the run
	// (it was here before its host was lost) are not its approvals now.
	err := s.dropStaleApprovals(ctx, lost)
	var rec store.Run
	if err == nil {
		rec, err = s.runStore.UpdateRun(ctx, lost.Tenant, lost.ID, func(cur *store.Run) error {
			if cur.State != StateFailed || cur.HostLost == "" {
				return fmt.Errorf("%w (it is %s)", errRunNotPaused, cur.State)
			}
			cur.State, cur.Host, cur.HostLost, cur.EndReason, cur.EndTime = StateRunning, s.host, "", "", time.Time{}
			return nil
		})
	}
	s.runs.mu.Lock()
	delete(s.runs.starting, key)
	var r *run
	if err != nil {
		s.runs.count--
	} else {
		r = newRun(rec) // no session, no approval: everything starts fresh here
		r.lastActivity = time.Now()
		s.runs.byKey[key] = r
	}
	s.runs.mu.Unlock()
	if err != nil {
		return nil, err
	}
	s.log.Info("re-homed a run whose pool host was lost", "run", rec.ID, "tenant", rec.Tenant, "lost_host", lost.HostLost)
	return r.info(), nil
}

// dropStaleApprovals deletes what this host's file keeps of a run's approvals.
func (s *Service) dropStaleApprovals(ctx context.Context, rec store.Run) error {
	old, err := s.store.RunApprovals(ctx, rec.Tenant, rec.ID)
	if err != nil || len(old) == 0 {
		return err
	}
	ids := make([]string, len(old))
	for i, a := range old {
		ids[i] = a.ID
	}
	return s.store.DeleteApprovals(ctx, rec.Tenant, rec.ID, ids...)
}

// EndRun ends a run as completed or failed and stops its sessions, exactly once.
func (s *Service) EndRun(ctx context.Context, id, tenant, status, reason string) (*RunInfo, error) {
	r, err := s.lookup(ctx, id, tenant)
	if err != nil {
		return nil, err
	}
	if status == "" {
		status = StateCompleted
	}
	if status != StateCompleted && status != StateFailed {
		return nil, fieldError("status", "must be completed or failed, not %q", status)
	}
	return s.end(ctx, r, status, reason)
}

func (s *Service) end(ctx context.Context, r *run, status, reason string) (*RunInfo, error) {
	return s.endWhen(ctx, r, status, func() (string, bool) { return reason, true })
}

// errStillActive: the reaper found the run idle, but a call came in before it could end it.
var errStillActive = errors.New("pool: the run is active again")

// endWhen is end, if when (checked under the run's lock, with the state) still holds; it
// gives the reason too.
func (s *Service) endWhen(ctx context.Context, r *run, status string, when func() (reason string, ok bool)) (*RunInfo, error) {
	r.mu.Lock()
	if r.rec.State == StateCompleted || r.rec.State == StateFailed {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w (it %s at %s): ending it again changes nothing; GetRun (ringfence runs show) tells how it ended",
			errRunEnded, r.rec.State, r.rec.EndTime.Format(time.RFC3339))
	}
	reason, ok := when()
	if !ok {
		r.mu.Unlock()
		return nil, errStillActive
	}
	rec := r.rec
	rec.State, rec.EndReason, rec.EndTime = status, reason, time.Now().UTC()
	rec.Calls, rec.LastActivity = r.calls, r.lastActivity
	if err := s.runStore.PutRun(ctx, rec); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	r.rec = rec
	old := r.takeSessions()
	closed := s.closeApprovals(ctx, r, fmt.Sprintf("the run ended (%s) before it was decided", status))
	r.mu.Unlock()
	s.recordClosed(ctx, r, closed)
	s.stopSessions(old)
	s.dropRunTokens(context.WithoutCancel(ctx), r)
	s.runs.mu.Lock()
	s.runs.count--
	if s.runs.byKey[keyOf(rec)] == r {
		delete(s.runs.byKey, keyOf(rec)) // lookup reads ended runs from the store
	}
	s.runs.mu.Unlock()
	s.endListingWatches(keyOf(rec), errRunEnded)
	s.metrics.runsEnded.WithLabelValues(status).Inc()
	return r.info(), nil
}

// GetRun reports a run.
func (s *Service) GetRun(ctx context.Context, id, tenant string) (*RunInfo, error) {
	r, err := s.lookup(ctx, id, tenant)
	if err != nil {
		return nil, err
	}
	return r.info(), nil
}

// touch restarts a running run's idle clock. A paused run's clock runs from its pause: calls
// refused while it is paused do not hold off pool.paused_run_timeout. Must hold r.mu.
func (r *run) touch() {
	if r.rec.State == StateRunning {
		r.lastActivity = time.Now()
	}
}

// takeSessions detaches every session; the caller stops them outside the lock. Must hold r.mu.
func (r *run) takeSessions() map[string]*session {
	old := r.sessions
	r.sessions = make(map[string]*session)
	return old
}

// restoreRuns loads the runs a previous process hosted: they keep their ids and states, and
// get fresh sessions on their next calls (no process survived the restart).
func (s *Service) restoreRuns(ctx context.Context) error {
	active, err := s.runStore.ActiveRuns(ctx, s.host)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, rec := range active {
		r, err := s.restored(ctx, rec)
		if err != nil {
			return err
		}
		r.lastActivity = now // the idle clock starts at the restart
		s.runs.byKey[keyOf(rec)] = r
		s.runs.count++
	}
	if len(active) > 0 {
		s.log.Info("restored runs from before the restart; their sessions start fresh", "runs", len(active))
	}
	return nil
}

// restored builds the in-memory run of a stored one, with its approvals. Approvals outlive a
// restart: a pending one still holds the run, and expires by its own clock; an approved one
// whose outcome was not stored before the restart stays approved and is never run again.
func (s *Service) restored(ctx context.Context, rec store.Run) (*run, error) {
	r := newRun(rec)
	r.lastActivity = time.Now()
	kept, err := s.store.RunApprovals(ctx, rec.Tenant, rec.ID)
	if err != nil {
		return nil, err
	}
	for i := range kept {
		a := &approvalView{Approval: kept[i]}
		// Their monotonic deadlines start now, not at the reaper's first look.
		if a.State == approvalPending {
			s.pendingLife(a)
		}
		if a.Outcome != nil {
			s.outcomeLife(a)
		}
		r.approvals = append(r.approvals, a)
	}
	sortApprovals(r.approvals)
	return r, nil
}

// reapIdle ends running runs with no call for longer than the idle timeout, and runs paused
// for longer than the paused timeout, until ctx ends. A paused run is waiting for someone (an
// approval), not abandoned: it holds no session, so it gets far longer; its clock starts at
// the pause and again when it resumes.
func (s *Service) reapIdle(ctx context.Context) {
	every := min(s.cfg.RunIdleTimeout/4, 30*time.Second, s.cfg.ApprovalTimeout/4)
	if p := s.cfg.PausedRunTimeout; p > 0 {
		every = min(every, p/4)
	}
	every = max(every, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	var tokensSwept time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if now := time.Now(); now.Sub(tokensSwept) >= tokenSweepEvery {
			s.dropExpiredTokens(ctx, s.now())
			s.oauthLives.prune(s)
			s.signInLives.prune(s)
			tokensSwept = now
		}
		// The host's run list is only copied under its lock: each run is then judged, and
		// ended, under its own lock alone, so a run busy in a slow call holds up no other.
		s.runs.mu.Lock()
		all := slices.Collect(maps.Values(s.runs.byKey))
		s.runs.mu.Unlock()
		for _, r := range all {
			s.expireApprovals(ctx, r)
			expired := func() (string, bool) { return s.abandoned(r, time.Now()) }
			info, err := s.endWhen(ctx, r, StateFailed, expired)
			switch {
			case err == nil:
				s.log.Info("ended an abandoned run", "run", info.Run.ID, "reason", info.Run.EndReason)
			case errors.Is(err, store.ErrNotOwner):
				// Another pool host failed or took it while this one could not renew its
				// lease: it is not this host's to keep.
				s.forgetRun(r)
			}
		}
	}
}

// saveCallCounts stores the call count of each running run whose count moved since its record
// was last written (a run's record is otherwise written only when its state changes), so a
// clean restart shows the count the run had. The writes go together: bbolt commits them in
// shared transactions. A SIGKILL loses the calls counted since the last write; the audit log
// holds every one of them.
func (s *Service) saveCallCounts(ctx context.Context) {
	s.runs.mu.Lock()
	all := slices.Collect(maps.Values(s.runs.byKey))
	s.runs.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range all {
		wg.Go(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.rec.State != StateRunning || r.calls == r.rec.Calls {
				return
			}
			rec := r.rec
			rec.Calls, rec.LastActivity = r.calls, r.lastActivity
			if err := s.runStore.PutRun(ctx, rec); err != nil {
				s.log.Warn("could not store a run's call count; it shows the count of its last state change after the restart", "run", r.id.ID, "err", err)
				return
			}
			r.rec = rec
		})
	}
	wg.Wait()
}

// abandoned says whether run r is abandoned at now, and why: running with no call for longer
// than the idle timeout, or paused for longer than the paused timeout. A run that waits for an
// approval is not idle: its approval expires first (pool.approval_timeout), and its idle clock
// starts again then. Must hold r.mu.
func (s *Service) abandoned(r *run, now time.Time) (string, bool) {
	switch r.rec.State {
	case StateRunning:
		return fmt.Sprintf("idle for more than %s (pool.run_idle_timeout)", s.cfg.RunIdleTimeout),
			r.busy.Load() == 0 && r.pending() == nil && now.Sub(r.lastActivity) > s.cfg.RunIdleTimeout
	case StatePaused:
		return fmt.Sprintf("paused for more than %s (pool.paused_run_timeout)", s.cfg.PausedRunTimeout),
			s.cfg.PausedRunTimeout > 0 && now.Sub(r.lastActivity) > s.cfg.PausedRunTimeout
	}
	return "", false
}

// RunInfo is a run's state for callers.
type RunInfo struct {
	Run          store.Run
	Sessions     []SessionInfo
	LastActivity time.Time
	Calls        int64
	// IgnoredServers are the selected servers StartRun was given that no agent of the graph
	// uses (StartRun's answer only).
	IgnoredServers []string
	// PendingApproval names the approval the run waits for, if any.
	PendingApproval string
}

// SessionInfo is one live session of a run.
type SessionInfo struct {
	ServerRef string
	StartTime time.Time
	ListedAt  time.Time
	Calls     int64
}

func (r *run) info() *RunInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := &RunInfo{Run: r.rec, LastActivity: r.lastActivity, Calls: r.calls}
	if p := r.pending(); p != nil {
		out.PendingApproval = p.ID
	}
	for ref, sess := range r.sessions {
		if !sess.isReady() || sess.err != nil {
			continue
		}
		out.Sessions = append(out.Sessions, SessionInfo{ServerRef: ref, StartTime: sess.start, ListedAt: sess.listedTime(), Calls: sess.calls.Load()})
	}
	return out
}
