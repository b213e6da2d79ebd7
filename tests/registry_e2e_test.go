package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	adminKey = "e2e-admin-key-0123456789abcdef"
	canary   = "CANARY-6d1f0c2b-never-in-clear"
)

func registryEnv() []string {
	return []string{
		"RINGFENCE_BOOTSTRAP_ADMIN_KEY=" + adminKey,
		`RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS=["APP_TOKEN"]`,
	}
}

// rest is a tiny REST client that keeps the raw body for assertions.
type rest struct {
	t    *testing.T
	base string
	key  string
}

func (r rest) do(method, path, body string) (int, map[string]any, string) {
	r.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(r.t.Context(), method, r.base+path, rd)
	require.NoError(r.t, err)
	if r.key != "" {
		req.Header.Set("X-API-Key", r.key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(r.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(r.t, err)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m, string(raw)
}

// TestSeedSequenceOverREST is the seed's curl sequence against a fresh ringfenced.
func TestSeedSequenceOverREST(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	create := `{
        "ref": "docs-search",
        "command": "npx",
        "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/docs"],
        "env": {"APP_TOKEN": "` + canary + `"},
        "grants": ["process_spawn", "external_api_call"]
      }`
	code, body, raw := api.do("POST", "/v1/mcp/servers", create)
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, "docs-search", body["ref"])
	require.Equal(t, map[string]any{"APP_TOKEN": "********"}, body["env"])

	code, body, raw = api.do("POST", "/v1/mcp/servers", create)
	require.Equal(t, http.StatusConflict, code, raw)
	require.Contains(t, body["message"], "already exists")

	code, body, raw = api.do("PUT", "/v1/mcp/servers/docs-search", `{"command":"npx","args":["-y","@modelcontextprotocol/server-filesystem","/srv/handbook"],"grants":["process_spawn","external_api_call"]}`)
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, []any{"-y", "@modelcontextprotocol/server-filesystem", "/srv/handbook"}, body["args"])
	require.Equal(t, map[string]any{"APP_TOKEN": "********"}, body["env"], "PUT without env keeps it, masked")

	code, body, raw = api.do("GET", "/v1/mcp/servers/docs-search", "")
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, map[string]any{"APP_TOKEN": "********"}, body["env"])
	code, body, _ = api.do("GET", "/v1/mcp/servers", "")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, body["servers"], 1)

	code, body, raw = api.do("PUT", "/v1/mcp/servers/docs-search", `{"command":"npx","env":{}}`)
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, map[string]any{}, body["env"], `"env": {} clears it`)

	code, body, raw = api.do("GET", "/v1/mcp/servers/docs-search/tools", "")
	require.Equal(t, http.StatusServiceUnavailable, code, raw)
	require.Contains(t, body["message"], "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE")

	noKey := rest{t: t, base: api.base}
	code, _, raw = noKey.do("GET", "/v1/mcp/servers", "")
	require.Equal(t, http.StatusUnauthorized, code, raw)

	code, body, raw = api.do("POST", "/v1/keys", `{"name":"ops","role":"operator"}`)
	require.Equal(t, http.StatusOK, code, raw)
	operator := rest{t: t, base: api.base, key: body["secret"].(string)}
	code, body, raw = operator.do("GET", "/v1/mcp/servers", "")
	require.Equal(t, http.StatusForbidden, code, raw)
	require.Contains(t, body["message"], "mcp:admin")
	// The route's permission is checked before its body is decoded: this body would be 400.
	code, body, raw = operator.do("POST", "/v1/mcp/servers", `{"ref": [[[`)
	require.Equal(t, http.StatusForbidden, code, raw)
	require.Contains(t, body["message"], "CreateServer needs permission mcp:admin")

	code, _, raw = api.do("GET", "/v1/mcp/servers/nope", "")
	require.Equal(t, http.StatusNotFound, code, raw)
	code, _, raw = api.do("DELETE", "/v1/mcp/servers/docs-search", "")
	require.Equal(t, http.StatusOK, code, raw)
	require.NotContains(t, d.Logs.String(), canary)
}

// TestEveryRESTResponseCarriesARequestID: the id a caller sends comes back, once, on every
// answer (also those no RPC gives: a refused key, an unknown route, health, the export), and
// the server makes one when none or an insane one is sent.
func TestEveryRESTResponseCarriesARequestID(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	base := "http://" + d.HTTPAddr
	requestIDs := func(method, path, key, sent string) (int, []string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, nil)
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		if sent != "" {
			req.Header.Set("X-Request-Id", sent)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode, resp.Header.Values("X-Request-Id")
	}
	for _, tc := range []struct {
		name, method, path, key string
		code                    int
	}{
		{"served", "GET", "/v1/mcp/servers", adminKey, http.StatusOK},
		{"refused by the RPC", "GET", "/v1/mcp/servers/nope", adminKey, http.StatusNotFound},
		{"no key", "GET", "/v1/mcp/servers", "", http.StatusUnauthorized},
		{"unknown route", "GET", "/v1/nope", adminKey, http.StatusNotFound},
		{"wrong method", "PATCH", "/v1/mcp/servers", adminKey, http.StatusMethodNotAllowed},
		{"health", "GET", "/healthz", "", http.StatusOK},
		{"export", "GET", "/v1/audit/export", adminKey, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, ids := requestIDs(tc.method, tc.path, tc.key, "caller-id-1")
			require.Equal(t, tc.code, code)
			require.Equal(t, []string{"caller-id-1"}, ids)
			_, ids = requestIDs(tc.method, tc.path, tc.key, "")
			require.Len(t, ids, 1)
			require.Regexp(t, `^[0-9a-f]{16}$`, ids[0])
			_, ids = requestIDs(tc.method, tc.path, tc.key, "not sane!")
			require.Len(t, ids, 1)
			require.Regexp(t, `^[0-9a-f]{16}$`, ids[0], "an insane id is replaced, never echoed")
		})
	}
	require.Contains(t, d.Logs.String(), "request_id=caller-id-1", "the RPC behind a route logs the id the response carries")
}

// TestBadInputOverREST sends malformed and hostile bodies: each is a 400 naming the problem,
// nothing is stored, and the server keeps serving.
func TestBadInputOverREST(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	for _, tc := range []struct {
		name, body, want string
	}{
		{"bad ref", `{"ref":"Docs Search","command":"x"}`, "ref"},
		{"oversized description", `{"ref":"a","command":"x","description":"` + strings.Repeat("d", 3000) + `"}`, "description"},
		{"unknown field", `{"ref":"a","command":"x","colour":"red"}`, `unknown field "colour"`},
		{"malformed JSON", `{"ref":"a",`, "invalid JSON body"},
		{"wrong type", `{"ref":"a","command":["x"]}`, "command"},
		{"non-string env value", `{"ref":"a","command":"x","env":{"APP_TOKEN":42}}`, "env.APP_TOKEN"},
		{"env key not allowlisted", `{"ref":"a","command":"x","env":{"AWS_SECRET":"v"}}`, "env.AWS_SECRET"},
		{"docker control env key", `{"ref":"a","command":"x","env":{"DOCKER_HOST":"tcp://evil"}}`, "env.DOCKER_HOST"},
		{"grants not a list", `{"ref":"a","command":"x","grants":"process_spawn"}`, "grants"},
		{"body too large", `{"ref":"a","command":"x","description":"` + strings.Repeat("d", 5<<20) + `"}`, "too large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, raw := api.do("POST", "/v1/mcp/servers", tc.body)
			require.Equal(t, http.StatusBadRequest, code, raw)
			require.Contains(t, body["message"], tc.want)
		})
	}
	code, body, _ := api.do("GET", "/v1/mcp/servers", "")
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, body["servers"], "nothing was stored")
}

// TestSeedSequenceWithGRPCurl drives the same sequence with grpcurl through reflection.
func TestSeedSequenceWithGRPCurl(t *testing.T) {
	grpcurl := tool(t, "grpcurl")
	d := startDaemon(t, "ringfenced", registryEnv()...)
	call := func(key, method, data string) result {
		args := []string{"-plaintext"}
		if key != "" {
			args = append(args, "-H", "x-api-key: "+key)
		}
		if data != "" {
			args = append(args, "-d", data)
		}
		args = append(args, d.GRPCAddr, "ringfence.registry.v1.RegistryService/"+method)
		return runCmd(t, nil, nil, grpcurl, args...)
	}
	list := runCmd(t, nil, nil, grpcurl, "-plaintext", d.GRPCAddr, "list")
	require.Equal(t, 0, list.Code, list.Stderr)
	require.Contains(t, list.Stdout, "ringfence.registry.v1.RegistryService")
	require.Contains(t, list.Stdout, "grpc.health.v1.Health")

	create := `{"ref":"docs-search","command":"npx","args":["-y","@modelcontextprotocol/server-filesystem","/srv/docs"],"env":{"APP_TOKEN":"` + canary + `"},"grants":["process_spawn","external_api_call"]}`
	r := call(adminKey, "CreateServer", create)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, `"APP_TOKEN": "********"`)
	require.NotContains(t, r.Stdout, canary)

	r = call(adminKey, "CreateServer", create)
	require.NotEqual(t, 0, r.Code)
	require.Contains(t, r.Stderr, "AlreadyExists")

	r = call(adminKey, "UpdateServer", `{"ref":"docs-search","command":"npx","args":["/srv/handbook"],"grants":["process_spawn"]}`)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, `"APP_TOKEN": "********"`, "update without env keeps it")

	r = call(adminKey, "UpdateServer", `{"ref":"docs-search","command":"npx","env":{}}`)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stdout, "APP_TOKEN")

	r = call(adminKey, "ListServerTools", `{"ref":"docs-search"}`)
	require.NotEqual(t, 0, r.Code)
	require.Contains(t, r.Stderr, "Unavailable")
	require.Contains(t, r.Stderr, "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE")

	r = call("", "ListServers", "")
	require.Contains(t, r.Stderr, "Unauthenticated")

	health := runCmd(t, nil, nil, grpcurl, "-plaintext", d.GRPCAddr, "grpc.health.v1.Health/Check")
	require.Equal(t, 0, health.Code, health.Stderr)
	require.Contains(t, health.Stdout, "SERVING")
}

// TestSeedSequenceWithCLI drives the same sequence with the ringfence CLI.
func TestSeedSequenceWithCLI(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	cli := func(key string, args ...string) result {
		return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + key}, bin("ringfence"), args...)
	}
	r := cli(adminKey, "servers", "add", "docs-search", "--command", "npx -y @modelcontextprotocol/server-filesystem /srv/docs",
		"--env", "APP_TOKEN="+canary, "--grant", "process_spawn", "--grant", "external_api_call")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "APP_TOKEN=********")
	require.Contains(t, r.Stdout, "npx -y @modelcontextprotocol/server-filesystem /srv/docs")

	r = cli(adminKey, "servers", "add", "docs-search", "--command", "npx")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "already exists")
	require.NotContains(t, r.Stderr, "warning:", "a refused add warns of nothing")
	r = cli(adminKey, "servers", "add", "docs-nocmd")
	require.Equal(t, 2, r.Code)
	require.Contains(t, r.Stderr, "missing command to run inside the isolation image: pass --command")

	r = cli(adminKey, "servers", "update", "docs-search", "--command", "npx /srv/handbook", "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var s map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &s))
	require.Equal(t, map[string]any{"APP_TOKEN": "********"}, s["env"], "update without --env keeps it")
	require.Equal(t, []any{"process_spawn", "external_api_call"}, s["grants"], "flags not passed keep their values")

	r = cli(adminKey, "servers", "update", "docs-search", "--clear-env", "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &s))
	require.Equal(t, map[string]any{}, s["env"])

	// "--env KEY" takes the value from the CLI's environment, so it stays out of ps and
	// history; a malformed entry is refused without being echoed.
	r = runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey, "APP_TOKEN=" + canary},
		bin("ringfence"), "servers", "update", "docs-search", "--env", "APP_TOKEN", "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &s))
	require.Equal(t, map[string]any{"APP_TOKEN": "********"}, s["env"])
	r = cli(adminKey, "servers", "update", "docs-search", "--env", "APP_TOKEN")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "the environment variable APP_TOKEN is not set")
	r = cli(adminKey, "servers", "update", "docs-search", "--env", "="+canary)
	require.Equal(t, 2, r.Code, r.Stderr)
	require.NotContains(t, r.Stderr, canary)

	// The seed's remote registration: transport alias, URL, description and a header secret.
	r = runCmd(t, strings.NewReader("Bearer "+canary), []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey},
		bin("ringfence"), "secrets", "set", "tickets-token")
	require.Equal(t, 0, r.Code, r.Stderr)
	r = cli(adminKey, "servers", "add", "tickets", "--transport", "http", "--url", "https://tickets.example.com/mcp",
		"--description", "The support team's ticket system", "--header-secret", "Authorization=tickets-token",
		"--exclude-tool", "delete_ticket")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "warning: tickets does not grant process_spawn and external_api_call", "warned once registered")
	r = cli(adminKey, "servers", "show", "tickets")
	require.Equal(t, 0, r.Code, r.Stderr)
	for _, want := range []string{"streamable_http", "https://tickets.example.com/mcp", "The support team's ticket system", "Authorization <- secret tickets-token", "delete_ticket"} {
		require.Contains(t, r.Stdout, want)
	}
	require.NotContains(t, r.Stdout, canary)

	// One update switches a server's transport: what only the other kind takes (url and
	// headers, or command, args and env) is dropped, not refused as left over.
	update := func(args ...string) map[string]any {
		r := cli(adminKey, append(append([]string{"servers", "update", "tickets"}, args...), "-o", "json")...)
		require.Equal(t, 0, r.Code, r.Stderr)
		var out map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.Stdout), &out))
		return out
	}
	s = update("--transport", "stdio", "--command", "tickets-mcp --ro")
	require.Equal(t, "tickets-mcp", s["command"])
	require.Empty(t, s["url"])
	require.Empty(t, s["headers"])
	update("--env", "APP_TOKEN="+canary)
	s = update("--transport", "http", "--url", "https://tickets.example.com/mcp", "--header-secret", "Authorization=tickets-token")
	require.Equal(t, "streamable_http", s["transport"])
	require.Empty(t, s["command"])
	require.Empty(t, s["env"])
	require.Equal(t, map[string]any{"Authorization": "tickets-token"}, s["headers"])
	require.Empty(t, update("--clear-headers")["headers"])
	update("--header-secret", "Authorization=tickets-token")
	r = cli(adminKey, "servers", "add", "tickets2", "--transport", "http", "--url", "https://tickets.example.com/mcp",
		"--exclude-tool", "tickets2__delete_ticket")
	require.Equal(t, 1, r.Code, r.Stdout)
	require.Contains(t, r.Stderr, `write "delete_ticket"`)

	r = cli(adminKey, "servers", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "docs-search")

	// Removing a secret a registration still names is not refused, but says what it leaves
	// unable to start.
	r = cli(adminKey, "secrets", "remove", "tickets-token")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "removed secret tickets-token")
	require.Contains(t, r.Stderr, "warning: server tickets still names secret tickets-token (header Authorization)")

	r = cli(adminKey, "servers", "remove", "tickets")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "removed tickets\n", r.Stdout)
	r = cli(adminKey, "servers", "show", "tickets")
	require.Equal(t, 1, r.Code, r.Stdout)
	require.Contains(t, r.Stderr, "NotFound")
	r = cli(adminKey, "servers", "remove", "tickets")
	require.Equal(t, 1, r.Code, r.Stdout)
	require.Contains(t, r.Stderr, "NotFound")

	r = cli(adminKey, "servers", "tools", "docs-search")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE")
	require.Contains(t, r.Stderr, "isolation_required")

	r = cli("", "servers", "list")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "Unauthenticated")

	r = cli(adminKey, "keys", "create", "--name", "ops", "--role", "operator", "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var k map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &k))
	r = cli(k["secret"].(string), "servers", "list")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "PermissionDenied")

	r = cli(adminKey, "servers", "add", "--command", "npx")
	require.Equal(t, 2, r.Code, "a missing ref off a terminal is a usage error, not a hang")
	require.Contains(t, r.Stderr, "missing server ref")

	r = cli(adminKey, "roles", "check")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "operator")

	r = cli(adminKey, "keys", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "bootstrap-admin")
	require.NotContains(t, d.Logs.String(), canary)
}

// TestRolesCheckReportsRiskyCustomRoles starts a server with a custom role pairing mcp:admin
// and workflow:admin, and one pairing run:execute with run:approve (it would approve its own
// calls): the start logs a warning for each and `roles check` fails naming them.
func TestRolesCheckReportsRiskyCustomRoles(t *testing.T) {
	d := startDaemon(t, "ringfenced", append(registryEnv(),
		`RINGFENCE_SERVICE_ROLES_JSON={"platform":["mcp:admin","workflow:admin"],"deployer":["run:execute"],"selfie":["run:execute","run:approve"]}`)...)
	require.Contains(t, d.Logs.String(), `role \"platform\" pairs mcp:admin with workflow:admin`)
	require.Contains(t, d.Logs.String(), `role \"selfie\" pairs run:execute with run:approve`)
	r := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), "roles", "check")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stdout, "deployer")
	require.Contains(t, r.Stderr, "roles check failed: 2 problem(s)")
	require.Contains(t, r.Stderr, `"platform" pairs mcp:admin with workflow:admin`)
	require.Contains(t, r.Stderr, `"selfie" pairs run:execute with run:approve`)
	require.Contains(t, r.Stderr, "fix: split each role named above in two, in RINGFENCE_SERVICE_ROLES_JSON")
}

// TestRestartKeepsEverything restarts the server and finds registrations, secrets and keys.
func TestRestartKeepsEverything(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	code, _, raw := api.do("POST", "/v1/mcp/servers", `{"ref":"keep-me","command":"x","env":{"APP_TOKEN":"`+canary+`"},"grants":["process_spawn"]}`)
	require.Equal(t, http.StatusOK, code, raw)
	code, body, raw := api.do("POST", "/v1/keys", `{"name":"ci","role":"admin"}`)
	require.Equal(t, http.StatusOK, code, raw)
	ciKey := body["secret"].(string)

	d.restart()
	code, body, raw = api.do("GET", "/v1/mcp/servers/keep-me", "")
	require.Equal(t, http.StatusOK, code, raw)
	require.Equal(t, []any{"process_spawn"}, body["grants"])
	code, _, raw = rest{t: t, base: api.base, key: ciKey}.do("GET", "/v1/mcp/servers", "")
	require.Equal(t, http.StatusOK, code, "a created key survives a restart: %s", raw)
	code, _, _ = api.do("GET", "/v1/keys", "")
	require.Equal(t, http.StatusOK, code, "the bootstrap key is still the same single key")

	raw2, err := os.ReadFile(filepath.Join(d.DataDir, "registry.db"))
	require.NoError(t, err)
	require.False(t, bytes.Contains(raw2, []byte(canary)), "the canary is sealed at rest")
	require.NotContains(t, d.Logs.String(), canary)
}

// TestSIGKILLLosesNoAcknowledgedWrite creates servers from several clients while the server is
// killed with SIGKILL, then restarts it and finds every create that was acknowledged.
func TestSIGKILLLosesNoAcknowledgedWrite(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}

	var mu sync.Mutex
	var acked []string
	var n atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ref := fmt.Sprintf("w%d-%d", w, n.Add(1))
				req, _ := http.NewRequest("POST", api.base+"/v1/mcp/servers", strings.NewReader(`{"ref":"`+ref+`","command":"x"}`))
				req.Header.Set("X-API-Key", adminKey)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // the server is gone
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					mu.Lock()
					acked = append(acked, ref)
					acked := len(acked)
					mu.Unlock()
					if acked == 200 {
						d.kill()
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	require.GreaterOrEqual(t, len(acked), 200)

	d.start()
	for _, ref := range acked {
		code, _, raw := api.do("GET", "/v1/mcp/servers/"+ref, "")
		require.Equal(t, http.StatusOK, code, "acknowledged create of %s lost after SIGKILL: %s", ref, raw)
	}
}
