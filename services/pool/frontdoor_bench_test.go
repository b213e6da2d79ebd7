package pool

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// BenchmarkFrontDoorWarmCall (issue 22): a warm tools/call through the MCP front door (an MCP
// client over streamable HTTP on loopback → the front door → CallTool → every gate → the
// container), beside the same call through gRPC CallTool and on a raw go-sdk session over the
// same kind of container's attach stream, interleaved in one loop. The front door is asked at
// the stateful version (2025-11-25: a session, answers on SSE) and the stateless one
// (2026-07-28: each call a request of its own). Target: the front door adds at most 20% to the
// gRPC path's p50.
func BenchmarkFrontDoorWarmCall(b *testing.B) { eachServer(b, frontDoorWarmCall) }

func frontDoorWarmCall(b *testing.B, serverArgs []string) {
	productionGC(b)
	h := newHarness(b, harnessOpts{driftMaxAge: time.Second})
	h.server("fx", nil, serverArgs...)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	client, ctx := grpcClient(b, h)
	run := h.start("g")
	args, _ := structpb.NewStruct(map[string]any{"text": "ping"})
	call := &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: "fx__echo", Arguments: args}
	_, err := client.CallTool(ctx, call) // spawn
	require.NoError(b, err)

	// The loop makes thousands of requests a second with one token: no rate limit.
	fd, err := h.pool.FrontDoor(FrontDoorConfig{RateLimit: 1e9, RateBurst: 1 << 30})
	require.NoError(b, err)
	srv := httptest.NewServer(fd)
	b.Cleanup(srv.Close)
	_, secret, err := h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "a", 0)
	require.NoError(b, err)
	sessions := map[string]*mcp.ClientSession{}
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		tr := &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: &http.Client{Transport: bearer{secret, http.DefaultTransport}}, DisableStandaloneSSE: true}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: version})
		require.NoError(b, err)
		b.Cleanup(func() { _ = cs.Close() })
		sessions[version] = cs
	}
	mcpCall := &mcp.CallToolParams{Name: "fx__echo", Arguments: map[string]any{"text": "ping"}}

	image := dockertest.FixtureImage(b)
	raw, err := spawner.New(spawner.Config{Image: image, PoolID: "bench-raw-" + randomHex(), Logger: h.pool.log})
	require.NoError(b, err)
	b.Cleanup(func() { raw.Close(context.Background()) })
	rawSess, err := raw.Spawn(context.Background(), rawFixture(serverArgs...))
	require.NoError(b, err)
	defer rawSess.Close(context.Background())
	params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "ping"}}

	var grpcPath, stateful, stateless, attach latencies
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := client.CallTool(ctx, call); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if res, err := sessions["2025-11-25"].CallTool(context.Background(), mcpCall); err != nil || res.IsError {
			b.Fatal(err, res)
		}
		t2 := time.Now()
		if res, err := sessions["2026-07-28"].CallTool(context.Background(), mcpCall); err != nil || res.IsError {
			b.Fatal(err, res)
		}
		t3 := time.Now()
		if _, err := rawSess.CallTool(context.Background(), params); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		grpcPath, stateful, stateless, attach = append(grpcPath, t1.Sub(t0)), append(stateful, t2.Sub(t1)), append(stateless, t3.Sub(t2)), append(attach, t4.Sub(t3))
	}
	b.StopTimer()
	grpcPath.report(b, "grpc-")
	stateful.report(b, "door-stateful-")
	stateless.report(b, "door-stateless-")
	attach.report(b, "attach-")
	b.ReportMetric(p50(stateful)/p50(grpcPath), "stateful/grpc-p50")
	b.ReportMetric(p50(stateless)/p50(grpcPath), "stateless/grpc-p50")
}

func p50(l latencies) float64 {
	s := slices.Clone(l)
	slices.Sort(s)
	return float64(s[len(s)/2])
}
