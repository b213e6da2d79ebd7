package audit

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

type discardSink struct{}

func (discardSink) Append(context.Context, []Record) error { return nil }

// benchSpool opens an unbounded spool of one kind ("bbolt" or "files") forwarding to sink.
func benchSpool(b *testing.B, kind string, sink Sink) *Spool {
	cfg := SpoolConfig{Producer: "pool", MaxPending: 1 << 30, Logger: slog.New(slog.DiscardHandler), Sink: sink}
	if kind == "files" {
		cfg.Dir = filepath.Join(b.TempDir(), "spool")
	} else {
		db, err := bolt.Open(filepath.Join(b.TempDir(), "pool.db"), 0o600, &bolt.Options{Timeout: time.Second})
		require.NoError(b, err)
		b.Cleanup(func() { _ = db.Close() })
		cfg.DB, cfg.Bucket = db, "audit_outbox"
	}
	s, err := NewSpool(cfg)
	require.NoError(b, err)
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkSpoolEnqueue measures durable enqueues from many goroutines (group commit,
// one transaction per group), as the pool makes them: with the forwarder draining to a
// sink that accepts at once, and during an outage, when the outbox only grows.
func BenchmarkSpoolEnqueue(b *testing.B) {
	for _, kind := range spoolKinds {
		for _, mode := range []string{"forwarding", "outage"} {
			b.Run(kind+"/"+mode, func(b *testing.B) {
				var sink Sink = discardSink{}
				if mode == "outage" {
					sink = downSink{}
				}
				s := benchSpool(b, kind, sink)
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- s.Run(ctx) }()
				b.Cleanup(func() {
					cancel()
					require.NoError(b, <-done)
				})
				b.SetParallelism(32) // 64 goroutines on 2 cores
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						tc := ToolCallAttempt{RunID: "run-1", CallID: fmt.Sprint("call-", i), Attempt: 1, ServerRef: "files", ToolName: "read_file",
							ArgsDigest: "sha256:0f92d2abf9ed66168c7b98589da53f19f26832e4d65b3843319d73c5d7bbffd2", ArgsSize: 214}
						tc.Succeeded()
						if err := s.Enqueue(context.Background(), NewToolCallRecord("pool", "tenant-a", tc)); err != nil {
							b.Error(err)
							return
						}
						i++
					}
				})
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
			})
		}
	}
}

// BenchmarkSpoolEnqueueSerial is one producer waiting for each record, as one run's calls
// do: the latency a call pays for its record, per kind of outbox.
func BenchmarkSpoolEnqueueSerial(b *testing.B) {
	for _, kind := range spoolKinds {
		b.Run(kind, func(b *testing.B) {
			s := benchSpool(b, kind, discardSink{})
			f := s.StartForwarding()
			b.Cleanup(func() { f.Stop(time.Second) })
			lat := make([]time.Duration, 0, b.N)
			for i := 0; b.Loop(); i++ {
				tc := ToolCallAttempt{RunID: "run-1", CallID: fmt.Sprint("call-", i), Attempt: 1, ServerRef: "files", ToolName: "read_file"}
				tc.Succeeded()
				t0 := time.Now()
				if err := s.Enqueue(context.Background(), NewToolCallRecord("pool", "tenant-a", tc)); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkFileOutboxCommit is one durable commit of the file outbox, alone: a record of the
// size the pool writes for a call, and a group of eight (the mean group at 16 concurrent runs).
func BenchmarkFileOutboxCommit(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 700)
	for _, records := range []int{1, 8} {
		b.Run(fmt.Sprintf("records=%d", records), func(b *testing.B) {
			o, err := openFileOutbox(b.TempDir(), slog.New(slog.DiscardHandler))
			require.NoError(b, err)
			b.Cleanup(func() { _ = o.close() })
			group := slices.Repeat([][]byte{body}, records)
			admit := func(int) error { return nil }
			for b.Loop() {
				if _, err := o.add(group, nil, admit); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
