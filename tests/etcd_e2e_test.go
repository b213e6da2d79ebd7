package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/testutil"
)

// TestTwoRegistryReplicasShareEtcd runs two ringfence-registry processes on one embedded
// three-member etcd cluster (mutual TLS, as deployed) with ringfence-audit beside them. A write
// through either replica is what the other's next answer shows, with nothing waited for in
// between: registrations, their revisions, API keys and their revocation. Every change reaches
// the audit log once, whichever replica made it. With etcd's leader killed, both replicas go on
// serving once the two other members elected a new one.
func TestTwoRegistryReplicasShareEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	certs := cluster.CertDir
	root := cluster.Root()
	// Every replica seals with the same secrets key.
	keyFile := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(keyFile, []byte(strings.Repeat("ab", 32)+"\n"), 0o600))

	addr, internal := map[string]string{}, map[string]string{}
	for _, name := range []string{"a", "b", "audit"} {
		addr[name], internal[name] = testutil.FreeAddr(t), testutil.FreeAddr(t)
	}
	tlsEnv := func(svc string) []string {
		return []string{
			"RINGFENCE_TLS__CERT_FILE=" + filepath.Join(certs, svc+".pem"),
			"RINGFENCE_TLS__KEY_FILE=" + filepath.Join(certs, svc+"-key.pem"),
			"RINGFENCE_TLS__CLIENT_CA_FILE=" + filepath.Join(certs, "ca.pem"),
		}
	}
	startDaemonAt(t, "ringfence-audit", addr["audit"], append(tlsEnv("audit"),
		"RINGFENCE_INTERNAL_ADDR="+internal["audit"], "RINGFENCE_PEERS__REGISTRY_ADDR="+internal["a"])...)
	for _, name := range []string{"a", "b"} {
		startDaemonAt(t, "ringfence-registry", addr[name], append(append(tlsEnv("registry"), etcdEnv(cluster, root, "registry")...),
			"RINGFENCE_ENV=production",
			"RINGFENCE_INTERNAL_ADDR="+internal[name],
			"RINGFENCE_BOOTSTRAP_ADMIN_KEY="+adminKey,
			"RINGFENCE_SECRETS_KEY_FILE="+keyFile,
			"RINGFENCE_PEERS__AUDIT_ADDR="+internal["audit"],
		)...)
	}

	cli := func(name, key string, args ...string) result {
		identity := "registry"
		if name == "audit" {
			identity = "audit"
		}
		return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + addr[name], "RINGFENCE_API_KEY=" + key,
			"RINGFENCE_CA_FILE=" + filepath.Join(certs, "ca.pem"), "RINGFENCE_SERVER_IDENTITY=" + identity}, bin("ringfence"), args...)
	}
	must := func(r result) string {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
		return r.Stdout
	}
	revision := func(name, ref string) string {
		t.Helper()
		var s struct {
			Revision string `json:"revision"` // int64, a string in JSON
		}
		require.NoError(t, json.Unmarshal([]byte(must(cli(name, adminKey, "servers", "show", ref, "-o", "json"))), &s))
		return s.Revision
	}

	// Registrations: each write on one replica, read at once on the other.
	must(cli("a", adminKey, "servers", "add", "docs", "--command", "mcpfixture", "--grant", "process_spawn"))
	require.Equal(t, "1", revision("b", "docs"))
	must(cli("b", adminKey, "servers", "update", "docs", "--command", "mcpfixture --v2"))
	require.Equal(t, "2", revision("a", "docs"))
	must(cli("a", adminKey, "servers", "update", "docs", "--command", "mcpfixture --v3"))
	require.Equal(t, "3", revision("b", "docs"))

	// A key minted on one replica authenticates on the other, and revoked there, is refused
	// here by the very next call.
	var key struct {
		Key    map[string]any `json:"key"`
		Secret string         `json:"secret"`
	}
	require.NoError(t, json.Unmarshal([]byte(must(cli("a", adminKey, "keys", "create", "--name", "ops", "--role", "admin", "-o", "json"))), &key))
	must(cli("b", key.Secret, "servers", "list"))
	must(cli("b", adminKey, "keys", "revoke", key.Key["id"].(string)))
	r := cli("a", key.Secret, "servers", "list")
	require.NotEqual(t, 0, r.Code)
	require.Contains(t, r.Stderr, "unknown or revoked API key")

	// etcd loses its leader; once the others elected one, both replicas serve on.
	cluster.Kill(cluster.WaitLeader(t))
	cluster.WaitLeader(t)
	must(cli("b", adminKey, "servers", "add", "tickets", "--command", "mcpfixture"))
	require.Equal(t, "1", revision("a", "tickets"))
	must(cli("a", adminKey, "servers", "delete", "docs"))
	require.NotEqual(t, 0, cli("b", adminKey, "servers", "show", "docs").Code)

	// Every change is in the audit log once, whichever replica made it.
	var list struct {
		Records []struct {
			Admin struct {
				Action       string `json:"action"`
				ResourceType string `json:"resource_type"`
				ResourceID   string `json:"resource_id"`
			} `json:"admin"`
		} `json:"records"`
	}
	want := []string{"create mcp_server docs", "update mcp_server docs", "update mcp_server docs", "key_create api_key", "key_revoke api_key", "create mcp_server tickets", "delete mcp_server docs"}
	var got []string
	require.Eventually(t, func() bool {
		r := cli("audit", adminKey, "audit", "list", "--kind", "admin", "-o", "json")
		if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &list) != nil {
			return false
		}
		got = got[:0]
		for _, rec := range list.Records {
			a := rec.Admin
			if a.ResourceType == "api_key" {
				got = append(got, a.Action+" "+a.ResourceType)
			} else {
				got = append(got, a.Action+" "+a.ResourceType+" "+a.ResourceID)
			}
		}
		// The bootstrap key's creation is recorded by whichever replica made it first.
		return len(got) >= len(want)+1
	}, 30*time.Second, 100*time.Millisecond, "audit records: %v", got)
	require.Equal(t, append([]string{"key_create api_key"}, want...), got)
}

// etcdEnv is what a service needs to keep its state in cluster under root, presenting its own
// certificate.
func etcdEnv(cluster *etcdtest.Cluster, root, service string) []string {
	return []string{
		"RINGFENCE_STORE__BACKEND=etcd",
		`RINGFENCE_STORE__ETCD_ENDPOINTS=["` + strings.Join(cluster.Endpoints(), `","`) + `"]`,
		"RINGFENCE_STORE__ETCD_CA_FILE=" + filepath.Join(cluster.CertDir, "ca.pem"),
		"RINGFENCE_STORE__ETCD_CERT_FILE=" + filepath.Join(cluster.CertDir, service+".pem"),
		"RINGFENCE_STORE__ETCD_KEY_FILE=" + filepath.Join(cluster.CertDir, service+"-key.pem"),
		"RINGFENCE_STORE__ETCD_PREFIX=" + root,
	}
}
