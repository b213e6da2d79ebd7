package tests

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

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

// TestAgentCallTimeEndToEnd drives the agent's surface at call time through the real binaries
// and the isolation image: an agent whose server loads on demand and asks a person first for
// every tool not annotated read-only. With a runner key it lists, searches, loads and calls a
// read-only tool, passes a document by reference, and asks for a write tool, which waits; an
// approver key (and only it) approves it and gets the result, and the runner's retry gets the
// same result without a second call; a second approval is denied over REST; the audit trail
// says all of it.
func TestAgentCallTimeEndToEnd(t *testing.T) {
	d, _ := poolDaemon(t)
	as := func(key string) func(args ...string) result {
		return func(args ...string) result {
			return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + key}, bin("ringfence"), args...)
		}
	}
	ok := func(r result, args ...any) string {
		t.Helper()
		require.Equal(t, 0, r.Code, "%v\nstdout: %s\nstderr: %s", args, r.Stdout, r.Stderr)
		return r.Stdout
	}
	admin := as(adminKey)
	ok(admin("servers", "add", "desk", "--command", "mcpfixture --read-only-tools", "--description", "The team's desk.",
		"--grant", "process_spawn", "--grant", "external_api_call"))
	ok(admin("graphs", "create", "--graph", "ops", "--agent", "assistant"))
	ok(admin("mcp-import", "--server", "desk", "--graph", "ops", "--agent", "assistant", "--tool", "echo", "--tool", "peek"))
	ok(admin("graphs", "settings", "--graph", "ops", "--agent", "assistant", "--defer-tools", "--confirmation-default", "non_read_only",
		"--document-resolver", "--document-servers", "desk"))
	ok(admin("graphs", "publish", "--graph", "ops"))
	key := func(role string) string {
		var k map[string]any
		require.NoError(t, json.Unmarshal([]byte(ok(admin("keys", "create", "--name", role+"-key", "--role", role, "-o", "json"))), &k))
		return k["secret"].(string)
	}
	runnerKey, approverKey := key("runner"), key("approver")
	runner, approver := as(runnerKey), as(approverKey)
	call := func(tool, args string) result {
		return runner("runs", "call", "--run", "r1", "--agent", "assistant", "--tool", tool, "--args", args)
	}

	ok(runner("runs", "start", "--graph", "ops", "--run", "r1"))
	out := ok(runner("runs", "tools", "--run", "r1", "--agent", "assistant"))
	require.Regexp(t, `tool_search\s+-\s+-\s+Tool search`, out)
	require.Regexp(t, `desk\s+2\s+The team's desk\.`, out)

	r := call("desk__peek", `{"text":"hello"}`)
	require.Equal(t, 3, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "refused before dispatch (not_loaded)")
	out = ok(call("tool_search", `{"query":"changes nothing"}`))
	require.Contains(t, out, `"name":"desk__peek"`)
	out = ok(call("desk__peek", `{"text":"hello"}`))
	require.Contains(t, out, "hello", "a read-only tool asks nobody")

	doc := t.TempDir() + "/note.txt"
	require.NoError(t, os.WriteFile(doc, []byte("the minutes"), 0o600))
	docID := strings.TrimSpace(ok(runner("documents", "put", doc)))
	require.Regexp(t, `media type:? +text/plain`, ok(runner("documents", "get", docID)), "the media type is the file's, unless --media-type says")
	pdf := t.TempDir() + "/scan.pdf"
	require.NoError(t, os.WriteFile(pdf, []byte("%PDF-1.4\n"), 0o600))
	require.Regexp(t, `media type:? +application/pdf`, ok(runner("documents", "get", strings.TrimSpace(ok(runner("documents", "put", pdf))))))
	out = ok(call("desk__peek", `{"text":"my-documents://`+docID+`"}`))
	require.Contains(t, out, base64.StdEncoding.EncodeToString([]byte("the minutes")), "a listed server gets the document's content")

	// Over REST a document is one JSON message, its content base64; it comes back as the
	// stream of chunks grpc-gateway writes, one JSON object a line.
	docs := rest{t: t, base: "http://" + d.HTTPAddr, key: runnerKey}
	code, body, raw := docs.do(http.MethodPost, "/v1/documents", `{"name":"a.txt","content":"`+base64.StdEncoding.EncodeToString([]byte("over rest"))+`"}`)
	require.Equal(t, http.StatusOK, code, raw)
	restID := body["document"].(map[string]any)["document_id"].(string)
	code, _, raw = docs.do(http.MethodGet, "/v1/documents/"+restID, "")
	require.Equal(t, http.StatusOK, code, raw)
	var chunk struct {
		Result struct {
			Document map[string]any `json:"document"`
			Content  []byte         `json:"content"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.Split(strings.TrimSpace(raw), "\n")[0]), &chunk), raw)
	require.Equal(t, "over rest", string(chunk.Result.Content))
	require.Equal(t, "a.txt", chunk.Result.Document["name"])
	code, _, raw = docs.do(http.MethodGet, "/v1/documents/"+restID+"?tenant=globex", "")
	require.Equal(t, http.StatusNotFound, code, "another tenant's documents are not found: %s", raw)

	ok(call("tool_search", `{"query":"echo"}`))
	r = call("desk__echo", `{"text":"write it"}`)
	require.Equal(t, 5, r.Code, "a call that waits for an approver: %s", r.Stderr)
	m := regexp.MustCompile(`awaiting approval (apr-[0-9a-f]+)`).FindStringSubmatch(r.Stderr)
	require.NotNil(t, m, r.Stderr)
	id := m[1]
	require.Contains(t, r.Stderr, "ringfence runs approve --run r1 --approval "+id)
	r = call("desk__peek", `{"text":"meanwhile"}`)
	require.Equal(t, 3, r.Code)
	require.Contains(t, r.Stderr, "approval_pending")

	r = runner("runs", "approve", "--run", "r1", "--approval", id)
	require.Equal(t, 1, r.Code, "a runner cannot approve its own calls: %s", r.Stderr)
	require.Contains(t, r.Stderr, "run:approve")
	out = ok(approver("runs", "approvals", "--run", "r1"))
	require.Regexp(t, id+`\s+pending\s+assistant\s+desk__echo`, out)
	require.Contains(t, out, `{"text":"write it"}`)
	out = ok(approver("runs", "approve", "--run", "r1", "--approval", id))
	require.Contains(t, out, "approved "+id)
	require.Contains(t, out, "write it")
	m = regexp.MustCompile(`\(desk/echo, call (\S+) attempt (\d+); the server was reached once`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	dispatched := m[1] + "#" + m[2] // as audit list names the call the approver dispatched
	out = ok(call("desk__echo", `{"text":"write it"}`))
	require.Contains(t, out, "approved: the result of approval "+id+": succeeded")
	require.Contains(t, out, ", dispatched as call "+dispatched+" when it was approved", "the retry names the call that reached the server")
	require.NotContains(t, out, "dispatched:", "the retry did not reach the server: it is not told as a dispatch")
	require.Contains(t, out, "write it")

	// A second approval, denied over REST by the approver.
	r = call("desk__echo", `{"text":"again"}`)
	require.Equal(t, 5, r.Code)
	second := regexp.MustCompile(`awaiting approval (apr-[0-9a-f]+)`).FindStringSubmatch(r.Stderr)[1]
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: approverKey}
	code, body, raw = api.do(http.MethodGet, "/v1/runs/r1/approvals", "")
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, second, body["approvals"].([]any)[0].(map[string]any)["approval_id"])
	code, body, raw = api.do(http.MethodPost, "/v1/runs/r1/approvals/"+second+":deny", `{"reason":"not twice"}`)
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, "denied", body["approval"].(map[string]any)["state"])
	r = call("desk__echo", `{"text":"again"}`)
	require.Equal(t, 3, r.Code)
	require.Contains(t, r.Stderr, "denied_by_approver")
	require.Contains(t, r.Stderr, "not twice")

	// The audit trail, as an auditor reads it: the pool forwards records from its spool in
	// batches that may linger up to 100 ms (docs/operations.md), so the last one can reach the
	// log just after the call that wrote it answered.
	last := `refused_before_dispatch: denied_by_approver \[approval ` + second + ` denied by key:approver-key`
	require.Eventually(t, func() bool {
		out = ok(admin("audit", "list", "--run", "r1", "--kind", "tool_call"))
		return regexp.MustCompile(last).MatchString(out)
	}, 10*time.Second, 50*time.Millisecond, "the denial's record reaches the audit log")
	for _, want := range []string{
		`refused_before_dispatch: not_loaded`,
		`assistant→tool_search .* dispatched: succeeded \[loaded: desk__peek\]`,
		`assistant→desk/peek .* dispatched: succeeded`,
		`refused_before_dispatch: approval_required \[approval ` + id + ` pending\]`,
		`refused_before_dispatch: approval_pending`,
		`call ` + regexp.QuoteMeta(dispatched) + `\s+dispatched: succeeded \[approval ` + id + ` approved by key:approver-key \(approver, `,
		// The retry's line names that call, as the line above does.
		`dispatched: succeeded \[approval ` + id + ` delivered, approved by key:approver-key \(approver, [^)]*\), dispatched as call ` + regexp.QuoteMeta(dispatched) + `\]`,
		last,
	} {
		require.Regexp(t, want, out)
	}
	require.NotContains(t, out, base64.StdEncoding.EncodeToString([]byte("the minutes")))
	ok(runner("runs", "end", "--run", "r1"))

	// The one-shot call keeps its run for the approval and names the command that gets the
	// result, with the arguments quoted for the shell as they were given.
	ok(admin("graphs", "settings", "--graph", "ops", "--agent", "assistant", "--defer-tools=false"))
	ok(admin("graphs", "publish", "--graph", "ops"))
	r = runner("call", "--graph", "ops", "--agent", "assistant", "--tool", "desk__echo", "--args", `{"text":"it's done"}`)
	require.Equal(t, 5, r.Code, r.Stderr)
	m = regexp.MustCompile(`ringfence runs call --run (\S+) --agent assistant --tool desk__echo --args '\{"text":"it'\\''s done"\}', then end it`).FindStringSubmatch(r.Stderr)
	require.NotNil(t, m, r.Stderr)
	kept := m[1]
	pending := regexp.MustCompile(`awaiting approval (apr-[0-9a-f]+)`).FindStringSubmatch(r.Stderr)
	require.NotNil(t, pending, r.Stderr)
	ok(approver("runs", "approve", "--run", kept, "--approval", pending[1]))
	// What a shell makes of the quoted arguments: the same call, which gets the approved result.
	out = ok(runner("runs", "call", "--run", kept, "--agent", "assistant", "--tool", "desk__echo", "--args", `{"text":"it's done"}`))
	require.Contains(t, out, "approved: the result of approval "+pending[1])
	ok(runner("runs", "end", "--run", kept))
}
