package pool

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
)

// Refusals before dispatch that must be classified honestly and must leave the server
// untouched.

// inject serves a copy of published version 1 of graphID, changed by edit, as graph id (a
// version publish would refuse, to reach a run-time gate) and starts a run of it.
func (h *harness) inject(graphID, id string, edit func(g *graph.Graph)) string {
	h.t.Helper()
	v, err := h.pub.PublishedVersion(h.ctx, "default", graphID, 1)
	require.NoError(h.t, err)
	g := *v.Graph
	g.ID = id
	g.Nodes = slices.Clone(g.Nodes)
	for i := range g.Nodes {
		if a := g.Nodes[i].Agent; a != nil {
			c := *a
			g.Nodes[i].Agent = &c
		}
		if m := g.Nodes[i].MCPTool; m != nil {
			c := *m
			g.Nodes[i].MCPTool = &c
		}
	}
	edit(&g)
	h.versions.mu.Lock()
	h.versions.fix[id] = &graph.Version{GraphID: id, Tenant: "default", Version: 1, Graph: &g}
	h.versions.mu.Unlock()
	info, err := h.pool.StartRun(h.ctx, "default", id, 1, "")
	require.NoError(h.t, err)
	return info.Run.ID
}

// flakyRegistry is the real registry with outages a test switches on.
type flakyRegistry struct {
	Registry
	policyDown, resolveDown atomic.Bool
}

var errRegistryDown = status.Error(codes.Unavailable, "registry: connection refused")

func (f *flakyRegistry) ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error) {
	if f.policyDown.Load() {
		return mcpserver.Policy{}, errRegistryDown
	}
	return f.Registry.ServerPolicy(ctx, ref)
}

func (f *flakyRegistry) ResolveRegistration(ctx context.Context, ref string) (*mcpserver.Resolved, error) {
	if f.resolveDown.Load() {
		return nil, errRegistryDown
	}
	return f.Registry.ResolveRegistration(ctx, ref)
}

// TestARegistryOutageIsNotASpawnFailure: when the registry cannot be asked, at the ceiling or
// for the registration to start the server, the call is refused as registry_unavailable
// (UNAVAILABLE) with nothing spawned; once it answers again, the call goes through.
func TestARegistryOutageIsNotASpawnFailure(t *testing.T) {
	var fake *flakyRegistry
	h := newHarness(t, harnessOpts{host: true, registry: func(r Registry) Registry {
		fake = &flakyRegistry{Registry: r}
		return fake
	}})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	run := h.start("g")

	fake.policyDown.Store(true)
	_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonRegistryUnavailable)
	require.ErrorContains(t, ref, "ceiling")
	require.Equal(t, codes.Unavailable, status.Code(callStatus(h.ctx, h.pool, err)))
	require.Equal(t, reasonRegistryUnavailable, h.last().Reason)

	fake.policyDown.Store(false)
	fake.resolveDown.Store(true)
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	requireRefused(t, err, reasonRegistryUnavailable)
	require.Equal(t, reasonRegistryUnavailable, h.last().Reason)
	require.Zero(t, h.spawned(), "nothing was started")

	fake.resolveDown.Store(false)
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	require.NoError(t, err)
}

// TestClientSessionTimeoutBoundsTheFirstListing: the first tools/list is part of client setup,
// so a server that never answers it is refused as a handshake failure within
// client_session_timeout, in a run and in discovery alike.
func TestClientSessionTimeoutBoundsTheFirstListing(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	run := h.start("g")
	_, err := h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture", Args: []string{"--hang-list"},
		// Room for a loaded machine to start the container and answer initialize in time.
		Grants: []string{"process_spawn", "external_api_call"}, ClientSessionTimeout: durationpb.New(3 * time.Second)})
	require.NoError(t, err)

	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonHandshakeFailed)
	require.Equal(t, discovery.ClassHandshakeTimeout, ref.Server.Class)
	require.ErrorContains(t, ref, "tools/list")
	require.Empty(t, h.pendings())

	_, err = h.pool.DiscoverTools(h.ctx, "fx")
	f, ok := discovery.AsFailure(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, discovery.ClassHandshakeTimeout, f.Class)
}

// TestAPinnedSchemaThatCannotBeCompiledIsRefusedBeforeDispatch: a pinned input or output
// schema that does not compile is refused before anything starts, as unusable_schema with the
// way out (re-import), never as the caller's invalid_input and never after the call.
func TestAPinnedSchemaThatCannotBeCompiledIsRefusedBeforeDispatch(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"add"}}}, nil)
	broken := []byte(`{"type":"object","properties":{"sum":{"$ref":"#/$defs/missing"}}}`)
	for _, which := range []string{"input", "output"} {
		t.Run(which, func(t *testing.T) {
			run := h.inject("g", "g-"+which, func(g *graph.Graph) {
				for _, n := range g.Nodes {
					if m := n.MCPTool; m != nil {
						m.SchemaHash = "v1:sha256:" + strings.Repeat("0", 58) + which // its own cache entry
						if which == "input" {
							m.InputSchema = broken
						} else {
							m.OutputSchema = broken
						}
					}
				}
			})
			_, err := h.call(run, "a", "fx__add", map[string]any{"a": 2, "b": 3})
			ref := requireRefused(t, err, reasonUnusableSchema)
			require.ErrorContains(t, ref, "the "+which+" schema")
			require.ErrorContains(t, ref, "re-import")
			require.Equal(t, codes.FailedPrecondition, status.Code(callStatus(h.ctx, h.pool, err)))
		})
	}
	require.Zero(t, h.spawned())
	require.Empty(t, h.pendings(), "nothing reached a server")
}

// TestArgumentsThatWouldTakeUnboundedWorkAreRefused: a pinned schema whose recursive oneOf
// branches double the validator's work at each level of the value (41 bytes of nested
// arrays took seconds) is refused as invalid_input before anything starts, and the pool goes
// on answering.
func TestArgumentsThatWouldTakeUnboundedWorkAreRefused(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"add"}}}, nil)
	run := h.inject("g", "g-exponential", func(g *graph.Graph) {
		for _, n := range g.Nodes {
			if m := n.MCPTool; m != nil {
				m.SchemaHash = "v1:sha256:" + strings.Repeat("1", 64)
				m.InputSchema = []byte(`{"type":"object","properties":{"tree":{"$ref":"#/$defs/n"}},"$defs":{"n":{"oneOf":[` +
					`{"type":"array","items":{"$ref":"#/$defs/n"}},{"type":"array","items":{"$ref":"#/$defs/n"}},{"type":"null"}]}}}`)
			}
		}
	})
	tree := json.RawMessage(strings.Repeat("[", 20) + "null" + strings.Repeat("]", 20))
	_, err := h.call(run, "a", "fx__add", map[string]any{"tree": tree})
	ref := requireRefused(t, err, reasonInvalidInput)
	require.ErrorContains(t, ref, "bounded work")
	require.Zero(t, h.spawned(), "nothing started")

	res, err := h.call(h.start("g"), "a", "fx__add", map[string]any{"a": 2, "b": 3})
	require.NoError(t, err, "the pool goes on")
	require.Equal(t, audit.ResultSucceeded, res.Result)
}

// TestExploreRefusesADeclarationTheScreenHardFails: explore takes the live declaration, which
// nothing pinned or screened before: a tool whose declaration the screen hard-fails is refused
// before dispatch, naming the finding.
func TestExploreRefusesADeclarationTheScreenHardFails(t *testing.T) {
	h := newHarness(t)
	h.server("raw", nil, "--raw-tools", hostileTools)
	for tool, finding := range map[string]string{"bad": "input_schema_not_object", "remote": "remote_ref", "scalar": "input_schema_not_object"} {
		_, res, err := h.pool.ExploreTools(h.ctx, discovery.ExploreRequest{Ref: "raw", Tenant: "default", ActorKeyID: "key_ops", Call: &typesv1.ExploreCall{Tool: tool}})
		require.NoError(t, err, "the listing is answered")
		require.Equal(t, "refused_before_dispatch", res.GetOutcome(), tool)
		require.Equal(t, reasonDeclarationScreen, res.GetReason(), res.GetMessage())
		require.Contains(t, res.GetMessage(), finding)
	}
	require.Empty(t, h.pendings(), "nothing reached the server")
	require.Len(t, h.attempts(), 3)
}

// hostileTools are declarations the screen hard-fails (a boolean schema, a remote $ref, a
// schema that is not an object's), beside one that passes.
const hostileTools = `[{"name":"bad","inputSchema":true},` +
	`{"name":"remote","inputSchema":{"type":"object","properties":{"x":{"$ref":"https://example.com/s.json"}}}},` +
	`{"name":"scalar","inputSchema":{"type":"string"}},` +
	`{"name":"fine","inputSchema":{"type":"object"}}]`

// TestRefusedCallsNeverReachTheServer: agent_floor and argument_scope refusals happen in a
// run whose session is up, and still nothing reaches the server: its call count does not move
// and no pending record exists for the refused call ids.
func TestRefusedCallsNeverReachTheServer(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", toolPerms("echo", "fs.read:{text}"))
	h.publish("g", []string{"ok", "weak"}, []imp{{"fx", "ok", []string{"echo"}}, {"fx", "weak", []string{"echo"}}},
		func(d *publisherv1.Graph) {
			agentBindings(d, "ok", "fs.read:/srv/**")
			agentBindings(d, "weak", "fs.read:/srv/**")
		})
	run := h.inject("g", "g-weak", func(g *graph.Graph) {
		for _, n := range g.Nodes {
			if n.ID == "weak" {
				n.Agent.CapabilityBindings = []string{"process_spawn", "fs.read:/srv/**"}
			}
		}
	})
	serverCalls := func() int64 {
		info, err := h.pool.GetRun(h.ctx, run, "")
		require.NoError(t, err)
		require.Len(t, info.Sessions, 1)
		return info.Sessions[0].Calls
	}
	_, err := h.call(run, "ok", "fx__echo", map[string]any{"text": "/srv/a"})
	require.NoError(t, err)
	require.Equal(t, int64(1), serverCalls())

	_, err = h.call(run, "weak", "fx__echo", map[string]any{"text": "/srv/a"})
	floor := requireRefused(t, err, reasonAgentFloor)
	_, err = h.call(run, "ok", "fx__echo", map[string]any{"text": "/etc/shadow"})
	scope := requireRefused(t, err, reasonArgumentScope)
	require.Equal(t, int64(1), serverCalls(), "no refused call reached the server")

	require.NotEmpty(t, floor.CallID)
	require.NotEmpty(t, scope.CallID)
	pend := h.pendings()
	require.Len(t, pend, 1)
	for _, p := range pend {
		require.NotContains(t, []string{floor.CallID, scope.CallID}, p.CallID)
	}
}

// TestACallerThatGivesUpBeforeDispatchIsCanceledNotASpawnFailure: nothing was wrong with the
// server; the record says the caller cancelled.
func TestACallerThatGivesUpBeforeDispatchIsCanceledNotASpawnFailure(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	run := h.start("g")
	ctx, cancel := context.WithCancel(h.ctx)
	cancel()
	_, err := h.pool.CallTool(ctx, CallRequest{RunID: run, Tenant: auth.DefaultTenant, Agent: "a", Tool: "fx__echo", Arguments: json.RawMessage(`{"text":"x"}`)})
	requireRefused(t, err, reasonCanceled)
	require.Equal(t, reasonCanceled, h.last().Reason)
	require.Empty(t, h.pendings(), "nothing reached the server")
}
