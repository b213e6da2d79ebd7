package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
)

// TestRegisteringStartsNothing: seed 000, "Registering does not spawn anything. Listing tools
// starts the registered command inside the pinned image": creating and updating a registration
// (without prewarm) creates no container of the pool, and listing its tools creates one, which
// also shows the count below sees a discovery's container.
func TestRegisteringStartsNothing(t *testing.T) {
	h := newHarness(t)
	since := time.Now()
	h.server("fx", nil)
	_, err := h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture", Grants: []string{"process_spawn", "external_api_call"}})
	require.NoError(t, err)
	require.Zero(t, containersCreated(t, h.poolID, since), "registering starts no server")

	_, err = h.reg.ListServerTools(h.ctx, &registryv1.ListServerToolsRequest{Ref: "fx"})
	require.NoError(t, err)
	require.Equal(t, 1, containersCreated(t, h.poolID, since), "listing tools starts the server in isolation")
	requireNoContainers(t, h.poolID)
}

// TestImportStartsTheServerOnceAndStopsIt: seed 000, the importer "spawns the server once,
// takes its tool list, stops it": an import of two tools starts one container, publishing
// starts none, and none is left.
func TestImportStartsTheServerOnceAndStopsIt(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	since := time.Now()
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo", "add"}}}, nil)
	require.Equal(t, 1, containersCreated(t, h.poolID, since), "one listing for the whole import")
	requireNoContainers(t, h.poolID)
}

// TestRunTimeAgentFloorReadsTheEffectiveSet: seed 000, "the runner's tool gate compares the
// effective set PolicyGuard yields, which a policy bound in the same graph can make smaller":
// a version whose policy revokes external_api_call from the agent (served as it is, whatever
// publish would say of it) is refused agent_floor before any process exists, and the same
// version without the policy is called.
func TestRunTimeAgentFloorReadsTheEffectiveSet(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	v, err := h.pub.PublishedVersion(h.ctx, "default", "g", 1)
	require.NoError(t, err)
	for _, revoke := range []bool{true, false} {
		g := *v.Graph
		g.ID = fmt.Sprintf("g-revoke-%v", revoke)
		if revoke {
			g.Policies = []graph.Policy{{ID: "offline", Agents: []string{"a"}, Revoke: []string{"external_api_call"}}}
		}
		h.versions.mu.Lock()
		h.versions.fix[g.ID] = &graph.Version{GraphID: g.ID, Tenant: "default", Version: 1, Graph: &g}
		h.versions.mu.Unlock()
		info, err := h.pool.StartRun(h.ctx, "default", g.ID, 1, "")
		require.NoError(t, err)
		_, err = h.call(info.Run.ID, "a", "fx__echo", map[string]any{"text": "x"})
		if !revoke {
			require.NoError(t, err, "without the policy the agent holds the floor")
			continue
		}
		ref := requireRefused(t, err, reasonAgentFloor)
		require.Equal(t, []string{"external_api_call"}, ref.Missing)
		require.Zero(t, h.spawned(), "refused before any process exists")
	}
}

// containersCreated counts the engine's create events of containers of pool poolID from since
// until now (the events are read back, so a container already removed still counts).
func containersCreated(t *testing.T, poolID string, since time.Time) int {
	t.Helper()
	docker := dockertest.RequireEngine(t)
	f := client.Filters{}
	f.Add("type", string(events.ContainerEventType))
	f.Add("event", string(events.ActionCreate))
	f.Add("label", "io.ringfence.pool="+poolID)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The engine reads since and until in seconds with a fraction; until is the present, so
	// the stream ends once the past is read.
	stamp := func(at time.Time) string { return fmt.Sprintf("%d.%09d", at.Unix(), at.Nanosecond()) }
	res := docker.Events(ctx, client.EventsListOptions{Since: stamp(since.Add(-time.Second)), Until: stamp(time.Now()), Filters: f})
	n := 0
	for {
		select {
		case _, ok := <-res.Messages:
			if !ok {
				return n
			}
			n++
		case err := <-res.Err:
			if err == nil || errors.Is(err, io.EOF) {
				return n
			}
			require.NoError(t, err, "the engine's events could not be read")
		case <-ctx.Done():
			require.NoError(t, ctx.Err(), "the engine's events did not end")
		}
	}
}
