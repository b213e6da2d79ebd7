package tests

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestInlineServerEndToEnd is seed 000's deprecated inline path through ringfenced and the
// CLI: with dev.allow_inline_mcp_servers, a graph whose agent declares an inline server
// publishes over a warning, its tool is called as <server>__<tool> in the isolation image,
// the answer and the audit record say that no ceiling applied and nothing was pinned; a
// daemon without the flag refuses the same call before anything starts.
func TestInlineServerEndToEnd(t *testing.T) {
	d, cli, _ := runsDaemon(t, "RINGFENCE_DEV__ALLOW_INLINE_MCP_SERVERS=true")
	must := func(r result) result {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
		return r
	}
	must(cli("graphs", "create", "--graph", "legacy", "--agent", "a"))
	r := must(cli("graphs", "show", "--graph", "legacy", "-o", "json"))
	var g map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &g))
	for _, n := range g["nodes"].([]any) {
		node := n.(map[string]any)
		if node["id"] == "a" {
			agent, _ := node["agent"].(map[string]any)
			if agent == nil {
				agent = map[string]any{}
				node["agent"] = agent
			}
			agent["mcp_servers"] = []any{map[string]any{"name": "old", "command": "mcpfixture"}}
		}
	}
	edited, err := json.Marshal(g)
	require.NoError(t, err)
	file := t.TempDir() + "/g.json"
	require.NoError(t, writeFile(file, edited))
	must(cli("graphs", "edit", "--graph", "legacy", "--file", file))
	// The inline path has no ceiling, but the agent floor still applies to the calling agent.
	must(cli("graphs", "bind", "--graph", "legacy", "--agent", "a", "--capability", "process_spawn", "--capability", "external_api_call"))
	r = must(cli("graphs", "publish", "--graph", "legacy"))
	require.Contains(t, r.Stdout+r.Stderr, "dev.allow_inline_mcp_servers", "publish warns")

	r = must(cli("call", "--graph", "legacy", "--agent", "a", "--tool", "old__echo", "--args", `{"text":"from the inline path"}`))
	require.Contains(t, r.Stdout, "from the inline path")
	require.Contains(t, r.Stdout, "advisory (recorded, not enforced): inline_mcp_servers")

	require.Eventually(t, func() bool {
		r = cli("audit", "list", "--kind", "tool_call", "-o", "json")
		return r.Code == 0 && strings.Contains(r.Stdout, `"inline:a/old"`) && strings.Contains(r.Stdout, `"succeeded"`)
	}, 15*time.Second, 100*time.Millisecond, "the inline call reaches the audit log under its inline ref")
	require.Contains(t, r.Stdout, "nothing was pinned")

	// The same published version on a daemon without the flag: refused at run time.
	d.stop()
	d.env = slices.DeleteFunc(d.env, func(kv string) bool { return strings.HasPrefix(kv, "RINGFENCE_DEV__ALLOW_INLINE_MCP_SERVERS=") })
	d.start()
	r = cli("call", "--graph", "legacy", "--agent", "a", "--tool", "old__echo", "--args", `{"text":"x"}`)
	require.Equal(t, 3, r.Code, "refused before dispatch: %s %s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stderr, "inline_mcp_servers")
	require.Contains(t, r.Stderr, "ringfence mcp-import")
}
