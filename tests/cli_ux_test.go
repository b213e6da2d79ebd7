package tests

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
)

// TestCLIGuidesANewUser replays a new user's first mistakes against real servers: each error
// names what is wrong and the fix, rather than a symptom.
func TestCLIGuidesANewUser(t *testing.T) {
	certs := t.TempDir()
	r := runCmd(t, nil, nil, bin("ringfence"), "certs", "init", "--dir", certs)
	require.Equal(t, 0, r.Code, r.Stderr)
	caFile := filepath.Join(certs, "ca.pem")
	secure := startDaemon(t, "ringfenced", append(registryEnv(),
		"RINGFENCE_TLS__CERT_FILE="+filepath.Join(certs, "registry.pem"),
		"RINGFENCE_TLS__KEY_FILE="+filepath.Join(certs, "registry-key.pem"),
		"RINGFENCE_TLS__CLIENT_CA_FILE="+caFile)...)
	plain := startDaemon(t, "ringfenced", registryEnv()...)
	cli := func(d *daemon, env []string, args ...string) result {
		return runCmd(t, nil, append([]string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, env...), bin("ringfence"), args...)
	}
	fails := func(r result, code int, want ...string) {
		t.Helper()
		require.Equal(t, code, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
		for _, w := range want {
			require.Contains(t, r.Stderr, w)
		}
	}

	// Plaintext against TLS, and TLS against plaintext.
	r = cli(secure, nil, "servers", "list")
	fails(r, 1, "hint: the server speaks TLS: pass --ca-file (RINGFENCE_CA_FILE)")
	require.NotContains(t, r.Stderr, "is the server running")
	r = cli(secure, []string{"RINGFENCE_CA_FILE=" + caFile}, "servers", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	fails(cli(plain, []string{"RINGFENCE_CA_FILE=" + caFile}, "servers", "list"), 1,
		"hint: the server speaks plaintext: drop --ca-file (RINGFENCE_CA_FILE)")

	// A URL without a transport.
	fails(cli(plain, nil, "servers", "add", "tickets", "--url", "https://mcp.example.com/mcp"), 2,
		"--url needs --transport streamable_http (or sse)")

	// A server the registry cannot reach is the server's error (exit 1), however its message
	// reads: "nothing accepts connections" is not cobra's "accepts 1 arg(s)".
	r = cli(plain, nil, "servers", "explore", "--transport", "http", "--url", "http://"+testutil.FreeAddr(t)+"/mcp")
	fails(r, 1, "failure class: connection_refused")
	require.Contains(t, r.Stderr, "nothing accepts connections at http://")

	// A misspelt floor capability is granted as written, with a warning.
	r = cli(plain, nil, "servers", "add", "fx", "--command", "mcpfixture", "--grant", "proces_spawn", "--grant", "external_api_call")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "warning: --grant proces_spawn is not a floor capability; did you mean process_spawn?")
	require.Regexp(t, `grants:\s+proces_spawn, external_api_call`, r.Stdout)

	// A ref that is not registered.
	fails(cli(plain, nil, "servers", "show", "docss"), 1,
		`registry: no server is registered with ref "docss": ListServers (ringfence servers list) shows the registered refs (NotFound)`)

	// A header naming a secret that does not exist: the name sent is not echoed (it may be
	// the credential itself, pasted in its place).
	r = cli(plain, nil, "servers", "explore", "--transport", "http", "--url", "https://mcp.example.com/mcp", "--header-secret", "Authorization=nosuch")
	fails(r, 1, `registry: header "Authorization" names a secret that does not exist (the value sent is not shown: it may be a credential): create the secret first with ringfence secrets set NAME (PutSecret), then send its name; ringfence secrets list shows the secrets that exist (FailedPrecondition)`)
	require.NotContains(t, r.Stdout+r.Stderr, "nosuch")

	// A key or a secret that does not exist: where to find the ones that do.
	fails(cli(plain, nil, "keys", "revoke", "key_0000000000000000"), 1, "(NotFound)\n  hint: `ringfence keys list` shows the keys and their ids")
	fails(cli(plain, nil, "secrets", "remove", "nosuch"), 1, "(NotFound)\n  hint: `ringfence secrets list` shows the secrets' names")

	// An outcome that is not one.
	fails(cli(plain, nil, "audit", "list", "--outcome", "refused"), 1,
		`audit: invalid filter: outcome "refused" is not one of refused_before_dispatch, dispatched (InvalidArgument)`)

	// Mistyped commands, flags and arguments: exit 2 with the closest spelling, no help dump.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"servres", "list"}, `unknown command "servres" for "ringfence": did you mean "ringfence servers"?`},
		{[]string{"servers", "lsit"}, `unknown command "lsit" for "ringfence servers": did you mean "ringfence servers list"?`},
		{[]string{"audit", "list", "--limt", "3"}, `unknown flag --limt for "ringfence audit list": did you mean --limit?`},
		{[]string{"roles", "check", "all"}, `"ringfence roles check" takes no arguments, got "all"`},
		{[]string{"keys", "create", "--name", "ci"}, `"ringfence keys create" needs --role (usage: ringfence keys create; ringfence keys create --help)`},
		{[]string{"--addr", "localhost", "servers", "list"}, `--addr "localhost" has no port: give host:port`},
		{[]string{"--addr", "http://" + plain.GRPCAddr, "servers", "list"}, `is a URL, but the CLI takes the server's gRPC host:port: drop "http://" (--addr ` + plain.GRPCAddr + `)`},
	} {
		r := cli(plain, nil, tc.args...)
		fails(r, 2, tc.want)
		require.NotContains(t, r.Stdout+r.Stderr, "Usage:")
	}

	// Nothing listening: the hint names the address and where it came from.
	down := testutil.FreeAddr(t)
	fails(runCmd(t, nil, []string{"RINGFENCE_ADDR=" + down, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), "servers", "list"), 1,
		"hint: is the server running? nothing answers at "+down+" (RINGFENCE_ADDR)")

	// No key at all: a warning before the request, and the hint names the variable the CLI
	// reads when the user exported the README's MCP_ADMIN_KEY instead. A wrong key: its own hint.
	r = runCmd(t, nil, []string{"RINGFENCE_ADDR=" + plain.GRPCAddr, "MCP_ADMIN_KEY=" + adminKey}, bin("ringfence"), "servers", "list")
	fails(r, 1, "warning: no API key: pass --api-key or set RINGFENCE_API_KEY (MCP_ADMIN_KEY is set, but the CLI reads RINGFENCE_API_KEY: export RINGFENCE_API_KEY=$MCP_ADMIN_KEY)",
		"(Unauthenticated)\n  hint: pass --api-key or set RINGFENCE_API_KEY")
	require.Less(t, strings.Index(r.Stderr, "warning: no API key"), strings.Index(r.Stderr, "Unauthenticated"), "the warning comes first")
	fails(cli(plain, []string{"RINGFENCE_API_KEY=not-a-key"}, "servers", "list"), 1,
		"hint: the key is unknown or revoked: check --api-key or RINGFENCE_API_KEY")

	// A key whose role lacks the permission learns how to get one.
	r = cli(plain, nil, "keys", "create", "--name", "ops", "--role", "operator", "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	opsKey := regexp.MustCompile(`"secret":\s*"([^"]+)"`).FindStringSubmatch(r.Stdout)
	require.NotNil(t, opsKey, r.Stdout)
	fails(cli(plain, []string{"RINGFENCE_API_KEY=" + opsKey[1]}, "servers", "list"), 1,
		`needs permission mcp:admin, which role "operator" does not hold (PermissionDenied)`, "hint: use a key whose role holds that permission")

	// A second add of the same ref points at update.
	fails(cli(plain, nil, "servers", "add", "fx", "--command", "mcpfixture"), 1,
		"(AlreadyExists)", "hint: \"fx\" is already registered: `ringfence servers update fx` changes it")

	// --args that is not JSON: exit 2 naming the byte, with an example, and `call` says so
	// before it starts a run (the graph does not even exist: that error would come second).
	for _, args := range [][]string{
		{"call", "--graph", "nosuch", "--agent", "a", "--tool", "t", "--args", "{path:/handbook/leave.md}"},
		{"runs", "call", "--run", "nosuch", "--agent", "a", "--tool", "t", "--args", "{path:/handbook/leave.md}"},
	} {
		fails(cli(plain, nil, args...), 2, "--args is not valid JSON: invalid character 'p' looking for beginning of object key string at byte 2",
			"did the shell remove them?", `e.g. --args '{"path":"/handbook/leave.md"}'`)
	}

	// Binding a capability to an agent the graph does not have lists the ones it has.
	r = cli(plain, nil, "graphs", "create", "--graph", "triage", "--agent", "researcher")
	require.Equal(t, 0, r.Code, r.Stderr)
	fails(cli(plain, nil, "graphs", "bind", "--graph", "triage", "--agent", "reseacher", "--capability", "docs.read:/handbook/**"), 2,
		`graph triage has no agent node "reseacher" in its draft; its agents: researcher`)

	// A run of a graph that was created but never published says to publish it.
	fails(cli(plain, nil, "runs", "start", "--graph", "triage"), 1,
		`pool: the graph version is not published (or not in your tenant): graph "triage" has no published version yet: publish its draft first (ringfence graphs publish --graph triage) (NotFound)`)

	// A pool refusal names the pool once.
	r = cli(plain, nil, "runs", "call", "--run", "nosuch", "--agent", "a", "--tool", "t")
	fails(r, 3, `refused before dispatch (unknown_run): no run "nosuch" in tenant "default"`)
	require.NotContains(t, r.Stderr, "pool: pool:")
	api := rest{t: t, base: plain.HTTPBase, key: adminKey}
	code, obj, raw := api.do("POST", "/v1/runs/nosuch:call", `{"agent":"a","tool":"t"}`)
	require.Equal(t, http.StatusNotFound, code, raw)
	require.Equal(t, "pool: refused before dispatch (unknown_run): no run \"nosuch\" in tenant \"default\" (a key bound to no tenant names the run's tenant, or acts for \"default\"); nothing reached the server", obj["message"])

	// audit list says there is more, and how to read on.
	r = cli(plain, nil, "audit", "list", "--limit", "1")
	require.Equal(t, 0, r.Code, r.Stderr)
	m := regexp.MustCompile(`more records after these 1: the next page is --page-token (\S+) \(with the same filters\), or raise --limit`).FindStringSubmatch(r.Stderr)
	require.NotNil(t, m, r.Stderr)
	require.Regexp(t, `(?m)^1\s`, r.Stdout)
	r = cli(plain, nil, "audit", "list", "--limit", "1", "--page-token", m[1])
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^2\s`, r.Stdout, "the token reads on from the second record")

	// audit tail says what it waits for, and prints its columns.
	tail := startCmd(t, []string{"RINGFENCE_ADDR=" + plain.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), "audit", "tail", "--from", "1")
	require.Eventually(t, func() bool { return strings.Contains(tail.stdout.String(), "\n1 ") }, 10*time.Second, 20*time.Millisecond)
	require.True(t, strings.HasPrefix(tail.stdout.String(), "SEQ TIME KIND TENANT WHAT OUTCOME\n"), tail.stdout.String())
	require.Contains(t, tail.stderr.String(), "following the audit log from record 1; Ctrl-C stops")

	// audit export keeps an existing file unless --force.
	out := filepath.Join(t.TempDir(), "trail.jsonl")
	require.NoError(t, os.WriteFile(out, []byte("keep me\n"), 0o600))
	fails(cli(plain, nil, "audit", "export", "--out", out), 2, out+" already exists: pass --force to replace it")
	kept, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, "keep me\n", string(kept))
	r = cli(plain, nil, "audit", "export", "--out", out, "--force")
	require.Equal(t, 0, r.Code, r.Stderr)
	replaced, err := os.ReadFile(out)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(replaced), `{"id":`), string(replaced))
	entries, err := os.ReadDir(filepath.Dir(out))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no partial file is left beside the export")

	// documents get --out keeps an existing file unless --force, as audit export does.
	doc := filepath.Join(t.TempDir(), "note.txt")
	require.NoError(t, os.WriteFile(doc, []byte("the minutes"), 0o600))
	r = cli(plain, nil, "documents", "put", doc)
	require.Equal(t, 0, r.Code, r.Stderr)
	docID := strings.TrimSpace(r.Stdout)
	got := filepath.Join(t.TempDir(), "got.txt")
	require.NoError(t, os.WriteFile(got, []byte("keep me\n"), 0o644))
	fails(cli(plain, nil, "documents", "get", docID, "--out", got), 2, got+" already exists: pass --force to replace it")
	kept, err = os.ReadFile(got)
	require.NoError(t, err)
	require.Equal(t, "keep me\n", string(kept))
	r = cli(plain, nil, "documents", "get", docID, "--out", got, "--force")
	require.Equal(t, 0, r.Code, r.Stderr)
	replaced, err = os.ReadFile(got)
	require.NoError(t, err)
	require.Equal(t, "the minutes", string(replaced))
	info, err := os.Stat(got)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the content is written 0600, also over a file that was not")
	fresh := filepath.Join(t.TempDir(), "fresh.txt")
	r = cli(plain, nil, "documents", "get", docID, "--out", fresh)
	require.Equal(t, 0, r.Code, r.Stderr)
	entries, err = os.ReadDir(filepath.Dir(fresh))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no partial file is left beside the document")

	// roles check says what it checked.
	r = cli(plain, nil, "roles", "check")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "ok: no custom role pairs mcp:admin with workflow:write or workflow:admin")

	// REST: a misspelt filter is a 400 naming it, not an unfiltered answer.
	code, obj, raw = api.do("GET", "/v1/audit/records?kind=admin", "")
	require.Equal(t, http.StatusBadRequest, code, raw)
	require.Equal(t, "INVALID_ARGUMENT", obj["status"])
	require.Contains(t, obj["message"], `unknown query parameter "kind": this route takes only filter.tenant, filter.run_id`)
	code, _, raw = api.do("GET", "/v1/audit/records?filter.kind=admin&page_size=1", "")
	require.Equal(t, http.StatusOK, code, raw)
	code, obj, raw = api.do("POST", "/v1/mcp/servers?dry_run=true", `{"ref":"dry","command":"docs-mcp"}`)
	require.Equal(t, http.StatusBadRequest, code, raw)
	require.Contains(t, obj["message"], `unknown query parameter "dry_run": POST routes take no query parameters`)
	code, _, raw = api.do("GET", "/v1/mcp/servers/dry", "")
	require.Equal(t, http.StatusNotFound, code, "nothing was registered: %s", raw)
	code, obj, raw = api.do("GET", "/v1/mcp/server", "")
	require.Equal(t, http.StatusNotFound, code, raw)
	require.Contains(t, obj["message"], `no route takes GET "/v1/mcp/server": docs/api.md lists the routes`)
}

// running is a command left running; the test's cleanup kills it.
type running struct {
	stdout, stderr *testutil.SyncBuffer
}

// startCmd starts a program with extra env and returns its live output.
func startCmd(t *testing.T, env []string, name string, args ...string) *running {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(baseEnv(), env...)
	r := &running{stdout: &testutil.SyncBuffer{}, stderr: &testutil.SyncBuffer{}}
	cmd.Stdout, cmd.Stderr = r.stdout, r.stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return r
}

// TestAServerWithoutKeysSaysSo: a first start without RINGFENCE_BOOTSTRAP_ADMIN_KEY has no key
// that could call it; the log says so and how to fix it, and a start with one is quiet.
func TestAServerWithoutKeysSaysSo(t *testing.T) {
	bare := startDaemon(t, "ringfenced")
	require.Contains(t, bare.Logs.String(), "no API key exists and RINGFENCE_BOOTSTRAP_ADMIN_KEY is unset: every request will be refused")
	keyed := startDaemon(t, "ringfenced", registryEnv()...)
	require.NotContains(t, keyed.Logs.String(), "no API key exists")
}

// TestCLINamesTheBinaryThatServesACommand: in a split deployment a command sent to a binary
// that does not serve it (here graphs and runs to the audit service, which refuses an unknown
// method before reading it) says which binary serves which commands.
func TestCLINamesTheBinaryThatServesACommand(t *testing.T) {
	certs := t.TempDir()
	r := runCmd(t, nil, nil, bin("ringfence"), "certs", "init", "--dir", certs)
	require.Equal(t, 0, r.Code, r.Stderr)
	addr := map[string]string{"audit": testutil.FreeAddr(t)}
	internal := map[string]string{"audit": testutil.FreeAddr(t)}
	startDaemonAt(t, "ringfence-audit", addr["audit"], append(splitEnv(certs, "audit", addr, internal),
		"RINGFENCE_PEERS__REGISTRY_ADDR="+testutil.FreeAddr(t))...)
	for _, args := range [][]string{{"graphs", "list"}, {"runs", "show", "--run", "r"}, {"documents", "delete", "doc-1"}} {
		r := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + addr["audit"], "RINGFENCE_API_KEY=" + adminKey,
			"RINGFENCE_CA_FILE=" + filepath.Join(certs, "ca.pem")}, bin("ringfence"), args...)
		require.Equal(t, 1, r.Code, r.Stderr)
		require.Contains(t, r.Stderr, "(Unimplemented)\n  hint: the server at --addr does not serve ringfence.")
		require.Contains(t, r.Stderr, "graphs and mcp-import: ringfence-publisher; runs, call and documents: ringfence-pool")
	}
}
