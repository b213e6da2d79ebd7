// Package pinned writes pinned mcp_tool nodes into drafts, for tests that publish graphs
// without discovering a server: each declaration is pinned as mcp-import pins it (the real
// hash), so the publisher's checks pass as they would after an import.
package pinned

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
)

// Tool is one declaration to pin: a server's tool with a description and, optionally, its
// annotations as JSON. Its input schema is InputSchema (JSON), or else takes one string, text.
type Tool struct {
	Server, Tool, Description, Annotations, InputSchema string
}

// floor is what every mcp_tool node declares and every agent reaching one holds.
var floor = []string{"process_spawn", "external_api_call"}

// Add appends a pinned mcp_tool node per tool to draft, named and bound from agent as
// <server>__<tool> with a tool edge, and gives the agent the capability floor.
func Add(t testing.TB, draft *publisherv1.Graph, agent string, tools ...Tool) {
	t.Helper()
	var a *publisherv1.AgentNode
	for _, n := range draft.GetNodes() {
		if n.GetId() == agent {
			a = n.GetAgent()
		}
	}
	require.NotNil(t, a, "no agent node %q in the draft", agent)
	for _, f := range floor {
		if !slices.Contains(a.CapabilityBindings, f) {
			a.CapabilityBindings = append(a.CapabilityBindings, f)
		}
	}
	for _, pt := range tools {
		m := &graph.MCPToolNode{ServerRef: pt.Server, ToolName: pt.Tool, Description: pt.Description,
			InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)}
		if pt.InputSchema != "" {
			m.InputSchema = json.RawMessage(pt.InputSchema)
		}
		if pt.Annotations != "" {
			m.Annotations = json.RawMessage(pt.Annotations)
		}
		pin, err := mcpdecl.Hash(m.Declaration())
		require.NoError(t, err)
		id := graph.Namespaced(pt.Server, pt.Tool)
		node := &publisherv1.McpToolNode{ServerRef: pt.Server, ToolName: pt.Tool, Description: pt.Description, SchemaHash: pin,
			CapabilityBindings: floor, InputSchema: structOf(t, m.InputSchema)}
		if pt.Annotations != "" {
			node.Annotations = structOf(t, m.Annotations)
		}
		draft.Nodes = append(draft.Nodes, &publisherv1.Node{Id: id, Kind: graph.KindMCPTool, Data: &publisherv1.Node_McpTool{McpTool: node}})
		draft.Edges = append(draft.Edges, &publisherv1.Edge{From: agent, To: id, Kind: graph.EdgeTool})
		a.ToolBindings = append(a.ToolBindings, &publisherv1.ToolBinding{Name: id, NodeId: id})
	}
}

func structOf(t testing.TB, raw json.RawMessage) *structpb.Struct {
	t.Helper()
	s := &structpb.Struct{}
	require.NoError(t, protojson.Unmarshal(raw, s))
	return s
}
