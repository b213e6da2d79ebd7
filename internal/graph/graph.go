// Package graph is the domain model of an agent graph and the rules it must satisfy: its shape
// (ids, references, edges, bindings, bounds), what an agent effectively holds once the graph's
// policies have narrowed it, the capability rules publish proves, and that every pinned tool
// declaration passes the declaration screen (declaration.go). The publisher validates
// drafts with it; the pool reuses the same rule functions at run time against live grants, so
// publish and the run-time gates read the required set from the same place.
package graph

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/ringfence/ringfence/internal/discovery"
)

// Node kinds with a typed payload; every other kind is carried opaquely.
const (
	KindAgent   = "agent"
	KindMCPTool = "mcp_tool"
)

// EdgeTool is the edge kind by which an agent reaches a tool node.
const EdgeTool = "tool"

// Capability modes. In advisory mode the run-time agent floor is recorded rather than
// enforced; the ceiling is enforced in both, and publish applies every rule in both.
const (
	ModeEnforce  = "enforce"
	ModeAdvisory = "advisory"
)

// Graph is an agent graph: a tenant's draft, or the snapshot inside a published version.
// ErrNotPublished is wrapped by every "no such published version" answer (a missing graph,
// version or tenant), so the pool can tell it from an unreachable publisher.
var ErrNotPublished = errors.New("graph: no such published version")

type Graph struct {
	ID             string    `json:"id"`
	Tenant         string    `json:"tenant"`
	CapabilityMode string    `json:"capability_mode"`
	Nodes          []Node    `json:"nodes"`
	Edges          []Edge    `json:"edges"`
	Policies       []Policy  `json:"policies,omitempty"`
	Revision       int64     `json:"revision"`
	UpdateTime     time.Time `json:"update_time"`
}

// Node is one vertex; Kind says which payload is set.
type Node struct {
	ID      string       `json:"id"`
	Kind    string       `json:"kind"`
	Agent   *AgentNode   `json:"agent,omitempty"`
	MCPTool *MCPToolNode `json:"mcp_tool,omitempty"`
	// Opaque is the JSON object of a kind this package does not interpret.
	Opaque json.RawMessage `json:"opaque,omitempty"`
}

// AgentNode is an agent: what it holds and the tools it calls.
type AgentNode struct {
	CapabilityBindings []string      `json:"capability_bindings,omitempty"`
	ToolBindings       []ToolBinding `json:"tool_bindings,omitempty"`
	// MCPServers is the deprecated inline path: author-chosen binaries with no ceiling.
	MCPServers []InlineMCPServer `json:"mcp_servers,omitempty"`
	// ToolSettings decide which of its tools the agent's model sees, which load on demand and
	// which ask the user first (settings.go). Embedded, so its fields sit in the agent's JSON
	// under the seed's names.
	ToolSettings
}

// ToolBinding gives the model the name it calls a tool node by.
type ToolBinding struct {
	Name   string `json:"name"`
	NodeID string `json:"node_id"`
	// Confirmation is the tool's own rule, ConfirmAlways or ConfirmNever, which wins over the
	// agent's confirmation_default; empty leaves the default to decide.
	Confirmation string `json:"confirmation,omitempty"`
}

// InlineMCPServer is a server written directly onto an agent node (deprecated).
type InlineMCPServer struct {
	Name    string            `json:"name"`
	Command string            `json:"command"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
}

// MCPToolNode is one tool of a registered server with its declaration as pinned at import.
// The declaration fields are the server's raw JSON; SchemaHash covers exactly them.
type MCPToolNode struct {
	ServerRef    string          `json:"server_ref"`
	ToolName     string          `json:"tool_name"`
	Title        string          `json:"title,omitempty"`
	Description  string          `json:"description,omitempty"`
	InputSchema  json.RawMessage `json:"input_schema,omitempty"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	Annotations  json.RawMessage `json:"annotations,omitempty"`
	SchemaHash   string          `json:"schema_hash,omitempty"`
	// CapabilityBindings are what the node declares it needs: caps(M).
	CapabilityBindings []string `json:"capability_bindings,omitempty"`
	// Flags are the declaration screen's heuristic findings, kept for reviewers.
	Flags []discovery.Finding `json:"flags,omitempty"`
}

// Edge connects two nodes.
type Edge struct {
	From string `json:"from"`
	To   string `json:"to"`
	Kind string `json:"kind"`
}

// Policy takes capabilities away from agents.
type Policy struct {
	ID string `json:"id"`
	// Agents are the agent node ids it applies to; empty applies to every agent.
	Agents []string `json:"agents,omitempty"`
	Revoke []string `json:"revoke"`
}

// AppliesTo reports whether the policy narrows agentID.
func (p Policy) AppliesTo(agentID string) bool {
	if len(p.Agents) == 0 {
		return true
	}
	for _, a := range p.Agents {
		if a == agentID {
			return true
		}
	}
	return false
}

// Version is a published, immutable version of a graph.
type Version struct {
	GraphID     string    `json:"graph_id"`
	Tenant      string    `json:"tenant"`
	Version     int64     `json:"version"`
	Graph       *Graph    `json:"graph,omitempty"`
	PublishTime time.Time `json:"publish_time"`
	PublishedBy string    `json:"published_by"`
	Warnings    []string  `json:"warnings,omitempty"`
}

// Mode returns the capability mode, defaulted to enforce.
func (g *Graph) Mode() string {
	if g.CapabilityMode == "" {
		return ModeEnforce
	}
	return g.CapabilityMode
}

// Node returns the node with id. It scans; build an Index for repeated lookups.
func (g *Graph) Node(id string) (*Node, bool) {
	for i := range g.Nodes {
		if g.Nodes[i].ID == id {
			return &g.Nodes[i], true
		}
	}
	return nil, false
}

// Agent returns the agent node with id.
func (g *Graph) Agent(id string) (*AgentNode, bool) {
	n, ok := g.Node(id)
	if !ok || n.Kind != KindAgent || n.Agent == nil {
		return nil, false
	}
	return n.Agent, true
}

// FindMCPTool returns the mcp_tool node pinning (serverRef, toolName): the key a re-import
// updates in place.
func (g *Graph) FindMCPTool(serverRef, toolName string) (*Node, bool) {
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Kind == KindMCPTool && n.MCPTool != nil && n.MCPTool.ServerRef == serverRef && n.MCPTool.ToolName == toolName {
			return n, true
		}
	}
	return nil, false
}

// Index answers the lookups a validation or a run makes repeatedly, in constant time. It reads
// the graph it was built from, which must not change while the index is in use; it is safe
// for concurrent reads.
type Index struct {
	g     *Graph
	nodes map[string]int
	// bindings maps agent id → binding name → node id.
	bindings map[string]map[string]string
	// reaching[i] lists the indexes of the agents that bind node i or have a tool edge to it,
	// in graph order.
	reaching [][]int32
}

// NewIndex indexes g.
func NewIndex(g *Graph) *Index {
	nodes := make(map[string]int, len(g.Nodes))
	for i := range g.Nodes {
		if _, dup := nodes[g.Nodes[i].ID]; !dup {
			nodes[g.Nodes[i].ID] = i
		}
	}
	ix := newIndex(g, nodes)
	ix.bindings = make(map[string]map[string]string)
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Kind != KindAgent || n.Agent == nil || ix.nodes[n.ID] != i {
			continue
		}
		names := make(map[string]string, len(n.Agent.ToolBindings))
		for _, b := range n.Agent.ToolBindings {
			if _, dup := names[b.Name]; !dup {
				names[b.Name] = b.NodeID
			}
		}
		ix.bindings[n.ID] = names
	}
	return ix
}

// newIndex builds what the validator needs from an id map it already has: which agents reach
// which node. Integer slices instead of maps keep a 10,000-node graph cheap.
func newIndex(g *Graph, nodes map[string]int) *Index {
	ix := &Index{g: g, nodes: nodes, reaching: make([][]int32, len(g.Nodes))}
	edgesFrom := make([][]int32, len(g.Nodes))
	for _, e := range g.Edges {
		if e.Kind != EdgeTool {
			continue
		}
		from, ok1 := nodes[e.From]
		to, ok2 := nodes[e.To]
		if ok1 && ok2 {
			edgesFrom[from] = append(edgesFrom[from], int32(to))
		}
	}
	// mark[n] == a+1 when agent a has already been recorded as reaching node n.
	mark := make([]int32, len(g.Nodes))
	for a := range g.Nodes {
		n := &g.Nodes[a]
		if n.Kind != KindAgent || n.Agent == nil || nodes[n.ID] != a {
			continue
		}
		reach := func(to int) {
			if mark[to] != int32(a+1) {
				mark[to] = int32(a + 1)
				ix.reaching[to] = append(ix.reaching[to], int32(a))
			}
		}
		for _, b := range n.Agent.ToolBindings {
			if to, ok := nodes[b.NodeID]; ok {
				reach(to)
			}
		}
		for _, to := range edgesFrom[a] {
			reach(int(to))
		}
	}
	return ix
}

// Graph returns the indexed graph.
func (ix *Index) Graph() *Graph { return ix.g }

// Node returns the node with id.
func (ix *Index) Node(id string) (*Node, bool) {
	i, ok := ix.nodes[id]
	if !ok {
		return nil, false
	}
	return &ix.g.Nodes[i], true
}

// Agent returns the agent node with id.
func (ix *Index) Agent(id string) (*AgentNode, bool) {
	n, ok := ix.Node(id)
	if !ok || n.Kind != KindAgent || n.Agent == nil {
		return nil, false
	}
	return n.Agent, true
}

// BoundTool returns the node an agent calls by name: what the run-time gate resolves a
// model's tool call to.
func (ix *Index) BoundTool(agentID, name string) (*Node, bool) {
	id, ok := ix.bindings[agentID][name]
	if !ok {
		return nil, false
	}
	return ix.Node(id)
}

// AgentIDs returns the ids of the graph's agent nodes, sorted: what an unknown agent's error
// lists.
func (ix *Index) AgentIDs() []string {
	var out []string
	for i := range ix.g.Nodes {
		if n := &ix.g.Nodes[i]; n.Kind == KindAgent && n.Agent != nil {
			out = append(out, n.ID)
		}
	}
	slices.Sort(out)
	return out
}

// BindingNames returns the names an agent binds tools by, sorted.
func (ix *Index) BindingNames(agentID string) []string {
	return slices.Sorted(maps.Keys(ix.bindings[agentID]))
}

// AgentsReaching returns the ids of the agents that bind node id or have a tool edge to it.
func (ix *Index) AgentsReaching(id string) []string {
	i, ok := ix.nodes[id]
	if !ok {
		return nil
	}
	out := make([]string, len(ix.reaching[i]))
	for k, a := range ix.reaching[i] {
		out[k] = ix.g.Nodes[a].ID
	}
	return out
}
