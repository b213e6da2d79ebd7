package spawner

import (
	"context"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// Run with:
//
//	go test ./services/pool/spawner -run '^$' -bench . -benchtime=20x
//
// Each iteration is one cold discovery: start a server, handshake, list every
// tool, stop it and wait until it is gone. BenchmarkColdDiscovery does it
// through the spawner (hardened container over the Engine API);
// BenchmarkDockerRunBaseline does the same over the stdio of
// `docker run -i --rm <image> mcpfixture`, ...Hardened with the spawner's
// profile given as docker run flags. On a shared machine the separate runs
// drift; BenchmarkColdDiscoveryVsDockerRun alternates the spawner and the
// hardened baseline within one run and reports their ratio.

// hardenedRunFlags are the spawner's profile as `docker run` flags.
var hardenedRunFlags = []string{
	"--init", "--user", "65534:65534", "--read-only", "--cap-drop", "ALL",
	"--security-opt", "no-new-privileges", "--network", "none", "--ipc", "private",
	"--pids-limit", "128", "--memory", "512m", "--memory-swap", "512m", "--cpus", "1",
	"--tmpfs", "/tmp:rw,noexec,nosuid,nodev,size=64m", "--log-driver", "none",
}

func BenchmarkColdDiscovery(b *testing.B) {
	e := dockerEnv(b)
	r := benchRouter(b, e)
	var total, spawnD, listD, closeD []time.Duration
	for b.Loop() {
		p := coldDiscovery(b, r)
		total = append(total, p.spawn+p.list+p.close)
		spawnD = append(spawnD, p.spawn)
		listD = append(listD, p.list)
		closeD = append(closeD, p.close)
	}
	reportPercentiles(b, "", total)
	reportPercentiles(b, "spawn-", spawnD)
	reportPercentiles(b, "list-", listD)
	reportPercentiles(b, "close-", closeD)
}

func BenchmarkDockerRunBaseline(b *testing.B) {
	e := dockerEnv(b)
	args := dockerRunArgs(b, e)
	var total []time.Duration
	for b.Loop() {
		total = append(total, dockerRun(b, args))
	}
	reportPercentiles(b, "", total)
}

func BenchmarkDockerRunBaselineHardened(b *testing.B) {
	e := dockerEnv(b)
	args := dockerRunArgs(b, e, hardenedRunFlags...)
	var total []time.Duration
	for b.Loop() {
		total = append(total, dockerRun(b, args))
	}
	reportPercentiles(b, "", total)
}

func BenchmarkColdDiscoveryVsDockerRun(b *testing.B) {
	e := dockerEnv(b)
	r := benchRouter(b, e)
	args := dockerRunArgs(b, e, hardenedRunFlags...)
	var ours, theirs []time.Duration
	i := 0
	for b.Loop() {
		runOurs := func() {
			p := coldDiscovery(b, r)
			ours = append(ours, p.spawn+p.list+p.close)
		}
		runTheirs := func() { theirs = append(theirs, dockerRun(b, args)) }
		// Alternate which goes first, so neither always runs on a warmer engine.
		if i%2 == 0 {
			runOurs()
			runTheirs()
		} else {
			runTheirs()
			runOurs()
		}
		i++
	}
	reportPercentiles(b, "spawner-", ours)
	reportPercentiles(b, "dockerrun-", theirs)
	b.ReportMetric(float64(percentile(ours, 0.50))/float64(percentile(theirs, 0.50)), "p50-ratio")
	b.ReportMetric(float64(percentile(ours, 0.99))/float64(percentile(theirs, 0.99)), "p99-ratio")
	b.ReportMetric(0, "ns/op")
}

func benchRouter(b *testing.B, e *env) *Router {
	r := e.router()
	_, err := r.Preflight(context.Background()) // the pool resolves the image once, at start
	require.NoError(b, err)
	return r
}

type phases struct{ spawn, list, close time.Duration }

func coldDiscovery(b *testing.B, r *Router) phases {
	ctx := context.Background()
	t0 := time.Now()
	s, err := r.Spawn(ctx, fixtureSpec())
	require.NoError(b, err)
	t1 := time.Now()
	tools, err := s.ListTools(ctx)
	require.NoError(b, err)
	require.NotEmpty(b, tools)
	t2 := time.Now()
	require.NoError(b, s.Close(ctx))
	t3 := time.Now()
	return phases{spawn: t1.Sub(t0), list: t2.Sub(t1), close: t3.Sub(t2)}
}

func dockerRunArgs(b *testing.B, e *env, flags ...string) []string {
	args := append([]string{"run", "-i", "--rm", "--label", LabelPool + "=" + e.poolID}, flags...)
	return append(args, e.image, "mcpfixture")
}

// dockerRun does one cold discovery over `docker run -i --rm`.
func dockerRun(b *testing.B, args []string) time.Duration {
	dockerCLI, err := exec.LookPath("docker")
	require.NoError(b, err, "the baseline needs the docker CLI")
	ctx := context.Background()
	t0 := time.Now()
	c := mcp.NewClient(&mcp.Implementation{Name: "baseline", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: exec.Command(dockerCLI, args...)},
		&mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	require.NoError(b, err)
	res, err := cs.ListTools(ctx, nil)
	require.NoError(b, err)
	require.NotEmpty(b, res.Tools)
	// Closing stdin ends `docker run -i --rm`, which returns once the
	// container is removed; CommandTransport waits for it.
	require.NoError(b, cs.Close())
	return time.Since(t0)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func reportPercentiles(b *testing.B, prefix string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(ds, 0.50)), prefix+"p50-ms")
	b.ReportMetric(ms(percentile(ds, 0.99)), prefix+"p99-ms")
	if prefix == "" {
		// The percentiles are the result; a mean per op would hide the tail.
		b.ReportMetric(0, "ns/op")
	}
}
