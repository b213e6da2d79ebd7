package pool

import (
	"testing"

	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/graph"
)

// inlineServer writes an inline server onto an agent of a draft, and binds the agent the floor
// that reaching any server needs.
func inlineServer(agent, name string, args ...string) func(d *publisherv1.Graph) {
	return func(d *publisherv1.Graph) {
		inlineServerOnly(agent, name, args...)(d)
		agentBindings(d, agent, "process_spawn", "external_api_call")
	}
}

// inlineServerOnly writes an inline server onto an agent of a draft and binds nothing.
func inlineServerOnly(agent, name string, args ...string) func(d *publisherv1.Graph) {
	return func(d *publisherv1.Graph) {
		for _, n := range d.GetNodes() {
			if n.GetId() == agent {
				a := n.GetAgent()
				a.McpServers = append(a.McpServers, &publisherv1.InlineMcpServer{Name: name, Command: "mcpfixture", Args: args})
			}
		}
	}
}

// TestInlineServerRunsOnlyUnderTheDevelopmentFlag: the deprecated inline path is refused at
// run time by default, before any process exists, and says what to do instead.
func TestInlineServerRunsOnlyUnderTheDevelopmentFlag(t *testing.T) {
	dev := newHarness(t, harnessOpts{allowInline: true})
	dev.publish("g", []string{"a"}, nil, inlineServer("a", "legacy"))
	v, err := dev.pub.PublishedVersion(dev.ctx, "default", "g", 1)
	require.NoError(t, err)
	require.NotEmpty(t, v.Warnings, "publish warned about the inline server")

	h := newHarness(t) // the same version on a pool without the flag
	g := *v.Graph
	h.versions.mu.Lock()
	h.versions.fix["g"] = &graph.Version{GraphID: "g", Tenant: "default", Version: 1, Graph: &g}
	h.versions.mu.Unlock()
	run := h.start("g")
	_, err = h.call(run, "a", "legacy__echo", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonInlineServers)
	require.ErrorContains(t, ref, "dev.allow_inline_mcp_servers")
	require.ErrorContains(t, ref, "ringfence mcp-import")
	require.Zero(t, h.spawned(), "nothing was started")
	att := h.last()
	require.Equal(t, audit.OutcomeRefusedBeforeDispatch, att.Outcome)
	require.Equal(t, "inline:a/legacy", att.ServerRef)
	require.Equal(t, "echo", att.ToolName)
	require.Contains(t, att.Advisory, inlineAdvisory)
}

// TestInlineServerCallsUnderTheFlag: with the flag, an inline server runs in the pool's
// isolation (one session per run, shared by its calls), its tools are called by
// "<server>__<tool>", the arguments are checked against the live input schema, and the record
// says that nothing was pinned and no ceiling applied.
func TestInlineServerCallsUnderTheFlag(t *testing.T) {
	h := newHarness(t, harnessOpts{allowInline: true})
	h.publish("g", []string{"a"}, nil, inlineServer("a", "legacy"))
	run := h.start("g")

	res, err := h.call(run, "a", "legacy__echo", map[string]any{"text": "hello"})
	require.NoError(t, err)
	require.Equal(t, "hello", res.Content[0]["text"])
	require.Equal(t, "inline:a/legacy", res.ServerRef)
	require.Equal(t, []string{inlineAdvisory}, res.Advisory, "the caller is told what the call did not have")
	require.Equal(t, float64(1), h.spawned())
	require.Positive(t, poolContainers(t, h.poolID), "the inline server runs in the isolation image")

	_, err = h.call(run, "a", "legacy__echo", map[string]any{"text": 5})
	require.ErrorContains(t, requireRefused(t, err, reasonInvalidInput), "text")
	_, err = h.call(run, "a", "legacy__nope", nil)
	require.ErrorContains(t, requireRefused(t, err, reasonUnknownTool), "echo")
	_, err = h.call(run, "a", "other__echo", nil)
	requireRefused(t, err, reasonUnknownTool)
	require.Equal(t, float64(1), h.spawned(), "the run's calls share one session")

	pend := h.pendings()
	require.Len(t, pend, 1)
	require.Equal(t, "inline:a/legacy", pend[0].ServerRef)
	ok := h.attempts()[0]
	require.Equal(t, audit.ResultSucceeded, ok.Result)
	require.Empty(t, ok.PinnedHash, "nothing about an inline tool is pinned")
	require.NotEmpty(t, ok.LiveHash)
	require.Contains(t, ok.Advisory, inlineAdvisory)

	_, err = h.pool.EndRun(h.ctx, run, "", "completed", "test")
	require.NoError(t, err)
	require.Equal(t, float64(1), h.stopped())
}

// TestInlineServerNeedsIsolation: the flag does not lift isolation; without an image (and
// without allow_unisolated_mcp_development) the call is refused before spawning.
func TestInlineServerNeedsIsolation(t *testing.T) {
	h := newHarness(t, harnessOpts{allowInline: true, noImage: true})
	h.publish("g", []string{"a"}, nil, inlineServer("a", "legacy"))
	_, err := h.call(h.start("g"), "a", "legacy__echo", map[string]any{"text": "x"})
	requireRefused(t, err, reasonIsolationRequired)
	require.Zero(t, h.spawned())
}

// TestInlineCallsNeedTheAgentFloor: an inline tool has no registration, but reaching its server
// spawns a process that calls out all the same, so the agent must hold the floor: refused
// before anything starts in enforce mode, recorded as advisory in advisory mode.
func TestInlineCallsNeedTheAgentFloor(t *testing.T) {
	h := newHarness(t, harnessOpts{allowInline: true, allowAdvisory: true})
	h.publish("g", []string{"a"}, nil, inlineServerOnly("a", "legacy"))
	_, err := h.call(h.start("g"), "a", "legacy__echo", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonAgentFloor)
	require.ElementsMatch(t, []string{"process_spawn", "external_api_call"}, ref.Missing)
	require.Zero(t, h.spawned(), "nothing was started")
	require.Equal(t, reasonAgentFloor, h.last().Reason)

	h.publish("adv", []string{"a"}, nil, func(d *publisherv1.Graph) {
		inlineServerOnly("a", "legacy")(d)
		d.CapabilityMode = graph.ModeAdvisory
	})
	res, err := h.call(h.start("adv"), "a", "legacy__echo", map[string]any{"text": "x"})
	require.NoError(t, err)
	require.Len(t, res.Advisory, 2)
	require.Contains(t, res.Advisory[1], reasonAgentFloor)
}

// TestInlineCallsScreenTheLiveDeclaration: an inline tool's declaration is taken live and was
// never screened; one the screen hard-fails is refused before dispatch, naming the finding.
func TestInlineCallsScreenTheLiveDeclaration(t *testing.T) {
	h := newHarness(t, harnessOpts{allowInline: true})
	h.publish("g", []string{"a"}, nil, inlineServer("a", "raw", "--raw-tools", hostileTools))
	run := h.start("g")
	for tool, finding := range map[string]string{"bad": "input_schema_not_object", "remote": "remote_ref", "scalar": "input_schema_not_object"} {
		_, err := h.call(run, "a", "raw__"+tool, map[string]any{})
		ref := requireRefused(t, err, reasonDeclarationScreen)
		require.ErrorContains(t, ref, finding)
	}
	require.Empty(t, h.pendings(), "nothing reached the server")
}
