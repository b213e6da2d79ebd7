package graph

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate/capability"
)

// GrantsResolver returns a registered server's policy (its grants and tool filter): the
// registry in-process, or its GetServerPolicy RPC. An unregistered ref is an error wrapping
// mcpserver.ErrNotRegistered.
type GrantsResolver interface {
	ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error)
}

// ErrNoGrantsResolver refuses to build a validator that would silently skip the ceiling.
var ErrNoGrantsResolver = errors.New("graph: a validator needs a grants resolver (the registry); " +
	"to validate without a deployment, ask for it explicitly with NewContractOnlyValidator, which skips the floor and the ceiling")

// Validator proves the publish rules for a graph. Build one with NewValidator, or, for callers
// with no deployment to resolve refs against, NewContractOnlyValidator.
type Validator struct {
	grants       GrantsResolver
	contractOnly bool
	allowInline  bool
}

// Option configures a Validator.
type Option func(*Validator)

// AllowInlineMCPServers turns the refusal of inline mcp_servers into a warning (the
// development flag dev.allow_inline_mcp_servers, which production refuses).
func AllowInlineMCPServers(allow bool) Option { return func(v *Validator) { v.allowInline = allow } }

// NewValidator returns a validator that checks every rule, resolving grants with grants. A nil
// resolver is refused: passing nothing must not disarm the ceiling.
func NewValidator(grants GrantsResolver, opts ...Option) (*Validator, error) {
	if isNil(grants) {
		return nil, ErrNoGrantsResolver
	}
	v := &Validator{grants: grants}
	for _, o := range opts {
		o(v)
	}
	return v, nil
}

// NewContractOnlyValidator returns a validator for callers with no registry: the floor and
// the ceiling (and the checks that need the registry: unknown server, excluded tool) are
// skipped, and every result says so in a warning. The agent floor, pins, inline servers and
// structure are still checked.
func NewContractOnlyValidator(opts ...Option) *Validator {
	v := &Validator{contractOnly: true}
	for _, o := range opts {
		o(v)
	}
	return v
}

// ContractOnly reports whether the floor and ceiling are skipped.
func (v *Validator) ContractOnly() bool { return v.contractOnly }

// ContractOnlyWarning is the warning every contract-only result carries.
const ContractOnlyWarning = "contract-only validation: the capability floor and the registry's ceiling were not checked (no grants resolver)"

// Result is every violation and warning of one validation.
type Result struct {
	Violations []Violation
	Warnings   []string
	// Flags holds, by node id, the screen's flags for each pinned mcp_tool node whose stored
	// flags differ from them (stored before the screen changed, or written around it): publish
	// stores these, since a node's flags are the screen's and never the author's. Read only.
	Flags map[string][]discovery.Finding
}

// OK reports whether the graph may be published.
func (r Result) OK() bool { return len(r.Violations) == 0 }

// Validate checks g against every rule and returns all violations at once. It returns an
// error only when a rule cannot be decided: the registry cannot be asked, the context ends,
// or deciding would take the capability comparisons past MaxGlobWork (a *fielderr.Error,
// refused as invalid input). It never returns an error for a violation; each server's
// policy is resolved once per call.
func (v *Validator) Validate(ctx context.Context, g *Graph) (Result, error) {
	res, _, err := v.validate(ctx, g)
	return res, err
}

// validate is Validate, also returning the glob comparison work it spent.
func (v *Validator) validate(ctx context.Context, g *Graph) (Result, int64, error) {
	var res Result
	cc := newCapCache()
	errs, ids := structure(g, cc)
	if len(errs) > 0 {
		for _, err := range errs {
			viol := Violation{Rule: RuleStructure, Message: err.Error()}
			if fe, ok := fielderr.As(err); ok {
				viol.Message = fe.Field + ": " + fe.Problem
			}
			res.Violations = append(res.Violations, viol)
		}
		// The other rules read references structure just refused.
		return res, 0, nil
	}
	ix := newIndex(g, ids)
	servers := make(map[string]*serverState)
	agents := make(map[int32]*agentState)
	w := &globWork{meter: capability.Meter{Limit: MaxGlobWork}}
	var settingsWarns []string

	for i := range g.Nodes {
		n := &g.Nodes[i]
		switch n.Kind {
		case KindAgent:
			viol, warn := CheckInlineServers(n, v.allowInline)
			if viol != nil {
				res.Violations = append(res.Violations, *viol)
			}
			if warn != "" {
				res.Warnings = append(res.Warnings, warn)
			}
			settingsWarns = append(settingsWarns, settingsWarnings(g, ids, n)...)
		case KindMCPTool:
			if err := ctx.Err(); err != nil {
				return Result{}, 0, err
			}
			m := n.MCPTool
			// Structure has parsed every binding, so none is invalid here.
			caps := cc.set(m.CapabilityBindings)
			if viol := CheckPin(n); viol != nil {
				res.Violations = append(res.Violations, *viol)
			}
			viol, flags := CheckDeclaration(n)
			if viol != nil {
				res.Violations = append(res.Violations, *viol)
			}
			if m.SchemaHash != "" && !slices.Equal(flags, m.Flags) {
				if res.Flags == nil {
					res.Flags = make(map[string][]discovery.Finding)
				}
				res.Flags[n.ID] = flags
			}
			if !v.contractOnly {
				if viol := checkFloor(n, caps); viol != nil {
					res.Violations = append(res.Violations, *viol)
				}
				st, err := v.server(ctx, servers, cc, m.ServerRef)
				if err != nil {
					return Result{}, 0, err
				}
				if !st.registered {
					res.Violations = append(res.Violations, *UnknownServer(n))
				} else {
					if viol := CheckToolFilter(n, st.policy); viol != nil {
						res.Violations = append(res.Violations, *viol)
					}
					viol, err := w.ceiling(ctx, st, n, caps)
					if err != nil {
						return Result{}, 0, w.refusal(err, fmt.Sprintf("nodes[%d].mcp_tool.capability_bindings", i),
							fmt.Sprintf("comparing mcp_tool node %q's capabilities with server %q's grants", n.ID, m.ServerRef))
					}
					if viol != nil {
						res.Violations = append(res.Violations, *viol)
					}
				}
			}
			for _, a := range ix.reaching[i] {
				agent := &g.Nodes[a]
				as, ok := agents[a]
				if !ok {
					as = w.newAgentState(g, agent, cc)
					agents[a] = as
				}
				viol, err := w.agentFloor(ctx, g, as, n, caps)
				if err != nil {
					return Result{}, 0, w.refusal(err, "policies",
						fmt.Sprintf("comparing mcp_tool node %q's capabilities with what agent %q holds after the policies that apply to it", n.ID, agent.ID))
				}
				if viol != nil {
					res.Violations = append(res.Violations, *viol)
				}
			}
		}
	}
	if n := len(settingsWarns); n > maxSettingsWarnings {
		settingsWarns = append(settingsWarns[:maxSettingsWarnings:maxSettingsWarnings],
			fmt.Sprintf("and %d more entries of agent settings that match none of the agent's tools", n-maxSettingsWarnings))
	}
	res.Warnings = append(res.Warnings, settingsWarns...)
	if len(res.Flags) > 0 {
		res.Warnings = append(res.Warnings, fmt.Sprintf("the stored flags of %d mcp_tool node(s), %s among them, differ from what the declaration screen finds now; "+
			"publish stores the screen's", len(res.Flags), firstID(g, res.Flags)))
	}
	if v.contractOnly {
		res.Warnings = append(res.Warnings, ContractOnlyWarning)
	}
	return res, w.meter.Spent(), nil
}

// maxSettingsWarnings bounds the warnings about agent settings that match nothing, which a
// version stores.
const maxSettingsWarnings = 50

// firstID names the first node of g, in graph order, that flags lists.
func firstID(g *Graph, flags map[string][]discovery.Finding) string {
	for i := range g.Nodes {
		if _, ok := flags[g.Nodes[i].ID]; ok {
			return fmt.Sprintf("%q", g.Nodes[i].ID)
		}
	}
	return ""
}

type serverState struct {
	registered bool
	policy     mcpserver.Policy
	grants     capability.Set
	// covered remembers, for each capability the ceiling has decided, the first grant that
	// covers it (-1: none).
	covered map[capability.Capability]int
}

func (v *Validator) server(ctx context.Context, cache map[string]*serverState, cc *capCache, ref string) (*serverState, error) {
	if st, ok := cache[ref]; ok {
		return st, nil
	}
	p, err := v.grants.ServerPolicy(ctx, ref)
	st := &serverState{}
	switch {
	case errors.Is(err, mcpserver.ErrNotRegistered):
	case err != nil:
		return nil, fmt.Errorf("graph: read the grants of server %q: %w", ref, err)
	default:
		st.registered, st.policy = true, p
		// Grants were validated when registered; one that does not parse grants nothing.
		st.grants = cc.set(p.Grants)
		st.covered = make(map[capability.Capability]int)
	}
	cache[ref] = st
	return st, nil
}

// isNil reports whether an interface holds nothing or a nil pointer, so a typed nil
// (var r *registry.Service; NewValidator(r)) is refused like an untyped one.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Func, reflect.Slice, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// MaxGlobWork bounds the capability comparisons of one validation, in capability.Meter's
// units (a few nanoseconds each; a comparison costs from 2 to about 3,600). Every other bound
// on a graph is on one list, but the agent floor compares each node capability with each
// revoke entry that applies to an agent reaching the node, and the ceiling with each grant,
// so their product, not any list, sets the work: up to 64 capabilities × 16,384 revoke
// entries per node. At this bound the costliest graphs take 20–40 ms of CPU to validate on
// the shared 2-vCPU machine of docs/benchmarks.md, about what BenchmarkValidate10kNodes
// takes there; a 10,000-node graph in which every node declares its own glob against 40 glob
// revoke entries uses about 60% of it.
const MaxGlobWork = 1 << 23

// errGlobWork stops a validation whose comparisons would pass MaxGlobWork.
var errGlobWork = errors.New("graph: glob work bound")

// globWork meters the capability comparisons of one validation. Verdicts are remembered per
// server and per agent, so a capability many nodes share is decided once. A node whose check
// fails is checked again by the rule that writes its violation, on lists cut to the entries
// that decide it; the meter is charged for that too, so the bound holds for everything the
// validation compares.
type globWork struct {
	meter capability.Meter
	rx    *revokeIndex // built at the first agent
	// steps counts comparisons, to look at the context every so often.
	steps int
}

// ctxEvery is how many comparisons pass between looks at the context: at most a few
// milliseconds of work, so a caller that went away stops the validation promptly.
const ctxEvery = 1024

func (w *globWork) tick(ctx context.Context) error {
	w.steps++
	if w.steps%ctxEvery == 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if w.meter.Exceeded() {
		return errGlobWork
	}
	return nil
}

// refusal turns errGlobWork into the field error a caller gets as INVALID_ARGUMENT: field is
// where the bound was passed and subject what was being compared. Other errors (the
// context's) pass through.
func (w *globWork) refusal(err error, field, subject string) error {
	if !errors.Is(err, errGlobWork) {
		return err
	}
	return fielderr.New(field, "%s took this validation past %d units of capability glob comparison work, the most one validation may spend "+
		"(each node capability is compared with the grants of its server and with every revoke entry that applies to an agent reaching it). "+
		"Use fewer distinct glob scopes, fewer revoke entries, or shorter scopes with fewer wildcards, "+
		"e.g. one fs.read:/srv/** rather than many narrower entries", subject, MaxGlobWork)
}

// ceiling checks caps(n) ⊆ grants(S). Only a failing node is handed to checkCeiling, which
// writes the violation, and with only the grants that cover one of the node's capabilities
// (in their order): they reach the same verdicts as all of them, and the message still lists
// every grant.
func (w *globWork) ceiling(ctx context.Context, st *serverState, n *Node, caps capability.Set) (*Violation, error) {
	all := true
	var covering []int
	for _, c := range caps {
		i, ok := st.covered[c]
		if !ok {
			i = -1
			for j, g := range st.grants {
				if err := w.tick(ctx); err != nil {
					return nil, err
				}
				if w.meter.Covers(g, c) {
					i = j
					break
				}
			}
			st.covered[c] = i
		}
		if i < 0 {
			all = false
		} else {
			covering = append(covering, i)
		}
	}
	if all {
		return nil, nil
	}
	var cut capability.Set
	for _, i := range sortedUnique(covering) {
		cut = append(cut, st.grants[i])
	}
	// checkCeiling decides each capability again, on the cut grants.
	for _, c := range caps {
		for _, g := range cut {
			if err := w.tick(ctx); err != nil {
				return nil, err
			}
			if w.meter.Covers(g, c) {
				break
			}
		}
	}
	if w.meter.Exceeded() {
		return nil, errGlobWork
	}
	return checkCeiling(n, caps, nil, cut, st.policy.Grants), nil
}

// agentState is one agent's side of the agent floor: what effective(g, agent) holds, the
// policies whose revoke entries apply to it, and the verdicts reached so far.
type agentState struct {
	id       string
	held     capability.Set
	policies []int
	verdicts map[capability.Capability]*floorVerdict
}

// revokeIndex holds every policy's revoke entries, parsed once per validation, and which
// policies apply to which agent. An agent's revoke entries are then its policies' ranges, not
// a copy: an agent under 256 policies of 64 entries would copy 16,384, and every agent of a
// graph may be.
type revokeIndex struct {
	entries  []revokeEntry    // every policy's, in policy order
	start    []int            // policy p's are entries[start[p]:start[p+1]]
	everyone []int            // the policies that name no agent, which apply to every one
	named    map[string][]int // agent id → the policies that name it, in order
}

type revokeEntry struct {
	policy int // in g.Policies
	raw    string
	c      capability.Capability
}

func (w *globWork) revokes(g *Graph, cc *capCache) *revokeIndex {
	if w.rx != nil {
		return w.rx
	}
	rx := &revokeIndex{start: make([]int, 0, len(g.Policies)+1), named: make(map[string][]int)}
	for i, p := range g.Policies {
		rx.start = append(rx.start, len(rx.entries))
		for _, raw := range p.Revoke {
			// Structure has parsed every entry; one that does not parse revokes nothing, as in
			// effective.
			if c, err := cc.parse(raw); err == nil {
				rx.entries = append(rx.entries, revokeEntry{policy: i, raw: raw, c: c})
			}
		}
		if len(p.Agents) == 0 {
			rx.everyone = append(rx.everyone, i)
		}
		for _, a := range p.Agents {
			if ps := rx.named[a]; len(ps) == 0 || ps[len(ps)-1] != i {
				rx.named[a] = append(ps, i)
			}
		}
	}
	rx.start = append(rx.start, len(rx.entries))
	w.rx = rx
	return rx
}

// newAgentState reads the agent's bindings and the policies that apply to it, in order:
// effective's lists.
func (w *globWork) newAgentState(g *Graph, agent *Node, cc *capCache) *agentState {
	rx := w.revokes(g, cc)
	as := &agentState{id: agent.ID, held: cc.set(agent.Agent.CapabilityBindings), verdicts: make(map[capability.Capability]*floorVerdict)}
	as.policies = append(append(as.policies, rx.everyone...), rx.named[agent.ID]...)
	slices.Sort(as.policies)
	return as
}

// floorVerdict is the agent floor's verdict on one capability for one agent.
type floorVerdict struct {
	// held is the first binding that covers it and revoked the first revoke entry that takes
	// it away (-1: none).
	held, revoked int
	// revokers holds, for a revoked capability, the first entry of each policy that takes it
	// away, found when a violation first names them.
	revokers []int
	scanned  bool
}

func (v *floorVerdict) ok() bool { return v.held >= 0 && v.revoked < 0 }

// revokeParseWork is what parsing one revoke entry costs in meter units (a parse takes
// about as long as that much comparison work): naming the policies that revoke a capability
// parses their entries.
const revokeParseWork = 64

// agentFloor checks effective(agent) ⊇ caps for node n. Only a failing node is handed to
// checkAgentFloor, which writes the violation, and with the lists cut to what decides it:
// the bindings that cover the node's capabilities and the revoke entries that take them away,
// in their order, and of each policy only those entries. checkAgentFloor reaches the same
// verdicts and names the same policies from them as from the whole lists, since every entry
// left out covers or takes away none of the node's capabilities; but the work of writing each
// violation no longer grows with every revoke entry of the graph.
func (w *globWork) agentFloor(ctx context.Context, g *Graph, as *agentState, n *Node, caps capability.Set) (*Violation, error) {
	all := true
	for _, c := range caps {
		v, err := w.floorVerdict(ctx, as, c)
		if err != nil {
			return nil, err
		}
		all = all && v.ok()
	}
	if all {
		return nil, nil
	}
	var heldIdx, revokedIdx []int
	byPolicy := make(map[int][]int)
	for _, c := range caps {
		v := as.verdicts[c]
		if v.held >= 0 {
			heldIdx = append(heldIdx, v.held)
		}
		if v.held < 0 || v.revoked < 0 {
			continue
		}
		revokedIdx = append(revokedIdx, v.revoked)
		if err := w.findRevokers(ctx, as, c, v); err != nil {
			return nil, err
		}
		for _, e := range v.revokers {
			byPolicy[w.rx.entries[e].policy] = append(byPolicy[w.rx.entries[e].policy], e)
		}
	}
	cut := capability.Effective{}
	for _, i := range sortedUnique(heldIdx) {
		cut.Held = append(cut.Held, as.held[i])
	}
	for _, i := range sortedUnique(revokedIdx) {
		cut.Revoked = append(cut.Revoked, w.rx.entries[i].c)
	}
	policies := make([]int, 0, len(byPolicy))
	for p := range byPolicy {
		policies = append(policies, p)
	}
	slices.Sort(policies)
	cutGraph := *g
	cutGraph.Policies = make([]Policy, 0, len(policies))
	cutRevokes := make([]capability.Set, 0, len(policies))
	for _, p := range policies {
		cp, set := Policy{ID: g.Policies[p].ID}, capability.Set(nil)
		for _, e := range sortedUnique(byPolicy[p]) {
			cp.Revoke = append(cp.Revoke, w.rx.entries[e].raw)
			set = append(set, w.rx.entries[e].c)
		}
		cutGraph.Policies = append(cutGraph.Policies, cp)
		cutRevokes = append(cutRevokes, set)
	}
	if err := w.chargeAgentFloor(ctx, cut, cutRevokes, caps); err != nil {
		return nil, err
	}
	return checkAgentFloor(&cutGraph, as.id, cut, n, caps, nil), nil
}

// chargeAgentFloor makes, metered, the comparisons checkAgentFloor makes on the cut lists:
// each capability decided again; for one that fails, the bindings asked again; for one
// revoked, each policy's entries parsed and compared up to the first that takes it away.
// Mostly the lists are a few entries; the meter bounds them when they are not.
func (w *globWork) chargeAgentFloor(ctx context.Context, cut capability.Effective, policies []capability.Set, caps capability.Set) error {
	covers := func(c capability.Capability) (bool, error) {
		for _, h := range cut.Held {
			if err := w.tick(ctx); err != nil {
				return false, err
			}
			if w.meter.Covers(h, c) {
				return true, nil
			}
		}
		return false, nil
	}
	takenBy := func(revokes capability.Set, c capability.Capability) error {
		for _, r := range revokes {
			if err := w.tick(ctx); err != nil {
				return err
			}
			if w.meter.TakesAway(r, c) {
				return nil
			}
		}
		return nil
	}
	for _, c := range caps {
		held, err := covers(c)
		if err != nil {
			return err
		}
		ok := held
		for _, r := range cut.Revoked {
			if !ok {
				break
			}
			if err := w.tick(ctx); err != nil {
				return err
			}
			ok = !w.meter.TakesAway(r, c)
		}
		if ok {
			continue
		}
		if _, err := covers(c); err != nil {
			return err
		}
		if !held {
			continue
		}
		for _, revokes := range policies {
			w.meter.Charge(int64(len(revokes)) * revokeParseWork)
			if err := takenBy(revokes, c); err != nil {
				return err
			}
		}
	}
	if w.meter.Exceeded() {
		return errGlobWork
	}
	return nil
}

// floorVerdict decides, once per agent, whether it effectively holds c: the first binding
// that covers c, then the first revoke entry of the agent's policies that takes it away.
func (w *globWork) floorVerdict(ctx context.Context, as *agentState, c capability.Capability) (*floorVerdict, error) {
	if v, ok := as.verdicts[c]; ok {
		return v, nil
	}
	v := &floorVerdict{held: -1, revoked: -1}
	for i, h := range as.held {
		if err := w.tick(ctx); err != nil {
			return nil, err
		}
		if w.meter.Covers(h, c) {
			v.held = i
			break
		}
	}
	if v.held >= 0 {
	policies:
		for _, p := range as.policies {
			for i := w.rx.start[p]; i < w.rx.start[p+1]; i++ {
				if err := w.tick(ctx); err != nil {
					return nil, err
				}
				if w.meter.TakesAway(w.rx.entries[i].c, c) {
					v.revoked = i
					break policies
				}
			}
		}
	}
	as.verdicts[c] = v
	return v, nil
}

// findRevokers finds, once per agent and capability, the first entry of each policy that
// takes c away, scanning as the violation's naming of policies does.
func (w *globWork) findRevokers(ctx context.Context, as *agentState, c capability.Capability, v *floorVerdict) error {
	if v.scanned {
		return nil
	}
	for _, p := range as.policies {
		for i := w.rx.start[p]; i < w.rx.start[p+1]; i++ {
			if err := w.tick(ctx); err != nil {
				return err
			}
			if w.meter.TakesAway(w.rx.entries[i].c, c) {
				v.revokers = append(v.revokers, i)
				break
			}
		}
	}
	v.scanned = true
	return nil
}

func sortedUnique(xs []int) []int {
	slices.Sort(xs)
	return slices.Compact(xs)
}
