package graph

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate/capability"
)

// Rules a graph can break, as named in violations.
const (
	RuleStructure        = "structure"
	RuleFloor            = "floor"
	RuleCeiling          = "ceiling"
	RuleAgentFloor       = "agent_floor"
	RuleInlineMCPServers = "inline_mcp_servers"
	RuleUnknownServer    = "unknown_server"
	RuleExcludedTool     = "excluded_tool"
	RuleMissingPin       = "missing_pin"
	RuleDeclaration      = "declaration"
)

// Violation is one broken rule: its subject (a node, and for the agent floor the agent), the
// capabilities it is about, and a message that names the fix for that subject.
type Violation struct {
	Rule      string `json:"rule"`
	NodeID    string `json:"node_id,omitempty"`
	AgentID   string `json:"agent_id,omitempty"`
	ServerRef string `json:"server_ref,omitempty"`
	// Missing are capabilities the subject should hold (floor, agent floor).
	Missing []string `json:"missing,omitempty"`
	// Excess are capabilities the node declares beyond the server's grants (ceiling).
	Excess  []string `json:"excess,omitempty"`
	Message string   `json:"message"`
}

func (v *Violation) Error() string { return "graph: " + v.Rule + ": " + v.Message }

var floorSet = capability.MustParseSet(capability.Floor)

// CheckFloor checks caps(M) ⊇ {process_spawn, external_api_call} for an mcp_tool node: reaching
// a server spawns a process that then calls out, whatever the node says. Without the floor,
// declaring nothing would be the cheapest way past the ceiling.
func CheckFloor(n *Node) *Violation {
	if n.MCPTool == nil {
		return nil
	}
	caps, _ := parseLenient(n.MCPTool.CapabilityBindings)
	return checkFloor(n, caps)
}

func checkFloor(n *Node, caps capability.Set) *Violation {
	var missing []string
	for _, f := range floorSet {
		if !caps.Covers(f) {
			missing = append(missing, f.String())
		}
	}
	if len(missing) == 0 {
		return nil
	}
	m := n.MCPTool
	return &Violation{
		Rule: RuleFloor, NodeID: n.ID, ServerRef: m.ServerRef, Missing: missing,
		Message: fmt.Sprintf("mcp_tool node %q (tool %q of server %q) does not declare %s: every mcp_tool node needs "+
			"process_spawn and external_api_call, because an MCP tool runs code outside Ringfence (a stdio server's process, or a remote server's on its own host) that reaches outside systems. "+
			"Add %s to the node's capability_bindings (ringfence mcp-import writes both)",
			n.ID, m.ToolName, m.ServerRef, strings.Join(missing, " and "), strings.Join(missing, " and ")),
	}
}

// CheckCeiling checks caps(M) ⊆ grants(S) for an mcp_tool node against its server's policy.
// The node is the subject, never an agent: an agent holds capabilities for everything else it
// does, and comparing those against the grants would push operators to widen them until they
// meant nothing. Empty grants deny every node.
func CheckCeiling(n *Node, p mcpserver.Policy) *Violation {
	if n.MCPTool == nil {
		return nil
	}
	caps, invalid := parseLenient(n.MCPTool.CapabilityBindings)
	grants, _ := parseLenient(p.Grants)
	return checkCeiling(n, caps, invalid, grants, p.Grants)
}

func checkCeiling(n *Node, caps capability.Set, invalid []string, grants capability.Set, grantsRaw []string) *Violation {
	var excess []string
	for _, c := range caps {
		if !grants.Covers(c) && !containsString(excess, c.String()) {
			excess = append(excess, c.String())
		}
	}
	// An entry that does not parse cannot be covered: fail closed.
	excess = append(excess, invalid...)
	if len(excess) == 0 {
		return nil
	}
	m := n.MCPTool
	var granted string
	if len(grantsRaw) == 0 {
		granted = fmt.Sprintf("server %q grants nothing (grants: [] is the default, and it denies every node that references the server)", m.ServerRef)
	} else {
		granted = fmt.Sprintf("server %q does not grant it (it grants %s)", m.ServerRef, strings.Join(grantsRaw, ", "))
	}
	// The floor cannot be removed from a node (the floor rule demands it), so only a grant
	// fixes an excess floor capability; anything else the author may also drop.
	var floor, other []string
	for _, c := range excess {
		if slices.Contains(capability.Floor, c) {
			floor = append(floor, c)
		} else {
			other = append(other, c)
		}
	}
	// update replaces the grants: the suggested command lists every one to keep, less
	// near-misses of the floor, and the floor.
	var flags []string
	for _, g := range append(append([]string(nil), grantsRaw...), floor...) {
		if _, typo := capability.NearFloor(g); !typo && !slices.Contains(flags, "--grant "+g) {
			flags = append(flags, "--grant "+g)
		}
	}
	var fix string
	switch {
	case len(floor) == 0:
		fix = fmt.Sprintf("Remove %s from the node's capability_bindings, or ask an operator of server %q to grant it", strings.Join(other, ", "), m.ServerRef)
	case len(other) == 0:
		fix = fmt.Sprintf("%s is the floor every mcp_tool node must declare, so only a grant fixes this: ask an operator of server %q to grant it (ringfence servers update %s %s)", strings.Join(floor, " and "), m.ServerRef, m.ServerRef, strings.Join(flags, " "))
	default:
		fix = fmt.Sprintf("Remove %s from the node's capability_bindings or have it granted; %s is the floor every mcp_tool node must declare, so only a grant fixes that: ask an operator of server %q", strings.Join(other, ", "), strings.Join(floor, " and "), m.ServerRef)
	}
	return &Violation{
		Rule: RuleCeiling, NodeID: n.ID, ServerRef: m.ServerRef, Excess: excess,
		Message: fmt.Sprintf("mcp_tool node %q declares %s, but %s. %s", n.ID, strings.Join(excess, ", "), granted, fix),
	}
}

// CheckToolFilter checks that the server's tool filter still lets the node's tool through.
func CheckToolFilter(n *Node, p mcpserver.Policy) *Violation {
	m := n.MCPTool
	if m == nil || p.Filter.Allows(m.ToolName) {
		return nil
	}
	return &Violation{
		Rule: RuleExcludedTool, NodeID: n.ID, ServerRef: m.ServerRef,
		Message: fmt.Sprintf("server %q's tool_filter excludes tool %q, which mcp_tool node %q pins. "+
			"Remove the node and the bindings to it, or ask an operator of server %q to change the filter",
			m.ServerRef, m.ToolName, n.ID, m.ServerRef),
	}
}

// UnknownServer is the violation of an mcp_tool node whose server is not registered.
func UnknownServer(n *Node) *Violation {
	m := n.MCPTool
	return &Violation{
		Rule: RuleUnknownServer, NodeID: n.ID, ServerRef: m.ServerRef,
		Message: fmt.Sprintf("mcp_tool node %q references server %q, which is not registered. "+
			"Ask an operator to register it, or remove the node", n.ID, m.ServerRef),
	}
}

// CheckPin checks that an mcp_tool node carries a pin: an unpinned declaration could be
// anything at run time.
func CheckPin(n *Node) *Violation {
	m := n.MCPTool
	if m == nil || m.SchemaHash != "" {
		return nil
	}
	return &Violation{
		Rule: RuleMissingPin, NodeID: n.ID, ServerRef: m.ServerRef,
		Message: fmt.Sprintf("mcp_tool node %q has no schema_hash, so nothing pins its declaration. "+
			"Import the tool (ringfence mcp-import --server %s --tool %s) instead of writing the node by hand",
			n.ID, m.ServerRef, m.ToolName),
	}
}

// Effective returns what agentID effectively holds: its capability bindings minus the revoke
// entries of every policy that applies to it.
func Effective(g *Graph, agentID string) (capability.Effective, error) {
	a, ok := g.Agent(agentID)
	if !ok {
		return capability.Effective{}, fielderr.New("agent", "%s is not an agent node of graph %q", fielderr.Quote(agentID), g.ID)
	}
	return effective(g, agentID, a, nil), nil
}

func effective(g *Graph, agentID string, a *AgentNode, cc *capCache) capability.Effective {
	if cc == nil {
		cc = newCapCache()
	}
	eff := capability.Effective{Held: cc.set(a.CapabilityBindings)}
	for _, p := range g.Policies {
		if p.AppliesTo(agentID) {
			eff.Revoked = append(eff.Revoked, cc.set(p.Revoke)...)
		}
	}
	return eff
}

// CheckAgentFloor checks effective(A) ⊇ caps(M) for an agent that binds or has a tool edge to
// node M: an agent granted nothing must not reach a server through a node that declares the
// floor.
func CheckAgentFloor(g *Graph, agentID string, n *Node) *Violation {
	eff, err := Effective(g, agentID)
	if err != nil {
		return &Violation{Rule: RuleAgentFloor, NodeID: n.ID, AgentID: agentID, Message: err.Error()}
	}
	return CheckAgentFloorWith(g, agentID, eff, n)
}

// CheckAgentFloorWith is CheckAgentFloor with the agent's effective set already computed (a
// run computes it once per agent). g names the revoking policies in the message.
func CheckAgentFloorWith(g *Graph, agentID string, eff capability.Effective, n *Node) *Violation {
	if n.MCPTool == nil {
		return nil
	}
	caps, invalid := parseLenient(n.MCPTool.CapabilityBindings)
	return checkAgentFloor(g, agentID, eff, n, caps, invalid)
}

func checkAgentFloor(g *Graph, agentID string, eff capability.Effective, n *Node, caps capability.Set, invalid []string) *Violation {
	var unbound, revoked []string
	var policies []string
	for _, c := range caps {
		if eff.Covers(c) {
			continue
		}
		s := c.String()
		if !eff.Held.Covers(c) {
			if !containsString(unbound, s) {
				unbound = append(unbound, s)
			}
			continue
		}
		if !containsString(revoked, s) {
			revoked = append(revoked, s)
		}
		for _, id := range revokingPolicies(g, agentID, c) {
			if !containsString(policies, id) {
				policies = append(policies, id)
			}
		}
	}
	unbound = append(unbound, invalid...)
	if len(unbound) == 0 && len(revoked) == 0 {
		return nil
	}
	missing := append(append([]string(nil), unbound...), revoked...)
	var fixes []string
	if len(unbound) > 0 {
		fixes = append(fixes, fmt.Sprintf("add %s to agent %q's capability_bindings", strings.Join(unbound, ", "), agentID))
	}
	if len(revoked) > 0 {
		fixes = append(fixes, fmt.Sprintf("change policy %s, which revokes %s from the agent", strings.Join(policies, ", "), strings.Join(revoked, ", ")))
	}
	return &Violation{
		Rule: RuleAgentFloor, NodeID: n.ID, AgentID: agentID, ServerRef: n.MCPTool.ServerRef, Missing: missing,
		Message: fmt.Sprintf("agent %q reaches mcp_tool node %q but does not effectively hold %s. To fix it, %s, "+
			"or stop binding the tool from this agent. This rule is about what the agent holds; the server's grants play no part in it",
			agentID, n.ID, strings.Join(missing, ", "), strings.Join(fixes, " and ")),
	}
}

func revokingPolicies(g *Graph, agentID string, c capability.Capability) []string {
	var out []string
	for _, p := range g.Policies {
		if !p.AppliesTo(agentID) {
			continue
		}
		revoke, _ := parseLenient(p.Revoke)
		for _, r := range revoke {
			if capability.TakesAway(r, c) {
				out = append(out, fmt.Sprintf("%q", p.ID))
				break
			}
		}
	}
	return out
}

// CheckInlineServers reports an agent's deprecated inline mcp_servers: refused, or, with the
// development flag, a warning that says what is lost.
func CheckInlineServers(n *Node, allow bool) (*Violation, string) {
	if n.Agent == nil || len(n.Agent.MCPServers) == 0 {
		return nil, ""
	}
	names := make([]string, len(n.Agent.MCPServers))
	for i, s := range n.Agent.MCPServers {
		names[i] = s.Name
	}
	list := strings.Join(names, ", ")
	if allow {
		return nil, fmt.Sprintf("agent %q declares inline mcp_servers (%s), allowed only because dev.allow_inline_mcp_servers is set: "+
			"inline servers have no ceiling (no registry row, no grants), run author-chosen commands, and nothing about their tools is pinned. "+
			"Migrate them: register each server with an operator, run ringfence mcp-import, then delete the inline entry", n.ID, list)
	}
	return &Violation{
		Rule: RuleInlineMCPServers, NodeID: n.ID, AgentID: n.ID,
		Message: fmt.Sprintf("agent %q declares inline mcp_servers (%s), which are refused: an inline server has no registry row, "+
			"so no ceiling applies to it and none of its tools is pinned. Register each server with an operator, "+
			"run ringfence mcp-import, then delete the inline entry", n.ID, list),
	}, ""
}

// parseLenient parses what it can; entries that do not parse are returned apart, so a rule
// can fail closed on them.
func parseLenient(ss []string) (capability.Set, []string) {
	set := make(capability.Set, 0, len(ss))
	var invalid []string
	for _, s := range ss {
		c, err := capability.Parse(s)
		if err != nil {
			invalid = append(invalid, clip(s))
			continue
		}
		set = append(set, c)
	}
	return set, invalid
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// Stranded is a published version whose tools of one server declare capabilities the server
// does not grant: the ceiling refuses their calls at run time. Excess lists what is not
// granted.
type Stranded struct {
	Tenant, GraphID string
	Version         int64
	Excess          []string
}

// StrandedBy reports whether v's tools of server ref declare capabilities grants do not
// cover, and which (the ceiling's excess, over every such node).
func StrandedBy(v *Version, ref string, grants []string) (Stranded, bool) {
	st := Stranded{Tenant: v.Tenant, GraphID: v.GraphID, Version: v.Version}
	for i := range v.Graph.Nodes {
		n := &v.Graph.Nodes[i]
		if n.MCPTool == nil || n.MCPTool.ServerRef != ref {
			continue
		}
		if viol := CheckCeiling(n, mcpserver.Policy{Grants: grants}); viol != nil {
			for _, e := range viol.Excess {
				if !containsString(st.Excess, e) {
					st.Excess = append(st.Excess, e)
				}
			}
		}
	}
	return st, len(st.Excess) > 0
}
