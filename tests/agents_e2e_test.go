package tests

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAgentSurfaceEndToEnd drives the agent's tool surface through the real binaries: two
// servers imported for one agent, its settings set with the CLI (an excluded tool, a deferred
// server, confirmation for every tool not annotated read-only, a rule on one binding),
// published; a run with selected servers, and the listings over the CLI and REST, with a
// runner key, which is all a platform needs.
func TestAgentSurfaceEndToEnd(t *testing.T) {
	d, _ := poolDaemon(t)
	cli := func(args ...string) result {
		return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), args...)
	}
	must := func(args ...string) string {
		t.Helper()
		r := cli(args...)
		require.Equal(t, 0, r.Code, "%v\nstdout: %s\nstderr: %s", args, r.Stdout, r.Stderr)
		return r.Stdout
	}
	must("servers", "add", "docs", "--command", "mcpfixture", "--description", "The company handbook.", "--grant", "process_spawn", "--grant", "external_api_call")
	must("servers", "add", "tickets", "--command", "mcpfixture --runtime-tools", "--description", "The support team's ticket system.",
		"--grant", "process_spawn", "--grant", "external_api_call")
	must("graphs", "create", "--graph", "desk", "--agent", "researcher")
	must("mcp-import", "--server", "docs", "--graph", "desk", "--agent", "researcher", "--tool", "echo", "--tool", "add")
	must("mcp-import", "--server", "tickets", "--graph", "desk", "--agent", "researcher", "--tool", "echo", "--tool", "fail")
	agent := []string{"--graph", "desk", "--agent", "researcher"}
	must(append([]string{"graphs", "settings", "--exclude-tools", "docs__add", "--confirmation-default", "non_read_only"}, agent...)...)
	must(append([]string{"graphs", "mount", "--server", "tickets", "--defer-tools"}, agent...)...)
	must(append([]string{"graphs", "confirm", "--tool", "docs__echo", "--rule", "never"}, agent...)...)
	out := must(append([]string{"graphs", "settings"}, agent...)...)
	require.Contains(t, out, "docs__add")
	require.Contains(t, out, "non_read_only")
	must("graphs", "publish", "--graph", "desk")

	r := cli("keys", "create", "--name", "platform", "--role", "runner", "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var key map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &key))
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: key["secret"].(string)}

	// A run without a selection: docs' tools (less the excluded one), tickets deferred.
	must("runs", "start", "--graph", "desk", "--run", "all")
	out = must("runs", "tools", "--run", "all", "--agent", "researcher")
	require.Regexp(t, `docs__echo\s+docs\s+-\s+`, out, "the binding's rule wins over non_read_only")
	require.Regexp(t, `tool_search\s+-\s+-\s+Tool search`, out)
	require.Regexp(t, `tickets\s+2\s+The support team's ticket system\.`, out)
	require.Regexp(t, `docs__add\s+filtered_out \(provider_tools\)\s+agent "researcher"'s exclude_tools lists docs__add`, out)
	require.Regexp(t, `tickets__fail\s+not_loaded\s+`, out)

	code, body, raw := api.do(http.MethodGet, "/v1/runs/all/agents/researcher/tools", "")
	require.Equal(t, http.StatusOK, code, raw)
	var viaCLI map[string]any
	require.NoError(t, json.Unmarshal([]byte(must("runs", "tools", "--run", "all", "--agent", "researcher", "-o", "json")), &viaCLI))
	require.Equal(t, viaCLI["tools"], body["tools"], "the CLI's -o json is the REST answer")
	tools := body["tools"].([]any)
	require.Len(t, tools, 2)
	echo := tools[0].(map[string]any)
	require.Equal(t, "docs__echo", echo["name"])
	require.Equal(t, "echo", echo["tool_name"])
	require.NotNil(t, echo["input_schema"], "the pinned schema, as the model reads it")
	search := tools[1].(map[string]any)
	require.Equal(t, "tool_search", search["kind"])
	require.Contains(t, search["description"], "- tickets: The support team's ticket system.")

	// A run that selects docs (and a server nobody uses): tickets is out, nothing is deferred.
	r = cli("runs", "start", "--graph", "desk", "--run", "picked", "--selected-server", "docs", "--selected-server", "wiki")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, `no agent of graph desk uses "wiki", so the run ignores it`)
	code, body, raw = api.do(http.MethodGet, "/v1/runs/picked/agents/researcher/tools", "")
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, []any{"docs"}, body["selected_servers"])
	require.Len(t, body["tools"], 1)
	require.Equal(t, "docs__echo", body["tools"].([]any)[0].(map[string]any)["name"])
	levels := map[string]string{}
	for _, h := range body["hidden"].([]any) {
		hm := h.(map[string]any)
		levels[hm["name"].(string)] = hm["level"].(string)
	}
	require.Equal(t, map[string]string{"docs__add": "provider_tools", "tickets__echo": "selected_servers", "tickets__fail": "selected_servers"}, levels)

	// Over REST, a run started with selected servers answers which it ignored.
	code, body, raw = api.do(http.MethodPost, "/v1/runs", `{"graph_id":"desk","run_id":"rest","selected_servers":["tickets","nope"]}`)
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, []any{"nope"}, body["ignored_servers"])
	require.Equal(t, []any{"tickets"}, body["run"].(map[string]any)["selected_servers"])

	code, _, raw = api.do(http.MethodGet, "/v1/runs/all/agents/nobody/tools", "")
	require.Equal(t, http.StatusNotFound, code, raw)
	require.True(t, strings.Contains(raw, "its agents: researcher"), raw)
	noKey := rest{t: t, base: api.base}
	code, _, _ = noKey.do(http.MethodGet, "/v1/runs/all/agents/researcher/tools", "")
	require.Equal(t, http.StatusUnauthorized, code)
}
