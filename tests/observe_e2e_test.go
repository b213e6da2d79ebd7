package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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
	callOf := regexp.MustCompile(`\(call (call-[0-9a-f]+) attempt 1; its records: ringfence audit list --run r-follow --call (call-[0-9a-f]+)\)`)
	r = cli("runs", "call", "--run", "r-follow", "--agent", "researcher", "--tool", "fx__add", "--args", `{"a":"two","b":3}`)
	require.Equal(t, 3, r.Code, r.Stderr)
	m := callOf.FindStringSubmatch(r.Stderr)
	require.NotNil(t, m, r.Stderr)
	require.Equal(t, m[1], m[2], "the command it names lists this call")
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
	failedOf := regexp.MustCompile(`\(call (call-[0-9a-f]+) attempt 1; its records: ringfence audit list --run r-fail --call (call-[0-9a-f]+)\)`)
	var failed []string
	for _, tool := range []string{"fx__rpc_error", "fx__crash"} {
		r = cli("runs", "call", "--run", "r-fail", "--agent", "researcher", "--tool", tool)
		require.Equal(t, 4, r.Code, r.Stderr)
		require.NotContains(t, r.Stdout+r.Stderr, canary)
		m := failedOf.FindStringSubmatch(r.Stderr)
		require.NotNil(t, m, r.Stderr)
		require.Equal(t, m[1], m[2], "the command it names lists this call")
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
	// The REST call's line is the last one written: once it is read, so are the others.
	d.requireLogged(t, `msg=rpc method=/ringfence.pool.v1.PoolService/CallTool code=NotFound .*request_id=on-call-7 .*run_id=r-follow call_id=`+viaREST+` attempt=1`)
	logs := d.Logs.String()
	require.Regexp(t, `level=INFO msg=rpc method=/ringfence.pool.v1.PoolService/CallTool code=InvalidArgument .*request_id=cli-[0-9a-f]{12} .*err="pool: refused before dispatch \(invalid_input\): .* run_id=r-follow call_id=`+refused+` attempt=1`, logs)
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
	require.Contains(t, metricLines(scrape(t, d), "ringfence_refused_total"), `ringfence_refused_total{listener="http",reason="Unauthenticated"} 3`)
	require.Contains(t, d.Logs.String(), `msg="refused a peer before reading a request" listener=http peer=127.0.0.1 reason=Unauthenticated refused=1`)
	require.NotContains(t, d.Logs.String(), canary)
}

// TestACLIRefusalNamesTheRequestIDTheServerLogged: the CLI sends one request id with the
// requests of an invocation, and a refusal prints it: the server's log line of the request
// carries it.
func TestACLIRefusalNamesTheRequestIDTheServerLogged(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	r := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), "servers", "show", "nosuch")
	require.Equal(t, 1, r.Code, r.Stderr)
	m := regexp.MustCompile(`(?m)^  request id: (cli-[0-9a-f]{12}) \(the server's log line of the request has request_id=cli-[0-9a-f]{12}\)$`).FindStringSubmatch(r.Stderr)
	require.NotNil(t, m, r.Stderr)
	d.requireLogged(t, `msg=rpc method=/ringfence.registry.v1.RegistryService/GetServer code=NotFound .*request_id=`+m[1])
}

// TestTheAuditLogsHeadIsAMetric: ringfence_audit_records_total is the log's head seq, and
// grows as a change's record arrives.
func TestTheAuditLogsHeadIsAMetric(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	records := func() int {
		m := regexp.MustCompile(`(?m)^ringfence_audit_records_total (\d+)$`).FindStringSubmatch(scrape(t, d))
		require.NotNil(t, m)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	before := records()
	code, _, raw := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}.do("POST", "/v1/mcp/servers", `{"ref":"fx","command":"mcpfixture"}`)
	require.Equal(t, http.StatusOK, code, raw)
	require.Eventually(t, func() bool { return records() > before }, 10*time.Second, 50*time.Millisecond, "the create's record arrives")
	r := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), "audit", "verify")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, fmt.Sprintf("head %d ", records()), "the metric is the head verify proves")
}

// scrape reads the /metrics page of a daemon's HTTP listener.
func scrape(t *testing.T, d *daemon) string {
	t.Helper()
	resp, err := d.HTTP.Get(d.HTTPBase + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(page))
	return string(page)
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

// TestEveryMetricIsDocumented: every ringfence_* series a binary exports is named in
// docs/operations.md ("Health, metrics and logs") with the labels it has, and every series
// named there without labels is exported (one with labels appears once it has a value).
func TestEveryMetricIsDocumented(t *testing.T) {
	documented := documentedMetrics(t)
	d := startDaemon(t, "ringfenced", registryEnv()...)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	code, _, raw := api.do("GET", "/v1/mcp/servers", "")
	require.Equal(t, http.StatusOK, code, raw)
	code, _, raw = rest{t: t, base: api.base}.do("GET", "/v1/mcp/servers", "")
	require.Equal(t, http.StatusUnauthorized, code, raw)

	exported := map[string]bool{}
	for line := range strings.Lines(scrape(t, d)) {
		if !strings.HasPrefix(line, "ringfence_") {
			continue
		}
		name, labels := parseSample(line)
		family := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if _, ok := documented[family]; !ok {
			family = name
		}
		want, ok := documented[family]
		require.True(t, ok, "%s is exported but docs/operations.md does not name it", name)
		delete(labels, "le")
		require.Equal(t, want, labels, "the labels of %s", line)
		exported[family] = true
	}
	for name, labels := range documented {
		if len(labels) == 0 {
			require.True(t, exported[name], "docs/operations.md names %s, which is not exported", name)
		}
	}
}

// documentedMetrics reads the metrics docs/operations.md names in its "Health, metrics and
// logs" section, written `name{label,label}`, where a brace group inside a name is
// alternatives (`ringfence_pool_sessions_{spawned,stopped}_total`).
func documentedMetrics(t *testing.T) map[string]map[string]bool {
	t.Helper()
	root, err := repoRoot()
	require.NoError(t, err)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	require.NoError(t, err)
	text := string(doc)
	start := strings.Index(text, "## Health, metrics and logs")
	require.GreaterOrEqual(t, start, 0)
	text = text[start:]
	text = text[:strings.Index(text, "\n## ")+1]
	out := map[string]map[string]bool{}
	for _, m := range regexp.MustCompile("`(ringfence_[a-z_{},]+)`").FindAllStringSubmatch(text, -1) {
		spec := m[1]
		labels := map[string]bool{}
		// A trailing group is labels, unless it follows "_": then it ends the name.
		if i := strings.LastIndex(spec, "{"); i > 0 && strings.HasSuffix(spec, "}") && spec[i-1] != '_' {
			for _, l := range strings.Split(spec[i+1:len(spec)-1], ",") {
				labels[l] = true
			}
			spec = spec[:i]
		}
		for _, name := range expandBraces(spec) {
			out[name] = labels
		}
	}
	require.NotEmpty(t, out)
	return out
}

// expandBraces expands the first {a,b} group of s, and the rest recursively.
func expandBraces(s string) []string {
	i := strings.Index(s, "{")
	if i < 0 {
		return []string{s}
	}
	j := strings.Index(s[i:], "}") + i
	var out []string
	for _, alt := range strings.Split(s[i+1:j], ",") {
		out = append(out, expandBraces(s[:i]+alt+s[j+1:])...)
	}
	return out
}

// parseSample splits a sample line of the text exposition format into its name and label
// names.
func parseSample(line string) (string, map[string]bool) {
	labels := map[string]bool{}
	name, rest, ok := strings.Cut(strings.Fields(line)[0], "{")
	if !ok {
		return name, labels
	}
	for _, m := range regexp.MustCompile(`([a-z_]+)="`).FindAllStringSubmatch(rest, -1) {
		labels[m[1]] = true
	}
	return name, labels
}
