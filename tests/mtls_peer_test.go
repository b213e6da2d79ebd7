package tests

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
)

// TestMTLSPeerIdentityIsChecked runs split binaries with certificates from `ringfence certs
// init` and points a publisher's registry address and the registry's pool address at
// ringfence-audit. Its certificate chains to the same CA and is valid for 127.0.0.1, but it is
// not the registry's nor the pool's: the callers refuse the handshake, naming both identities,
// instead of taking its answers (API keys, grants) or sending it requests (discovery). A
// publisher pointed at the real registry works as before.
func TestMTLSPeerIdentityIsChecked(t *testing.T) {
	certs := t.TempDir()
	r := runCmd(t, nil, nil, bin("ringfence"), "certs", "init", "--dir", certs)
	require.Equal(t, 0, r.Code, r.Stderr)

	// addr is each daemon's public address, internal its internal one, which peers dial.
	addr, internal := map[string]string{}, map[string]string{}
	for _, name := range []string{"registry", "audit", "publisher", "misled-publisher", "nowhere"} {
		addr[name], internal[name] = testutil.FreeAddr(t), testutil.FreeAddr(t)
	}
	tlsEnv := func(svc, name string) []string {
		return []string{
			"RINGFENCE_GRPC_ADDR=" + addr[name],
			"RINGFENCE_INTERNAL_ADDR=" + internal[name],
			"RINGFENCE_TLS__CERT_FILE=" + filepath.Join(certs, svc+".pem"),
			"RINGFENCE_TLS__KEY_FILE=" + filepath.Join(certs, svc+"-key.pem"),
			"RINGFENCE_TLS__CLIENT_CA_FILE=" + filepath.Join(certs, "ca.pem"),
		}
	}
	startDaemonAt(t, "ringfence-audit", addr["audit"], append(tlsEnv("audit", "audit"),
		"RINGFENCE_PEERS__REGISTRY_ADDR="+internal["registry"])...)
	// The registry's "pool" is the audit service.
	startDaemonAt(t, "ringfence-registry", addr["registry"], append(tlsEnv("registry", "registry"),
		"RINGFENCE_BOOTSTRAP_ADMIN_KEY="+adminKey,
		"RINGFENCE_PEERS__POOL_ADDR="+internal["audit"], "RINGFENCE_PEERS__AUDIT_ADDR="+internal["audit"])...)
	startDaemonAt(t, "ringfence-publisher", addr["publisher"], append(tlsEnv("publisher", "publisher"),
		"RINGFENCE_PEERS__REGISTRY_ADDR="+internal["registry"], "RINGFENCE_PEERS__POOL_ADDR="+internal["nowhere"],
		"RINGFENCE_PEERS__AUDIT_ADDR="+internal["audit"])...)
	// This publisher's "registry" is the audit service.
	startDaemonAt(t, "ringfence-publisher", addr["misled-publisher"], append(tlsEnv("publisher", "misled-publisher"),
		"RINGFENCE_PEERS__REGISTRY_ADDR="+internal["audit"], "RINGFENCE_PEERS__POOL_ADDR="+internal["nowhere"],
		"RINGFENCE_PEERS__AUDIT_ADDR="+internal["audit"])...)

	cli := func(name string, args ...string) result {
		return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + addr[name], "RINGFENCE_API_KEY=" + adminKey,
			"RINGFENCE_CA_FILE=" + filepath.Join(certs, "ca.pem")}, bin("ringfence"), args...)
	}

	r = cli("publisher", "graphs", "list")
	require.Equal(t, 0, r.Code, "the real registry vouches for the key: %s", r.Stderr)

	r = cli("misled-publisher", "graphs", "list")
	require.NotEqual(t, 0, r.Code, r.Stdout)
	require.Contains(t, r.Stderr, "expected peer identity spiffe://ringfence/service/registry")
	require.Contains(t, r.Stderr, "the server presented spiffe://ringfence/service/audit")

	r = cli("registry", "servers", "add", "fx", "--command", "mcpfixture")
	require.Equal(t, 0, r.Code, r.Stderr)
	r = cli("registry", "servers", "tools", "fx")
	require.NotEqual(t, 0, r.Code, r.Stdout)
	require.Contains(t, r.Stderr, "expected peer identity spiffe://ringfence/service/pool")
	require.Contains(t, r.Stderr, "the server presented spiffe://ringfence/service/audit")
}
