package graph

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/mcpserver"
)

// Generated is a publishable graph of n nodes: one agent per 100 nodes, each binding (and
// with a tool edge to) the 99 mcp_tool nodes after it, spread over 20 servers, with two
// policies. Shared with the publisher's benchmarks through the test helper below.
func generated(tb testing.TB, n int) (*Graph, *fakeGrants) {
	tb.Helper()
	g := &Graph{ID: "bench", Tenant: "default", Policies: []Policy{
		{ID: "no-etc", Revoke: []string{"fs.read:/etc/**"}},
		{ID: "no-mail", Revoke: []string{"email.send"}},
	}}
	r := &fakeGrants{policies: map[string]mcpserver.Policy{}}
	schema := json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","description":"Path of the file to read, relative to the root."},"encoding":{"type":"string","enum":["utf-8","latin-1"]},"max_bytes":{"type":"integer","minimum":1}},"required":["path"]}`)
	var agent *AgentNode
	var agentID string
	for i := 0; i < n; i++ {
		if i%100 == 0 {
			agentID = fmt.Sprintf("agent-%d", i/100)
			g.Nodes = append(g.Nodes, Node{ID: agentID, Kind: KindAgent, Agent: &AgentNode{
				CapabilityBindings: []string{"process_spawn", "external_api_call", "fs.read"},
			}})
			agent = g.Nodes[len(g.Nodes)-1].Agent
			continue
		}
		ref := fmt.Sprintf("server-%d", i%20)
		tool := fmt.Sprintf("tool_%05d", i)
		id := ref + "__" + tool
		m := &MCPToolNode{
			ServerRef: ref, ToolName: tool, Description: "Read the complete contents of a file from the file system as text.",
			InputSchema: schema, CapabilityBindings: []string{"process_spawn", "external_api_call"},
			SchemaHash: "v1:sha256:" + fmt.Sprintf("%064x", i),
		}
		g.Nodes = append(g.Nodes, Node{ID: id, Kind: KindMCPTool, MCPTool: m})
		agent.ToolBindings = append(agent.ToolBindings, ToolBinding{Name: id, NodeID: id})
		g.Edges = append(g.Edges, Edge{From: agentID, To: id, Kind: EdgeTool})
	}
	for s := 0; s < 20; s++ {
		ref := fmt.Sprintf("server-%d", s)
		r.policies[ref] = mcpserver.Policy{Ref: ref, Grants: []string{"process_spawn", "external_api_call", "fs.read:/srv/**"}}
	}
	return g, r
}

func BenchmarkValidate10kNodes(b *testing.B) {
	g, r := generated(b, 10000)
	require.Len(b, g.Nodes, 10000)
	v, err := NewValidator(r)
	require.NoError(b, err)
	res, err := v.Validate(b.Context(), g)
	require.NoError(b, err)
	require.True(b, res.OK(), "%+v", res.Violations)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Validate(b.Context(), g); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValidate10kNodesFirstScreen is the first validation of the graph in a process: no
// verdict of the declaration screen is remembered, so each of the 9,900 distinct declarations
// is screened, its schema compiled included (as after a restart).
func BenchmarkValidate10kNodesFirstScreen(b *testing.B) {
	g, r := generated(b, 10000)
	v, err := NewValidator(r)
	require.NoError(b, err)
	for b.Loop() {
		verdicts.Lock()
		clear(verdicts.m)
		verdicts.Unlock()
		if _, err := v.Validate(b.Context(), g); err != nil {
			b.Fatal(err)
		}
	}
}
