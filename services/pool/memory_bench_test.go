package pool

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
)

// BenchmarkPoolResultMemory: the pool's heap while 1, 4 and 12 tool results of 16 MB are in
// flight at once (each from its own run's server, in the fixture image), through the whole
// path of a call (gates, the stdio stream, decoding, sanitization, the API's proto form and its
// wire encoding). It reports the peak heap in use above the idle pool's (sampled every
// millisecond, from a collected heap), that peak per byte of results, the bytes allocated per
// byte of result, the peak RSS of the process, and the heap the idle sessions still hold once
// the results are gone. gc=400 is the collector setting the binaries run with, whose heap may
// grow to five times what was live at the last collection; gc=25 lets the collector run often
// enough that the peak is close to what the results hold live.
//
//	go test -run '^$' -bench PoolResultMemory -benchtime 3x ./services/pool/
func BenchmarkPoolResultMemory(b *testing.B) {
	for _, gc := range []int{400, 25} {
		for _, n := range []int{1, 4, 12} {
			b.Run(fmt.Sprintf("gc=%d/results=%d", gc, n), func(b *testing.B) {
				b.Cleanup(func() { debug.SetGCPercent(debug.SetGCPercent(gc)) })
				poolResultMemory(b, n)
			})
		}
	}
}

// resultBytes is the size of each result the memory benchmark and tests ask for.
const resultBytes = 16_000_000

func poolResultMemory(b *testing.B, n int) {
	h := newHarness(b, harnessOpts{driftMaxAge: time.Hour})
	h.server("fx", nil, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"blob"}}}, nil)
	runs := make([]string, n)
	for i := range runs {
		runs[i] = h.start("g")
		_, err := h.call(runs[i], "a", "fx__blob", map[string]any{"bytes": 10})
		require.NoError(b, err)
	}
	args, err := json.Marshal(map[string]any{"bytes": resultBytes})
	require.NoError(b, err)
	idle := liveHeap()
	var peak, rss, allocs uint64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		baseline := liveHeap()
		b.StartTimer()
		resetPeakRSS()
		s := startHeapSampler()
		before := allocated()
		var wg sync.WaitGroup
		for _, run := range runs {
			wg.Go(func() {
				res, err := h.pool.CallTool(h.ctx, CallRequest{RunID: run, Agent: "a", Tool: "fx__blob", Arguments: args})
				if err != nil {
					b.Error(err)
					return
				}
				// What the RPC handler builds, and what grpc-go then encodes for the wire.
				out := &poolv1.CallToolResponse{CallId: res.CallID, Result: res.Result}
				out.Content, out.StructuredContent = resultToProto(res)
				wire, err := proto.Marshal(out)
				if err != nil || len(wire) < resultBytes {
					b.Errorf("the answer is %d bytes (%v)", len(wire), err)
				}
			})
		}
		wg.Wait()
		allocs += allocated() - before
		peak = max(peak, s.stop()-min(s.stop(), baseline))
		rss = max(rss, peakRSS())
	}
	b.StopTimer()
	retained := int64(liveHeap()) - int64(idle)
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(peak)/float64(n)/resultBytes, "peak-heap/result-bytes")
	b.ReportMetric(float64(allocs)/float64(b.N)/float64(n)/resultBytes, "alloc/result-bytes")
	if rss > 0 {
		b.ReportMetric(float64(rss)/(1<<20), "peak-RSS-MiB")
	}
	b.ReportMetric(float64(retained)/(1<<20), "retained-idle-MiB")
}

// liveHeap is the heap the program holds after two collections.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// allocated is the total of bytes allocated on the heap so far.
func allocated() uint64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

// heapSampler records the most heap in use (objects, live or not yet collected, and the free
// space of their spans: MemStats.HeapInuse) it sees, sampling every millisecond.
type heapSampler struct {
	done chan struct{}
	peak chan uint64
	once sync.Once
	max  uint64
}

func startHeapSampler() *heapSampler {
	s := &heapSampler{done: make(chan struct{}), peak: make(chan uint64)}
	go func() {
		samples := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"}}
		var peak uint64
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			rtmetrics.Read(samples)
			peak = max(peak, samples[0].Value.Uint64()+samples[1].Value.Uint64())
			select {
			case <-s.done:
				s.peak <- peak
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends the sampling (once) and returns the peak.
func (s *heapSampler) stop() uint64 {
	s.once.Do(func() {
		close(s.done)
		s.max = <-s.peak
	})
	return s.max
}

// resetPeakRSS resets the kernel's record of the process's peak resident set (Linux); peakRSS
// reads it (0 where it cannot).
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

func peakRSS() uint64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(status) {
		if v, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			kb, err := strconv.ParseUint(string(bytes.Fields(v)[0]), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
