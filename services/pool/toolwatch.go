package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
)

// Watches of a run's listings across pool hosts. An agent's listing changes on the run's owner
// (tool_search or a connect tool loaded tools, a server said its tools changed); the owner's
// front door tells its sessions tools/list_changed itself (toolsChanged). A front door of
// another host that has sessions of the run holds one WatchAgentTools stream open to the owner
// (one per run, however many sessions: frontdoor.go, follow), and tells its own sessions of each
// change the owner streams. The owner keeps, per stream, the changes it has yet to send,
// merged, so a server that floods list_changed or a peer that reads slowly costs it a bounded
// set, never a queue.

// toolChange is one change of a run's listings: agent is the agent whose listing changed, ""
// for every agent; ref is the server that said its tools changed (or whose sign-in added
// them), "" for tools loaded, or for a change of every agent.
type toolChange struct{ agent, ref string }

// Bounds of the watches a host serves.
const (
	// maxPendingChanges bounds the changes a watch keeps for its stream: past it they merge
	// into one change of every agent, which has the peer read every agent's listing again.
	maxPendingChanges = 64
	// maxRunWatches bounds the watches of one run (each other host holds one at most).
	maxRunWatches = 64
)

var (
	// errRunLeft: the run left this host's memory (it lost its lease, or the run moved).
	errRunLeft = errors.New("pool: the run is no longer this pool host's: look its owner up again")
	// errRunHere: a front door follows a run this host owns; toolsChanged tells its sessions.
	errRunHere = errors.New("pool: the run is this pool host's")
)

// toolWatch is one WatchAgentTools stream this host serves.
type toolWatch struct {
	wake chan struct{} // holds one token while changes wait
	gone chan struct{} // closed when the run ends or leaves this host; why says which
	why  error

	mu      sync.Mutex
	pending map[toolChange]struct{}
}

// add keeps c for the stream, merged with what waits, and wakes the stream.
func (w *toolWatch) add(c toolChange) {
	w.mu.Lock()
	if _, all := w.pending[toolChange{}]; !all {
		if len(w.pending) >= maxPendingChanges {
			clear(w.pending)
			c = toolChange{}
		}
		w.pending[c] = struct{}{}
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// take is what waits, in a stable order, and forgets it.
func (w *toolWatch) take() []*poolinternalv1.AgentToolsChange {
	w.mu.Lock()
	out := make([]*poolinternalv1.AgentToolsChange, 0, len(w.pending))
	for c := range w.pending {
		out = append(out, &poolinternalv1.AgentToolsChange{Agent: c.agent, ServerRef: c.ref})
	}
	clear(w.pending)
	w.mu.Unlock()
	slices.SortFunc(out, func(a, b *poolinternalv1.AgentToolsChange) int {
		return strings.Compare(a.GetAgent()+"\x00"+a.GetServerRef(), b.GetAgent()+"\x00"+b.GetServerRef())
	})
	return out
}

// listingWatches are the watches this host serves, by run.
type listingWatches struct {
	mu    sync.Mutex
	byRun map[runKey]map[*toolWatch]struct{}
	// stopping: the host stops, and serves no more (EndListingWatches).
	stopping bool
}

// watchListings starts a watch of the listings of a run this host owns (WatchAgentTools).
func (s *Service) watchListings(ctx context.Context, tenant, runID string) (*toolWatch, error) {
	if tenant == "" {
		return nil, fieldError("tenant", "is required")
	}
	if runID == "" {
		return nil, fieldError("run_id", "is required")
	}
	r, err := s.lookup(ctx, runID, tenant)
	var e *elsewhereError
	if errors.As(err, &e) {
		return nil, status.Errorf(codes.Unavailable, "pool: run %s is pool host %s's: watch it there", runID, e.host)
	}
	if err != nil {
		return nil, err
	}
	key := runKey{tenant, runID}
	w := &toolWatch{wake: make(chan struct{}, 1), gone: make(chan struct{}), pending: make(map[toolChange]struct{})}
	// Under the runs' lock, so that a run that ends or leaves now either is not found here or
	// ends this watch as it goes (endListingWatches).
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	if s.runs.byKey[key] != r {
		return nil, fmt.Errorf("%w (run %s)", errRunEnded, runID)
	}
	s.toolWatches.mu.Lock()
	defer s.toolWatches.mu.Unlock()
	if s.toolWatches.stopping {
		return nil, errHostStopping
	}
	ws := s.toolWatches.byRun[key]
	if len(ws) >= maxRunWatches {
		return nil, status.Errorf(codes.ResourceExhausted, "pool: run %s has %d listing watches open, the most it may: close one", runID, maxRunWatches)
	}
	if ws == nil {
		ws = make(map[*toolWatch]struct{})
		s.toolWatches.byRun[key] = ws
	}
	ws[w] = struct{}{}
	return w, nil
}

// unwatchListings ends w.
func (s *Service) unwatchListings(key runKey, w *toolWatch) {
	s.toolWatches.mu.Lock()
	defer s.toolWatches.mu.Unlock()
	if ws := s.toolWatches.byRun[key]; ws != nil {
		delete(ws, w)
		if len(ws) == 0 {
			delete(s.toolWatches.byRun, key)
		}
	}
}

// endListingWatches ends the watches of a run that ended (errRunEnded) or left this host's
// memory (errRunLeft).
func (s *Service) endListingWatches(key runKey, why error) {
	s.toolWatches.mu.Lock()
	defer s.toolWatches.mu.Unlock()
	for w := range s.toolWatches.byRun[key] {
		w.why = why
		close(w.gone)
	}
	delete(s.toolWatches.byRun, key)
}

// errHostStopping ends the watches a host serves when it stops.
var errHostStopping = status.Error(codes.Unavailable, "pool: this pool host is stopping: look the run's owner up again")

// EndListingWatches ends every WatchAgentTools stream this host serves, and refuses new ones: it stops (the binary
// calls it as its graceful stop begins, which would wait for them otherwise). The watching
// hosts open them again where the runs are then.
func (s *Service) EndListingWatches() {
	s.toolWatches.mu.Lock()
	s.toolWatches.stopping = true
	keys := slices.Collect(maps.Keys(s.toolWatches.byRun))
	s.toolWatches.mu.Unlock()
	for _, key := range keys {
		s.endListingWatches(key, errHostStopping)
	}
}

// listingChanged hands a change of a run's listings to the watches of the run.
func (s *Service) listingChanged(key runKey, c toolChange) {
	s.toolWatches.mu.Lock()
	defer s.toolWatches.mu.Unlock()
	for w := range s.toolWatches.byRun[key] {
		w.add(c)
	}
}

// servedWatches counts the watches this host serves.
func (s *Service) servedWatches() int {
	s.toolWatches.mu.Lock()
	defer s.toolWatches.mu.Unlock()
	n := 0
	for _, ws := range s.toolWatches.byRun {
		n += len(ws)
	}
	return n
}

// holds says the run is in this host's memory: its own, running or paused.
func (s *Service) holds(key runKey) bool {
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	_, ok := s.runs.byKey[key]
	return ok
}

// followElsewhere holds a WatchAgentTools stream open to the owner of a run another host owns,
// handing changed each change it streams, and a change of every agent once the watch is in
// place (what changed before it was may not have been heard), until ctx or the stream ends.
// It returns errRunHere for a run of this host's, and errRunEnded for one that ended.
func (s *Service) followElsewhere(ctx context.Context, key runKey, changed func(agent, ref string)) error {
	r, err := s.lookup(ctx, key.id, key.tenant)
	var e *elsewhereError
	switch {
	case errors.As(err, &e):
	case err != nil:
		return err
	default:
		r.mu.Lock()
		st := r.rec.State
		r.mu.Unlock()
		if st != StateRunning && st != StatePaused {
			return errRunEnded
		}
		return errRunHere
	}
	h, err := s.hosts.runs.Host(ctx, e.host)
	if err != nil {
		return err
	}
	s.heldWatches.Add(1)
	defer s.heldWatches.Add(-1)
	return s.hosts.peers.WatchAgentTools(ctx, h.Addr, &poolinternalv1.WatchAgentToolsRequest{Tenant: key.tenant, RunId: key.id},
		func(resp *poolinternalv1.WatchAgentToolsResponse) {
			if len(resp.GetChanges()) == 0 {
				changed("", "")
			}
			for _, c := range resp.GetChanges() {
				changed(c.GetAgent(), c.GetServerRef())
			}
		})
}
