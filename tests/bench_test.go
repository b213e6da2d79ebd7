package tests

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// Benchmarks of issue 23 against the real ringfenced, a process of its own, so that what the
// pool spends is read from the kernel (utime + stime of the process, every thread, the
// in-process audit log included) and not mixed with the load generator's. Run them with make
// bench, or:
//
//	go test -run '^$' -bench 'PoolProcessCPU$' -benchtime 6000x ./tests/
//	go test -run '^$' -bench 'PoolSoak$' -benchtime 100000x ./tests/
//
// RINGFENCE_BENCH_CPUPROFILE=FILE writes a CPU profile of ringfenced over the first pool phase
// of BenchmarkPoolProcessCPU (go tool pprof FILE), RINGFENCE_BENCH_ALLOCPROFILE=PREFIX its
// allocation profiles before and after that phase (go tool pprof -sample_index=alloc_space
// -base PREFIX-before.pprof PREFIX-after.pprof); RINGFENCE_BENCH_PERF=1 logs what perf stat
// counted in ringfenced over that phase (syscalls that sync, write, read and wait; scheduler
// switches), where perf is installed; RINGFENCE_BENCH_PERF_RECORD=PREFIX records what the whole
// machine runs over the first pool phase and the first raw phase (perf record -a -g, into
// PREFIX-pool.data and PREFIX-raw.data); RINGFENCE_BENCH_RAW_PACE=1 holds each raw phase to
// the rate its pool phase reached.

// benchRuns is how many runs call at once, each from its own goroutine.
const benchRuns = 16

// poolProcess is ringfenced serving the fixture's lean echo server (one decode and one encode
// per line: the server's own cost hides nothing) to a gRPC client with an admin key.
type poolProcess struct {
	d      *daemon
	pid    int
	poolID string // labels its containers
	pprof  string
	client poolv1.PoolServiceClient
	ctx    context.Context
	args   *structpb.Struct
}

func startPoolProcess(b *testing.B) *poolProcess {
	b.Helper()
	p := &poolProcess{pprof: testutil.FreeAddr(b)}
	env := []string{"RINGFENCE_DEBUG__PPROF_ADDR=" + p.pprof, "RINGFENCE_LOG_LEVEL=warn"}
	// RINGFENCE_BENCH_DAEMON_ENV="GOGC=200 GOMEMLIMIT=64MiB", say: settings for ringfenced
	// alone, not for the load generator.
	env = append(env, strings.Fields(os.Getenv("RINGFENCE_BENCH_DAEMON_ENV"))...)
	p.d, p.poolID = poolDaemon(b, env...)
	p.pid = p.d.cmd.Process.Pid
	cli := func(args ...string) {
		b.Helper()
		r := runCmd(b, nil, []string{"RINGFENCE_ADDR=" + p.d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), args...)
		require.Equal(b, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	}
	cli("servers", "add", "fx", "--command", "mcpfixture --lean", "--grant", "process_spawn", "--grant", "external_api_call")
	cli("graphs", "create", "--graph", "bench", "--agent", "a")
	cli("mcp-import", "--server", "fx", "--graph", "bench", "--agent", "a", "--tool", "echo")
	cli("graphs", "publish", "--graph", "bench")
	conn, err := grpc.NewClient(p.d.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() })
	p.client, p.ctx = poolv1.NewPoolServiceClient(conn), testutil.WithKey(context.Background(), adminKey)
	p.args, err = structpb.NewStruct(map[string]any{"text": "ping"})
	require.NoError(b, err)
	return p
}

// startRuns starts n runs and makes each one's first call (the spawn), concurrently.
func (p *poolProcess) startRuns(b *testing.B, n int) []string {
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range ids {
		wg.Go(func() {
			r, err := p.client.StartRun(p.ctx, &poolv1.StartRunRequest{GraphId: "bench"})
			if err == nil {
				ids[i] = r.GetRun().GetRunId()
				err = p.callOnce(ids[i])
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return ids
}

func (p *poolProcess) endRuns(b *testing.B, ids []string) {
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			if _, err := p.client.EndRun(p.ctx, &poolv1.EndRunRequest{RunId: id}); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
}

func (p *poolProcess) callOnce(run string) error {
	res, err := p.client.CallTool(p.ctx, &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: "fx__echo", Arguments: p.args})
	if err == nil && res.GetResult() != "succeeded" {
		err = fmt.Errorf("echo answered %q", res.GetResult())
	}
	return err
}

// callAll makes n calls in all, spread over the runs, one goroutine per run.
func (p *poolProcess) callAll(b *testing.B, ids []string, n int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := p.callOnce(id); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// usage is what the kernel counts for a process: CPU time over all its threads, and context
// switches over its live threads.
type usage struct {
	cpu    time.Duration
	ctxsw  int64
	rss    int64 // VmRSS, bytes
	anon   int64 // RssAnon: the heap, stacks and other private memory
	file   int64 // RssFile: mapped files (bbolt's), pages the kernel may drop
	taken  time.Time
	sample bool
}

// userHZ is the unit of utime and stime in /proc/<pid>/stat: USER_HZ, 100 on Linux.
const userHZ = 100

func readUsage(b *testing.B, pid int) usage {
	b.Helper()
	u := usage{taken: time.Now(), sample: true}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(b, err)
	// Fields after the command name, which is in parentheses: state is the first, utime the
	// 12th and stime the 13th (fields 14 and 15 of proc(5)).
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, err := strconv.ParseInt(f[11], 10, 64)
	require.NoError(b, err)
	stime, err := strconv.ParseInt(f[12], 10, 64)
	require.NoError(b, err)
	u.cpu = time.Duration(utime+stime) * time.Second / userHZ
	status := procStatus(b, fmt.Sprintf("/proc/%d/status", pid))
	u.rss, u.anon, u.file = status["VmRSS"]*1024, status["RssAnon"]*1024, status["RssFile"]*1024
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	require.NoError(b, err)
	for _, t := range tasks {
		if s, err := os.ReadFile(t); err == nil {
			st := parseStatus(s)
			u.ctxsw += st["voluntary_ctxt_switches"] + st["nonvoluntary_ctxt_switches"]
		}
	}
	return u
}

func procStatus(b *testing.B, path string) map[string]int64 {
	data, err := os.ReadFile(path)
	require.NoError(b, err)
	return parseStatus(data)
}

// parseStatus reads the numeric fields of a /proc status file (kB for sizes).
func parseStatus(data []byte) map[string]int64 {
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}

// allocs reads from ringfenced's /metrics how many heap allocations it made and how many
// bytes they took, since it started: steadier measures of the work per call than CPU time on a
// shared machine.
func (p *poolProcess) allocs(b *testing.B) (count, bytes float64) {
	b.Helper()
	resp, err := http.Get(p.d.HTTPBase + "/metrics")
	require.NoError(b, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), " ")
		switch name {
		case "go_memstats_mallocs_total":
			count, err = strconv.ParseFloat(value, 64)
		case "go_memstats_alloc_bytes_total":
			bytes, err = strconv.ParseFloat(value, 64)
		}
		require.NoError(b, err)
	}
	require.NoError(b, sc.Err())
	return count, bytes
}

// liveHeap collects ringfenced's garbage and returns its heap after that: the live heap (and
// what the runtime holds from the system besides). With RINGFENCE_BENCH_HEAPPROFILE=PREFIX it
// also writes the heap profile to PREFIX-<name>.pprof (go tool pprof -base ... to compare).
func (p *poolProcess) liveHeap(b *testing.B, name string) (heap, sys int64) {
	b.Helper()
	if prefix := os.Getenv("RINGFENCE_BENCH_HEAPPROFILE"); prefix != "" {
		p.saveProfile(b, "heap?gc=1", prefix+"-"+name+".pprof")
	}
	resp, err := http.Get("http://" + p.pprof + "/debug/pprof/heap?debug=1&gc=1")
	require.NoError(b, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b, err)
	stat := func(name string) int64 {
		_, rest, ok := bytes.Cut(body, []byte("\n# "+name+" = "))
		require.True(b, ok, "no %s in the heap profile", name)
		line, _, _ := bytes.Cut(rest, []byte("\n"))
		n, err := strconv.ParseInt(string(line), 10, 64)
		require.NoError(b, err)
		return n
	}
	return stat("HeapAlloc"), stat("Sys")
}

// saveProfile writes ringfenced's profile of that name (a path under /debug/pprof/) to path.
func (p *poolProcess) saveProfile(b *testing.B, name, path string) {
	b.Helper()
	resp, err := http.Get("http://" + p.pprof + "/debug/pprof/" + name)
	require.NoError(b, err)
	defer resp.Body.Close()
	profile, err := io.ReadAll(resp.Body)
	require.NoError(b, err)
	require.NoError(b, os.WriteFile(path, profile, 0o600))
}

// cpuProfile writes a CPU profile of ringfenced, taken over the next d, to path.
func (p *poolProcess) cpuProfile(b *testing.B, path string, d time.Duration) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.pprof, max(int(d.Seconds()), 1)))
		if err != nil {
			b.Error(err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(path)
		if err != nil {
			b.Error(err)
			return
		}
		defer f.Close()
		if _, err := io.Copy(f, resp.Body); err != nil {
			b.Error(err)
		}
	}()
	return func() { <-done }
}

// selfCPU is the CPU time of this process: the load generator's.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// perfStat counts, with perf stat, what pid does until the returned func is called, and logs it.
func perfStat(b *testing.B, pid int) (stop func()) {
	return runPerf(b, func(out string, _ error) {
		// Printed, not logged: a benchmark's log keeps ten lines.
		fmt.Printf("Perf stat of ringfenced over the first pool phase of %s (%d calls):\n%s\n", b.Name(), b.N/2, indent(out))
	}, "stat", "-p", strconv.Itoa(pid), "-e",
		"task-clock,context-switches,cpu-migrations,syscalls:sys_enter_fdatasync,syscalls:sys_enter_pwrite64,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_pwait")
}

// perfRecord samples, with perf record, what every CPU of the machine runs (call graphs, the
// kernel's included) until the returned func is called, into path (perf report -i path
// --sort comm,dso tells who spent what).
func perfRecord(b *testing.B, path string) (stop func()) {
	return runPerf(b, func(out string, err error) {
		if err != nil {
			b.Logf("perf record: %v: %s", err, out)
		}
	}, "record", "-a", "-g", "-o", path)
}

// runPerf runs perf with args until the returned func is called, which interrupts it and hands
// done what it wrote; without perf it logs so and does nothing.
func runPerf(b *testing.B, done func(out string, err error), args ...string) (stop func()) {
	path, err := exec.LookPath("perf")
	if err != nil {
		b.Logf("perf is not installed: no perf %s", args[0])
		return func() {}
	}
	var out bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(b, cmd.Start())
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		err := cmd.Wait() // perf writes its counts as it exits
		done(out.String(), err)
	}
}

// rawSessions are 16 go-sdk client sessions on the fixture's lean server, each in a container
// of the same image on its attach stream, with no Ringfence code between: the ceiling.
func rawSessions(b *testing.B) (sessions []*spawner.Session, poolID string) {
	image := dockertest.FixtureImage(b)
	poolID = "bench-raw-" + randomHex(6)
	raw, err := spawner.New(spawner.Config{Image: image, PoolID: poolID})
	require.NoError(b, err)
	b.Cleanup(func() { raw.Close(context.Background()) })
	for range benchRuns {
		s, err := raw.Spawn(context.Background(), spawner.Spec{ServerRef: "raw", Transport: "stdio", Command: "mcpfixture", Args: []string{"--lean"}, Purpose: spawner.PurposeRun})
		require.NoError(b, err)
		b.Cleanup(func() { s.Close(context.Background()) })
		sessions = append(sessions, s)
	}
	return sessions, poolID
}

// rawCalls makes n calls in all over the sessions, one goroutine per session; pace, when set,
// holds them to its rate.
func rawCalls(b *testing.B, sessions []*spawner.Session, n int, pace *rate.Limiter) {
	params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "ping"}}
	var next atomic.Int64
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if pace != nil {
					if err := pace.Wait(context.Background()); err != nil {
						b.Error(err)
						return
					}
				}
				if _, err := s.CallTool(context.Background(), params); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// grpcFloor is a bare grpc-go server of the pool's API in this process, whose CallTool does
// nothing but read the arguments and answer what the pool answers an echo: what the gRPC hop
// alone costs a call, client and server together, with the same messages as the pool phase.
type grpcFloor struct {
	poolv1.UnimplementedPoolServiceServer
	content *structpb.Struct
}

func (f *grpcFloor) CallTool(_ context.Context, req *poolv1.CallToolRequest) (*poolv1.CallToolResponse, error) {
	_ = req.GetArguments().AsMap()
	return &poolv1.CallToolResponse{CallId: "call-" + strings.Repeat("0", 24), Attempt: 1, Outcome: "dispatched", Result: "succeeded",
		Content: []*structpb.Struct{f.content}, ServerRef: "fx", ToolName: "echo", LatencyMicros: 100}, nil
}

// startGRPCFloor serves a grpcFloor on loopback and returns a client of it, set up as the
// pool phase's client is (no TLS, an API key in the metadata).
func startGRPCFloor(b *testing.B) poolv1.PoolServiceClient {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	content, err := structpb.NewStruct(map[string]any{"type": "text", "text": "ping"})
	require.NoError(b, err)
	srv := grpc.NewServer()
	poolv1.RegisterPoolServiceServer(srv, &grpcFloor{content: content})
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() })
	return poolv1.NewPoolServiceClient(conn)
}

// floorCalls makes n calls in all to the floor, from benchRuns goroutines, as callAll does.
func floorCalls(b *testing.B, client poolv1.PoolServiceClient, args *structpb.Struct, n int) {
	ctx := testutil.WithKey(context.Background(), adminKey)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range benchRuns {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := client.CallTool(ctx, &poolv1.CallToolRequest{RunId: "run-" + strings.Repeat("0", 24), Agent: "a", Tool: "fx__echo", Arguments: args}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkPoolProcessCPU (issue 23, part 2): the CPU time ringfenced spends per warm call with
// 16 concurrent runs (gRPC in, every gate, the pending record durable before dispatch, the
// outcome record, the audit log in the same process), and its calls per second beside the raw
// ceiling in the same run: 16 go-sdk sessions on attach streams, no Ringfence code. The two
// alternate, half the calls each twice, so a change in the machine's load meets both. Target:
// at most 0.35 ms of the pool's CPU per call and at least 0.8 of the ceiling.
//
// Both phases saturate the machine's two cores, so each one's rate is bound by the CPU its
// calls cost everywhere, not in the pool alone: the metrics split the whole machine's CPU per
// call in each phase (cpushare_test.go) into the pool, the load generator (client-), the
// engine (dockerd, containerd and the containers' shims), the servers' containers, kernel
// threads and everything else (other processes: other engineers' builds on a shared machine),
// the raw phase's prefixed raw-. After both, the gRPC hop's floor (grpc-floor-, a bare grpc-go
// server of the same API answering at once) says what the pool path's one hop the raw path
// does not make costs by itself.
func BenchmarkPoolProcessCPU(b *testing.B) {
	p := startPoolProcess(b)
	ids := p.startRuns(b, benchRuns)
	raw, rawPool := rawSessions(b)
	// Warm both paths (connections, caches, the spool's first segment) before measuring.
	p.callAll(b, ids, 200)
	rawCalls(b, raw, 200, nil)
	watch := &cpuWatch{pool: p.pid, containers: map[string]bool{}}
	for _, id := range append(poolContainers(b, p.poolID), poolContainers(b, rawPool)...) {
		watch.containers[id] = true
	}
	// The discovery container of mcp-import may still be on its way out: counting it costs nothing.
	require.GreaterOrEqual(b, len(watch.containers), 2*benchRuns, "the benchmark's containers")

	var poolTime, rawTime, clientCPU, rawCPU time.Duration
	var poolUse usage
	var poolAllocs, poolBytes float64
	// Where the whole machine's CPU went in each kind of phase: on two saturated cores a
	// phase's rate is the CPU left to it over what its calls cost, wherever that is spent.
	var poolShare, rawShare cpuShare
	profile := os.Getenv("RINGFENCE_BENCH_CPUPROFILE")
	b.ResetTimer()
	for i, n := range []int{b.N / 2, b.N - b.N/2} {
		var wait []func()
		if i == 0 && profile != "" {
			// About the phase's length at ~1,000 calls/s.
			wait = append(wait, p.cpuProfile(b, profile, time.Duration(n)*time.Millisecond))
		}
		if i == 0 && os.Getenv("RINGFENCE_BENCH_PERF") == "1" {
			wait = append(wait, perfStat(b, p.pid))
		}
		record := os.Getenv("RINGFENCE_BENCH_PERF_RECORD")
		if i == 0 && record != "" {
			wait = append(wait, perfRecord(b, record+"-pool.data"))
		}
		allocProfile := os.Getenv("RINGFENCE_BENCH_ALLOCPROFILE")
		if i == 0 && allocProfile != "" {
			p.saveProfile(b, "allocs", allocProfile+"-before.pprof")
		}
		mallocs, allocated := p.allocs(b)
		machine0 := watch.sample(b)
		before, self := readUsage(b, p.pid), selfCPU(b)
		p.callAll(b, ids, n)
		after := readUsage(b, p.pid)
		poolShare = poolShare.add(watch.share(machine0, watch.sample(b)))
		if i == 0 && allocProfile != "" {
			p.saveProfile(b, "allocs", allocProfile+"-after.pprof")
		}
		clientCPU += selfCPU(b) - self
		m, a := p.allocs(b)
		poolAllocs, poolBytes = poolAllocs+m-mallocs, poolBytes+a-allocated
		poolTime += after.taken.Sub(before.taken)
		poolUse.cpu += after.cpu - before.cpu
		poolUse.ctxsw += after.ctxsw - before.ctxsw
		for _, w := range wait {
			w()
		}
		stopRecord := func() {}
		if i == 0 && record != "" {
			stopRecord = perfRecord(b, record+"-raw.data")
		}
		// RINGFENCE_BENCH_RAW_PACE=1 holds the raw phase to the rate the pool phase reached: the
		// engine's and the servers' CPU per call at the same rate (a diagnosis; of-raw then
		// means nothing).
		var pace *rate.Limiter
		if os.Getenv("RINGFENCE_BENCH_RAW_PACE") == "1" {
			pace = rate.NewLimiter(rate.Limit(float64(n)/after.taken.Sub(before.taken).Seconds()), 1)
		}
		machine0 = watch.sample(b)
		t0, self := time.Now(), selfCPU(b)
		rawCalls(b, raw, n, pace)
		rawTime += time.Since(t0)
		rawCPU += selfCPU(b) - self
		rawShare = rawShare.add(watch.share(machine0, watch.sample(b)))
		stopRecord()
	}
	b.StopTimer()
	// The gRPC hop's own floor, in the same run: b.N calls to a bare grpc-go server of the same
	// API in this process. grpc-bound-of-raw is the best of-raw a pool behind a gRPC front could
	// reach here were everything else it does free: the raw path's own CPU per call over that
	// plus the hop's.
	floor := startGRPCFloor(b)
	floorCalls(b, floor, p.args, 200)
	self := selfCPU(b)
	floorCalls(b, floor, p.args, b.N)
	floorPerCall := float64((selfCPU(b) - self).Nanoseconds()) / 1e3 / float64(b.N)
	rawPerCall := float64(rawShare.own().Nanoseconds()) / 1e3 / float64(b.N)
	b.ReportMetric(floorPerCall, "grpc-floor-cpu-µs/call")
	b.ReportMetric(rawPerCall/(rawPerCall+floorPerCall), "grpc-bound-of-raw")
	b.ReportMetric(float64(clientCPU.Microseconds())/float64(b.N), "client-cpu-µs/call")
	b.ReportMetric(float64(rawCPU.Microseconds())/float64(b.N), "raw-client-cpu-µs/call")
	calls, ceiling := float64(b.N)/poolTime.Seconds(), float64(b.N)/rawTime.Seconds()
	b.ReportMetric(calls, "calls/s")
	b.ReportMetric(ceiling, "raw-calls/s")
	b.ReportMetric(calls/ceiling, "of-raw")
	b.ReportMetric(float64(poolUse.cpu.Microseconds())/float64(b.N), "pool-cpu-µs/call")
	b.ReportMetric(float64(poolUse.ctxsw)/float64(b.N), "pool-ctxsw/call")
	b.ReportMetric(poolAllocs/float64(b.N), "pool-allocs/call")
	b.ReportMetric(poolBytes/float64(b.N), "pool-B/call")
	poolShare.report(b, "", b.N)
	rawShare.report(b, "raw-", b.N)
	// On two saturated cores each phase's rate is the CPU it gets over what a call costs: with
	// nothing else running, of-raw would be the raw path's cost per call over the pool path's.
	// Other processes take CPU per second, not per call, so they cost the slower phase more per
	// call and push of-raw below this.
	b.ReportMetric(float64(rawShare.own())/float64(max(poolShare.own(), 1)), "cpu-of-raw")
	// ringfenced idle beside the raw phase (its spool's and audit log's background work).
	b.ReportMetric(float64(rawShare.pool.Nanoseconds())/1e3/float64(b.N), "raw-pool-cpu-µs/call")
	p.endRuns(b, ids)
}

// soakCallsPerRun is how many calls each run of a soak round makes before it ends.
const soakCallsPerRun = 125

// BenchmarkPoolSoak (issue 23, part 3): b.N calls (100,000 in make bench) in rounds of 16 runs,
// each run started, called soakCallsPerRun times and ended, against ringfenced. It reports the
// process's RSS after every round (in the log), and its live heap after a forced collection
// after the first round and at the end: anything kept per call or per run shows as growth. The
// end's live heap must be within 10% of the first round's.
func BenchmarkPoolSoak(b *testing.B) {
	p := startPoolProcess(b)
	perRound := benchRuns * soakCallsPerRun
	start := readUsage(b, p.pid)
	var firstHeap int64
	var firstRSS usage
	calls := 0
	b.ResetTimer()
	for round := 1; calls < b.N; round++ {
		// Each run's first call is in startRuns.
		n := max(min(perRound, b.N-calls), benchRuns)
		ids := p.startRuns(b, benchRuns)
		p.callAll(b, ids, n-benchRuns)
		p.endRuns(b, ids)
		calls += n
		u := readUsage(b, p.pid)
		// Printed, not logged: a benchmark's log keeps ten lines. No line starts with a lower-case
		// word and a colon, which benchstat would read as configuration.
		fmt.Printf("Soak round %3d: %7d calls  RSS %6.1f MiB (anon %6.1f, file %6.1f)\n", round, calls, mib(u.rss), mib(u.anon), mib(u.file))
		if round == 1 {
			b.StopTimer()
			firstHeap, _ = p.liveHeap(b, "first")
			firstRSS = u
			b.StartTimer()
		}
	}
	b.StopTimer()
	end := readUsage(b, p.pid)
	// Idle: what the process holds ten seconds after the last call, before anything forces a
	// collection, as an operator's top sees it.
	time.Sleep(10 * time.Second)
	idle := readUsage(b, p.pid)
	heap, sys := p.liveHeap(b, "end")
	b.ReportMetric(float64(calls)/end.taken.Sub(start.taken).Seconds(), "calls/s")
	b.ReportMetric(float64((end.cpu-start.cpu).Microseconds())/float64(calls), "pool-cpu-µs/call")
	b.ReportMetric(mib(firstHeap), "heap-first-MiB")
	b.ReportMetric(mib(heap), "heap-end-MiB")
	b.ReportMetric(mib(firstRSS.rss), "rss-first-MiB")
	b.ReportMetric(mib(end.rss), "rss-end-MiB")
	b.ReportMetric(mib(end.anon), "anon-end-MiB")
	b.ReportMetric(mib(idle.rss), "rss-idle-MiB")
	b.Logf("after %d calls: live heap %.1f MiB after the first round, %.1f MiB at the end (runtime's Sys %.1f MiB); RSS idle %.1f MiB (anon %.1f, file %.1f)",
		calls, mib(firstHeap), mib(heap), mib(sys), mib(idle.rss), mib(idle.anon), mib(idle.file))
	if float64(heap) > 1.1*float64(firstHeap) {
		b.Errorf("the live heap grew from %.1f MiB after the first round to %.1f MiB after %d calls: more than 10%%", mib(firstHeap), mib(heap), calls)
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// indent puts a tab before every line of s, so that no line of it reads as a benchmark result
// or configuration.
func indent(s string) string {
	return "\t" + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n\t")
}
