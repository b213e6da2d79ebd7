package tests

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
)

// TestOAuthSignInAcrossPoolHosts: two ringfence-pool hosts on one etcd cluster, with one
// secrets key, share users' sign-ins. A sign-in asked of p1 comes back to p2's callback (the
// redirect URI every host is configured with, as a load balancer in front of them would be);
// p1 then lists the server's tools with the user's token for an import, and runs of the user
// placed on each host call the server with it.
func TestOAuthSignInAcrossPoolHosts(t *testing.T) {
	key := filepath.Join(t.TempDir(), "secrets.key")
	_, err := secretbox.LoadOrCreate(key)
	require.NoError(t, err)
	p2HTTP := testutil.FreeAddr(t)
	callback := "https://" + p2HTTP + "/v1/oauth/callback"
	as := oauthtest.StartAuthServer(t, "ringfence", "client-secret-"+canary, callback)
	ms := oauthtest.StartMCPServer(t, as, map[string][]oauthtest.Tool{oauthtest.Alice: {{Name: "alpha", Description: "Alpha."}}})
	d := startPoolHostsWith(t, func(host string) []string {
		env := []string{"RINGFENCE_SECRETS_KEY_FILE=" + key, "RINGFENCE_OAUTH__CALLBACK_URL=" + callback}
		if host == "p2" {
			env = append(env, "RINGFENCE_HTTP_ADDR="+p2HTTP)
		}
		return env
	})

	r := runCmd(t, strings.NewReader(as.ClientSecret), []string{"RINGFENCE_ADDR=" + d.addr["registry"], "RINGFENCE_API_KEY=" + adminKey,
		"RINGFENCE_CA_FILE=" + filepath.Join(d.certs, "ca.pem"), "RINGFENCE_SERVER_IDENTITY=registry"}, bin("ringfence"), "secrets", "set", "tickets-client")
	require.Equal(t, 0, r.Code, r.Stderr)
	d.must(d.cli("registry", "servers", "add", "tickets", "--transport", "http", "--url", ms.URL, "--grant", "process_spawn", "--grant", "external_api_call",
		"--oauth-authorization-server", as.Issuer, "--oauth-client-id", "ringfence", "--oauth-client-secret-ref", "tickets-client", "--oauth-scope", "openid"))

	r = d.cli("p1", "servers", "connect", "tickets", "--user", oauthtest.Alice)
	require.Equal(t, 1, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	loc := as.SignIn(t, strings.TrimSpace(strings.Split(r.Stdout, "\n")[1]), oauthtest.Alice)
	require.True(t, strings.HasPrefix(loc, callback+"?"), loc)
	resp, err := d.pools["p2"].HTTP.Get(loc)
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(page))
	require.Contains(t, string(page), "The server is connected (2 tools)")

	// The publisher's discovery reaches p1 (peers.pool_addr), which lists with Alice's token.
	d.must(d.cli("publisher", "graphs", "create", "--graph", "desk", "--agent", "a"))
	require.Contains(t, d.must(d.cli("publisher", "mcp-import", "--server", "tickets", "--graph", "desk", "--agent", "a", "--user", oauthtest.Alice)), "alpha")
	d.must(d.cli("publisher", "graphs", "publish", "--graph", "desk"))

	// One run on each host (the second placed on the less loaded one), each called through
	// the other host.
	first := d.run("p1", "runs", "start", "--graph", "desk", "--run", "r1", "--user", oauthtest.Alice)
	second := d.run("p1", "runs", "start", "--graph", "desk", "--run", "r2", "--user", oauthtest.Alice)
	require.ElementsMatch(t, []string{"p1", "p2"}, []string{first.Host, second.Host})
	for via, run := range map[string]string{"p2": "r1", "p1": "r2"} {
		out := d.must(d.cli(via, "runs", "call", "--run", run, "--agent", "a", "--tool", "tickets__whoami", "--args", `{}`))
		require.Contains(t, out, "whoami for "+oauthtest.Alice)
		for _, tok := range ms.Tokens(oauthtest.Alice) {
			require.NotContains(t, out, tok)
		}
	}
	for _, host := range []string{"p1", "p2"} {
		require.NotContains(t, d.pools[host].Logs.String(), "secrets key is not the one", "one key for both hosts")
		require.NotContains(t, d.pools[host].Logs.String(), canary)
	}
}
