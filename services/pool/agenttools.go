package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
)

// The agent surface in a run: what an agent's model sees of its tools (internal/agentsurface
// decides), given the registry's policies now, the run's selected servers and the deferred
// tools loaded so far. ListAgentTools answers from it; the per-call gates ask the same
// Surface, so a listing and a call never disagree.

// maxSelectedServers bounds StartRun's selected_servers, as an agent's own setting is bounded.
const maxSelectedServers = graph.MaxSettingEntries

// maxServerName bounds one selected_servers entry (a ref is at most 64 bytes; a longer name is
// merely ignored, but it is echoed back, so it is bounded).
const maxServerName = 128

// errRegistryUnavailable: the registry could not be asked for a server's policy, so no filter
// of the registration's level can be decided; nothing is listed rather than too much.
var errRegistryUnavailable = errors.New("pool: the registry could not be asked for a server's tool filter, so the agent's tools cannot be decided")

// checkSelection bounds StartRun's selected_servers.
func checkSelection(selected []string) error {
	if len(selected) > maxSelectedServers {
		return fieldError("selected_servers", "has %d entries; at most %d", len(selected), maxSelectedServers)
	}
	for i, s := range selected {
		if len(s) > maxServerName {
			return fieldError(fmt.Sprintf("selected_servers[%d]", i), "is %d bytes; a server ref is at most 64", len(s))
		}
	}
	return nil
}

// selection splits the servers a user picked into those some agent of the graph has tools
// of, sorted and distinct, which the run keeps, and the others, which it ignores.
func selection(ix *graph.Index, picked []string) (kept, ignored []string) {
	if len(picked) == 0 {
		return nil, nil
	}
	used := make(map[string]bool)
	g := ix.Graph()
	for i := range g.Nodes {
		a := g.Nodes[i].Agent
		if g.Nodes[i].Kind != graph.KindAgent || a == nil {
			continue
		}
		for _, b := range a.ToolBindings {
			if n, ok := ix.Node(b.NodeID); ok && n.MCPTool != nil {
				used[n.MCPTool.ServerRef] = true
			}
		}
	}
	for _, p := range picked {
		switch {
		case used[p] && !slices.Contains(kept, p):
			kept = append(kept, p)
		case !used[p] && !slices.Contains(ignored, p):
			ignored = append(ignored, p)
		}
	}
	slices.Sort(kept)
	return kept, ignored
}

// ListAgentTools is the listing agent's model sees in one of tenant's runs now. A paused run
// answers too (it is what the run offers once resumed); an ended one offers nothing.
func (s *Service) ListAgentTools(ctx context.Context, runID, tenant, agent string) (*agentsurface.Listing, error) {
	r, err := s.lookup(ctx, runID, tenant)
	if e := s.elsewhereFor(ctx, err); e != nil {
		return s.listElsewhere(ctx, e, runID, tenant, agent)
	}
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	state := r.rec.State
	r.mu.Unlock()
	if state != StateRunning && state != StatePaused {
		return nil, fmt.Errorf("%w (it %s): its agents offer no tools; start a new run", errRunEnded, state)
	}
	surface, err := s.agentSurface(ctx, r, agent)
	if err != nil {
		return nil, err
	}
	l := surface.Listing()
	return &l, nil
}

// agentSurface resolves agent's surface in run r now: the agent as the version defines it,
// the registry's policy of each of its servers (asked now, as the ceiling is: an operator's
// change to a tool_filter holds from the next call), the run's selection and the tools it
// loaded. An unregistered server leaves its tools unknown_server; a registry that cannot be
// asked fails the whole answer.
func (s *Service) agentSurface(ctx context.Context, r *run, agent string) (*agentsurface.Surface, error) {
	a, err := s.surfaceAgent(ctx, r, agent)
	if err != nil {
		return nil, err
	}
	policies, err := s.policies(ctx, a.Servers())
	if err != nil {
		return nil, err
	}
	connections, err := s.connections(ctx, r.id.Tenant, r.id.User, policies)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	st := agentsurface.State{Policies: policies, Selected: r.rec.SelectedServers, Loaded: make(map[string]bool), Connections: connections}
	for _, name := range r.rec.LoadedTools[agent] {
		st.Loaded[name] = true
	}
	r.mu.Unlock()
	return a.Resolve(st), nil
}

// policies asks the registry for the policy of each server of refs: an unregistered server
// has none (its tools are unknown_server); a registry that cannot be asked fails the whole
// answer, so nothing is decided on part of the filters.
func (s *Service) policies(ctx context.Context, refs []string) (map[string]mcpserver.Policy, error) {
	policies := make(map[string]mcpserver.Policy, len(refs))
	for _, ref := range refs {
		p, err := s.cfg.Registry.ServerPolicy(ctx, ref)
		switch {
		case errors.Is(err, mcpserver.ErrNotRegistered):
			continue
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, fmt.Errorf("%w (server %q): %v", errRegistryUnavailable, ref, err)
		}
		policies[ref] = p
	}
	return policies, nil
}

// surfaceAgent reads agent from the run's version once per run. It is read outside the run's
// lock (converting a thousand schemas to strict form takes a while, and the run's calls take
// that lock); two first readers both read it, and the first kept wins.
func (s *Service) surfaceAgent(ctx context.Context, r *run, agent string) (*agentsurface.Agent, error) {
	if err := s.load(ctx, r); err != nil {
		return nil, err
	}
	r.mu.Lock()
	a, ok := r.surfaces[agent]
	r.mu.Unlock()
	if ok {
		return a, nil
	}
	a, err := agentsurface.ForAgent(r.index, agent)
	if err != nil {
		return nil, fmt.Errorf("%w: graph %s v%d has no agent node %q (its agents: %s)", errUnknownAgent, r.id.GraphID, r.id.Version, agent, listed(r.index.AgentIDs()))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if kept, ok := r.surfaces[agent]; ok {
		return kept, nil
	}
	r.surfaces[agent] = a
	return a, nil
}

// errUnknownAgent: the run's graph has no such agent.
var errUnknownAgent = errors.New("pool: no such agent")

// loadTools records that tool_search loaded names (binding names of agent's deferred tools,
// as Surface.Search returned them) for the rest of run r: durably first, so a restarted pool
// keeps them, then in memory. Names already loaded are skipped; an ended run loads nothing.
func (s *Service) loadTools(ctx context.Context, r *run, agent string, names []string) error {
	changed, err := s.storeLoaded(ctx, r, agent, names)
	if changed {
		s.toolsChanged(r.id, agent, "")
	}
	return err
}

// storeLoaded is loadTools's change of the run's record; changed says it loaded a tool the
// agent did not have.
func (s *Service) storeLoaded(ctx context.Context, r *run, agent string, names []string) (changed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.rec.State; st != StateRunning && st != StatePaused {
		return false, fmt.Errorf("%w (it %s): start a new run", errRunEnded, st)
	}
	have := r.rec.LoadedTools[agent]
	next := slices.Clone(have)
	for _, n := range names {
		if !slices.Contains(next, n) {
			next = append(next, n)
		}
	}
	if len(next) == len(have) {
		return false, nil
	}
	slices.Sort(next)
	rec := r.rec
	rec.LoadedTools = maps.Clone(rec.LoadedTools)
	if rec.LoadedTools == nil {
		rec.LoadedTools = make(map[string][]string)
	}
	rec.LoadedTools[agent] = next
	rec.Calls, rec.LastActivity = r.calls, r.lastActivity
	if err := s.runStore.PutRun(ctx, rec); err != nil {
		return false, err
	}
	r.rec = rec
	return true, nil
}
