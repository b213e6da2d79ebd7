package pool

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/gctune"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
	auditsvc "github.com/ringfence/ringfence/services/audit"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// Benchmarks of issue 6, reported with p50/p99 per operation (b.ReportMetric). Run them with
// make bench, or: go test -run '^$' -bench 'Pool' -benchtime=200x ./services/pool/

// latencies collects per-operation durations.
type latencies []time.Duration

func (l latencies) report(b *testing.B, prefix string) {
	if len(l) == 0 {
		return
	}
	b.ReportMetric(float64(l.quantile(50).Microseconds()), prefix+"p50-µs")
	b.ReportMetric(float64(l.quantile(99).Microseconds()), prefix+"p99-µs")
}

// quantile is the pct-th percentile of l (zero when l is empty).
func (l latencies) quantile(pct int) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*pct/100)]
}

// productionGC sets the garbage collector as the binaries run it (app.Main applies it).
func productionGC(b *testing.B) {
	if prev, applied := gctune.Apply(); applied {
		b.Cleanup(func() { debug.SetGCPercent(prev) })
	}
}

const benchKey = "bench-admin-key-0123456789"

// grpcClient serves the harness's pool over authenticated gRPC on loopback, as ringfenced does.
func grpcClient(b testing.TB, h *harness) (poolv1.PoolServiceClient, context.Context) {
	require.NoError(b, h.reg.EnsureBootstrapAdmin(h.ctx, benchKey))
	srv := grpcserver.New(grpcserver.Options{Name: "bench", GRPCAddr: "127.0.0.1:0", Authorizer: auth.NewAuthorizer(h.reg, auth.Rules), Logger: h.pool.log})
	poolv1.RegisterPoolServiceServer(srv.GRPC(), NewServer(h.pool))
	conn, _ := testutil.Serve(b, srv)
	return poolv1.NewPoolServiceClient(conn), testutil.WithKey(context.Background(), benchKey)
}

// benchServers are the MCP servers the call benchmarks run against, each serving echo: the
// fixture on the go-sdk server, and the fixture's --lean loop, which answers by hand in a few
// microseconds, so that the server's own cost (~0.6 ms of CPU per call for sixteen go-sdk
// servers sharing two cores) does not hide the pool's and the engine's.
var benchServers = []struct {
	name string
	args []string
}{
	{"go-sdk", nil},
	{"lean", []string{"--lean"}},
}

// eachServer runs bench once per server of benchServers, as a sub-benchmark named for it.
func eachServer(b *testing.B, bench func(b *testing.B, serverArgs []string)) {
	for _, srv := range benchServers {
		b.Run("server="+srv.name, func(b *testing.B) { bench(b, srv.args) })
	}
}

// rawFixture is the spawner spec of the fixture run with args, for the raw baselines.
func rawFixture(args ...string) spawner.Spec {
	return spawner.Spec{ServerRef: "raw", Transport: "stdio", Command: "mcpfixture", Args: args, Purpose: spawner.PurposeRun}
}

// BenchmarkPoolWarmCall (a): a warm echo through the whole path (gRPC client → pool → every
// gate → container) against the same call on a raw go-sdk session over the same kind of
// container's attach stream, and on a direct host stdio session. Target: the whole path adds at
// most 0.3 ms p50 over the raw attach path.
func BenchmarkPoolWarmCall(b *testing.B) { eachServer(b, poolWarmCall) }

func poolWarmCall(b *testing.B, serverArgs []string) {
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

	image := dockertest.FixtureImage(b)
	raw, err := spawner.New(spawner.Config{Image: image, PoolID: "bench-raw-" + randomHex(), Logger: h.pool.log})
	require.NoError(b, err)
	b.Cleanup(func() { raw.Close(context.Background()) })
	rawSess, err := raw.Spawn(context.Background(), rawFixture(serverArgs...))
	require.NoError(b, err)
	defer rawSess.Close(context.Background())

	host, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(context.Background(),
		&mcp.CommandTransport{Command: exec.Command(fixtures.Binaries(b).Path(b, "mcpfixture"), serverArgs...)}, &mcp.ClientSessionOptions{ProtocolVersion: spawner.ProtocolVersion})
	require.NoError(b, err)
	defer host.Close()
	params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "ping"}}

	var whole, attach, stdio, noop latencies
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := client.CallTool(ctx, call); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := rawSess.CallTool(context.Background(), params); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if _, err := host.CallTool(context.Background(), params); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		// The floor the gRPC hop puts under the whole path: an RPC that does nothing, on
		// the same connection, server and interceptors, in the same loop.
		if _, err := client.GetRun(ctx, &poolv1.GetRunRequest{RunId: run}); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		whole, attach, stdio = append(whole, t1.Sub(t0)), append(attach, t2.Sub(t1)), append(stdio, t3.Sub(t2))
		noop = append(noop, t4.Sub(t3))
	}
	b.StopTimer()
	whole.report(b, "whole-")
	attach.report(b, "attach-")
	stdio.report(b, "stdio-")
	noop.report(b, "rpc-noop-")
}

// BenchmarkPoolFirstCall (b): the first call of a run, spawn included, against raw create →
// attach → start → initialize → call through the spawner. Target ratio ≤ 1.2.
func BenchmarkPoolFirstCall(b *testing.B) {
	productionGC(b)
	h := newHarness(b, harnessOpts{driftMaxAge: time.Second})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	image := dockertest.FixtureImage(b)
	raw, err := spawner.New(spawner.Config{Image: image, PoolID: "bench-raw-" + randomHex(), Logger: h.pool.log})
	require.NoError(b, err)
	b.Cleanup(func() { raw.Close(context.Background()) })
	params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "ping"}}
	args, _ := json.Marshal(map[string]any{"text": "ping"})

	var first, rawFirst latencies
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		info, err := h.pool.StartRun(h.ctx, "default", "g", 0, "")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := h.pool.CallTool(h.ctx, CallRequest{RunID: info.Run.ID, Agent: "a", Tool: "fx__echo", Arguments: args}); err != nil {
			b.Fatal(err)
		}
		first = append(first, time.Since(t0))
		b.StopTimer()
		if _, err := h.pool.EndRun(h.ctx, info.Run.ID, "", "completed", "bench"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		t1 := time.Now()
		sess, err := raw.Spawn(context.Background(), rawFixture())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sess.CallTool(context.Background(), params); err != nil {
			b.Fatal(err)
		}
		rawFirst = append(rawFirst, time.Since(t1))
		b.StopTimer()
		sess.Close(context.Background())
		b.StartTimer()
	}
	b.StopTimer()
	first.report(b, "run-")
	rawFirst.report(b, "raw-")
	slices.Sort(first)
	slices.Sort(rawFirst)
	b.ReportMetric(float64(first[len(first)/2])/float64(rawFirst[len(rawFirst)/2]), "p50-ratio")
}

// BenchmarkPoolFirstCallWarm (issue 23): in one run, the first call of a run that takes a warm
// container, beside the first call of a run that starts its container cold and a warm call
// (the cold run's second call, on its running session). Two registrations of the same
// fixture: one asking for a warm container, one not. The calls are timed from CallTool to its
// answer; starting the run (a durable write of its own) is reported apart. Nothing runs in the
// background while the cold calls are measured; the warm first call's refill starts once it
// has its answer, as in production. Target: warm first call ≤ 20 ms p50, and ≤ 1/20 of the
// cold one.
func BenchmarkPoolFirstCallWarm(b *testing.B) {
	productionGC(b)
	h := newHarness(b, harnessOpts{driftMaxAge: time.Second, maxWarm: 1, warmRefresh: 50 * time.Millisecond})
	h.server("cold", nil)
	h.server("warm", func(r *registryv1.CreateServerRequest) { r.Prewarm = 1 })
	h.publish("g", []string{"a"}, []imp{{"cold", "a", []string{"echo"}}, {"warm", "a", []string{"echo"}}}, nil)
	args, _ := json.Marshal(map[string]any{"text": "ping"})
	var coldFirst, warmFirst, warmCall, startRun latencies
	call := func(run, tool string, into *latencies) {
		t0 := time.Now()
		res, err := h.pool.CallTool(h.ctx, CallRequest{RunID: run, Agent: "a", Tool: tool, Arguments: args})
		*into = append(*into, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		if res.Content[0]["text"] != "ping" {
			b.Fatalf("echo answered %v", res.Content)
		}
	}
	start := func() string {
		t0 := time.Now()
		info, err := h.pool.StartRun(h.ctx, "default", "g", 0, "")
		startRun = append(startRun, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		return info.Run.ID
	}
	ready := func() {
		deadline := time.Now().Add(time.Minute)
		for h.pool.warm.count() < 1 {
			if time.Now().After(deadline) {
				b.Fatal("no warm container became ready within a minute")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		ready()
		b.StartTimer()
		coldRun := start()
		call(coldRun, "cold__echo", &coldFirst)
		call(coldRun, "cold__echo", &warmCall)
		warmRun := start()
		call(warmRun, "warm__echo", &warmFirst)
		b.StopTimer()
		for _, run := range []string{coldRun, warmRun} {
			if _, err := h.pool.EndRun(h.ctx, run, "", StateCompleted, "bench"); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	if hits := h.hitsOf("warm"); hits != float64(b.N) {
		b.Fatalf("%v of %d first calls took a warm container", hits, b.N)
	}
	coldFirst.report(b, "cold-first-")
	warmFirst.report(b, "warm-first-")
	warmCall.report(b, "warm-call-")
	startRun.report(b, "start-run-")
	slices.Sort(coldFirst)
	slices.Sort(warmFirst)
	b.ReportMetric(float64(coldFirst[len(coldFirst)/2])/float64(warmFirst[len(warmFirst)/2]), "cold/warm-first-p50")
}

// BenchmarkPoolThroughput (c): calls per second with 16 concurrent runs, every attempt
// recorded durably (the pool's spool fsyncs, the real audit log appends). Target ≥ 2,000/s.
func BenchmarkPoolThroughput(b *testing.B) { eachServer(b, poolThroughput) }

func poolThroughput(b *testing.B, serverArgs []string) {
	productionGC(b)
	h := newHarness(b, harnessOpts{driftMaxAge: time.Second, realAudit: true})
	h.server("fx", nil, serverArgs...)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	const runs = 16
	ids := make([]string, runs)
	args, _ := json.Marshal(map[string]any{"text": "ping"})
	for i := range ids {
		ids[i] = h.start("g")
		_, err := h.pool.CallTool(h.ctx, CallRequest{RunID: ids[i], Agent: "a", Tool: "fx__echo", Arguments: args})
		require.NoError(b, err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if _, err := h.pool.CallTool(h.ctx, CallRequest{RunID: ids[i], Agent: "a", Tool: "fx__echo", Arguments: args}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "calls/s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(b, h.pool.Spool().Flush(ctx), "every attempt reached the audit log")
}

// BenchmarkPoolIdleSessionMemory (d): the pool's own memory per idle session (Go heap and
// goroutine stacks), besides the container. Target ≤ 256 KiB.
func BenchmarkPoolIdleSessionMemory(b *testing.B) {
	h := newHarness(b, harnessOpts{driftMaxAge: time.Hour, maxSessions: 1000, maxRuns: 1000})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	args, _ := json.Marshal(map[string]any{"text": "ping"})
	const sessions = 20
	measure := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc + m.StackInuse
	}
	for range b.N {
		before := measure()
		var ids []string
		for range sessions {
			id := h.start("g")
			_, err := h.pool.CallTool(h.ctx, CallRequest{RunID: id, Agent: "a", Tool: "fx__echo", Arguments: args})
			require.NoError(b, err)
			ids = append(ids, id)
		}
		time.Sleep(200 * time.Millisecond) // let the sessions go idle
		after := measure()
		b.ReportMetric(float64(int64(after)-int64(before))/sessions/1024, "KiB/session")
		for _, id := range ids {
			_, err := h.pool.EndRun(h.ctx, id, "", "completed", "bench")
			require.NoError(b, err)
		}
	}
}

// BenchmarkRawAttachThroughput is the ceiling for (c) on this machine: the same echo from 16
// concurrent raw go-sdk sessions on attach streams, with no gates and no audit.
func BenchmarkRawAttachThroughput(b *testing.B) {
	eachServer(b, func(b *testing.B, serverArgs []string) { rawAttachThroughput(b, serverArgs, false) })
}

// BenchmarkRawAttachDurableThroughput is (c)'s floor for any pool that keeps the
// durable-before-dispatch rule: the raw sessions of BenchmarkRawAttachThroughput, with each
// call recorded as the pool records it (a pending record durable in the pool's spool before
// the call, the outcome spooled in the background after it, both forwarded to a real audit
// log), and nothing else: no gRPC, no runs, no gates.
func BenchmarkRawAttachDurableThroughput(b *testing.B) {
	eachServer(b, func(b *testing.B, serverArgs []string) { rawAttachThroughput(b, serverArgs, true) })
}

// rawAttachThroughput calls echo on 16 raw attach sessions from 16 goroutines; with durable,
// each call is audited as the pool audits it.
func rawAttachThroughput(b *testing.B, serverArgs []string, durable bool) {
	productionGC(b)
	image := dockertest.FixtureImage(b)
	raw, err := spawner.New(spawner.Config{Image: image, PoolID: "bench-raw-" + randomHex()})
	require.NoError(b, err)
	b.Cleanup(func() { raw.Close(context.Background()) })
	const sessions = 16
	var all []*spawner.Session
	for range sessions {
		s, err := raw.Spawn(context.Background(), rawFixture(serverArgs...))
		require.NoError(b, err)
		all = append(all, s)
	}
	params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "ping"}}
	call := func(s *spawner.Session) error {
		_, err := s.CallTool(context.Background(), params)
		return err
	}
	var spool *audit.Spool
	if durable {
		spool = benchSpool(b)
		call = func(s *spawner.Session) error {
			att := audit.ToolCallAttempt{RunID: "raw", AgentNode: "a", ServerRef: "raw", ToolName: "echo", CallID: audit.NewID(), Attempt: 1}
			att.Pending()
			pending := audit.NewToolCallRecord("pool", auth.DefaultTenant, att)
			if err := spool.Enqueue(context.Background(), pending); err != nil {
				return err
			}
			if _, err := s.CallTool(context.Background(), params); err != nil {
				return err
			}
			att.Succeeded()
			att.PendingID = pending.ID
			return spool.EnqueueAsync(audit.NewToolCallRecord("pool", auth.DefaultTenant, att), func(err error) { b.Error(err) })
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for _, s := range all {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := call(s); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
	b.StopTimer()
	if durable {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(b, spool.Flush(ctx), "every attempt reached the audit log")
	}
}

// benchSpool is a spool in the pool's form (segment files) forwarding to a real audit log,
// both in temporary directories, for as long as the benchmark runs.
func benchSpool(b *testing.B) *audit.Spool {
	dir := b.TempDir()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	log, err := auditsvc.Open(auditsvc.Config{DBPath: filepath.Join(dir, "audit.db"), Logger: quiet})
	require.NoError(b, err)
	b.Cleanup(func() { log.Close() })
	spool, err := audit.NewSpool(audit.SpoolConfig{Dir: filepath.Join(dir, "spool"), Sink: log.Sink(), Producer: "pool", Logger: quiet})
	require.NoError(b, err)
	b.Cleanup(func() { spool.Close() })
	fwd := spool.StartForwarding()
	b.Cleanup(func() { fwd.Stop(30 * time.Second) })
	return spool
}
