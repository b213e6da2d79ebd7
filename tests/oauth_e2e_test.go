package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
	"github.com/ringfence/ringfence/internal/testutil/pinned"
)

// connectPollOfCLI is how often `ringfence servers connect --wait` asks whether the user has
// signed in (internal/cli's connectPoll).
const connectPollOfCLI = 2 * time.Second

// bearer adds an agent token to every request of the front door's client.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestOAuthSignInEndToEnd drives sign-in through the real binaries: a real authorization
// server (zitadel's provider) and a remote MCP server that takes only its tokens, on loopback.
// A run started over REST for Alice offers, through the MCP front door (whose token inherits
// the run's user), only the server's connect tool, which answers the authorization URL; Alice
// signs in in a "browser" that lands on /v1/oauth/callback of the daemon's HTTP listener (no
// API key); the front door then lists and calls Alice's tools. Bob connects with the CLI
// (servers connect) and sees his own tools; a key of another tenant finds Alice not connected.
// A canary in the client secret, and every token the authorization server issued, appear in no
// response, log line, file under the data directory or audit record.
func TestOAuthSignInEndToEnd(t *testing.T) {
	httpAddr := testutil.FreeAddr(t)
	as := oauthtest.StartAuthServer(t, "ringfence", "client-secret-"+canary, "http://"+httpAddr+"/v1/oauth/callback")
	ms := oauthtest.StartMCPServer(t, as, map[string][]oauthtest.Tool{
		oauthtest.Alice: {{Name: "alpha", Description: "Alpha."}},
		oauthtest.Bob:   {{Name: "beta", Description: "Beta."}},
	})
	d := startDaemon(t, "ringfenced", append(registryEnv(), "RINGFENCE_HTTP_ADDR="+httpAddr)...)
	var seen []string // every answer any client got
	cli := func(stdin io.Reader, args ...string) result {
		t.Helper()
		r := runCmd(t, stdin, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), args...)
		seen = append(seen, r.Stdout, r.Stderr)
		return r
	}
	must := func(args ...string) string {
		t.Helper()
		r := cli(nil, args...)
		require.Equal(t, 0, r.Code, "%v\nstdout: %s\nstderr: %s", args, r.Stdout, r.Stderr)
		return r.Stdout
	}
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	call := func(method, path, body string) map[string]any {
		t.Helper()
		code, m, raw := api.do(method, path, body)
		seen = append(seen, raw)
		require.Equal(t, http.StatusOK, code, raw)
		return m
	}

	r := cli(strings.NewReader(as.ClientSecret), "secrets", "set", "tickets-client")
	require.Equal(t, 0, r.Code, r.Stderr)
	out := must("servers", "add", "tickets", "--transport", "http", "--url", ms.URL, "--grant", "process_spawn", "--grant", "external_api_call",
		"--oauth-client-id", "ringfence", "--oauth-client-secret-ref", "tickets-client", "--oauth-authorization-server", as.Issuer, "--oauth-scope", "openid", "--oauth-scope", "offline_access")
	require.Contains(t, out, "callback http://"+d.HTTPAddr+"/v1/oauth/callback")
	out = must("servers", "update", "tickets", "--description", "The ticket system.")
	require.Contains(t, out, "oauth client ringfence", "an update keeps the sign-in")

	// The graph binds the server's tools as an import would pin them.
	call(http.MethodPost, "/v1/graphs", `{"graph_id":"desk","agents":["researcher"]}`)
	draft := call(http.MethodGet, "/v1/graphs/desk/draft", "")
	raw, err := json.Marshal(draft["draft"])
	require.NoError(t, err)
	g := &publisherv1.Graph{}
	require.NoError(t, protojson.Unmarshal(raw, g))
	pinned.Add(t, g, "researcher",
		pinned.Tool{Server: "tickets", Tool: "whoami", Description: "Say who the caller is."},
		pinned.Tool{Server: "tickets", Tool: "alpha", Description: "Alpha."},
		pinned.Tool{Server: "tickets", Tool: "beta", Description: "Beta."})
	body, err := protojson.Marshal(&publisherv1.ReplaceDraftRequest{Draft: g})
	require.NoError(t, err)
	call(http.MethodPut, "/v1/graphs/desk/draft", string(body))
	call(http.MethodPost, "/v1/graphs/desk:publish", `{}`)

	// Alice's run, through the front door.
	run := call(http.MethodPost, "/v1/runs", `{"graph_id":"desk","run_id":"r1","user":"`+oauthtest.Alice+`"}`)
	require.Equal(t, oauthtest.Alice, run["run"].(map[string]any)["user"])
	tok := call(http.MethodPost, "/v1/runs/r1/tokens", `{"agent":"researcher"}`)
	changed := make(chan struct{}, 16)
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	})
	session, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: tok["url"].(string),
		HTTPClient: &http.Client{Transport: bearer{token: tok["secret"].(string)}}}, nil)
	require.NoError(t, err)
	defer session.Close()
	names := func() []string {
		t.Helper()
		l, err := session.ListTools(t.Context(), nil)
		require.NoError(t, err)
		var out []string
		for _, tool := range l.Tools {
			out = append(out, tool.Name)
		}
		return out
	}
	text := func(res *mcp.CallToolResult) string {
		b, _ := json.Marshal(res)
		seen = append(seen, string(b))
		return res.Content[0].(*mcp.TextContent).Text
	}
	require.Equal(t, []string{"mcp_oauth_connect_tickets"}, names())
	res, err := session.CallTool(t.Context(), &mcp.CallToolParams{Name: "mcp_oauth_connect_tickets", Arguments: map[string]any{}})
	require.NoError(t, err)
	msg := text(res)
	require.Contains(t, msg, as.Issuer+"/auth?")
	authURL := msg[strings.Index(msg, as.Issuer+"/auth?"):]
	authURL = authURL[:strings.IndexByte(authURL, ' ')]

	// The browser comes back to the daemon's HTTP listener, with no API key.
	loc := as.SignIn(t, authURL, oauthtest.Alice)
	back, err := url.Parse(loc)
	require.NoError(t, err)
	code := back.Query().Get("code") // a one-time secret, in no answer but the browser's redirect
	// The state is in the authorization URL the user is shown, and nowhere else.
	state := back.Query().Get("state")
	require.NotEmpty(t, state)
	require.True(t, strings.HasPrefix(loc, "http://"+d.HTTPAddr+"/v1/oauth/callback?"), loc)
	resp, err := http.Get(loc)
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	seen = append(seen, string(page))
	require.Equal(t, http.StatusOK, resp.StatusCode, string(page))
	require.Contains(t, string(page), "Signed in to tickets")
	resp, err = http.Get(loc)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "a callback is good once")

	select { // the front door tells the client its tools changed
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("no tools/list_changed after the sign-in")
	}
	require.Equal(t, []string{"tickets__alpha", "tickets__whoami"}, names())
	res, err = session.CallTool(t.Context(), &mcp.CallToolParams{Name: "tickets__whoami", Arguments: map[string]any{}})
	require.NoError(t, err)
	require.Equal(t, "whoami for "+oauthtest.Alice, text(res))

	// Bob connects with the CLI, which waits for his sign-in (--wait) and polls meanwhile: its
	// polls, like a REST client's with no_new_sign_in, leave the sign-in whose URL he was shown
	// good (a new sign-in would replace it, and his browser's callback would be refused).
	r = cli(nil, "servers", "connect", "tickets", "--user", oauthtest.Bob)
	require.Equal(t, 1, r.Code, r.Stdout)
	require.Contains(t, r.Stdout, as.Issuer+"/auth?")
	wait := exec.CommandContext(t.Context(), bin("ringfence"), "servers", "connect", "tickets", "--user", oauthtest.Bob, "--wait", "2m")
	wait.Env = append(baseEnv(), "RINGFENCE_ADDR="+d.GRPCAddr, "RINGFENCE_API_KEY="+adminKey)
	var waitOut, waitErr bytes.Buffer
	wait.Stdout = &waitOut
	stderr, err := wait.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, wait.Start())
	lines := bufio.NewScanner(io.TeeReader(stderr, &waitErr))
	bobURL := ""
	for bobURL == "" && lines.Scan() {
		if l := strings.TrimSpace(lines.Text()); strings.HasPrefix(l, as.Issuer+"/auth?") {
			bobURL = l
		}
	}
	require.NotEmpty(t, bobURL, "servers connect --wait showed no authorization URL: %s", waitErr.String())
	go func() { _, _ = io.Copy(io.Discard, io.TeeReader(stderr, &waitErr)) }()
	status, m, rawBody := api.do(http.MethodPost, "/v1/mcp/servers/tickets:connect", `{"user":"`+oauthtest.Bob+`","no_new_sign_in":true}`)
	seen = append(seen, rawBody)
	require.Equal(t, http.StatusOK, status, rawBody)
	require.Equal(t, "sign_in_required", m["state"], rawBody)
	require.Empty(t, m["authorization_url"], "no_new_sign_in begins no sign-in")
	// Past one poll of the CLI's (a slower machine only lets it poll less before the sign-in).
	time.Sleep(connectPollOfCLI + 500*time.Millisecond)
	resp, err = http.Get(as.SignIn(t, bobURL, oauthtest.Bob))
	require.NoError(t, err)
	page, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the callback of the URL servers connect --wait showed: %s", page)
	require.NoError(t, wait.Wait(), "stdout: %s\nstderr: %s", waitOut.String(), waitErr.String())
	seen = append(seen, waitOut.String(), waitErr.String())
	require.Contains(t, waitOut.String(), "connected tickets for "+oauthtest.Bob+": beta, whoami")
	require.Contains(t, must("servers", "connect", "tickets", "--user", oauthtest.Bob), "connected tickets for "+oauthtest.Bob+": beta, whoami")
	call(http.MethodPost, "/v1/runs", `{"graph_id":"desk","run_id":"r2","user":"`+oauthtest.Bob+`"}`)
	listing := call(http.MethodGet, "/v1/runs/r2/agents/researcher/tools", "")
	var bobTools []string
	for _, tool := range listing["tools"].([]any) {
		bobTools = append(bobTools, tool.(map[string]any)["name"].(string))
	}
	require.Equal(t, []string{"tickets__beta", "tickets__whoami"}, bobTools)

	// An author imports the server's tools as Bob sees them (the admin key holds run:execute).
	must("graphs", "create", "--graph", "bobs", "--agent", "researcher")
	out = must("mcp-import", "--server", "tickets", "--graph", "bobs", "--agent", "researcher", "--user", oauthtest.Bob)
	require.Contains(t, out, "beta")
	require.NotContains(t, out, "alpha")

	// A key of another tenant: Alice is not connected there.
	r = cli(nil, "keys", "create", "--name", "acme", "--role", "runner", "--tenant", "acme", "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var key map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &key))
	acme := rest{t: t, base: api.base, key: key["secret"].(string)}
	status, m, rawBody = acme.do(http.MethodPost, "/v1/mcp/servers/tickets:connect", `{"user":"`+oauthtest.Alice+`"}`)
	seen = append(seen, rawBody)
	require.Equal(t, http.StatusOK, status, rawBody)
	require.Equal(t, "sign_in_required", m["state"], "Alice's token is the default tenant's")

	// The canary scan: the client secret and every token issued.
	markers := []string{canary, code}
	for _, u := range []string{oauthtest.Alice, oauthtest.Bob} {
		markers = append(markers, ms.Tokens(u)...)
	}
	require.Greater(t, len(markers), 2)
	audit := call(http.MethodGet, "/v1/audit/records?page_size=1000", "")
	auditRaw, err := json.Marshal(audit)
	require.NoError(t, err)
	require.Contains(t, string(auditRaw), "tool_call", "the calls are on record")
	files := map[string]string{}
	require.NoError(t, filepath.WalkDir(d.DataDir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		files[path] = string(b)
		return err
	}))
	d.stop()
	require.NotContains(t, d.Logs.String(), state, "the daemon's log")
	require.NotContains(t, string(auditRaw), state, "the audit log")
	for path, content := range files {
		require.False(t, strings.Contains(content, state), "%s holds a sign-in's state", path)
	}
	for _, marker := range markers {
		for i, s := range seen {
			require.NotContains(t, s, marker, "answer %d", i)
		}
		require.NotContains(t, d.Logs.String(), marker, "the daemon's log")
		require.NotContains(t, string(auditRaw), marker, "the audit log")
		for path, content := range files {
			require.False(t, strings.Contains(content, marker), "%s holds a secret in clear", path)
		}
	}
}
