package tests

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/mcpgate/mcpdecl/jcs"
)

// runsDaemon starts ringfenced with the fixture image and a pool id of its own, registers the
// fixture server (runtime tools, an env canary), imports echo, add and fail into graph "demo"
// for agent "researcher", and publishes version 1.
func runsDaemon(t *testing.T, extra ...string) (*daemon, func(args ...string) result, string) {
	t.Helper()
	d, poolID := poolDaemon(t, extra...)
	cli := func(args ...string) result {
		return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), args...)
	}
	must := func(r result) {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	}
	must(cli("servers", "add", "fx", "--command", "mcpfixture --runtime-tools", "--env", "APP_TOKEN="+canary,
		"--grant", "process_spawn", "--grant", "external_api_call"))
	must(cli("graphs", "create", "--graph", "demo", "--agent", "researcher"))
	must(cli("mcp-import", "--server", "fx", "--graph", "demo", "--agent", "researcher", "--tool", "echo", "--tool", "add", "--tool", "fail", "--tool", "sleep"))
	must(cli("graphs", "publish", "--graph", "demo"))
	return d, cli, poolID
}

// TestRunsEndToEnd drives a run over the CLI and REST: a call that succeeds, one refused by a
// gate (exit 3), one whose tool fails (exit 4), the one-shot call, and the audit trail of every
// attempt, which verifies and never holds the canary.
func TestRunsEndToEnd(t *testing.T) {
	d, cli, _ := runsDaemon(t)
	// The start names the isolation image's own ENV keys, which every server sees
	// (docs/operations.md): an image of ringfence image build sets PATH alone.
	require.Regexp(t, `msg="isolation ready" .*env=PATH `, d.Logs.String())
	r := cli("runs", "start", "--graph", "demo", "--run", "run-e2e")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "run-e2e", strings.TrimSpace(r.Stdout))

	r = cli("runs", "call", "--run", "run-e2e", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"hello"}`)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "dispatched: succeeded")
	require.Contains(t, r.Stdout, "hello")

	r = cli("runs", "call", "--run", "run-e2e", "--agent", "researcher", "--tool", "fx__add", "--args", `{"a":"two","b":3}`)
	require.Equal(t, 3, r.Code, "refused before dispatch exits 3: %s", r.Stderr)
	require.Contains(t, r.Stderr, "refused before dispatch (invalid_input)")
	require.Contains(t, r.Stderr, "nothing reached the server")

	r = cli("runs", "call", "--run", "run-e2e", "--agent", "researcher", "--tool", "fx__fail")
	require.Equal(t, 4, r.Code, "a tool error exits 4: %s", r.Stderr)
	require.Contains(t, r.Stderr, "may have taken effect")

	// The same run over REST.
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	code, body, raw := api.do("POST", "/v1/runs/run-e2e:call", `{"agent":"researcher","tool":"fx__add","arguments":{"a":2,"b":40}}`)
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, "succeeded", body["result"])
	require.Equal(t, 42.0, body["structured_content"].(map[string]any)["sum"])
	// The digest of the result as this caller got it (docs/api.md, "Result digests"), which
	// its audit record must carry.
	added := body["call_id"].(string)
	addedDigest, addedSize := restResultDigest(t, body)
	addedBody := raw // kept, as a caller keeps a result, for audit check-result below
	require.Equal(t, addedDigest, body["result_digest"], "the response names the digest its record will hold")
	require.Equal(t, strconv.FormatInt(addedSize, 10), body["result_size"], "an int64, as protojson writes it")
	code, body, raw = api.do("POST", "/v1/runs/run-e2e:call", `{"agent":"researcher","tool":"fx__nope"}`)
	require.Equal(t, http.StatusNotFound, code, raw)
	require.Equal(t, "unknown_tool", body["details"].([]any)[0].(map[string]any)["reason"])

	r = cli("runs", "show", "--run", "run-e2e", "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var run map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &run))
	require.Equal(t, "running", run["state"])
	require.Len(t, run["sessions"], 1, "one session per server ref, shared")

	r = cli("runs", "end", "--run", "run-e2e")
	require.Equal(t, 0, r.Code, r.Stderr)
	r = cli("call", "--graph", "demo", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"one-shot"}`, "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "one-shot")
	// A result as its caller kept it is tied to its outcome record, checked at once: the
	// command waits the moment the outcome takes to reach the log.
	oneShot := r.Stdout
	kept := filepath.Join(t.TempDir(), "kept.json")
	require.NoError(t, os.WriteFile(kept, []byte(oneShot), 0o600))
	r = cli("audit", "check-result", kept)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `^matches record \d+: run \S+ researcher→fx/echo call \S+#1, dispatched: succeeded\nresult sha256:[0-9a-f]{64}, \d+ bytes\n$`, r.Stdout)

	// The audit trail: every attempt, refused or dispatched, with the guarantee stated.
	require.Eventually(t, func() bool {
		r = cli("audit", "list", "--kind", "tool_call", "-o", "json")
		// Six attempts; the four dispatched ones also have their pending record.
		return r.Code == 0 && strings.Count(r.Stdout, `"call_id"`) >= 10
	}, 15*time.Second, 100*time.Millisecond, "every attempt reaches the audit log")
	var list struct {
		Records []struct {
			ID       string `json:"id"`
			ToolCall struct {
				CallID           string `json:"call_id"`
				PendingID        string `json:"pending_id"`
				Outcome          string `json:"outcome"`
				Reason           string `json:"reason"`
				Result           string `json:"result"`
				FailureClass     string `json:"failure_class"`
				OperationSupport string `json:"operation_support"`
				Risk             bool   `json:"operation_residual_duplicate_risk"`
				ResultDigest     string `json:"result_digest"`
				ResultSize       int64  `json:"result_size,string"`
			} `json:"tool_call"`
		} `json:"records"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &list))
	// Attempts are in call order by their first record (the refusal, or the pending record that
	// is durable before dispatch); a dispatched call's outcome is spooled after the answer, so it
	// may land after a later call's records and is placed by its pending_id.
	outcomes := make([]string, len(list.Records))
	pendingAt := map[string]int{}
	for i, rec := range list.Records {
		tc := rec.ToolCall
		require.Equal(t, "at_least_once", tc.OperationSupport)
		require.True(t, tc.Risk)
		if tc.Result == "pending" {
			pendingAt[rec.ID] = i
			continue
		}
		at := i
		if tc.Outcome == "dispatched" {
			p, ok := pendingAt[tc.PendingID]
			require.True(t, ok, "call %s was on record before it was dispatched", tc.CallID)
			at = p
		}
		outcomes[at] = strings.Trim(tc.Outcome+"/"+tc.Reason+tc.Result+"/"+tc.FailureClass, "/")
		// A result reached the caller exactly when the call succeeded or the tool answered
		// an error: only then is its digest on record.
		returned := tc.Result == "succeeded" || tc.FailureClass == "tool_error"
		require.Equal(t, returned, tc.ResultDigest != "", "%s: %s", tc.CallID, outcomes[at])
		require.Equal(t, returned, tc.ResultSize > 0, tc.CallID)
		if tc.CallID == added {
			require.Equal(t, addedDigest, tc.ResultDigest, "the REST caller's result, recomputed")
			require.Equal(t, addedSize, tc.ResultSize)
		}
	}
	require.Len(t, pendingAt, 4)
	var inOrder []string
	for _, o := range outcomes {
		if o != "" {
			inOrder = append(inOrder, o)
		}
	}
	require.Equal(t, []string{
		"dispatched/succeeded", "refused_before_dispatch/invalid_input", "dispatched/failed/tool_error",
		"dispatched/succeeded", "refused_before_dispatch/unknown_tool", "dispatched/succeeded",
	}, inOrder)

	// So is a REST body (structured content, numbers as protojson writes them); changed, a
	// result is not.
	require.NoError(t, os.WriteFile(kept, []byte(addedBody), 0o600))
	r = cli("audit", "check-result", kept)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `^matches record \d+: run run-e2e researcher→fx/add call \S+#1, dispatched: succeeded\n`, r.Stdout)
	require.NoError(t, os.WriteFile(kept, []byte(strings.Replace(oneShot, "one-shot", "one-shot, edited", 1)), 0o600))
	r = cli("audit", "check-result", kept)
	require.Equal(t, 1, r.Code, r.Stdout)
	require.Regexp(t, `does not match: this result is sha256:[0-9a-f]{64} \(\d+ bytes\), but record \d+ holds sha256:`, r.Stderr)

	r = cli("audit", "verify")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "ok:")
	// The head it prints is an anchor: later verifies must pass through it.
	var headSeq uint64
	var headHash string
	_, err := fmt.Sscanf(r.Stdout[strings.Index(r.Stdout, "head "):], "head %d %s", &headSeq, &headHash)
	require.NoError(t, err)
	r = cli("audit", "verify", "--anchor", fmt.Sprintf("%d:%s", headSeq, headHash))
	require.Equal(t, 0, r.Code, r.Stderr)
	r = cli("audit", "verify", "--anchor", fmt.Sprintf("%d:%s", headSeq+100, headHash))
	require.Equal(t, 1, r.Code, r.Stdout)
	require.Contains(t, r.Stderr, "before the anchor you kept")

	// The JSON-lines export carries the hashed bodies: the chain verifies offline, and the
	// canary is nowhere.
	req, err := http.NewRequest("GET", api.base+"/v1/audit/export", nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", adminKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	export, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(export))
	require.NotContains(t, string(export), canary)
	requireChainVerifies(t, export)
	r = cli("audit", "export")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stdout, canary)
	require.NotContains(t, d.Logs.String(), canary)
}

// restResultDigest is the result digest an auditor computes of a CallToolResponse received as
// REST JSON: the RFC 8785 form of {"content", "isError", "structuredContent"}, SHA-256.
func restResultDigest(t *testing.T, body map[string]any) (string, int64) {
	t.Helper()
	doc := map[string]any{"content": []any{}, "isError": body["is_error"] == true}
	if c, ok := body["content"].([]any); ok {
		doc["content"] = c
	}
	if s, ok := body["structured_content"].(map[string]any); ok && len(s) > 0 {
		doc["structuredContent"] = s
	}
	raw, err := json.Marshal(doc)
	require.NoError(t, err)
	canonical, err := jcs.Canonicalize(raw)
	require.NoError(t, err)
	sum := sha256.Sum256(canonical)
	return "sha256:" + hex.EncodeToString(sum[:]), int64(len(canonical))
}

// TestArgumentScopeRefusalEndToEnd: a call whose path argument lies outside what the agent
// holds is refused by the argument-scope gate through ringfenced: over REST as 403 with the
// reason, what is missing and the attempt's call id in the details, and by `ringfence runs
// call` with exit 3.
func TestArgumentScopeRefusalEndToEnd(t *testing.T) {
	d, cli, _ := runsDaemon(t)
	must := func(r result) {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	}
	must(cli("servers", "add", "docs", "--command", "mcpfixture", "--grant", "process_spawn", "--grant", "external_api_call",
		"--tool-permission", "echo=fs.read:{text}"))
	must(cli("graphs", "create", "--graph", "scoped", "--agent", "reader"))
	must(cli("mcp-import", "--server", "docs", "--graph", "scoped", "--agent", "reader", "--tool", "echo"))
	must(cli("graphs", "bind", "--graph", "scoped", "--agent", "reader", "--capability", "fs.read:/srv/docs/**"))
	must(cli("graphs", "publish", "--graph", "scoped"))
	must(cli("runs", "start", "--graph", "scoped", "--run", "run-scope"))

	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	code, _, raw := api.do("POST", "/v1/runs/run-scope:call", `{"agent":"reader","tool":"docs__echo","arguments":{"text":"/srv/docs/leave.md"}}`)
	require.Equal(t, http.StatusOK, code, raw)
	code, body, raw := api.do("POST", "/v1/runs/run-scope:call", `{"agent":"reader","tool":"docs__echo","arguments":{"text":"/etc/shadow"}}`)
	require.Equal(t, http.StatusForbidden, code, raw)
	details, _ := body["details"].([]any)
	require.NotEmpty(t, details, raw)
	refusal := details[0].(map[string]any)
	require.Equal(t, "argument_scope", refusal["reason"], raw)
	require.Equal(t, []any{"fs.read:/etc/shadow"}, refusal["missing"], raw)
	require.NotEmpty(t, refusal["call_id"], "the pool's call id, as in the audit log")

	r := cli("runs", "call", "--run", "run-scope", "--agent", "reader", "--tool", "docs__echo", "--args", `{"text":"/etc/shadow"}`)
	require.Equal(t, 3, r.Code, "refused before dispatch exits 3: %s %s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stderr, "argument_scope")
	require.Contains(t, r.Stderr, "fs.read:/etc/shadow")
	must(cli("runs", "end", "--run", "run-scope"))
}

// requireChainVerifies recomputes the hash chain of a JSON-lines export with nothing but
// SHA-256: hash_i = SHA-256(hash_{i-1} || body_i).
func requireChainVerifies(t *testing.T, export []byte) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(export))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var prev []byte
	n := 0
	for sc.Scan() {
		var line struct {
			Hash   string          `json:"hash"`
			Record json.RawMessage `json:"record"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line))
		var body struct {
			PrevHash string `json:"prev_hash"`
		}
		require.NoError(t, json.Unmarshal(line.Record, &body))
		if prev != nil {
			require.Equal(t, hex.EncodeToString(prev), body.PrevHash, "record %d links to the one before", n)
		}
		pb, err := hex.DecodeString(body.PrevHash)
		require.NoError(t, err)
		sum := sha256.Sum256(append(pb, line.Record...))
		require.Equal(t, line.Hash, hex.EncodeToString(sum[:]), "record %d hashes to its stored hash", n)
		prev = sum[:]
		n++
	}
	require.NoError(t, sc.Err())
	require.Positive(t, n)
}

// TestPoolSIGKILLMidRunLosesNoAttemptAndLeavesNoContainer kills ringfenced while a run holds a
// session, restarts it, and finds every attempt made before the kill in the audit log, no
// container of the pool left, and the run able to call again with a fresh session.
func TestPoolSIGKILLMidRunLosesNoAttemptAndLeavesNoContainer(t *testing.T) {
	d, cli, poolID := runsDaemon(t)
	require.Equal(t, 0, cli("runs", "start", "--graph", "demo", "--run", "run-kill").Code)
	const calls = 12
	for i := range calls {
		r := cli("runs", "call", "--run", "run-kill", "--agent", "researcher", "--tool", "fx__echo", "--args", fmt.Sprintf(`{"text":"%d"}`, i))
		require.Equal(t, 0, r.Code, r.Stderr)
	}
	require.Len(t, poolContainers(t, poolID), 1, "the run's session is up")
	// One more call is at the server when the pool dies.
	inFlight := make(chan result, 1)
	go func() {
		inFlight <- cli("runs", "call", "--run", "run-kill", "--agent", "researcher", "--tool", "fx__sleep", "--args", `{"ms":10000}`)
	}()
	pendings := func() int {
		r := cli("audit", "list", "--run", "run-kill", "-o", "json")
		if r.Code != 0 {
			return -1
		}
		return strings.Count(r.Stdout, `"pending"`)
	}
	require.Eventually(t, func() bool { return pendings() == calls+1 }, 20*time.Second, 50*time.Millisecond, "the in-flight call is on record")
	d.kill()
	require.NotEqual(t, 0, (<-inFlight).Code, "the in-flight call never got an answer")
	d.start()
	requireNoContainers(t, poolID)

	// Every attempt made before the kill is in the log: the twelve answered calls, and the one
	// at the server when the pool died, whose pending record says it may have taken effect.
	require.Eventually(t, func() bool {
		r := cli("audit", "list", "--run", "run-kill", "-o", "json")
		return r.Code == 0 && strings.Count(r.Stdout, `"pending"`) == calls+1 && strings.Count(r.Stdout, `"succeeded"`) >= calls-1
	}, 20*time.Second, 100*time.Millisecond, "every attempt is in the audit log after the kill")
	r := cli("audit", "list", "--run", "run-kill", "-o", "json")
	require.Equal(t, 1, strings.Count(r.Stdout, `"tool_name": "sleep"`)+strings.Count(r.Stdout, `"tool_name":"sleep"`), "the in-flight call has its pending record and no outcome")

	r = cli("runs", "show", "--run", "run-kill")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "running")
	r = cli("runs", "call", "--run", "run-kill", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"after"}`)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "after")
	require.Equal(t, 0, cli("runs", "end", "--run", "run-kill").Code)
	requireNoContainers(t, poolID)
}

// TestAuditVerifyNamesATamperedRecord flips one byte of a stored record in audit.db while the
// server is stopped: `ringfence audit verify` exits 1 naming that record.
func TestAuditVerifyNamesATamperedRecord(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	for i := range 5 {
		code, _, raw := api.do("POST", "/v1/mcp/servers", fmt.Sprintf(`{"ref":"srv-%d","command":"x","description":"marker-%d"}`, i, i))
		require.Equal(t, http.StatusOK, code, raw)
	}
	cli := func(args ...string) result {
		return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), args...)
	}
	require.Eventually(t, func() bool {
		r := cli("audit", "list", "--kind", "admin", "-o", "json")
		return strings.Count(r.Stdout, `"resource_type"`) >= 6
	}, 15*time.Second, 100*time.Millisecond)
	r := cli("audit", "list", "-o", "json")
	var list struct {
		Records []struct {
			Seq   string `json:"seq"`
			Admin struct {
				ResourceID string `json:"resource_id"`
			} `json:"admin"`
		} `json:"records"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &list))
	var target string
	for _, rec := range list.Records {
		if rec.Admin.ResourceID == "srv-3" {
			target = rec.Seq
		}
	}
	require.NotEmpty(t, target)
	d.stop()

	path := filepath.Join(d.DataDir, "audit.db")
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	// Every copy: bbolt writes a changed page elsewhere and frees the old one, so the first
	// copy in the file may be a stale page the live tree no longer reaches.
	require.Positive(t, bytes.Count(raw, []byte("marker-3")), "the record's body is in the file")
	raw = bytes.ReplaceAll(raw, []byte("marker-3"), []byte("Marker-3"))
	require.NoError(t, os.WriteFile(path, raw, 0o600))

	d.start()
	r = cli("audit", "verify")
	require.Equal(t, 1, r.Code, r.Stdout)
	require.Contains(t, r.Stderr, "broken at record "+target)
}

// TestALargeResultReachesTheCaller: sanitizing grows a result (every ' becomes &#39;), so
// 1 MB of arguments comes back as 5 MB: REST delivers it instead of refusing a call already
// made with RESOURCE_EXHAUSTED (HTTP 429, read as "retry"). The CLI and peer clients take the
// same limit (grpcserver.MaxResponseBytes); an argument list cannot carry 1 MB to the CLI.
func TestALargeResultReachesTheCaller(t *testing.T) {
	d, cli, _ := runsDaemon(t)
	r := cli("runs", "start", "--graph", "demo", "--run", "run-big")
	require.Equal(t, 0, r.Code, r.Stderr)
	text := strings.Repeat("'", 1_000_000) // JSON keeps ' as one byte: 1 MB of arguments
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	code, _, raw := api.do("POST", "/v1/runs/run-big:call", `{"agent":"researcher","tool":"fx__echo","arguments":{"text":"`+text+`"}}`)
	require.Equal(t, http.StatusOK, code, "%.300s", raw)
	require.Greater(t, len(raw), 5_000_000, "the escaped result came back whole")

	r = cli("runs", "end", "--run", "run-big")
	require.Equal(t, 0, r.Code, r.Stderr)
}

// TestACallWithNoAnswerWithinTimeoutSaysItsOutcomeIsUnknown: when the CLI's own --timeout
// ends a call the server took, neither "refused" (3) nor a bare error (1) is true: the call was
// dispatched and may take effect. `runs call` and the one-shot `call` exit 4, say the outcome
// is unknown, and name the call id and the command that looks it up, which finds the attempt.
func TestACallWithNoAnswerWithinTimeoutSaysItsOutcomeIsUnknown(t *testing.T) {
	d, cli, _ := runsDaemon(t)
	r := cli("runs", "start", "--graph", "demo", "--run", "run-slow")
	require.Equal(t, 0, r.Code, r.Stderr)
	// The session is up before the timed call, so it reaches the server at once.
	r = cli("runs", "call", "--run", "run-slow", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"warm"}`)
	require.Equal(t, 0, r.Code, r.Stderr)

	r = callUnanswered(t, d, cli, 0, "runs", "call", "--run", "run-slow", "--agent", "researcher", "--tool", "fx__sleep",
		"--args", `{"ms":60000}`, "--call-id", "call-slow", "--timeout", "15s")
	require.Equal(t, 4, r.Code, "no answer within --timeout exits 4, like a failure that may have taken effect: %s", r.Stderr)
	require.Contains(t, r.Stderr, "the call's outcome is unknown: no answer within --timeout 15s")
	require.Contains(t, r.Stderr, "it may have reached the server and taken effect")
	require.Contains(t, r.Stderr, "look up call call-slow before calling again: ringfence audit list --run run-slow --call call-slow (needs audit:read)")
	require.NotContains(t, r.Stderr, "DeadlineExceeded", "not a bare gRPC error")
	// What it says to run finds the attempt.
	r = cli("audit", "list", "--run", "run-slow", "--call", "call-slow")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "call call-slow#1")
	require.NotContains(t, r.Stdout, "fx/echo", "the run's other call is not listed")
	require.Equal(t, 0, cli("runs", "end", "--run", "run-slow").Code)

	// The one-shot call generates the call id itself, and names it and the run it started.
	r = callUnanswered(t, d, cli, 1, "call", "--graph", "demo", "--agent", "researcher", "--tool", "fx__sleep",
		"--args", `{"ms":60000}`, "--timeout", "20s")
	require.Equal(t, 4, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stderr, "the call's outcome is unknown: no answer within --timeout 20s")
	require.Regexp(t, `look up call (call-[0-9a-f]+) before calling again: ringfence audit list --run run-[0-9a-f]+ --call call-[0-9a-f]+ \(needs audit:read\)`, r.Stderr)
	require.NotContains(t, r.Stderr, "warning: ending run", "the run it started is ended")

	// A one-shot call whose run does not start within --timeout made no call, and says which
	// run to end should it have started.
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGSTOP))
	r = cli("call", "--graph", "demo", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"x"}`, "--timeout", "2s")
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGCONT))
	require.Equal(t, 1, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	require.Regexp(t, `no answer within --timeout 2s while starting run run-[0-9a-f]{24}, so no tool was called`, r.Stderr)
	require.Regexp(t, `ringfence runs end --run run-[0-9a-f]{24}`, r.Stderr)

	// An explore call outside any run: the same, named by the call id the CLI sent, which
	// finds it.
	r = callUnanswered(t, d, cli, 2, "servers", "explore", "fx", "--call", "sleep", "--args", `{"ms":60000}`, "--timeout", "20s")
	require.Equal(t, 4, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stderr, "the explore call's outcome is unknown: no answer within --timeout 20s")
	require.NotContains(t, r.Stderr, "DeadlineExceeded", "not a bare gRPC error")
	m := regexp.MustCompile(`look up call (call-[0-9a-f]{24}) before calling again: ringfence audit list --call (\S+) \(needs audit:read\)`).FindStringSubmatch(r.Stderr)
	require.NotNil(t, m, r.Stderr)
	require.Equal(t, m[1], m[2])
	r = cli("audit", "list", "--call", m[1])
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "call "+m[1]+"#1")
	require.Contains(t, r.Stdout, "explore-", "the explore call's run")
}

// callUnanswered runs a CLI call of fx__sleep that ends with "--timeout D" in the background.
// Once the call is on record as dispatched (pending sleep calls number more than before), it
// stops the daemon (SIGSTOP), so no answer, not even the pool's own for the deadline it shares
// with the CLI, can come before the CLI's timer fires; the daemon continues once that deadline
// has passed.
func callUnanswered(t *testing.T, d *daemon, cli func(args ...string) result, before int, args ...string) result {
	t.Helper()
	timeout, err := time.ParseDuration(args[len(args)-1])
	require.NoError(t, err)
	start := time.Now()
	done := make(chan result, 1)
	go func() { done <- cli(args...) }()
	require.Eventually(t, func() bool {
		r := cli("audit", "list", "--kind", "tool_call")
		n := 0
		for _, line := range strings.Split(r.Stdout, "\n") {
			if strings.Contains(line, "/sleep call ") && strings.Contains(line, "dispatched: pending") {
				n++
			}
		}
		return n > before
	}, timeout-2*time.Second, 50*time.Millisecond, "the call reaches the server within its --timeout")
	t.Cleanup(func() { _ = d.cmd.Process.Signal(syscall.SIGCONT) })
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(time.Until(start.Add(timeout + time.Second)))
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGCONT))
	return <-done
}

// TestRunIDsAreScopedByTenantOverTheCLI: the same run id in the default tenant and in acme,
// reached by an unbound key with --tenant (and ?tenant= over REST); ending acme's leaves the
// other running.
func TestRunIDsAreScopedByTenantOverTheCLI(t *testing.T) {
	d, cli, _ := runsDaemon(t)
	must := func(r result) result {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
		return r
	}
	must(cli("graphs", "create", "--graph", "demo", "--agent", "researcher", "--tenant", "acme"))
	must(cli("mcp-import", "--server", "fx", "--graph", "demo", "--agent", "researcher", "--tool", "echo", "--tenant", "acme"))
	must(cli("graphs", "publish", "--graph", "demo", "--tenant", "acme"))

	must(cli("runs", "start", "--graph", "demo", "--run", "nightly"))
	must(cli("runs", "start", "--graph", "demo", "--run", "nightly", "--tenant", "acme"))
	r := must(cli("runs", "call", "--run", "nightly", "--tenant", "acme", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"in acme"}`))
	require.Contains(t, r.Stdout, "in acme")

	show := func(tenant ...string) map[string]any {
		t.Helper()
		args := append([]string{"runs", "show", "--run", "nightly", "-o", "json"}, tenant...)
		r := must(cli(args...))
		var run map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.Stdout), &run))
		return run
	}
	acme := show("--tenant", "acme")
	require.Equal(t, "acme", acme["tenant"])
	require.Len(t, acme["sessions"], 1)
	require.Equal(t, "default", show()["tenant"])
	require.Empty(t, show()["sessions"], "the default tenant's run of the same id made no call")
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	code, body, raw := api.do("GET", "/v1/runs/nightly?tenant=acme", "")
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, "acme", body["run"].(map[string]any)["tenant"])

	must(cli("runs", "end", "--run", "nightly", "--tenant", "acme"))
	require.Equal(t, "completed", show("--tenant", "acme")["state"])
	require.Equal(t, "running", show()["state"])
	must(cli("runs", "end", "--run", "nightly"))
}
