package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
)

// TestGoClientOfTheStubs builds examples/grpc-client as a module of its own outside the
// checkout, with only a replace that points at gen/go (offline: the stubs' own checksums
// must suffice), and runs it as docs/api.md ("Go clients") says: against ringfenced in
// plaintext, and against a split registry over TLS, where a certificate of another service
// is refused before the API key is sent. Every line of the document's Go snippets is a line
// of the program, so the document shows code that compiles and runs.
func TestGoClientOfTheStubs(t *testing.T) {
	root := bins.root
	src, err := os.ReadFile(filepath.Join(root, "examples", "grpc-client", "main.go"))
	require.NoError(t, err)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "api.md"))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(doc), "\n## Go clients\n")
	require.True(t, ok, "docs/api.md has no Go clients section")
	section, _, _ = strings.Cut(section, "\n## ")
	snippets := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(section, -1)
	require.NotEmpty(t, snippets)
	for _, s := range snippets {
		for line := range strings.SplitSeq(strings.TrimSpace(s[1]), "\n") {
			require.True(t, strings.Contains(string(src), strings.TrimSpace(line)), "docs/api.md's Go clients snippet has a line examples/grpc-client/main.go does not: %s", line)
		}
	}

	dir, mods := buildOutside(t, "grpc-client", "gen/go")
	require.NotContains(t, mods, "github.com/ringfence/ringfence ", "the servers are not a dependency")
	require.NotContains(t, mods, "go.etcd.io/")
	require.NotContains(t, mods, "github.com/moby/")
	client := filepath.Join(dir, "grpc-client")
	// The flag package names a flag's value by the first `quoted` word of its usage.
	r := runCmd(t, nil, nil, client, "-h")
	require.Contains(t, r.Stderr, "-ca-file file\n", "its help names -ca-file's value as a file")

	// ringfenced, plaintext on loopback.
	d := startDaemon(t, "ringfenced", "RINGFENCE_BOOTSTRAP_ADMIN_KEY="+adminKey)
	cli := func(addr string, env ...string) result {
		return runCmd(t, nil, append([]string{"RINGFENCE_ADDR=" + addr, "RINGFENCE_API_KEY=" + adminKey}, env...), bin("ringfence"),
			"servers", "add", "fx", "--command", "mcpfixture", "--grant", "process_spawn", "--grant", "external_api_call")
	}
	r = cli(d.GRPCAddr)
	require.Equal(t, 0, r.Code, r.Stderr)
	r = runCmd(t, nil, []string{"RINGFENCE_API_KEY=" + adminKey}, client, "-addr", d.GRPCAddr)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "fx\tstdio\tgrants=[process_spawn external_api_call]\n", r.Stdout)
	r = runCmd(t, nil, []string{"RINGFENCE_API_KEY=not-a-key"}, client, "-addr", d.GRPCAddr)
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "Unauthenticated: auth: unknown or revoked API key")

	// A split registry and audit log over TLS.
	certs := t.TempDir()
	r = runCmd(t, nil, nil, bin("ringfence"), "certs", "init", "--dir", certs)
	require.Equal(t, 0, r.Code, r.Stderr)
	addr, internal := map[string]string{}, map[string]string{}
	for _, svc := range []string{"registry", "audit", "pool"} {
		addr[svc], internal[svc] = testutil.FreeAddr(t), testutil.FreeAddr(t)
	}
	startDaemonAt(t, "ringfence-audit", addr["audit"], append(splitEnv(certs, "audit", addr, internal),
		"RINGFENCE_PEERS__REGISTRY_ADDR="+internal["registry"])...)
	startDaemonAt(t, "ringfence-registry", addr["registry"], append(splitEnv(certs, "registry", addr, internal),
		"RINGFENCE_BOOTSTRAP_ADMIN_KEY="+adminKey,
		"RINGFENCE_PEERS__POOL_ADDR="+internal["pool"], "RINGFENCE_PEERS__AUDIT_ADDR="+internal["audit"])...)
	ca := filepath.Join(certs, "ca.pem")
	r = cli(addr["registry"], "RINGFENCE_CA_FILE="+ca, "RINGFENCE_SERVER_IDENTITY=registry")
	require.Equal(t, 0, r.Code, r.Stderr)
	r = runCmd(t, nil, []string{"RINGFENCE_API_KEY=" + adminKey}, client, "-addr", addr["registry"], "-ca-file", ca)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "fx\tstdio\tgrants=[process_spawn external_api_call]\n", r.Stdout)

	// The audit log's certificate chains to the same CA and names the same host: the client
	// refuses it in the handshake, so the key never reaches it.
	r = runCmd(t, nil, []string{"RINGFENCE_API_KEY=" + adminKey}, client, "-addr", addr["audit"], "-ca-file", ca)
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "the server's certificate does not name spiffe://ringfence/service/registry: point -addr at the registry service")
}
