package tests

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The whole machine's CPU time over a benchmark phase, split by who spent it, so that a
// phase's rate on a saturated machine can be explained: on two busy cores the calls per
// second of a phase are the CPU left to it over the CPU its calls cost, everywhere.

// cpuShare is the CPU time one phase cost, by who spent it.
type cpuShare struct {
	// pool is ringfenced (every thread: gRPC, gates, the spool, the audit log).
	pool time.Duration
	// client is this process: the load generator (the gRPC client, or the raw go-sdk sessions).
	client time.Duration
	// engine is dockerd, containerd and the containerd-shim of each of the benchmark's
	// containers: the attach streams' copies between the socket and each container's stdio.
	engine time.Duration
	// servers is the benchmark's containers (docker-init and the MCP server), from their cgroups.
	servers time.Duration
	// kernel is kernel threads (kworker, ksoftirqd, jbd2, …).
	kernel time.Duration
	// other is the rest of the machine's busy time: other processes (other engineers' builds
	// and tests, other containers and their shims), and processes that ended during the phase.
	other time.Duration
	// steal is time the hypervisor gave to other guests while this one wanted to run.
	steal time.Duration
	// busy is the machine's busy time in all (user, nice, system, irq, softirq; steal apart),
	// and total its time in all, idle and steal included.
	busy, total time.Duration
}

func (s cpuShare) add(o cpuShare) cpuShare {
	return cpuShare{
		pool: s.pool + o.pool, client: s.client + o.client, engine: s.engine + o.engine,
		servers: s.servers + o.servers, kernel: s.kernel + o.kernel, other: s.other + o.other,
		steal: s.steal + o.steal, busy: s.busy + o.busy, total: s.total + o.total,
	}
}

// own is what the benchmark's processes, containers and the kernel's threads spent: the
// machine's busy time without the other processes'.
func (s cpuShare) own() time.Duration { return s.busy - s.other }

// report adds the share's figures per call to b's results, each name prefixed.
func (s cpuShare) report(b *testing.B, prefix string, calls int) {
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(calls) }
	b.ReportMetric(per(s.engine), prefix+"engine-cpu-µs/call")
	b.ReportMetric(per(s.servers), prefix+"server-cpu-µs/call")
	b.ReportMetric(per(s.kernel), prefix+"kernel-cpu-µs/call")
	b.ReportMetric(per(s.other), prefix+"other-cpu-µs/call")
	b.ReportMetric(per(s.busy), prefix+"machine-cpu-µs/call")
	b.ReportMetric(float64(s.busy)/float64(max(s.total, 1)), prefix+"busy")
	b.ReportMetric(float64(s.steal)/float64(max(s.total, 1)), prefix+"steal")
}

// cpuWatch samples where the machine's CPU time went; who tells it the processes and the
// containers that belong to the benchmark.
type cpuWatch struct {
	pool       int             // ringfenced's pid
	containers map[string]bool // the benchmark's container ids
}

// cpuSample is where the machine's CPU time had gone at one moment.
type cpuSample struct {
	busy, steal, total time.Duration
	procs              map[int]procTime
	cgroups            map[string]time.Duration // container id → its cgroup's CPU time
}

// procTime is one process's CPU time (every thread, live and ended) and its place in the tree.
type procTime struct {
	comm  string
	ppid  int
	start string // starttime, which tells a reused pid apart
	cpu   time.Duration
	shim  string // for a containerd-shim, the id of the container it runs
}

// cpuacctRoot is where cgroup v1 keeps the CPU time of Docker's containers (cgroupfs driver).
const cpuacctRoot = "/sys/fs/cgroup/cpuacct/docker"

func (w *cpuWatch) sample(b *testing.B) cpuSample {
	b.Helper()
	s := cpuSample{procs: map[int]procTime{}, cgroups: map[string]time.Duration{}}
	s.busy, s.steal, s.total = machineTimes(b)
	dirs, err := os.ReadDir("/proc")
	require.NoError(b, err)
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if p, ok := readProcTime(pid); ok {
			s.procs[pid] = p
		}
	}
	for id := range w.containers {
		if usage, err := os.ReadFile(filepath.Join(cpuacctRoot, id, "cpuacct.usage")); err == nil {
			if ns, err := strconv.ParseInt(strings.TrimSpace(string(usage)), 10, 64); err == nil {
				s.cgroups[id] = time.Duration(ns)
			}
		}
	}
	return s
}

// readProcTime reads /proc/<pid>/stat (and, for a shim, its command line); ok is false when
// the process ended meanwhile.
func readProcTime(pid int) (procTime, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procTime{}, false
	}
	open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return procTime{}, false
	}
	// Fields after the command name: state is f[0], ppid f[1], utime f[11], stime f[12],
	// starttime f[19] (fields 3, 4, 14, 15 and 22 of proc(5)).
	f := strings.Fields(string(stat[end+1:]))
	if len(f) < 20 {
		return procTime{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	p := procTime{comm: string(stat[open+1 : end]), ppid: ppid, start: f[19], cpu: time.Duration(utime+stime) * time.Second / userHZ}
	if p.comm == "containerd-shim" { // containerd-shim-runc-v2, cut to 15 characters
		if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
			args := strings.Split(string(cmd), "\x00")
			for i, a := range args[:max(len(args)-1, 0)] {
				if a == "-id" {
					p.shim = args[i+1]
				}
			}
		}
	}
	return p, true
}

// machineTimes reads the first line of /proc/stat: the time all CPUs spent busy (user, nice,
// system, irq, softirq), stolen by the hypervisor, and in all.
func machineTimes(b *testing.B) (busy, steal, total time.Duration) {
	data, err := os.ReadFile("/proc/stat")
	require.NoError(b, err)
	line, _, _ := strings.Cut(string(data), "\n")
	// user nice system idle iowait irq softirq steal guest guest_nice; guest time is counted
	// in user and nice already.
	for i, f := range strings.Fields(line)[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		require.NoError(b, err)
		d := time.Duration(n) * time.Second / userHZ
		switch {
		case i >= 8:
		case i == 7:
			steal, total = steal+d, total+d
		case i == 3 || i == 4:
			total += d
		default:
			busy, total = busy+d, total+d
		}
	}
	return busy, steal, total
}

// share splits what the machine spent between two samples.
func (w *cpuWatch) share(before, after cpuSample) cpuShare {
	s := cpuShare{busy: after.busy - before.busy, steal: after.steal - before.steal, total: after.total - before.total}
	self := os.Getpid()
	for pid, p := range after.procs {
		spent := p.cpu
		if q, ok := before.procs[pid]; ok && q.start == p.start {
			spent -= q.cpu
		}
		switch {
		case pid == w.pool:
			s.pool += spent
		case pid == self:
			s.client += spent
		case pid == 2 || p.ppid == 2:
			s.kernel += spent
		case p.comm == "dockerd" || p.comm == "containerd" || w.containers[p.shim]:
			s.engine += spent
		}
		// The containers' processes are counted from their cgroups below, which keep the time
		// of ended processes too; the rest is other, by difference.
	}
	for id, cpu := range after.cgroups {
		s.servers += cpu - before.cgroups[id]
	}
	s.other = s.busy - s.pool - s.client - s.engine - s.servers - s.kernel
	return s
}
