package tests

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
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

	// A misspelt floor capability is granted as written, with a warning.
	r = cli(plain, nil, "servers", "add", "fx", "--command", "mcpfixture", "--grant", "proces_spawn", "--grant", "external_api_call")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "warning: --grant proces_spawn is not a floor capability; did you mean process_spawn?")
	require.Regexp(t, `grants:\s+proces_spawn, external_api_call`, r.Stdout)

	// A ref that is not registered.
	fails(cli(plain, nil, "servers", "show", "docss"), 1,
		`registry: no server is registered with ref "docss": ListServers (ringfence servers list) shows the registered refs (NotFound)`)

	// A header naming a secret that does not exist.
	fails(cli(plain, nil, "servers", "explore", "--transport", "http", "--url", "https://mcp.example.com/mcp", "--header-secret", "Authorization=nosuch"), 1,
		`registry: header "Authorization" references secret "nosuch", which does not exist: create it with PutSecret (ringfence secrets set nosuch) (FailedPrecondition)`)

	// An outcome that is not one.
	fails(cli(plain, nil, "audit", "list", "--outcome", "refused"), 1,
		`audit: invalid filter: outcome "refused" is not one of refused_before_dispatch, dispatched (InvalidArgument)`)
}
