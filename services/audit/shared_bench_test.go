package audit

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// BenchmarkAppendBackends appends tool-call records from concurrent callers to the log in
// bbolt alone and to the log shared through etcd (the leader writes an embedded three-member
// cluster, then its copy), in one run. The cluster runs in this process, on the same cores
// and disk, so the etcd figures include its members' work.
func BenchmarkAppendBackends(b *testing.B) {
	cluster := etcdtest.Start(b, 3)
	cli := cluster.Client(b, "audit")
	for _, backend := range []string{"bbolt", "etcd"} {
		for _, bc := range []struct{ goroutines, perCall int }{{64, 1}, {8, 100}} {
			b.Run(fmt.Sprintf("backend=%s/goroutines=%d/records_per_call=%d", backend, bc.goroutines, bc.perCall), func(b *testing.B) {
				cfg := Config{DBPath: filepath.Join(b.TempDir(), "audit.db"), Logger: slog.New(slog.DiscardHandler)}
				if backend == "etcd" {
					cfg.Etcd, cfg.EtcdRoot, cfg.Instance = cli, cluster.Root(), "bench"
				}
				svc, err := Open(cfg)
				require.NoError(b, err)
				b.Cleanup(func() { _ = svc.Close() })
				if svc.shared != nil {
					require.Eventually(b, svc.shared.Leading, 30*time.Second, 10*time.Millisecond)
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for range bc.goroutines {
					wg.Go(func() {
						recs := make([]audit.Record, 0, bc.perCall)
						for {
							from := next.Add(int64(bc.perCall)) - int64(bc.perCall)
							if from >= int64(b.N) {
								return
							}
							recs = recs[:0]
							for i := from; i < min(from+int64(bc.perCall), int64(b.N)); i++ {
								tc := audit.ToolCallAttempt{RunID: fmt.Sprintf("run-%08d", i/50), CallID: fmt.Sprintf("call-%010d", i), Attempt: 1,
									ServerRef: "files", ToolName: "read_file", ArgsSize: 214, ResultSize: 4096, LatencyMicros: 1834}
								tc.Succeeded()
								recs = append(recs, audit.NewToolCallRecord("pool", fmt.Sprintf("tenant-%d", i%8), tc))
							}
							if _, err := svc.store.Append(b.Context(), recs); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
			})
		}
	}
}
