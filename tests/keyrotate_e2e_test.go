package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/mcpserver"
)

// TestRotatingTheSecretsKey follows docs/operations.md, "Rotating the secrets key", on one
// host: a server registered with an env secret, and a named secret; ringfenced stopped, its
// key file rotated with `ringfenced secrets-key rotate` (the key file found from the server's
// own configuration), started: the log says the values were re-sealed under the new key and
// that the old line can go, without a value or a key. Stopped, the old line dropped, started
// again: the server is still given its secret (its JSON-RPC error quotes APP_TOKEN, which the
// pool masks: only the value given to it is masked).
func TestRotatingTheSecretsKey(t *testing.T) {
	d, cli, _ := runsDaemon(t)
	must := func(r result) {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	}
	r := runCmd(t, strings.NewReader(canarySecret), []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey},
		bin("ringfence"), "secrets", "set", "tickets-token")
	must(r)
	must(cli("graphs", "create", "--graph", "rot", "--agent", "researcher"))
	must(cli("mcp-import", "--server", "fx", "--graph", "rot", "--agent", "researcher", "--tool", "rpc_error"))
	must(cli("graphs", "publish", "--graph", "rot"))
	reachesTheServer := func(run string) {
		t.Helper()
		must(cli("runs", "start", "--graph", "rot", "--run", run))
		r := cli("runs", "call", "--run", run, "--agent", "researcher", "--tool", "fx__rpc_error")
		require.Equal(t, 4, r.Code, r.Stderr)
		require.Contains(t, r.Stderr, "token="+mcpserver.SecretMask, "the server was given APP_TOKEN, and its value is masked")
		require.NotContains(t, r.Stdout+r.Stderr, canary)
		must(cli("runs", "end", "--run", run))
	}
	reachesTheServer("before")
	d.stop()

	keyFile := filepath.Join(d.DataDir, "secrets.key")
	old, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	r = runCmd(t, nil, d.env, bin("ringfenced"), "secrets-key", "rotate")
	must(r)
	require.Contains(t, r.Stdout, keyFile+": a new key is its first line (2 keys now)")
	rotated, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(rotated)), "\n")
	require.Len(t, lines, 2)
	require.Equal(t, strings.TrimSpace(string(old)), lines[1], "the old key is kept after the new one")
	require.NotContains(t, r.Stdout+r.Stderr, lines[0], "no key is printed")
	st, err := os.Stat(keyFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	d.start()
	d.requireLogged(t, `registry: re-sealed under the first key .* resealed=2 `, "the named secret and the env")
	d.requireLogged(t, `registry: every sealed value opens with the first key of `+keyFile+`: the other lines can be removed`)
	for _, hidden := range []string{canary, canarySecret, lines[0], lines[1]} {
		require.NotContains(t, d.Logs.String(), hidden)
	}
	reachesTheServer("rotated")
	d.stop()

	require.NoError(t, os.WriteFile(keyFile, []byte(lines[0]+"\n"), 0o600))
	d.start()
	reachesTheServer("old-line-dropped")
	must(cli("secrets", "list"))
}
