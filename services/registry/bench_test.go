package registry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/gctune"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
)

// benchStores are the back ends the registry's benchmarks run on, side by side in one run:
// bbolt, and a three-member etcd cluster embedded in the benchmark's process (on the same
// cores, so the figures show etcd's cost here, not what members on hosts of their own give).
var benchStores = []string{"bbolt", "etcd"}

// benchClient serves a registry on the named back end over authenticated gRPC on loopback,
// with access logs formatted (to io.Discard) and the garbage collector set as in production.
func benchClient(b *testing.B, backend string) registryv1.RegistryServiceClient {
	b.Helper()
	// The collector setting the binaries run with (app.Main applies it).
	if prev, applied := gctune.Apply(); applied {
		b.Cleanup(func() { debug.SetGCPercent(prev) })
	}
	dir := b.TempDir()
	box, err := secretbox.LoadOrCreate(filepath.Join(dir, "secrets.key"))
	require.NoError(b, err)
	roles, _ := auth.NewRoles("")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{DBPath: filepath.Join(dir, "registry.db"), Secrets: box, Roles: roles, AllowedEnvKeys: []string{"APP_TOKEN"}, Logger: log, AuditSink: testutil.NewAuditRecorder()}
	if backend == "etcd" {
		cluster := etcdtest.Start(b, 3)
		cfg.Etcd, cfg.EtcdRoot = cluster.Client(b, "registry"), cluster.Root()
	}
	svc, err := Open(cfg)
	require.NoError(b, err)
	b.Cleanup(func() { svc.Close() })
	require.NoError(b, svc.EnsureBootstrapAdmin(context.Background(), adminKey))
	srv := grpcserver.New(grpcserver.Options{Name: "bench", GRPCAddr: "127.0.0.1:0", Authorizer: auth.NewAuthorizer(svc, auth.Rules), Logger: log})
	registryv1.RegisterRegistryServiceServer(srv.GRPC(), svc)
	conn, _ := testutil.Serve(b, srv)
	return registryv1.NewRegistryServiceClient(conn)
}

// latencies collects per-operation durations from parallel workers.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d []time.Duration) { l.mu.Lock(); l.d = append(l.d, d...); l.mu.Unlock() }

func (l *latencies) report(b *testing.B, elapsed time.Duration) {
	slices.Sort(l.d)
	if len(l.d) == 0 {
		return
	}
	b.ReportMetric(float64(len(l.d))/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(l.d[len(l.d)*50/100].Microseconds()), "p50-µs")
	b.ReportMetric(float64(l.d[len(l.d)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkRegistryGet: GetServer through the auth interceptor and the store, 64 concurrent
// callers, on each back end. Target on 2 cores (bbolt): ≥ 20,000 ops/s.
func BenchmarkRegistryGet(b *testing.B) {
	for _, backend := range benchStores {
		b.Run("store="+backend, func(b *testing.B) { benchRegistryGet(b, backend) })
	}
}

func benchRegistryGet(b *testing.B, backend string) {
	client := benchClient(b, backend)
	ctx := testutil.WithKey(context.Background(), adminKey)
	_, err := client.CreateServer(ctx, docsSearch())
	require.NoError(b, err)
	var lat latencies
	b.SetParallelism(32) // 32 × GOMAXPROCS callers
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			if _, err := client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search"}); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		lat.add(mine)
	})
	lat.report(b, time.Since(start))
}

// BenchmarkRegistryCreate: durable CreateServer (fsync before the answer: bbolt's concurrent
// creates share a transaction; etcd's commit on a quorum), 64 concurrent callers, on each back
// end. Target on 2 cores (bbolt): ≥ 2,000 ops/s.
func BenchmarkRegistryCreate(b *testing.B) {
	for _, backend := range benchStores {
		b.Run("store="+backend, func(b *testing.B) { benchRegistryCreate(b, backend) })
	}
}

func benchRegistryCreate(b *testing.B, backend string) {
	client := benchClient(b, backend)
	ctx := testutil.WithKey(context.Background(), adminKey)
	var lat latencies
	var n atomic.Int64
	b.SetParallelism(32)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			req := docsSearch()
			req.Ref = fmt.Sprintf("srv-%d", n.Add(1))
			t0 := time.Now()
			if _, err := client.CreateServer(ctx, req); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		lat.add(mine)
	})
	lat.report(b, time.Since(start))
}
