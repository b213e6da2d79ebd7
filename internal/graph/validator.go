package graph

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/ringfence/ringfence/internal/capability"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/mcpserver"
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
// error only when a rule cannot be decided (the registry cannot be asked), never for a
// violation; each server's policy is resolved once per call.
func (v *Validator) Validate(ctx context.Context, g *Graph) (Result, error) {
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
		return res, nil
	}
	ix := newIndex(g, ids)
	servers := make(map[string]*serverState)
	effs := make(map[int32]*capability.Effective)

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
		case KindMCPTool:
			if err := ctx.Err(); err != nil {
				return Result{}, err
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
					return Result{}, err
				}
				if !st.registered {
					res.Violations = append(res.Violations, *UnknownServer(n))
				} else {
					if viol := CheckToolFilter(n, st.policy); viol != nil {
						res.Violations = append(res.Violations, *viol)
					}
					if viol := checkCeiling(n, caps, nil, st.grants, st.policy.Grants); viol != nil {
						res.Violations = append(res.Violations, *viol)
					}
				}
			}
			for _, a := range ix.reaching[i] {
				agent := &g.Nodes[a]
				eff, ok := effs[a]
				if !ok {
					e := effective(g, agent.ID, agent.Agent, cc)
					eff = &e
					effs[a] = eff
				}
				if viol := checkAgentFloor(g, agent.ID, *eff, n, caps, nil); viol != nil {
					res.Violations = append(res.Violations, *viol)
				}
			}
		}
	}
	if len(res.Flags) > 0 {
		res.Warnings = append(res.Warnings, fmt.Sprintf("the stored flags of %d mcp_tool node(s), %s among them, differ from what the declaration screen finds now; "+
			"publish stores the screen's", len(res.Flags), firstID(g, res.Flags)))
	}
	if v.contractOnly {
		res.Warnings = append(res.Warnings, ContractOnlyWarning)
	}
	return res, nil
}

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
