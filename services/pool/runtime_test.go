package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/mcpgate"
)

func TestCallSucceedsThroughEveryGateAndIsAudited(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo", "add"}}}, nil)
	run := h.start("g")
	require.Zero(t, h.spawned(), "starting a run spawns nothing")

	res, err := h.call(run, "a", "fx__echo", map[string]any{"text": "hello"})
	require.NoError(t, err)
	require.Equal(t, audit.ResultSucceeded, res.Result)
	require.Equal(t, "hello", res.Content[0]["text"])

	res, err = h.call(run, "a", "fx__add", map[string]any{"a": 2, "b": 3})
	require.NoError(t, err)
	require.Equal(t, float64(5), res.StructuredContent["sum"], "structured content validated against the pinned output schema")

	att := h.last()
	require.Equal(t, audit.OutcomeDispatched, att.Outcome)
	require.Equal(t, audit.ResultSucceeded, att.Result)
	require.Equal(t, "fx", att.ServerRef)
	require.Equal(t, "add", att.ToolName)
	require.Equal(t, "g", att.GraphID)
	require.Equal(t, int64(1), att.GraphVersion)
	require.Regexp(t, `^v1:sha256:`, att.PinnedHash)
	require.Regexp(t, `^sha256:`, att.ArgsDigest)
	require.NotZero(t, att.ArgsSize)
	require.NotZero(t, att.LatencyMicros)
}

func TestGateUnknownRunAgentAndBinding(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	run := h.start("g")
	_, err := h.call("no-such-run", "a", "fx__echo", map[string]any{"text": "x"})
	requireRefused(t, err, reasonUnknownRun)
	_, err = h.call(run, "nobody", "fx__echo", map[string]any{"text": "x"})
	require.ErrorContains(t, requireRefused(t, err, reasonUnknownAgent), "(its agents: a)", "the error lists what exists")
	_, err = h.call(run, "a", "fx__add", map[string]any{})
	require.ErrorContains(t, requireRefused(t, err, reasonUnknownTool), "(it binds: fx__echo;")
	for _, att := range h.attempts() {
		require.Equal(t, audit.OutcomeRefusedBeforeDispatch, att.Outcome)
	}
	require.Len(t, h.attempts(), 3)
	require.Zero(t, h.spawned())
}

func TestGateCeilingIsRecheckedBeforeAnyProcessExists(t *testing.T) {
	for _, mode := range []string{"enforce", "advisory"} {
		t.Run(mode, func(t *testing.T) {
			// The pool honours advisory mode here: the ceiling holds even then.
			h := newHarness(t, harnessOpts{host: true, allowAdvisory: mode == "advisory"})
			h.server("fx", nil)
			h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, func(d *publisherv1.Graph) { d.CapabilityMode = mode })
			run := h.start("g")
			_, err := h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture", Grants: []string{"process_spawn"}})
			require.NoError(t, err)
			_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
			ref := requireRefused(t, err, reasonCeiling)
			require.Contains(t, ref.Missing, "external_api_call")
			require.Zero(t, h.spawned(), "no process exists")
			require.Equal(t, reasonCeiling, h.last().Reason)

			_, err = h.reg.DeleteServer(h.ctx, &registryv1.DeleteServerRequest{Ref: "fx"})
			require.NoError(t, err)
			_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
			requireRefused(t, err, reasonUnknownServer)
		})
	}
}

// TestGateNodeFloorStandsWithoutPublish: a version that never passed publish (here one whose
// node and agent declare nothing, served by a server whose grants are []) is refused at gate 2
// before any process exists: the floor is checked again, so grants: [] still denies the node.
func TestGateNodeFloorStandsWithoutPublish(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	v, err := h.pub.PublishedVersion(h.ctx, "default", "g", 1)
	require.NoError(t, err)
	g := *v.Graph
	g.ID = "bare"
	g.Nodes = slices.Clone(g.Nodes)
	for i := range g.Nodes {
		switch n := &g.Nodes[i]; {
		case n.Agent != nil:
			a := *n.Agent
			a.CapabilityBindings = nil
			n.Agent = &a
		case n.MCPTool != nil:
			m := *n.MCPTool
			m.CapabilityBindings = nil
			n.MCPTool = &m
		}
	}
	h.versions.mu.Lock()
	h.versions.fix["bare"] = &graph.Version{GraphID: "bare", Tenant: "default", Version: 1, Graph: &g}
	h.versions.mu.Unlock()
	_, err = h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture", Grants: []string{}})
	require.NoError(t, err)
	info, err := h.pool.StartRun(h.ctx, "default", "bare", 1, "")
	require.NoError(t, err)

	_, err = h.call(info.Run.ID, "a", "fx__echo", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonCapability)
	require.ElementsMatch(t, []string{"process_spawn", "external_api_call"}, ref.Missing)
	require.Zero(t, h.spawned(), "no process exists")
}

// TestGateRefusesAToolTheFilterNowExcludes: an operator's tool_filter holds from the next
// call, refused as the agent's listing hides the tool: filtered_out at the registration level.
func TestGateRefusesAToolTheFilterNowExcludes(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	run := h.start("g")
	_, err := h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture",
		Grants: []string{"process_spawn", "external_api_call"}, ToolFilter: &registryv1.ToolFilter{Exclude: []string{"echo"}}})
	require.NoError(t, err)
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonFilteredOut)
	require.Equal(t, "registration", ref.Level)
	require.Contains(t, ref.Error(), `server "fx"'s tool_filter excludes tool "echo"`)
	require.Zero(t, h.spawned(), "no process exists")
}

// TestGateAgentFloorEnforceAndAdvisory serves a version whose agent lacks the floor (publish
// refuses such a graph, so it is injected): enforce refuses, advisory records and allows.
func TestGateAgentFloorEnforceAndAdvisory(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		honour  bool // pool.allow_advisory
		enforce bool
	}{
		{graph.ModeEnforce, true, true},
		{graph.ModeAdvisory, true, false},
		{graph.ModeAdvisory, false, true},
	} {
		mode := tc.mode
		t.Run(fmt.Sprintf("%s, allow_advisory %v", mode, tc.honour), func(t *testing.T) {
			h := newHarness(t, harnessOpts{host: true, allowAdvisory: tc.honour})
			h.server("fx", nil)
			h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
			v, err := h.pub.PublishedVersion(h.ctx, "default", "g", 1)
			require.NoError(t, err)
			g := *v.Graph
			g.CapabilityMode = mode
			g.Nodes = append([]graph.Node(nil), g.Nodes...)
			for i := range g.Nodes {
				if g.Nodes[i].Agent != nil {
					agent := *g.Nodes[i].Agent
					agent.CapabilityBindings = []string{"process_spawn"}
					g.Nodes[i].Agent = &agent
				}
			}
			id := "g-" + mode
			g.ID = id
			h.versions.mu.Lock()
			h.versions.fix[id] = &graph.Version{GraphID: id, Tenant: "default", Version: 1, Graph: &g}
			h.versions.mu.Unlock()
			info, err := h.pool.StartRun(h.ctx, "default", id, 1, "")
			require.NoError(t, err)
			res, err := h.call(info.Run.ID, "a", "fx__echo", map[string]any{"text": "x"})
			if tc.enforce {
				ref := requireRefused(t, err, reasonAgentFloor)
				require.Contains(t, ref.Missing, "external_api_call")
				if mode == graph.ModeAdvisory {
					require.ErrorContains(t, ref, "pool.allow_advisory is off")
				}
				return
			}
			require.NoError(t, err)
			require.Len(t, res.Content, 1)
			require.Len(t, res.Advisory, 1, "the caller is told what was recorded but not enforced")
			att := h.last()
			require.Equal(t, audit.ResultSucceeded, att.Result)
			require.Len(t, att.Advisory, 1)
			require.Contains(t, att.Advisory[0], "agent_floor")
		})
	}
}

func TestGateArgumentScopedPermissionsAreDefaultDeny(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", toolPerms("echo", "fs.read:{text}"))
	h.publish("g", []string{"reader", "stranger"}, []imp{{"fx", "reader", []string{"echo"}}, {"fx", "stranger", []string{"echo"}}},
		func(d *publisherv1.Graph) { agentBindings(d, "reader", "fs.read:/srv/docs/**") })
	run := h.start("g")
	_, err := h.call(run, "reader", "fx__echo", map[string]any{"text": "/srv/docs/a/b.md"})
	require.NoError(t, err)
	_, err = h.call(run, "reader", "fx__echo", map[string]any{"text": "/etc/shadow"})
	ref := requireRefused(t, err, reasonArgumentScope)
	require.Equal(t, []string{"fs.read:/etc/shadow"}, ref.Missing)
	_, err = h.call(run, "stranger", "fx__echo", map[string]any{"text": "/srv/docs/a"})
	requireRefused(t, err, reasonArgumentScope)
	_, err = h.call(run, "reader", "fx__echo", map[string]any{})
	requireRefused(t, err, reasonArgumentScope)
	// The glob compares text; the server resolves "..": a value that climbs out is refused.
	_, err = h.call(run, "reader", "fx__echo", map[string]any{"text": "/srv/docs/../../etc/shadow"})
	ref = requireRefused(t, err, reasonArgumentScope)
	require.ErrorContains(t, ref, `".." segment`)
}

// TestGateStaticPermissionsMustAllBeHeld: a tool may require fixed permissions (no argument
// in them), and every requirement listed must be covered: one missing refuses the call and is
// named.
func TestGateStaticPermissionsMustAllBeHeld(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", toolPerms("echo", "db.kb_facts:read", "fs.read:{text}"))
	h.publish("g", []string{"both", "facts", "none"}, []imp{{"fx", "both", []string{"echo"}}, {"fx", "facts", []string{"echo"}}, {"fx", "none", []string{"echo"}}},
		func(d *publisherv1.Graph) {
			agentBindings(d, "both", "db.kb_facts:read", "fs.read:/srv/**")
			agentBindings(d, "facts", "db.kb_facts:*")
		})
	run := h.start("g")
	_, err := h.call(run, "both", "fx__echo", map[string]any{"text": "/srv/a"})
	require.NoError(t, err)
	_, err = h.call(run, "facts", "fx__echo", map[string]any{"text": "/srv/a"})
	ref := requireRefused(t, err, reasonArgumentScope)
	require.Equal(t, []string{"fs.read:/srv/a"}, ref.Missing, "the static requirement is covered, the scoped one is not")
	_, err = h.call(run, "none", "fx__echo", map[string]any{"text": "/srv/a"})
	ref = requireRefused(t, err, reasonArgumentScope)
	require.Contains(t, ref.Missing, "db.kb_facts:read")
}

func TestGateInputSchemaNamesTheField(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"add"}}}, nil)
	run := h.start("g")
	_, err := h.call(run, "a", "fx__add", map[string]any{"a": "two", "b": 3})
	requireRefused(t, err, reasonInvalidInput)
	require.Contains(t, err.Error(), "/a")
	_, err = h.call(run, "a", "fx__add", []int{1, 2})
	requireRefused(t, err, reasonInvalidInput)
	require.Zero(t, h.spawned(), "invalid input never reaches a process")
}

func TestGateIsolationRequiredWithoutAnImage(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)

	bare := newHarness(t, harnessOpts{noImage: true})
	bare.versions.pub = h.pub // the graph is published; the second pool has no image
	bare.server("fx", nil)
	info, err := bare.pool.StartRun(bare.ctx, "default", "g", 1, "")
	require.NoError(t, err)
	_, err = bare.call(info.Run.ID, "a", "fx__echo", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonIsolationRequired)
	require.Contains(t, ref.Error(), "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE")
}

func TestGateSpawnAndHandshakeFailuresAreRefusals(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	run := h.start("g")
	_, err := h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "no-such-binary", Grants: []string{"process_spawn", "external_api_call"}})
	require.NoError(t, err)
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonSpawnFailed)
	require.Equal(t, "command_not_found", ref.Server.Class)

	_, err = h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture", Args: []string{"--garbage"}, Grants: []string{"process_spawn", "external_api_call"}})
	require.NoError(t, err)
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	ref = requireRefused(t, err, reasonHandshakeFailed)
	require.Equal(t, "not_mcp_server", ref.Server.Class)
}

func TestGateDrift(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		drift  time.Duration
		second bool // whether the second call still passes
	}{
		{"rug pull without list_changed, re-listed before every call", []string{"--rug-pull", "1"}, 0, false},
		{"rug pull with list_changed and a long drift_max_age", []string{"--rug-pull-notify", "1"}, time.Hour, false},
		{"a poisoned declaration listed before the pinned one, under its name", []string{"--rug-pull-shadow", "1"}, 0, false},
		{"a stable server with a long drift_max_age", nil, time.Hour, true},
		{"rug pull without list_changed, caught once the listing is older than drift_max_age", []string{"--rug-pull", "1"}, 300 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{driftMaxAge: tc.drift})
			h.server("fx", nil, tc.args...)
			h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
			run := h.start("g")
			_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "first"})
			require.NoError(t, err)
			// The notification is asynchronous: give it a moment to land.
			var res *CallResult
			require.Eventually(t, func() bool {
				res, err = h.call(run, "a", "fx__echo", map[string]any{"text": "second"})
				return tc.second || err != nil
			}, 5*time.Second, 50*time.Millisecond)
			if tc.second {
				require.NoError(t, err)
				require.NotNil(t, res)
				return
			}
			ref := requireRefused(t, err, reasonSchemaDrift)
			require.NotEqual(t, ref.Pinned, ref.Live)
			require.Contains(t, err.Error(), ref.Pinned)
			require.Contains(t, err.Error(), ref.Live)
			att := h.last()
			require.Equal(t, reasonSchemaDrift, att.Reason)
			require.Equal(t, ref.Live, att.LiveHash)
		})
	}
}

func TestDispatchOutcomes(t *testing.T) {
	h := newHarness(t)
	// The engine reports a container's exit 0.3-0.9 s after it here, under load: a server
	// that crashes mid-call is "crashed" only if its death is known before the call's timeout.
	h.server("fx", callTimeout(3*time.Second), "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", nil}}, nil)
	run := h.start("g")

	t.Run("tool error", func(t *testing.T) {
		res, err := h.call(run, "a", "fx__fail", map[string]any{})
		require.NoError(t, err)
		require.True(t, res.IsError)
		require.Equal(t, audit.ResultFailed, res.Result)
		require.Equal(t, failureToolError, h.last().FailureClass)
	})
	t.Run("timeout", func(t *testing.T) {
		before := h.spawned()
		_, err := h.call(run, "a", "fx__sleep", map[string]any{"ms": 60000})
		requireFailed(t, err, failureTimeout)
		require.Contains(t, err.Error(), "may have taken effect")
		require.Equal(t, audit.OutcomeDispatched, h.last().Outcome)
		_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "still here"})
		require.NoError(t, err)
		require.Equal(t, before, h.spawned(), "a server that was only slow answers the ping and keeps its session")
	})
	// A wedged server, and one whose stdout is closed (the engine's attach stream ends no
	// single stream, so nothing says so): the call ends at its timeout, the ping after it goes
	// unanswered, and the server is stopped.
	for _, tc := range []struct{ name, tool string }{
		{"a server that freezes mid-call is replaced", "fx__freeze"},
		{"a server that closes its stdout mid-call is replaced", "fx__close_stdout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, stopped := h.spawned(), h.stopped()
			_, err := h.call(run, "a", tc.tool, map[string]any{})
			requireFailed(t, err, failureTimeout)
			require.Equal(t, stopped+1, h.stopped(), "no answer to the ping either: the session is stopped at once")
			h.requireFreshServer(t, run, before)
		})
	}
	t.Run("output that breaks its schema", func(t *testing.T) {
		_, err := h.call(run, "a", "fx__liar", map[string]any{})
		requireFailed(t, err, failureOutputInvalid)
		require.Contains(t, err.Error(), "/sum")
	})
	t.Run("output is validated as the server sent it, then sanitized", func(t *testing.T) {
		res, err := h.call(run, "a", "fx__short_markup", map[string]any{})
		require.NoError(t, err, "<b> fits maxLength 3; its escaped form would not")
		require.Equal(t, "&lt;b&gt;", res.StructuredContent["tag"])
	})
	t.Run("a non-object where an object is required", func(t *testing.T) {
		_, err := h.call(run, "a", "fx__liar_scalar", map[string]any{})
		requireFailed(t, err, failureOutputInvalid)
	})
	t.Run("a non-object with no output schema declared", func(t *testing.T) {
		_, err := h.call(run, "a", "fx__bare_scalar", map[string]any{})
		requireFailed(t, err, failureOutputInvalid)
		require.ErrorContains(t, err, "not a JSON object")
	})
	t.Run("a tool error's content is sanitized too", func(t *testing.T) {
		res, err := h.call(run, "a", "fx__fail_inject", map[string]any{})
		require.NoError(t, err)
		require.True(t, res.IsError)
		text := res.Content[0]["text"].(string)
		require.NotContains(t, text, "<b>")
		require.NotContains(t, text, "__system__")
		require.Contains(t, text, "&lt;b&gt;")
	})
	t.Run("every string leaf is sanitized", func(t *testing.T) {
		res, err := h.call(run, "a", "fx__inject", map[string]any{})
		require.NoError(t, err)
		for _, s := range []string{res.Content[0]["text"].(string), res.StructuredContent["note"].(string)} {
			require.NotContains(t, s, "<script>")
			require.NotContains(t, s, "__system__")
			require.NotContains(t, s, "<|im_start|>")
			require.NotContains(t, s, "\u200b")
			require.NotContains(t, s, "\u202e")
			require.Contains(t, s, "&lt;script&gt;")
		}
	})
	t.Run("crash mid-call, then a fresh session", func(t *testing.T) {
		_, err := h.call(run, "a", "fx__crash", map[string]any{})
		requireFailed(t, err, failureCrashed)
		before := h.spawned()
		res, err := h.call(run, "a", "fx__echo", map[string]any{"text": "again"})
		require.NoError(t, err)
		require.Equal(t, "again", res.Content[0]["text"])
		require.Equal(t, before+1, h.spawned())
	})
}

func TestKeepMarkupIsTheRegistrationsChoice(t *testing.T) {
	h := newHarness(t)
	h.server("fx", func(r *registryv1.CreateServerRequest) { r.KeepMarkup = true }, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"inject"}}}, nil)
	run := h.start("g")
	res, err := h.call(run, "a", "fx__inject", map[string]any{})
	require.NoError(t, err)
	text := res.Content[0]["text"].(string)
	require.Contains(t, text, "<script>", "markup kept")
	require.NotContains(t, text, "__system__", "role markers are removed regardless")
}

func TestHostileServersLeaveThePoolUpAndOtherRunsUnaffected(t *testing.T) {
	h := newHarness(t)
	h.server("fx", callTimeout(20*time.Second), "--runtime-tools", "--banner")
	h.server("calm", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", nil}}, nil)
	h.publish("calm", []string{"a"}, []imp{{"calm", "a", []string{"echo"}}}, nil)
	hostile, calm := h.start("g"), h.start("calm")

	check := func() {
		res, err := h.call(calm, "a", "calm__echo", map[string]any{"text": "still here"})
		require.NoError(t, err)
		require.Equal(t, "still here", res.Content[0]["text"])
	}
	check()

	t.Run("a banner on stdout", func(t *testing.T) {
		_, err := h.call(hostile, "a", "fx__echo", map[string]any{"text": "hi"})
		require.NoError(t, err)
	})
	t.Run("100 MB of non-JSON output goes to the bounded tail", func(t *testing.T) {
		res, err := h.call(hostile, "a", "fx__big", map[string]any{"mib": 100, "junk": true})
		require.NoError(t, err)
		require.Equal(t, "flooded", res.Content[0]["text"])
		check()
	})
	t.Run("a 100 MB message is bounded and reported", func(t *testing.T) {
		_, err := h.call(hostile, "a", "fx__big", map[string]any{"mib": 100})
		requireFailed(t, err, failureResultTooLarge)
		check()
	})
	t.Run("a result of too many content items is bounded and reported", func(t *testing.T) {
		_, err := h.call(hostile, "a", "fx__many", map[string]any{"n": mcpgate.MaxContentItems + 1})
		requireFailed(t, err, failureResultTooLarge)
		res, err := h.call(hostile, "a", "fx__many", map[string]any{"n": 3})
		require.NoError(t, err)
		require.Len(t, res.Content, 3)
		check()
	})
	t.Run("a flood of requests to the client stops the server", func(t *testing.T) {
		before := h.spawned()
		_, err := h.call(hostile, "a", "fx__flood", map[string]any{"n": 200_000})
		requireFailed(t, err, failureProtocolViolation)
		require.ErrorContains(t, err, "faster than")
		require.Equal(t, failureProtocolViolation, h.last().FailureClass)
		check()
		h.requireFreshServer(t, hostile, before)
	})
	t.Run("a message the client cannot decode stops the server", func(t *testing.T) {
		before := h.spawned()
		_, err := h.call(hostile, "a", "fx__raw", map[string]any{"line": `{"jsonrpc":"2.0"}`})
		requireFailed(t, err, failureProtocolViolation)
		require.ErrorContains(t, err, "cannot decode")
		require.NotContains(t, err.Error(), "-32600", "the server sent no JSON-RPC error")
		require.Equal(t, failureProtocolViolation, h.last().FailureClass)
		h.requireFreshServer(t, hostile, before, "the run's next call is not dispatched into the closed connection")
		check()
	})
	t.Run("answers to requests never sent stop the server", func(t *testing.T) {
		before := h.spawned()
		_, err := h.call(hostile, "a", "fx__raw", map[string]any{"line": `{"jsonrpc":"2.0","id":"bogus","result":{}}`, "n": 200_000})
		requireFailed(t, err, failureProtocolViolation)
		require.ErrorContains(t, err, "did not send")
		h.requireFreshServer(t, hostile, before)
	})
	t.Run("an answer of too many JSON values fails its call alone", func(t *testing.T) {
		before := h.spawned()
		_, err := h.call(hostile, "a", "fx__wide", map[string]any{"n": 300_000})
		requireFailed(t, err, failureResultTooLarge)
		require.ErrorContains(t, err, "250000 JSON values")
		res, err := h.call(hostile, "a", "fx__wide", map[string]any{"n": 10})
		require.NoError(t, err)
		require.Len(t, res.StructuredContent["a"], 10)
		require.Equal(t, before, h.spawned(), "the session stays")
	})
	t.Run("a fork loop stops at the PID limit", func(t *testing.T) {
		res, err := h.call(hostile, "a", "fx__fork_bomb", map[string]any{"max": 1000})
		require.NoError(t, err)
		started := res.StructuredContent["started"].(float64)
		require.Less(t, started, 64.0)
		check()
	})
	t.Run("a memory hog is killed and reported as a crash", func(t *testing.T) {
		_, err := h.call(hostile, "a", "fx__hog", map[string]any{"max_mib": 4096})
		requireFailed(t, err, failureCrashed)
		check()
	})
}

// TestAnAnswerThatIsNotMCP: a result the client cannot decode (a content type MCP does not
// define) fails the call at once as protocol_violation, within the caller's deadline, and the
// session stays for the run's next call. It used to wait out a death that never came and
// report a crash after the caller had given up.
func TestAnAnswerThatIsNotMCP(t *testing.T) {
	h := newHarness(t)
	h.server("fx", callTimeout(10*time.Second), "--raw-result", `{"content":[{"type":"<script>__system__"}]}`)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"t"}}}, nil)
	run := h.start("g")
	for range 2 {
		ctx, cancel := context.WithTimeout(h.ctx, 3*time.Second)
		start := time.Now()
		_, err := h.pool.CallTool(ctx, CallRequest{RunID: run, Agent: "a", Tool: "fx__t", Arguments: []byte(`{}`)})
		cancel()
		requireFailed(t, err, failureProtocolViolation)
		require.Less(t, time.Since(start), 2*time.Second)
		require.ErrorContains(t, err, "not MCP")
		require.NotContains(t, err.Error(), "<script>")
		require.Equal(t, failureProtocolViolation, h.last().FailureClass)
	}
	require.Equal(t, float64(1), h.spawned(), "the session stays")
}

// TestExploreCallThatTimesOut: an explore call that times out is reported as a dispatched
// failure, and its one-off session is closed by the explore itself, outside the run sessions'
// accounting (the harness's cleanup proves the container is gone).
func TestExploreCallThatTimesOut(t *testing.T) {
	h := newHarness(t)
	h.server("fx", callTimeout(time.Second), "--runtime-tools")
	req := discovery.ExploreRequest{Ref: "fx", Tenant: "default", ActorKeyID: "key_ops", Call: &typesv1.ExploreCall{Tool: "freeze"}}
	_, res, err := h.pool.ExploreTools(h.ctx, req)
	require.NoError(t, err)
	require.Equal(t, "dispatched", res.GetOutcome())
	require.Equal(t, failureTimeout, res.GetFailureClass())
	require.Zero(t, h.pool.liveSessions.Load(), "explore sessions are not run sessions")
}

// TestAServerThatCannotBeListedIsReplaced: a session whose listing cannot be taken again
// refuses the call before dispatch as spawn_failed and is stopped; the run's next call runs on
// a fresh server. A server that hangs on tools/list is held to the registration's
// client_session_timeout, however long the caller would wait: unbounded, each call waited out
// its caller's deadline as canceled and the wedged session was kept.
func TestAServerThatCannotBeListedIsReplaced(t *testing.T) {
	for _, tc := range []struct {
		name, mode, class, message string
		caller                     time.Duration // the second call's deadline
	}{
		{"tools/list answered with an error", "--break-list", "protocol_violation", "tools/list", 2 * time.Minute},
		{"tools/list never answered", "--hang-relist", "timeout", "client_session_timeout", 2 * time.Minute},
		{"tools/list never answered, and the caller gives up first", "--hang-relist", "", "", 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t) // drift_max_age 0: re-listed before every call
			h.server("fx", func(r *registryv1.CreateServerRequest) {
				// Room for a loaded machine's spawns, which the same bound holds.
				r.ClientSessionTimeout = durationpb.New(3 * time.Second)
			}, tc.mode, "1")
			h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
			run := h.start("g")
			_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "one"})
			require.NoError(t, err)

			ctx, cancel := context.WithTimeout(h.ctx, tc.caller)
			defer cancel()
			_, err = h.pool.CallTool(ctx, CallRequest{RunID: run, Agent: "a", Tool: "fx__echo", Arguments: []byte(`{"text":"two"}`)})
			if tc.class != "" {
				ref := requireRefused(t, err, reasonSpawnFailed)
				require.Equal(t, tc.class, ref.Server.Class)
				require.ErrorContains(t, ref, tc.message)
				require.NoError(t, ctx.Err(), "refused within the session's bound, not the caller's")
			} else {
				require.Error(t, err)
			}
			require.Equal(t, float64(1), h.stopped(), "the broken session is stopped at once")

			res, err := h.call(run, "a", "fx__echo", map[string]any{"text": "three"})
			require.NoError(t, err)
			require.Equal(t, "three", res.Content[0]["text"])
			require.Equal(t, float64(2), h.spawned())
		})
	}
}

// TestCancellationReachesTheServer: a caller that gives up on a dispatched call cancels it at
// the server too (notifications/cancelled), so the tool stops working for nobody.
func TestCancellationReachesTheServer(t *testing.T) {
	h := newHarness(t)
	h.server("fx", callTimeout(10*time.Minute), "--runtime-tools") // the call's own timeout never fires
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"sleep", "echo"}}}, nil)
	run := h.start("g")
	_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "warm"})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan error, 1)
	go func() {
		_, err := h.pool.CallTool(ctx, CallRequest{RunID: run, Agent: "a", Tool: "fx__sleep", Arguments: []byte(`{"ms":60000}`)})
		done <- err
	}()
	require.Eventually(t, func() bool { return len(h.pendings()) == 2 }, 30*time.Second, 20*time.Millisecond, "the sleep is dispatched")
	r, err := h.pool.lookup(h.ctx, run, "")
	require.NoError(t, err)
	r.mu.Lock()
	sess := r.sessions["fx"]
	r.mu.Unlock()
	require.NotNil(t, sess)
	cancel()
	require.Eventually(t, func() bool {
		return strings.Contains(sess.sess.StderrTail(), "sleep canceled by the client")
	}, 10*time.Second, 20*time.Millisecond, "the server's handler saw the cancellation")
	require.Error(t, <-done)
}

// TestListChangedStormDoesNotSpin: thousands of notifications cost no listing by themselves;
// the next call re-lists once.
func TestListChangedStormDoesNotSpin(t *testing.T) {
	h := newHarness(t, harnessOpts{driftMaxAge: time.Hour})
	h.server("fx", nil, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"storm", "echo"}}}, nil)
	run := h.start("g")
	_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "warm"})
	require.NoError(t, err)
	before := h.listings()
	res, err := h.call(run, "a", "fx__storm", map[string]any{"n": 2000})
	require.NoError(t, err)
	require.Contains(t, res.Content[0]["text"], "sent 2000")
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, before, h.listings(), "notifications never list by themselves")
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	require.NoError(t, err)
	require.Equal(t, before+1, h.listings(), "the next call re-lists once")
}

func TestSessionRules(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a", "b"}, []imp{{"fx", "a", []string{"echo"}}, {"fx", "b", []string{"echo"}}}, nil)
	run := h.start("g")
	require.Zero(t, h.spawned(), "lazy: nothing before the first call")
	require.Zero(t, poolContainers(t, h.poolID))
	// Seed 003: a turn never dials a server up front; the agent's tools come from the pins.
	listing, err := h.pool.ListAgentTools(h.ctx, run, "", "a")
	require.NoError(t, err)
	require.Equal(t, "fx__echo", listing.Tools[0].Name)
	require.Zero(t, h.spawned(), "listing an agent's tools starts no server: it starts on its first call")

	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agent := []string{"a", "b"}[i%2]
			_, err := h.call(run, agent, "fx__echo", map[string]any{"text": fmt.Sprint(i)})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 1.0, h.spawned(), "concurrent first calls of both agents spawn once and share it")
	require.Equal(t, 1, poolContainers(t, h.poolID))

	_, err = h.pool.PauseRun(h.ctx, run, "")
	require.NoError(t, err)
	require.Equal(t, 1.0, h.stopped(), "pausing stops the session")
	requireNoContainers(t, h.poolID)
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "paused"})
	requireRefused(t, err, reasonRunNotRunning)
	_, err = h.pool.PauseRun(h.ctx, run, "")
	require.ErrorIs(t, err, errRunNotRunning)
	require.ErrorContains(t, err, "it is paused already (ResumeRun, ringfence runs resume, runs it again)")

	_, err = h.pool.ResumeRun(h.ctx, run, "")
	require.NoError(t, err)
	_, err = h.call(run, "b", "fx__echo", map[string]any{"text": "resumed"})
	require.NoError(t, err)
	require.Equal(t, 2.0, h.spawned(), "a resumed run gets a fresh session")

	info, err := h.pool.EndRun(h.ctx, run, "", "completed", "test")
	require.NoError(t, err)
	require.Equal(t, StateCompleted, info.Run.State)
	require.Equal(t, 2.0, h.stopped(), "each session stopped exactly once")
	_, err = h.pool.EndRun(h.ctx, run, "", "completed", "again")
	require.Error(t, err)
	require.Equal(t, 2.0, h.stopped())
	requireNoContainers(t, h.poolID)

	// An ended run leaves memory (a host serves runs without end) and is read from the store:
	// it still reports, other tenants still cannot see it, and a call says it ended.
	h.pool.runs.mu.Lock()
	_, held := h.pool.runs.byKey[runKey{auth.DefaultTenant, run}]
	h.pool.runs.mu.Unlock()
	require.False(t, held, "an ended run is not kept in memory")
	got, err := h.pool.GetRun(h.ctx, run, "")
	require.NoError(t, err)
	require.Equal(t, StateCompleted, got.Run.State)
	require.Equal(t, info.Calls, got.Calls, "the ended run reports its calls")
	require.Positive(t, got.Calls)
	require.Equal(t, info.LastActivity.UnixNano(), got.LastActivity.UnixNano())
	_, err = h.pool.GetRun(h.ctx, run, "other-tenant")
	require.ErrorIs(t, err, errRunNotFound)
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "after the end"})
	ref := requireRefused(t, err, reasonRunNotRunning)
	require.ErrorContains(t, ref, "has ended")
	_, err = h.pool.EndRun(h.ctx, run, "", "", "")
	require.ErrorIs(t, err, errRunEnded)
	require.ErrorContains(t, err, "(it completed at "+got.Run.EndTime.Format(time.RFC3339)+"): ending it again changes nothing; GetRun (ringfence runs show) tells how it ended")
	_, err = h.pool.StartRun(h.ctx, auth.DefaultTenant, "g", 0, run)
	require.ErrorIs(t, err, errRunExists, "an ended run's id stays taken")

	// A run that fails stops its session exactly as one that completes.
	failed := h.start("g")
	_, err = h.call(failed, "a", "fx__echo", map[string]any{"text": "then fail"})
	require.NoError(t, err)
	_, err = h.pool.EndRun(h.ctx, failed, "", StateFailed, "test")
	require.NoError(t, err)
	require.Equal(t, 3.0, h.stopped(), "a failed run stops its session")
	requireNoContainers(t, h.poolID)
}

func TestRunsOfAnotherTenantAreNotFound(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	run := h.start("g")
	_, err := h.pool.GetRun(h.ctx, run, "other-tenant")
	require.ErrorIs(t, err, errRunNotFound)
	_, err = h.pool.CallTool(h.ctx, CallRequest{RunID: run, Tenant: "other-tenant", Agent: "a", Tool: "fx__echo"})
	requireRefused(t, err, reasonUnknownRun)
}

func TestLimits(t *testing.T) {
	h := newHarness(t, harnessOpts{maxRuns: 1, maxSessions: 1})
	h.server("fx", nil)
	h.server("fy", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}, {"fy", "a", []string{"echo"}}}, nil)
	run := h.start("g")
	_, err := h.pool.StartRun(h.ctx, "default", "g", 0, "")
	require.ErrorIs(t, err, errTooManyRuns)
	require.Contains(t, err.Error(), "pool.max_runs")

	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	require.NoError(t, err)
	_, err = h.call(run, "a", "fy__echo", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonLimitExceeded)
	require.Contains(t, ref.Error(), "pool.max_sessions")
}

func TestAbandonedRunsEndAfterTheIdleTimeout(t *testing.T) {
	const idle = time.Second
	h := newHarness(t, harnessOpts{idle: idle})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	paused := h.start("g")
	_, err := h.pool.PauseRun(h.ctx, paused, auth.DefaultTenant)
	require.NoError(t, err)
	run := h.start("g")
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	require.NoError(t, err)
	require.Contains(t, h.reaped(run).Run.EndReason, "idle")
	require.Eventually(t, func() bool { return h.stopped() == h.spawned() }, 10*time.Second, 20*time.Millisecond,
		"the abandoned run's session is stopped")

	// A paused run waits for its approval however long it takes; resumed, its clock restarts.
	time.Sleep(5 * idle / 2)
	info, err := h.pool.GetRun(h.ctx, paused, "")
	require.NoError(t, err)
	require.Equal(t, StatePaused, info.Run.State, "the reaper leaves a paused run alone")
	_, err = h.pool.ResumeRun(h.ctx, paused, auth.DefaultTenant)
	require.NoError(t, err)
	_, err = h.call(paused, "a", "fx__echo", map[string]any{"text": "approved"})
	require.NoError(t, err, "the resumed run calls before its idle clock runs out")
}

// TestPausedRunsEndAfterThePausedTimeout: pool.paused_run_timeout bounds how long a paused run
// may hold a place under pool.max_runs (an approval that never came); running runs are
// judged by the idle timeout alone.
func TestPausedRunsEndAfterThePausedTimeout(t *testing.T) {
	h := newHarness(t, harnessOpts{idle: time.Hour, paused: 300 * time.Millisecond})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	paused, running := h.start("g"), h.start("g")
	_, err := h.pool.PauseRun(h.ctx, paused, auth.DefaultTenant)
	require.NoError(t, err)
	// Calls refused because the run is paused do not hold its clock off.
	poking, stop := context.WithCancel(h.ctx)
	defer stop()
	go func() {
		for poking.Err() == nil {
			_, _ = h.pool.CallTool(poking, CallRequest{RunID: paused, Agent: "a", Tool: "fx__echo", Arguments: []byte(`{"text":"x"}`)})
			time.Sleep(20 * time.Millisecond)
		}
	}()
	require.Contains(t, h.reaped(paused).Run.EndReason, "pool.paused_run_timeout")
	info, err := h.pool.GetRun(h.ctx, running, "")
	require.NoError(t, err)
	require.Equal(t, StateRunning, info.Run.State)
}

// TestExploreCall: an explore call outside any run is dispatched on the discovery session with
// the run's checks; a filtered-out tool is refused; each attempt is recorded with the
// operator's key and leaves no container behind.
func TestExploreCall(t *testing.T) {
	h := newHarness(t)
	h.server("fx", func(r *registryv1.CreateServerRequest) {
		r.ToolFilter = &registryv1.ToolFilter{Exclude: []string{"probe"}}
	})
	args, err := structpb.NewStruct(map[string]any{"a": 2, "b": 3})
	require.NoError(t, err)
	req := discovery.ExploreRequest{Ref: "fx", Tenant: "default", ActorKeyID: "key_ops", Actor: "key:ops (operator, key_ops)", Call: &typesv1.ExploreCall{Tool: "add", Arguments: args}}
	listing, res, err := h.pool.ExploreTools(h.ctx, req)
	require.NoError(t, err)
	require.NotEmpty(t, listing.Tools)
	require.Equal(t, "dispatched", res.GetOutcome())
	require.Equal(t, "succeeded", res.GetResult())
	require.Equal(t, float64(5), res.GetStructuredContent().AsMap()["sum"], "validated against the live output schema")

	req.Call = &typesv1.ExploreCall{Tool: "probe"}
	_, res, err = h.pool.ExploreTools(h.ctx, req)
	require.NoError(t, err, "the listing is answered")
	require.Equal(t, "refused_before_dispatch", res.GetOutcome())
	require.Equal(t, audit.ReasonCeiling, res.GetReason())
	require.Contains(t, res.GetMessage(), "tool_filter excludes")

	require.NoError(t, h.pool.Spool().Flush(h.ctx))
	var got []audit.ToolCallAttempt
	for _, r := range h.audit.Records() {
		if r.Kind == audit.KindToolCall && strings.HasPrefix(r.ToolCall.RunID, "explore-") {
			got = append(got, *r.ToolCall)
		}
	}
	require.Len(t, got, 3)
	require.Equal(t, "key:ops (operator, key_ops)", got[0].AgentNode, "the record names the key as the registry does")
	require.Equal(t, audit.ResultPending, got[0].Result, "on record before it reached the server")
	require.Equal(t, audit.ResultSucceeded, got[1].Result)
	require.Equal(t, got[0].CallID, got[1].CallID)
	require.NotEmpty(t, got[1].ArgsDigest)
	require.Equal(t, audit.ReasonCeiling, got[2].Reason)
	// The harness's cleanup proves no container outlives the explores.
}

// TestAttemptIsOnRecordBeforeDispatch: while a call is still at the server, its pending record
// is already durable (and forwarded); the outcome follows with the same call id.
func TestAttemptIsOnRecordBeforeDispatch(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"sleep"}}}, nil)
	run := h.start("g")
	done := make(chan error, 1)
	go func() {
		_, err := h.call(run, "a", "fx__sleep", map[string]any{"ms": 1500})
		done <- err
	}()
	require.Eventually(t, func() bool {
		require.NoError(t, h.pool.Spool().Flush(h.ctx))
		for _, r := range h.audit.Records() {
			if r.ToolCall != nil && r.ToolCall.ToolName == "sleep" && r.ToolCall.Result == audit.ResultPending {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the pending record is on file while the call runs")
	select {
	case err := <-done:
		t.Fatalf("the call ended (%v) before its pending record was seen", err)
	default:
	}
	require.NoError(t, <-done)
	pending, final := h.pendings(), h.last()
	require.Len(t, pending, 1)
	require.Equal(t, pending[0].CallID, final.CallID)
	require.Equal(t, audit.ResultSucceeded, final.Result)
	require.Equal(t, pending[0].ArgsDigest, final.ArgsDigest)
}

// TestStrictInputsRefusesUndeclaredArguments: a schema that lists its properties and says
// nothing of others lets any argument through; strict_inputs reads it as closed.
func TestStrictInputsRefusesUndeclaredArguments(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", nil, "--runtime-tools")
	h.server("fs", func(r *registryv1.CreateServerRequest) { r.StrictInputs = true }, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"loose"}}, {"fs", "a", []string{"loose"}}}, nil)
	run := h.start("g")
	args := map[string]any{"path": "/a", "recursive": true}
	res, err := h.call(run, "a", "fx__loose", args)
	require.NoError(t, err)
	require.Equal(t, "path,recursive", res.Content[0]["text"], "without strict_inputs the undeclared argument reaches the server")
	_, err = h.call(run, "a", "fs__loose", args)
	ref := requireRefused(t, err, reasonInvalidInput)
	require.ErrorContains(t, ref, "recursive")
	res, err = h.call(run, "a", "fs__loose", map[string]any{"path": "/a"})
	require.NoError(t, err)
	require.Equal(t, "path", res.Content[0]["text"])
}

// TestAnOutcomeNamesThePendingRecordItSettles: call_id and attempt repeat across pool
// restarts, so the outcome names its pending record by ID.
func TestAnOutcomeNamesThePendingRecordItSettles(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	run := h.start("g")
	for range 2 {
		_, err := h.pool.CallTool(h.ctx, CallRequest{RunID: run, Tenant: auth.DefaultTenant, Agent: "a", Tool: "fx__echo", CallID: "turn-7", Arguments: json.RawMessage(`{"text":"x"}`)})
		require.NoError(t, err)
	}
	h.pendings() // flushes
	pendingIDs := map[int32]string{}
	settled := map[int32]string{}
	for _, r := range h.audit.Records() {
		tc := r.ToolCall
		if tc == nil || tc.CallID != "turn-7" {
			continue
		}
		if tc.Result == audit.ResultPending {
			require.Empty(t, tc.PendingID)
			pendingIDs[tc.Attempt] = r.ID
		} else {
			settled[tc.Attempt] = tc.PendingID
		}
	}
	require.Len(t, pendingIDs, 2)
	require.Equal(t, pendingIDs, settled)
}

// TestACleanRestartKeepsARunsCallCount: a running run's record is written when its state
// changes, not per call; the pool's shutdown writes the count, so the run shows the calls it
// had after a restart (it showed 0).
func TestACleanRestartKeepsARunsCallCount(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	run, idle := h.start("g"), h.start("g")
	for range 3 {
		_, err := h.call(run, "a", "fx__add", map[string]any{})
		requireRefused(t, err, reasonUnknownTool)
	}
	h.reopen()
	info, err := h.pool.GetRun(h.ctx, run, "")
	require.NoError(t, err)
	require.EqualValues(t, 3, info.Calls, "refused calls are calls of the run too")
	info, err = h.pool.GetRun(h.ctx, idle, "")
	require.NoError(t, err)
	require.Zero(t, info.Calls)

	_, err = h.call(run, "a", "fx__add", map[string]any{})
	requireRefused(t, err, reasonUnknownTool)
	h.reopen()
	info, err = h.pool.GetRun(h.ctx, run, "")
	require.NoError(t, err)
	require.EqualValues(t, 4, info.Calls, "the count goes on from the restored one")
}
