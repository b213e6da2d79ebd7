package publisher

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/services/registry"
)

// openRegistry opens a real registry with n servers granting the floor.
func openRegistry(b testing.TB, dir string, refs ...string) *registry.Service {
	box, err := secretbox.LoadOrCreate(filepath.Join(dir, "secrets.key"))
	require.NoError(b, err)
	roles, err := auth.NewRoles("")
	require.NoError(b, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := registry.Open(registry.Config{DBPath: filepath.Join(dir, "registry.db"), Secrets: box, Roles: roles, Logger: quiet})
	require.NoError(b, err)
	b.Cleanup(func() { reg.Close() })
	for _, ref := range refs {
		_, err := reg.CreateServer(context.Background(), &registryv1.CreateServerRequest{
			Ref: ref, Command: "mcp-server", Grants: []string{"process_spawn", "external_api_call", "fs.read:/srv/**"},
		})
		require.NoError(b, err)
	}
	return reg
}

// generatedGraph is a publishable graph of n nodes: one agent per 100 nodes, binding (and with
// a tool edge to) the 99 mcp_tool nodes after it, spread over the servers, with two policies.
func generatedGraph(n int, servers []string) *graph.Graph {
	g := &graph.Graph{ID: "bench", Tenant: "default", CapabilityMode: graph.ModeEnforce, Policies: []graph.Policy{
		{ID: "no-etc", Revoke: []string{"fs.read:/etc/**"}},
		{ID: "no-mail", Revoke: []string{"email.send"}},
	}}
	schema := json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","description":"Path of the file to read, relative to the root."},"encoding":{"type":"string","enum":["utf-8","latin-1"]},"max_bytes":{"type":"integer","minimum":1}},"required":["path"]}`)
	var agent *graph.AgentNode
	var agentID string
	for i := 0; i < n; i++ {
		if i%100 == 0 {
			agentID = fmt.Sprintf("agent-%d", i/100)
			agent = &graph.AgentNode{CapabilityBindings: []string{"process_spawn", "external_api_call", "fs.read"}}
			g.Nodes = append(g.Nodes, graph.Node{ID: agentID, Kind: graph.KindAgent, Agent: agent})
			continue
		}
		ref := servers[i%len(servers)]
		tool := fmt.Sprintf("tool_%05d", i)
		id := ref + "__" + tool
		g.Nodes = append(g.Nodes, graph.Node{ID: id, Kind: graph.KindMCPTool, MCPTool: &graph.MCPToolNode{
			ServerRef: ref, ToolName: tool, Description: "Read the complete contents of a file from the file system as text.",
			InputSchema: schema, CapabilityBindings: []string{"process_spawn", "external_api_call"},
			SchemaHash: fmt.Sprintf("v1:sha256:%064x", i),
		}})
		agent.ToolBindings = append(agent.ToolBindings, graph.ToolBinding{Name: id, NodeID: id})
		g.Edges = append(g.Edges, graph.Edge{From: agentID, To: id, Kind: graph.EdgeTool})
	}
	return g
}

// BenchmarkValidateDraft10kNodes is ValidateDraft's work on a stored 10,000-node draft: read
// it from bbolt and prove every rule against a real registry (20 servers). "cached" is the
// usual case (the draft was decoded by an earlier read or written by this process); "cold"
// decodes the draft's JSON on every call, as the first read after a restart does.
func BenchmarkValidateDraft10kNodes(b *testing.B) {
	b.Run("cached", func(b *testing.B) { benchValidateDraft(b, 0) })
	b.Run("cold", func(b *testing.B) { benchValidateDraft(b, -1) })
}

func benchValidateDraft(b *testing.B, cacheBytes int) {
	dir := b.TempDir()
	var servers []string
	for i := range 20 {
		servers = append(servers, fmt.Sprintf("server-%d", i))
	}
	reg := openRegistry(b, dir, servers...)
	svc, err := Open(Config{DBPath: filepath.Join(dir, "publisher.db"), Policies: reg, CacheBytes: cacheBytes, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(b, err)
	b.Cleanup(func() { svc.Close() })
	g := generatedGraph(10000, servers)
	require.NoError(b, svc.store.CreateGraph(b.Context(), g, nil))

	res, _, err := svc.Validate(b.Context(), "default", "bench")
	require.NoError(b, err)
	require.True(b, res.OK(), "%+v", res.Violations)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := svc.Validate(b.Context(), "default", "bench"); err != nil {
			b.Fatal(err)
		}
	}
}
