package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
)

// TestSplitDeploymentOverMutualTLS runs ringfence-registry, -publisher, -pool and -audit as
// four processes on loopback with certificates from `ringfence certs init`, drives a run
// through them, shows that the internal RPCs are on their own listener, which refuses an API
// key without a certificate, and stops the audit service for 30 s while registry changes continue: every event
// arrives after it returns, in order, exactly once.
func TestSplitDeploymentOverMutualTLS(t *testing.T) {
	image := dockertest.FixtureImage(t)
	// Each service has a public address (API keys: the CLI, REST) and an internal one (mutual
	// TLS only), which its peers dial.
	certs, addr, internal := splitPlan(t)
	poolID := "e2e-split-" + randomHex(4)
	t.Cleanup(func() { requireNoContainers(t, poolID) })
	allowed := `RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS=["APP_TOKEN"]`
	started := startSplit(t, certs, addr, internal, map[string][]string{
		"registry": {"RINGFENCE_BOOTSTRAP_ADMIN_KEY=" + adminKey, allowed},
		"pool":     {"RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE=" + image, "RINGFENCE_SANDBOX__POOL_ID=" + poolID, allowed},
	})
	audit, registry := started["audit"], started["registry"]
	cli := func(svc string, args ...string) result { return splitCLI(t, certs, addr, svc, nil, args...) }
	must := func(r result) result { t.Helper(); return mustSucceed(t, r) }

	// The control plane: register (the registry lists tools through the remote pool), import
	// (the publisher discovers through the pool), publish.
	must(cli("registry", "servers", "add", "fx", "--command", "mcpfixture", "--env", "APP_TOKEN="+canary,
		"--grant", "process_spawn", "--grant", "external_api_call", "--tool-permission", "add=math.add:{a}"))
	// REST beside gRPC is served over TLS too (it carries API keys), and works (the gateway's
	// in-process connection speaks TLS); plaintext is refused.
	require.True(t, strings.HasPrefix(registry.HTTPBase, "https://"))
	req, err := http.NewRequest(http.MethodGet, registry.HTTPBase+"/v1/mcp/servers/fx", nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", adminKey)
	resp, err := registry.HTTP.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), `"ref":"fx"`)
	resp, err = http.Get("http://" + registry.HTTPAddr + "/healthz")
	if err == nil {
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "plaintext HTTP on the TLS port is refused")
	}
	r := must(cli("registry", "servers", "tools", "fx"))
	require.Contains(t, r.Stdout, "echo")
	require.Regexp(t, `(?m)^add\s.*\smath\.add:\{a\}\s`, r.Stdout, "the listing shows what the registration requires of callers")
	must(cli("publisher", "graphs", "create", "--graph", "split", "--agent", "a"))
	must(cli("publisher", "mcp-import", "--server", "fx", "--graph", "split", "--agent", "a", "--tool", "echo"))
	must(cli("publisher", "graphs", "publish", "--graph", "split"))
	// A command asked of a binary that does not serve it names the one that does.
	r = cli("registry", "graphs", "list")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "unknown service ringfence.publisher.v1.PublisherService")
	require.Contains(t, r.Stderr, "hint: the server at --addr does not serve ringfence.publisher.v1.PublisherService; in a split deployment point --addr at the service that does: ")
	require.Contains(t, r.Stderr, "graphs and mcp-import: ringfence-publisher")

	// The pool host: a run that loads the version from the publisher and resolves the server
	// (with its secret env) from the registry, both with its certificate.
	r = must(cli("pool", "call", "--graph", "split", "--agent", "a", "--tool", "fx__echo", "--args", `{"text":"across four processes"}`))
	require.Contains(t, r.Stdout, "across four processes")

	// Warm containers across the split: the pool learns which registrations want them from the
	// registry (ListWarmTargets), and the registry shows what the pool holds (GetWarmStatus),
	// both on the internal plane; the next run's first call takes one.
	must(cli("registry", "servers", "update", "fx", "--prewarm", "1"))
	require.Eventually(t, func() bool {
		return strings.Contains(cli("registry", "servers", "show", "fx").Stdout, "1 (ready 1, starting 0)")
	}, 60*time.Second, 200*time.Millisecond, "the registry shows the pool's warm container")
	r = must(cli("pool", "call", "--graph", "split", "--agent", "a", "--tool", "fx__echo", "--args", `{"text":"warm"}`))
	require.Contains(t, r.Stdout, "warm")
	require.Eventually(t, func() bool {
		return strings.Contains(cli("audit", "audit", "list", "--kind", "tool_call", "-o", "json").Stdout, `"warm_session": true`)
	}, 20*time.Second, 200*time.Millisecond, "the call took the warm container")

	// The internal plane is apart: the public port neither lists nor serves the internal
	// services, and their listener refuses an admin API key without a certificate at the
	// handshake, before any request is read.
	grpcurl := tool(t, "grpcurl")
	r = runCmd(t, nil, nil, grpcurl, "-cacert", filepath.Join(certs, "ca.pem"), addr["registry"], "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "ringfence.registry.v1.RegistryService")
	require.NotContains(t, r.Stdout, "ringfence.internal", "the public port's reflection lists no internal service")
	r = runCmd(t, nil, nil, grpcurl, "-cacert", filepath.Join(certs, "ca.pem"), "-H", "x-api-key: "+adminKey,
		"-d", `{"ref":"fx"}`, addr["registry"], "ringfence.internal.registry.v1.RegistryInternalService/ResolveServer")
	require.NotEqual(t, 0, r.Code)
	require.NotContains(t, r.Stdout+r.Stderr, canary)
	r = runCmd(t, nil, nil, grpcurl, "-cacert", filepath.Join(certs, "ca.pem"), "-H", "x-api-key: "+adminKey,
		"-d", `{"ref":"fx"}`, internal["registry"], "ringfence.internal.registry.v1.RegistryInternalService/ResolveServer")
	require.NotEqual(t, 0, r.Code)
	require.Contains(t, r.Stderr, "certificate", "refused at the TLS handshake")
	require.NotContains(t, r.Stdout+r.Stderr, canary)
	// With the pool's certificate the secrets resolve: the listener serves its peers.
	r = runCmd(t, nil, nil, grpcurl, "-cacert", filepath.Join(certs, "ca.pem"),
		"-cert", filepath.Join(certs, "pool.pem"), "-key", filepath.Join(certs, "pool-key.pem"),
		"-d", `{"ref":"fx"}`, internal["registry"], "ringfence.internal.registry.v1.RegistryInternalService/ResolveServer")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, canary, "the pool's certificate gets the env in clear")

	// The audit service goes away for 30 s while registry changes continue.
	audit.stop()
	const changes = 30
	for i := range changes {
		must(cli("registry", "servers", "add", fmt.Sprintf("outage-%02d", i), "--command", "mcpfixture"))
		time.Sleep(time.Second)
	}
	// The on-call sees the outage: the registry's spool depth, and one error line for it.
	var pending int
	line := metricLines(scrape(t, registry), `ringfence_audit_spool_pending{producer="registry"}`)
	_, err = fmt.Sscanf(line, `ringfence_audit_spool_pending{producer="registry"} %d`, &pending)
	require.NoError(t, err, line)
	require.GreaterOrEqual(t, pending, changes, "every change of the outage waits in the registry's outbox")
	require.Contains(t, registry.Logs.String(), "audit: forward to audit log failed, will retry")
	audit.start()
	var refs []string
	require.Eventually(t, func() bool {
		r := cli("audit", "audit", "list", "--kind", "admin", "--limit", "1000", "-o", "json")
		if r.Code != 0 {
			return false
		}
		var list struct {
			Records []struct {
				ID    string `json:"id"`
				Seq   string `json:"seq"`
				Admin struct {
					Action       string `json:"action"`
					ResourceType string `json:"resource_type"`
					ResourceID   string `json:"resource_id"`
				} `json:"admin"`
			} `json:"records"`
		}
		if json.Unmarshal([]byte(r.Stdout), &list) != nil {
			return false
		}
		refs = refs[:0]
		ids := map[string]bool{}
		for _, rec := range list.Records {
			require.False(t, ids[rec.ID], "record %s stored twice", rec.ID)
			ids[rec.ID] = true
			if rec.Admin.Action == "create" && strings.HasPrefix(rec.Admin.ResourceID, "outage-") {
				refs = append(refs, rec.Admin.ResourceID)
			}
		}
		return len(refs) == changes
	}, 60*time.Second, 250*time.Millisecond, "every event of the outage arrives")
	for i, ref := range refs {
		require.Equal(t, fmt.Sprintf("outage-%02d", i), ref, "events arrive in order")
	}
	require.Eventually(t, func() bool {
		return strings.Contains(scrape(t, registry), `ringfence_audit_spool_pending{producer="registry"} 0`)
	}, 10*time.Second, 100*time.Millisecond, "the spool empties once the audit service took its records")
	require.Contains(t, registry.Logs.String(), "audit: forwarding resumed")
	r = must(cli("audit", "audit", "verify"))
	require.Contains(t, r.Stdout, "ok:")
	r = must(cli("audit", "audit", "export"))
	require.NotContains(t, r.Stdout, canary)
	require.NotContains(t, registry.Logs.String(), canary)
}

// splitPlan makes the certificates of a split deployment (ringfence certs init) and picks
// each service's public and internal address.
func splitPlan(t *testing.T) (certs string, addr, internal map[string]string) {
	t.Helper()
	certs = t.TempDir()
	r := runCmd(t, nil, nil, bin("ringfence"), "certs", "init", "--dir", certs)
	require.Equal(t, 0, r.Code, r.Stderr)
	addr, internal = map[string]string{}, map[string]string{}
	for _, svc := range []string{"registry", "publisher", "pool", "audit"} {
		addr[svc], internal[svc] = testutil.FreeAddr(t), testutil.FreeAddr(t)
	}
	return certs, addr, internal
}

// splitEnv is the env of service svc in a split deployment: its public and internal addresses,
// and its certificate and the CA from certs (ringfence certs init).
func splitEnv(certs, svc string, addr, internal map[string]string) []string {
	return []string{
		"RINGFENCE_GRPC_ADDR=" + addr[svc],
		"RINGFENCE_INTERNAL_ADDR=" + internal[svc],
		"RINGFENCE_TLS__CERT_FILE=" + filepath.Join(certs, svc+".pem"),
		"RINGFENCE_TLS__KEY_FILE=" + filepath.Join(certs, svc+"-key.pem"),
		"RINGFENCE_TLS__CLIENT_CA_FILE=" + filepath.Join(certs, "ca.pem"),
	}
}

// splitPeers are the peers each service of a split deployment dials (DESIGN.md), as
// RINGFENCE_PEERS__* keys.
var splitPeers = map[string][]string{
	"audit": {"registry"}, "registry": {"pool", "audit"},
	"publisher": {"registry", "pool", "audit"}, "pool": {"registry", "publisher", "audit"},
}

// startSplit starts the four services of a split deployment splitPlan made, each with
// splitEnv, the internal addresses of the peers it dials and extra[svc], the audit service
// first (the others record to it from their start); it returns them by service.
func startSplit(t *testing.T, certs string, addr, internal map[string]string, extra map[string][]string) map[string]*daemon {
	t.Helper()
	out := make(map[string]*daemon, 4)
	for _, svc := range []string{"audit", "registry", "publisher", "pool"} {
		env := splitEnv(certs, svc, addr, internal)
		for _, peer := range splitPeers[svc] {
			env = append(env, "RINGFENCE_PEERS__"+strings.ToUpper(peer)+"_ADDR="+internal[peer])
		}
		out[svc] = startDaemonAt(t, "ringfence-"+svc, addr[svc], append(env, extra[svc]...)...)
	}
	return out
}

// splitCLI runs the CLI as the admin against service svc of a split deployment, over TLS
// checking the service's identity.
func splitCLI(t *testing.T, certs string, addr map[string]string, svc string, stdin io.Reader, args ...string) result {
	t.Helper()
	return runCmd(t, stdin, []string{"RINGFENCE_ADDR=" + addr[svc], "RINGFENCE_API_KEY=" + adminKey,
		"RINGFENCE_CA_FILE=" + filepath.Join(certs, "ca.pem"), "RINGFENCE_SERVER_IDENTITY=" + svc}, bin("ringfence"), args...)
}

// mustSucceed fails the test unless r exited 0, showing its output.
func mustSucceed(t *testing.T, r result) result {
	t.Helper()
	require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	return r
}

// startDaemonAt is startDaemon with a fixed gRPC address (peers need it before it starts).
func startDaemonAt(t testing.TB, name, grpcAddr string, env ...string) *daemon {
	t.Helper()
	return startDaemon(t, name, append(env, "RINGFENCE_GRPC_ADDR="+grpcAddr)...)
}
