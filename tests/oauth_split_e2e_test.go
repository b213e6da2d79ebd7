package tests

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
)

// TestOAuthSignInAcrossASplitDeployment: sign-in with the four services apart, over mutual
// TLS. The pool serves the callback on its own (TLS) listener and exchanges the code with the
// client secret the registry resolves for it on the internal plane; the publisher imports as
// the connected user through the pool's internal Discover; a run of the user on the pool host
// calls the server with her token. The tokens never leave the pool host's processes.
func TestOAuthSignInAcrossASplitDeployment(t *testing.T) {
	certs, addr, internal := splitPlan(t)
	poolHTTP := testutil.FreeAddr(t)
	callback := "https://" + poolHTTP + "/v1/oauth/callback"
	as := oauthtest.StartAuthServer(t, "ringfence", "client-secret-"+canary, callback)
	ms := oauthtest.StartMCPServer(t, as, map[string][]oauthtest.Tool{oauthtest.Alice: {{Name: "alpha", Description: "Alpha."}}})

	pool := startSplit(t, certs, addr, internal, map[string][]string{
		"registry": {"RINGFENCE_BOOTSTRAP_ADMIN_KEY=" + adminKey, "RINGFENCE_OAUTH__CALLBACK_URL=" + callback},
		"pool":     {"RINGFENCE_HTTP_ADDR=" + poolHTTP},
	})["pool"]

	cli := func(svc string, stdin io.Reader, args ...string) result {
		t.Helper()
		return splitCLI(t, certs, addr, svc, stdin, args...)
	}
	must := func(svc string, args ...string) string {
		t.Helper()
		r := cli(svc, nil, args...)
		require.Equal(t, 0, r.Code, "%v\nstdout: %s\nstderr: %s", args, r.Stdout, r.Stderr)
		return r.Stdout
	}

	r := cli("registry", strings.NewReader(as.ClientSecret), "secrets", "set", "tickets-client")
	require.Equal(t, 0, r.Code, r.Stderr)
	out := must("registry", "servers", "add", "tickets", "--transport", "http", "--url", ms.URL, "--grant", "process_spawn", "--grant", "external_api_call",
		"--oauth-authorization-server", as.Issuer, "--oauth-client-id", "ringfence", "--oauth-client-secret-ref", "tickets-client", "--oauth-scope", "openid")
	require.Contains(t, out, "callback "+callback)

	r = cli("pool", nil, "servers", "connect", "tickets", "--user", oauthtest.Alice)
	require.Equal(t, 1, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	loc := as.SignIn(t, strings.TrimSpace(strings.Split(r.Stdout, "\n")[1]), oauthtest.Alice)
	require.True(t, strings.HasPrefix(loc, callback+"?"), loc)
	resp, err := pool.HTTP.Get(loc)
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(page))
	require.Contains(t, string(page), "The server is connected (2 tools)")

	must("publisher", "graphs", "create", "--graph", "desk", "--agent", "a")
	out = must("publisher", "mcp-import", "--server", "tickets", "--graph", "desk", "--agent", "a", "--user", oauthtest.Alice)
	require.Contains(t, out, "alpha")
	must("publisher", "graphs", "publish", "--graph", "desk")
	must("pool", "runs", "start", "--graph", "desk", "--run", "r1", "--user", oauthtest.Alice)
	out = must("pool", "runs", "call", "--run", "r1", "--agent", "a", "--tool", "tickets__whoami", "--args", `{}`)
	require.Contains(t, out, "whoami for "+oauthtest.Alice)
	for _, tok := range ms.Tokens(oauthtest.Alice) {
		require.NotContains(t, out, tok)
	}
}
