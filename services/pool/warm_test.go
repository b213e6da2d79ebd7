package pool

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// The warm-container tests run on the real engine: what they prove (one run per container,
// the profile of a cold start, the sweep) is about containers.

// warmHarness is a harness that keeps warm containers (checked every 50 ms) and a server fx
// asking for prewarm of them, with the canary token one, and graph g binding its echo and
// env tools.
func warmHarness(t *testing.T, prewarm int, opts harnessOpts) *harness {
	t.Helper()
	if opts.maxWarm == 0 {
		opts.maxWarm = 8
	}
	if opts.warmRefresh == 0 {
		opts.warmRefresh = 50 * time.Millisecond
	}
	opts.driftMaxAge = time.Second
	h := newHarness(t, opts)
	h.server("fx", func(r *registryv1.CreateServerRequest) {
		r.Prewarm = int32(prewarm)
		r.Env = env("APP_TOKEN", "one")
	})
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo", "env"}}}, nil)
	return h
}

// warmContainers lists the pool's containers labelled purpose=warm, oldest first by creation.
func warmContainers(t testing.TB, poolID string) []container.Summary {
	t.Helper()
	docker := dockertest.RequireEngine(t)
	f := client.Filters{}
	f.Add("label", "io.ringfence.pool="+poolID, "io.ringfence.purpose="+spawner.PurposeWarm)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	require.NoError(t, err)
	return list.Items
}

// waitReady waits until the pool holds n warm sessions ready.
func (h *harness) waitReady(n int) {
	h.t.Helper()
	require.Eventually(h.t, func() bool { return h.pool.warm.count() == n }, 60*time.Second, 20*time.Millisecond,
		"the pool holds %d warm sessions (it holds %d)", n, h.pool.warm.count())
}

// readyHosts are the hostnames (12-digit IDs) of the running containers labelled warm, but
// for those the test saw taken by runs: a label cannot change once the container exists.
func (h *harness) readyHosts(taken ...string) []string {
	h.t.Helper()
	var out []string
	for _, c := range warmContainers(h.t, h.poolID) {
		if c.State == container.StateRunning && !slices.Contains(taken, c.ID[:12]) {
			out = append(out, c.ID[:12])
		}
	}
	return out
}

// hostOf calls env in run and returns the HOSTNAME its server sees (the container's short ID),
// the APP_TOKEN the engine says the container was given (results mask it), and whether the
// call's session was warm.
func (h *harness) hostOf(t *testing.T, run string) (host, token string, warm bool) {
	t.Helper()
	res, err := h.call(run, "a", "fx__env", map[string]any{})
	require.NoError(t, err)
	for _, kv := range res.StructuredContent["env"].([]any) {
		if v, ok := strings.CutPrefix(kv.(string), "HOSTNAME="); ok {
			host = v
		}
	}
	require.NotEmpty(t, host)
	got, err := dockertest.RequireEngine(t).ContainerInspect(t.Context(), host, client.ContainerInspectOptions{})
	require.NoError(t, err)
	for _, kv := range got.Container.Config.Env {
		if v, ok := strings.CutPrefix(kv, "APP_TOKEN="); ok {
			token = v
		}
	}
	return host, token, h.last().WarmSession
}

func (h *harness) hits() float64 { return h.hitsOf("fx") }
func (h *harness) hitsOf(ref string) float64 {
	return testutil.ToFloat64(h.pool.metrics.warmHits.WithLabelValues(ref))
}
func (h *harness) misses() float64 {
	return testutil.ToFloat64(h.pool.metrics.warmMisses.WithLabelValues("fx"))
}
func (h *harness) discards(reason string) float64 {
	return testutil.ToFloat64(h.pool.metrics.warmDiscarded.WithLabelValues(reason))
}

// TestAWarmContainerServesOneRunOnly: a run's first call takes the warm container; the pool
// starts another, which the next run takes; the first run keeps its own for its later calls,
// and its container stops with it, never going back to the warm set.
func TestAWarmContainerServesOneRunOnly(t *testing.T) {
	h := warmHarness(t, 1, harnessOpts{})
	h.waitReady(1)
	first := h.readyHosts()
	require.Len(t, first, 1)

	run1 := h.start("g")
	host1, token, warm := h.hostOf(t, run1)
	require.Equal(t, first[0], host1, "run 1 is served by the warm container")
	require.True(t, warm, "its audit record says the session was warm")
	require.Equal(t, "one", token)
	require.Equal(t, 1.0, h.hits())

	h.waitReady(1) // refilled
	second := h.readyHosts(host1)
	require.Len(t, second, 1)
	require.NotEqual(t, host1, second[0], "the refill is another container")

	run2 := h.start("g")
	host2, _, warm := h.hostOf(t, run2)
	require.Equal(t, second[0], host2, "run 2 takes the new warm container, not run 1's")
	require.True(t, warm)
	again, _, warm := h.hostOf(t, run1)
	require.Equal(t, host1, again, "run 1 keeps its own session")
	require.True(t, warm, "every call the warm session serves says so")

	_, err := h.pool.EndRun(h.ctx, run1, "", StateCompleted, "")
	require.NoError(t, err)
	h.waitReady(1)
	require.Eventually(t, func() bool {
		for _, c := range warmContainers(t, h.poolID) {
			if c.ID[:12] == host1 {
				return false
			}
		}
		return true
	}, 20*time.Second, 50*time.Millisecond, "run 1's container stopped with its run")
	require.NotContains(t, h.readyHosts(host2), host1, "and never went back to the warm set")
	require.Len(t, h.readyHosts(host2), 1, "the warm set holds a third container, not run 2's")
	for _, a := range h.attempts() {
		require.True(t, a.WarmSession, "%+v", a)
	}
}

// TestARegistrationChangeDiscardsWarmContainers: after an update, warm containers of the old
// revision are never handed out. The poll of the registry replaces them; and should a run come
// first, the registration resolved for its call does not match, so the container is discarded
// and the run gets one started from the registration as it is now.
func TestARegistrationChangeDiscardsWarmContainers(t *testing.T) {
	update := func(h *harness, token string) {
		_, err := h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture",
			Grants: []string{"process_spawn", "external_api_call"}, Env: env("APP_TOKEN", token), Prewarm: 1})
		require.NoError(t, err)
	}
	t.Run("the poll replaces them", func(t *testing.T) {
		h := warmHarness(t, 1, harnessOpts{})
		h.waitReady(1)
		old := h.readyHosts()
		require.Len(t, old, 1)
		update(h, "two")
		require.Eventually(t, func() bool {
			ready := h.readyHosts()
			return h.pool.warm.count() == 1 && len(ready) == 1 && ready[0] != old[0]
		}, 60*time.Second, 20*time.Millisecond, "the old warm container is replaced")
		require.Positive(t, h.discards(discardStale))
		host, token, warm := h.hostOf(t, h.start("g"))
		require.True(t, warm)
		require.NotEqual(t, old[0], host)
		require.Equal(t, "two", token, "the warm container has the registration as it is now")
	})
	t.Run("a run's first call refuses them", func(t *testing.T) {
		h := warmHarness(t, 1, harnessOpts{warmRefresh: time.Hour})
		h.pool.warm.wake() // the registration came after the first poll
		h.waitReady(1)
		old := h.readyHosts()
		update(h, "two") // no poll sees it before the run
		host, token, warm := h.hostOf(t, h.start("g"))
		require.False(t, warm, "the stale warm container is not handed out")
		require.NotEqual(t, old[0], host)
		require.Equal(t, "two", token)
		require.Equal(t, 1.0, h.discards(discardStale))
		require.Equal(t, 1.0, h.misses())
	})
}

// TestADeadWarmContainerIsNotHandedOut: a warm container killed, or frozen so that it no longer
// answers, while it waits is discarded and replaced; the run's first call gets a live server.
func TestADeadWarmContainerIsNotHandedOut(t *testing.T) {
	docker := dockertest.RequireEngine(t)
	for name, breakIt := range map[string]func(id string) error{
		"killed": func(id string) error {
			_, err := docker.ContainerKill(t.Context(), id, client.ContainerKillOptions{Signal: "KILL"})
			return err
		},
		"frozen": func(id string) error {
			_, err := docker.ContainerPause(t.Context(), id, client.ContainerPauseOptions{})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			// A long poll interval: the run's first call meets the broken container before
			// the keeper looks at it again.
			h := warmHarness(t, 1, harnessOpts{warmRefresh: time.Hour})
			h.pool.warm.wake()
			h.waitReady(1)
			broken := h.readyHosts()[0]
			require.NoError(t, breakIt(broken))
			host, _, _ := h.hostOf(t, h.start("g"))
			require.NotEqual(t, broken, host, "the broken container was not handed out")
			require.Eventually(t, func() bool { return h.discards(discardDead) == 1 }, 20*time.Second, 20*time.Millisecond)
			h.waitReady(1)
			require.NotContains(t, h.readyHosts(), broken, "it was replaced")
		})
	}
}

// TestWarmContainersCountTowardTheLimits: warm containers hold places under
// pool.max_sessions (so they never start past it) and pool.max_warm; a run that needs a place
// they hold takes it, stopping the oldest; only runs' own sessions refuse a run.
func TestWarmContainersCountTowardTheLimits(t *testing.T) {
	t.Run("max_warm", func(t *testing.T) {
		h := warmHarness(t, 3, harnessOpts{maxWarm: 1})
		h.waitReady(1)
		time.Sleep(300 * time.Millisecond) // several turns of the keeper
		require.Equal(t, 1, h.pool.warm.count(), "at most pool.max_warm, whatever the registrations ask")
		require.Len(t, h.readyHosts(), 1)
	})
	t.Run("max_sessions", func(t *testing.T) {
		h := warmHarness(t, 3, harnessOpts{maxSessions: 2})
		h.server("fy", nil)
		h.publish("g2", []string{"a"}, []imp{{"fy", "a", []string{"echo"}}}, nil)
		h.waitReady(2)
		time.Sleep(300 * time.Millisecond)
		require.Equal(t, 2, h.pool.warm.count(), "no warm container starts past pool.max_sessions")
		require.Equal(t, int64(2), h.pool.liveSessions.Load(), "each holds a place")

		run1 := h.start("g")
		_, _, warm := h.hostOf(t, run1)
		require.True(t, warm)
		require.Equal(t, int64(2), h.pool.liveSessions.Load(), "the taken one keeps its place; no refill past the limit")
		require.Equal(t, 1, h.pool.warm.count())

		run2 := h.start("g2")
		_, err := h.call(run2, "a", "fy__echo", map[string]any{"text": "x"})
		require.NoError(t, err, "a run that needs the place of a warm container takes it")
		require.Equal(t, 1.0, h.discards(discardEvicted))
		require.Equal(t, 0, h.pool.warm.count())
		require.Equal(t, int64(2), h.pool.liveSessions.Load())

		_, err = h.call(h.start("g"), "a", "fx__echo", map[string]any{"text": "x"})
		requireRefused(t, err, reasonLimitExceeded)

		_, err = h.pool.EndRun(h.ctx, run1, "", StateCompleted, "")
		require.NoError(t, err)
		h.waitReady(1)
		require.Equal(t, int64(2), h.pool.liveSessions.Load())
	})
}

// TestAWarmContainerHasTheProfileOfAColdOne compares, field by field as the engine reports
// them, a warm container with the cold one the same registration starts for a run: the same
// image, command, env (secrets resolved), user, limits, mounts, network and every other part of
// the profile. Only the labels that say what a container is for differ (purpose warm and no
// run, against purpose run and the run's id), with the names the engine gives each container.
func TestAWarmContainerHasTheProfileOfAColdOne(t *testing.T) {
	docker := dockertest.RequireEngine(t)
	h := warmHarness(t, 1, harnessOpts{})
	h.waitReady(1)
	inspect := func(host string) container.InspectResponse {
		t.Helper()
		got, err := docker.ContainerInspect(t.Context(), host, client.ContainerInspectOptions{})
		require.NoError(t, err)
		return got.Container
	}
	warm := inspect(h.readyHosts()[0])
	run1 := h.start("g")
	_, _, took := h.hostOf(t, run1)
	require.True(t, took)

	// The registration as it was, but asking for no warm container: the next run starts cold.
	_, err := h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture",
		Grants: []string{"process_spawn", "external_api_call"}, Env: env("APP_TOKEN", "one")})
	require.NoError(t, err)
	run2 := h.start("g")
	coldHost, _, took := h.hostOf(t, run2)
	require.False(t, took)
	cold := inspect(coldHost)

	require.Equal(t, map[string]string{spawner.LabelPurpose: spawner.PurposeWarm, spawner.LabelRun: ""},
		map[string]string{spawner.LabelPurpose: warm.Config.Labels[spawner.LabelPurpose], spawner.LabelRun: warm.Config.Labels[spawner.LabelRun]})
	require.Equal(t, map[string]string{spawner.LabelPurpose: spawner.PurposeRun, spawner.LabelRun: run2},
		map[string]string{spawner.LabelPurpose: cold.Config.Labels[spawner.LabelPurpose], spawner.LabelRun: cold.Config.Labels[spawner.LabelRun]})
	require.Equal(t, slices.Sorted(maps.Keys(cold.NetworkSettings.Networks)), slices.Sorted(maps.Keys(warm.NetworkSettings.Networks)), "the same network")
	for _, c := range []*container.InspectResponse{&warm, &cold} {
		// What the engine names each container by, and the labels just compared.
		c.ID, c.Name, c.Created, c.State = "", "", "", nil
		c.ResolvConfPath, c.HostnamePath, c.HostsPath, c.LogPath = "", "", "", ""
		c.GraphDriver, c.Storage, c.NetworkSettings = nil, nil, nil
		c.Config.Hostname = ""
		delete(c.Config.Labels, spawner.LabelPurpose)
		delete(c.Config.Labels, spawner.LabelRun)
	}
	require.NotEmpty(t, warm.Config.Env)
	require.Contains(t, warm.Config.Env, "APP_TOKEN=one", "the resolved secret")
	require.Equal(t, cold.Image, warm.Image, "the same image")
	require.Equal(t, *cold.Config, *warm.Config)
	require.Equal(t, *cold.HostConfig, *warm.HostConfig)
	require.Equal(t, cold, warm, "every other field")
}

// TestWarmContainersAreRecycledAfterTheirMaximumAge: a warm container that waited
// pool.warm_max_age is replaced by a fresh one, so none lives for days.
func TestWarmContainersAreRecycledAfterTheirMaximumAge(t *testing.T) {
	h := warmHarness(t, 1, harnessOpts{warmMaxAge: 500 * time.Millisecond})
	h.waitReady(1)
	first := h.readyHosts()
	require.Len(t, first, 1)
	require.Eventually(t, func() bool {
		ready := h.readyHosts()
		return h.discards(discardExpired) >= 1 && len(ready) == 1 && ready[0] != first[0]
	}, 60*time.Second, 20*time.Millisecond, "the warm container is replaced once it is older than the maximum age")
}

// TestParallelFirstCallsShareOneWarmContainer: first calls a run makes at once to a server
// share one session, as they share one spawn: one warm container serves them all, and no other
// is taken (and wasted) or started cold.
func TestParallelFirstCallsShareOneWarmContainer(t *testing.T) {
	h := warmHarness(t, 2, harnessOpts{})
	h.waitReady(2)
	spawned := h.spawned()
	run := h.start("g")
	const calls = 6
	hosts := make(chan string, calls)
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			res, err := h.call(run, "a", "fx__env", map[string]any{})
			if !assert.NoError(t, err) {
				return
			}
			for _, kv := range res.StructuredContent["env"].([]any) {
				if v, ok := strings.CutPrefix(kv.(string), "HOSTNAME="); ok {
					hosts <- v
				}
			}
		})
	}
	wg.Wait()
	close(hosts)
	var seen []string
	for host := range hosts {
		seen = append(seen, host)
	}
	require.Len(t, seen, calls)
	require.Len(t, slices.Compact(slices.Sorted(slices.Values(seen))), 1, "one container served every first call")
	require.Equal(t, 1.0, h.hits())
	require.Equal(t, 0.0, h.misses())
	require.Equal(t, 0.0, h.discards(discardUnwanted)+h.discards(discardDead)+h.discards(discardStale))
	require.Eventually(t, func() bool { return h.pool.warm.count() == 2 }, 60*time.Second, 20*time.Millisecond)
	require.Equal(t, spawned+1, h.spawned(), "one refill, and nothing started cold")
	for _, a := range h.attempts() {
		require.True(t, a.WarmSession)
	}
}

// TestShareDividesTheCapEvenly: pool.max_warm is shared one each in ref order, then a second
// each, up to what each registration asks.
func TestShareDividesTheCapEvenly(t *testing.T) {
	targets := map[string]mcpserver.WarmTarget{"a": {Ref: "a", Prewarm: 3}, "b": {Ref: "b", Prewarm: 1}, "c": {Ref: "c", Prewarm: 2}}
	for limit, want := range map[int]map[string]int{
		0:  {},
		1:  {"a": 1},
		2:  {"a": 1, "b": 1},
		4:  {"a": 2, "b": 1, "c": 1},
		5:  {"a": 2, "b": 1, "c": 2},
		16: {"a": 3, "b": 1, "c": 2},
	} {
		require.Equal(t, want, share(targets, limit), "limit %d", limit)
	}
}
