package tests

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAFailedCallIsFollowedFromWhatTheCallerGotToTheLogAndTheRecord walks a refused call as the
// operator on call does (docs/operations.md, "Following a call"): from what the caller got (the
// CLI's message, or the REST body and its X-Request-Id) to the pool's access line, which names
// the same call_id and attempt, and to the call's audit record. A failure at the MCP server is
// an INFO line, and the server's secret env value, which its error quotes, is in none of them.
func TestAFailedCallIsFollowedFromWhatTheCallerGotToTheLogAndTheRecord(t *testing.T) {
	d, cli, _ := runsDaemon(t)
	r := cli("runs", "start", "--graph", "demo", "--run", "r-follow")
	require.Equal(t, 0, r.Code, r.Stderr)

	// The CLI names the attempt of a refusal and of a failure, and where its records are.
	callOf := regexp.MustCompile(`\(call (call-[0-9a-f]+) attempt 1; its records: ringfence audit list --run r-follow --kind tool_call\)`)
	r = cli("runs", "call", "--run", "r-follow", "--agent", "researcher", "--tool", "fx__add", "--args", `{"a":"two","b":3}`)
	require.Equal(t, 3, r.Code, r.Stderr)
	m := callOf.FindStringSubmatch(r.Stderr)
	require.NotNil(t, m, r.Stderr)
	refused := m[1]

	// A failure at the server (a JSON-RPC error that quotes the server's secret env value,
	// then a crash) is named the same way, and is the tool's failure, not a fault of ours: an
	// INFO line, not an ERROR.
	for _, args := range [][]string{
		{"graphs", "create", "--graph", "obs", "--agent", "researcher"},
		{"mcp-import", "--server", "fx", "--graph", "obs", "--agent", "researcher", "--tool", "rpc_error", "--tool", "crash"},
		{"graphs", "publish", "--graph", "obs"},
		{"runs", "start", "--graph", "obs", "--run", "r-fail"},
	} {
		r = cli(args...)
		require.Equal(t, 0, r.Code, r.Stderr)
	}
	failedOf := regexp.MustCompile(`\(call (call-[0-9a-f]+) attempt 1; its records: ringfence audit list --run r-fail --kind tool_call\)`)
	var failed []string
	for _, tool := range []string{"fx__rpc_error", "fx__crash"} {
		r = cli("runs", "call", "--run", "r-fail", "--agent", "researcher", "--tool", tool)
		require.Equal(t, 4, r.Code, r.Stderr)
		require.NotContains(t, r.Stdout+r.Stderr, canary)
		m := failedOf.FindStringSubmatch(r.Stderr)
		require.NotNil(t, m, r.Stderr)
		failed = append(failed, m[1])
	}

	// REST: the body's CallRefusal names the attempt, the response the request id.
	req, err := http.NewRequestWithContext(t.Context(), "POST", "http://"+d.HTTPAddr+"/v1/runs/r-follow:call",
		strings.NewReader(`{"agent":"researcher","tool":"fx__nope"}`))
	require.NoError(t, err)
	req.Header.Set("X-API-Key", adminKey)
	req.Header.Set("X-Request-Id", "on-call-7")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, string(raw))
	require.Equal(t, "on-call-7", resp.Header.Get("X-Request-Id"))
	var body struct {
		Details []struct {
			CallID  string `json:"call_id"`
			Attempt int    `json:"attempt"`
		} `json:"details"`
	}
	require.NoError(t, json.Unmarshal(raw, &body))
	require.Len(t, body.Details, 1, string(raw))
	viaREST := body.Details[0].CallID

	// The access line of each call, found by the request id or by the call id, names both.
	logs := d.Logs.String()
	require.Regexp(t, `msg=rpc method=/ringfence.pool.v1.PoolService/CallTool code=NotFound .*request_id=on-call-7 .*run_id=r-follow call_id=`+viaREST+` attempt=1`, logs)
	require.Regexp(t, `level=INFO msg=rpc method=/ringfence.pool.v1.PoolService/CallTool code=InvalidArgument .*request_id=[0-9a-f]+ .*err="pool: refused before dispatch \(invalid_input\): .* run_id=r-follow call_id=`+refused+` attempt=1`, logs)
	for _, id := range failed {
		require.Regexp(t, `level=INFO msg=rpc method=/ringfence.pool.v1.PoolService/CallTool code=Unknown .*err=".*" run_id=r-fail call_id=`+id+` attempt=1`, logs)
	}
	require.NotContains(t, logs, "level=ERROR")
	require.NotContains(t, logs, canary)

	// And the audit log holds each attempt under the same call id.
	require.Eventually(t, func() bool {
		r = cli("audit", "list", "--run", "r-follow", "--kind", "tool_call", "-o", "json")
		return r.Code == 0 && strings.Contains(r.Stdout, refused) && strings.Contains(r.Stdout, viaREST)
	}, 15*time.Second, 100*time.Millisecond, "the refused attempts reach the audit log")
	require.Eventually(t, func() bool {
		r = cli("audit", "list", "--run", "r-fail", "--kind", "tool_call", "-o", "json")
		return r.Code == 0 && strings.Contains(r.Stdout, failed[0]) && strings.Contains(r.Stdout, failed[1])
	}, 15*time.Second, 100*time.Millisecond, "the failed attempts reach the audit log")
	r = cli("audit", "export")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stdout, canary)
	require.Equal(t, 0, cli("runs", "end", "--run", "r-follow").Code)
	require.Equal(t, 0, cli("runs", "end", "--run", "r-fail").Code)
}

// TestRESTRequestsRefusedForTheirKeyAreCountedAndLogged: a /v1/ request without a valid key is
// refused before it becomes an RPC; like a gRPC stream refused so (docs/security.md), it is
// counted in ringfence_refused_total{listener="http"} and logged as a refusal naming the peer,
// once per peer and interval, and the key sent is never logged.
func TestRESTRequestsRefusedForTheirKeyAreCountedAndLogged(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	for _, key := range []string{"", "rf_" + canary, "rf_" + canary} {
		code, _, raw := rest{t: t, base: "http://" + d.HTTPAddr, key: key}.do("GET", "/v1/mcp/servers", "")
		require.Equal(t, http.StatusUnauthorized, code, raw)
	}
	resp, err := http.Get("http://" + d.HTTPAddr + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, metricLines(string(metrics), "ringfence_refused_total"), `ringfence_refused_total{listener="http",reason="Unauthenticated"} 3`)
	require.Contains(t, d.Logs.String(), `msg="refused a peer before reading a request" listener=http peer=127.0.0.1 reason=Unauthenticated refused=1`)
	require.NotContains(t, d.Logs.String(), canary)
}

// metricLines are the lines of a /metrics page that begin with name, for short failure messages.
func metricLines(page, name string) string {
	var out []string
	for line := range strings.Lines(page) {
		if strings.HasPrefix(line, name) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}
