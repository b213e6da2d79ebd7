package publisher

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
	"github.com/ringfence/ringfence/services/pool"
	"github.com/ringfence/ringfence/services/pool/spawner"
	"github.com/ringfence/ringfence/services/registry"
)

// openRegistry opens a real registry with n servers granting the floor.
func openRegistry(b testing.TB, dir string, refs ...string) *registry.Service {
	box, err := secretbox.LoadOrCreate(filepath.Join(dir, "secrets.key"))
	require.NoError(b, err)
	roles, err := auth.NewRoles("")
	require.NoError(b, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := registry.Open(registry.Config{DBPath: filepath.Join(dir, "registry.db"), Secrets: box, Roles: roles, Logger: quiet, AuditSink: testutil.NewAuditRecorder()})
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
	svc, err := Open(Config{DBPath: filepath.Join(dir, "publisher.db"), Policies: reg, CacheBytes: cacheBytes, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AuditSink: testutil.NewAuditRecorder()})
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

// replay serves a listing taken once, so the import's own work can be measured apart from
// starting the server.
type replay struct{ listing *discovery.Listing }

func (r replay) DiscoverTools(context.Context, string) (*discovery.Listing, error) {
	return r.listing, nil
}

// BenchmarkImport200Tools imports every tool of `mcpfixture --tools 200` (206 tools) into a
// fresh graph per iteration, with discovery through the real pool: the fixture runs in the
// isolation image on the Docker engine. "pool" is the whole import and reports its parts
// (discovery-ns/op: start the container, handshake, list, stop; apply-ns/op: the import's own
// work); "apply" replays a listing taken once, so its ns/op is the time beyond the spawn.
func BenchmarkImport200Tools(b *testing.B) {
	image := dockertest.FixtureImage(b)
	dir := b.TempDir()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := openRegistry(b, dir)
	_, err := reg.CreateServer(b.Context(), &registryv1.CreateServerRequest{
		Ref: "gen", Command: fixtures.MCPFixture, Args: []string{"--tools", "200"}, Grants: []string{"process_spawn", "external_api_call"},
	})
	require.NoError(b, err)
	sp, err := spawner.New(spawner.Config{Image: image, PoolID: "bench-publisher-import"})
	require.NoError(b, err)
	pl, err := pool.Open(b.Context(), pool.Config{DBPath: filepath.Join(dir, "pool.db"), Registry: reg, AuditSink: testutil.NewAuditRecorder(),
		Spawner: sp, Logger: quiet})
	require.NoError(b, err)
	b.Cleanup(func() { _ = pl.Close(context.Background()) })
	listing, err := pl.DiscoverTools(b.Context(), "gen")
	require.NoError(b, err)
	require.Len(b, listing.Tools, 206)

	run := func(b *testing.B, disc Discoverer) {
		svc, err := Open(Config{DBPath: filepath.Join(b.TempDir(), "publisher.db"), Policies: reg, Discoverer: disc, Logger: quiet, AuditSink: testutil.NewAuditRecorder()})
		require.NoError(b, err)
		defer svc.Close()
		var discovery, apply time.Duration
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			id := fmt.Sprintf("g%d", i)
			require.NoError(b, svc.store.CreateGraph(b.Context(), &graph.Graph{ID: id, Tenant: "default", Nodes: []graph.Node{
				{ID: "a", Kind: graph.KindAgent, Agent: &graph.AgentNode{}},
			}}, nil))
			b.StartTimer()
			res, err := svc.Import(b.Context(), ImportRequest{Tenant: "default", GraphID: id, ServerRef: "gen", Agent: "a"})
			if err != nil {
				b.Fatal(err)
			}
			if len(res.Tools) != 206 {
				b.Fatalf("imported %d tools", len(res.Tools))
			}
			discovery += res.Discovery
			apply += res.Apply
		}
		b.ReportMetric(float64(discovery.Nanoseconds())/float64(b.N), "discovery-ns/op")
		b.ReportMetric(float64(apply.Nanoseconds())/float64(b.N), "apply-ns/op")
	}
	b.Run("pool", func(b *testing.B) { run(b, pl) })
	b.Run("apply", func(b *testing.B) { run(b, replay{listing}) })
}

// BenchmarkPublish publishes a stored 1,000-node draft (10 agents, 20 servers) as a new
// version per iteration: validation against a real registry, then the durable write of the
// version and its audit record, on each back end side by side: bbolt, and a three-member etcd
// cluster embedded in the benchmark's process (on the same cores).
func BenchmarkPublish(b *testing.B) {
	for _, backend := range []string{"bbolt", "etcd"} {
		b.Run("store="+backend, func(b *testing.B) {
			dir := b.TempDir()
			var servers []string
			for i := range 20 {
				servers = append(servers, fmt.Sprintf("server-%d", i))
			}
			cfg := Config{DBPath: filepath.Join(dir, "publisher.db"), Policies: openRegistry(b, dir, servers...),
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AuditSink: testutil.NewAuditRecorder()}
			if backend == "etcd" {
				cluster := etcdtest.Start(b, 3)
				cfg.Etcd, cfg.EtcdRoot = cluster.Client(b, "publisher"), cluster.Root()
			}
			svc, err := Open(cfg)
			require.NoError(b, err)
			b.Cleanup(func() { svc.Close() })
			require.NoError(b, svc.store.CreateGraph(b.Context(), generatedGraph(1000, servers), nil))
			ctx := auth.WithTenancy(auth.WithPrincipal(b.Context(), auth.Principal{System: "bench"}), auth.Tenancy{Tenant: "default"})
			for b.Loop() {
				if _, err := svc.Publish(ctx, &publisherv1.PublishRequest{GraphId: "bench"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
