package tests

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
)

// warmOf lists the running containers of the pool labelled purpose=warm: the warm set, and
// those runs took (a label cannot change once a container exists).
func warmOf(t *testing.T, poolID string) []container.Summary {
	t.Helper()
	docker := dockertest.RequireEngine(t)
	f := client.Filters{}
	f.Add("label", "io.ringfence.pool="+poolID, "io.ringfence.purpose=warm")
	f.Add("status", "running")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	require.NoError(t, err)
	return list.Items
}

// waitWarm waits until n warm containers of the pool run, and returns them.
func waitWarm(t *testing.T, poolID string, n int, why string) []container.Summary {
	t.Helper()
	var got []container.Summary
	require.Eventually(t, func() bool {
		got = warmOf(t, poolID)
		return len(got) == n
	}, 60*time.Second, 100*time.Millisecond, "%s: %d warm containers run (%d do)", why, n, len(got))
	return got
}

func idsOf(cs []container.Summary) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.ID)
	}
	slices.Sort(out)
	return out
}

// TestWarmContainersEndToEnd: an operator asks for warm containers with the CLI, sees them
// ready in `servers show` and `servers list`, a run's first call takes one (its audit record
// says so, and the metrics count the hit), and asking for none discards the rest.
func TestWarmContainersEndToEnd(t *testing.T) {
	d, cli, poolID := runsDaemon(t, "RINGFENCE_POOL__MAX_WARM=4")
	t.Cleanup(d.stop) // before the check that no container is left: the daemon holds warm ones
	must := func(r result) result {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
		return r
	}
	r := cli("servers", "update", "fx", "--prewarm", "17")
	require.NotEqual(t, 0, r.Code)
	require.Contains(t, r.Stderr, "--prewarm must be between 0 and 16")
	// Without the floor's grants every call to a server is denied: warm containers of it could
	// never be taken, and are refused (docs/api.md).
	r = cli("servers", "add", "idle", "--command", "mcpfixture", "--prewarm", "1")
	require.NotEqual(t, 0, r.Code, r.Stdout)
	require.Contains(t, r.Stderr, "prewarm: is 1, but grants do not grant external_api_call and process_spawn")
	require.Contains(t, r.Stderr, "or set prewarm to 0")
	must(cli("servers", "update", "fx", "--prewarm", "2"))
	waitWarm(t, poolID, 2, "prewarm 2")
	require.Eventually(t, func() bool {
		return regexp.MustCompile(`(?m)^prewarm:\s+2 \(ready 2, starting 0\)$`).MatchString(cli("servers", "show", "fx").Stdout)
	}, 30*time.Second, 100*time.Millisecond, "servers show reports the pool's warm containers")
	require.Regexp(t, `(?m)^fx\s.*\s2/2\s+\d+$`, must(cli("servers", "list")).Stdout)

	must(cli("runs", "start", "--graph", "demo", "--run", "warm-1"))
	r = must(cli("runs", "call", "--run", "warm-1", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"warm"}`))
	require.Contains(t, r.Stdout, "warm")
	require.Eventually(t, func() bool {
		r := cli("audit", "list", "--run", "warm-1", "--kind", "tool_call", "-o", "json")
		return r.Code == 0 && strings.Contains(r.Stdout, `"warm_session": true`) && strings.Contains(r.Stdout, `"succeeded"`)
	}, 20*time.Second, 100*time.Millisecond, "the call's audit record says its session was warm")
	resp, err := http.Get("http://" + d.HTTPAddr + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(metrics), `ringfence_pool_warm_hits_total{server="fx"} 1`)
	require.Contains(t, string(metrics), `ringfence_pool_warm_refills_total{result="ready",server="fx"}`)

	must(cli("servers", "update", "fx", "--prewarm", "0"))
	waitWarm(t, poolID, 1, "prewarm 0 leaves only the container run warm-1 took")
	require.Regexp(t, `(?m)^prewarm:\s+0$`, must(cli("servers", "show", "fx")).Stdout)
	must(cli("runs", "end", "--run", "warm-1"))
	waitWarm(t, poolID, 0, "the taken container stops with its run")
}

// TestSIGKILLLeavesNoWarmContainerBehind kills ringfenced while it holds warm containers and
// starts it again: none of them is left (each exits as its stdin closes, and the sweep at start
// removes what remains), and the new process keeps warm containers of its own.
func TestSIGKILLLeavesNoWarmContainerBehind(t *testing.T) {
	d, poolID := poolDaemon(t)
	t.Cleanup(d.stop)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	registerServer(t, api, `{"ref":"fx","command":"mcpfixture","prewarm":2,"grants":["process_spawn","external_api_call"]}`)
	before := idsOf(waitWarm(t, poolID, 2, "before the kill"))
	d.kill()
	d.start()
	after := idsOf(waitWarm(t, poolID, 2, "after the restart"))
	for _, id := range before {
		require.NotContains(t, after, id, "no warm container of the killed process is left")
	}
	for _, c := range warmOf(t, poolID) {
		require.NotContains(t, before, c.ID)
	}
}

// TestAnImageChangeDiscardsWarmContainers: after a restart with another isolation image, every
// warm container runs the new image and none of the old one is left.
func TestAnImageChangeDiscardsWarmContainers(t *testing.T) {
	docker := dockertest.RequireEngine(t)
	out := runCmd(t, nil, nil, bin("ringfence"), "image", "build", "--binary", fixtures.Binaries(t).Path(t, "mcpfixture"),
		"--name", "ringfence-e2e-warm:"+randomHex(4), "-o", "json")
	require.Equal(t, 0, out.Code, out.Stderr)
	var built struct{ Image string }
	require.NoError(t, json.Unmarshal([]byte(out.Stdout), &built))
	t.Cleanup(func() {
		_, _ = docker.ImageRemove(context.Background(), built.Image, client.ImageRemoveOptions{Force: true})
	})
	first := dockertest.FixtureImage(t)
	require.NotEqual(t, first, built.Image)

	d, poolID := poolDaemon(t)
	t.Cleanup(d.stop)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	registerServer(t, api, `{"ref":"fx","command":"mcpfixture","prewarm":2,"grants":["process_spawn","external_api_call"]}`)
	for _, c := range waitWarm(t, poolID, 2, "on the first image") {
		require.Equal(t, first, c.ImageID)
	}
	d.stop()
	for i, kv := range d.env {
		if strings.HasPrefix(kv, "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE=") {
			d.env[i] = "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE=" + built.Image
		}
	}
	d.start()
	for _, c := range waitWarm(t, poolID, 2, "on the new image") {
		require.Equal(t, built.Image, c.ImageID, "every warm container runs the new image")
	}
}
