package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/isoimage"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
)

// poolDaemon starts ringfenced with the fixture isolation image and a pool id of its own, so
// the test can find (and require the absence of) the containers it started.
func poolDaemon(t testing.TB, extra ...string) (*daemon, string) {
	t.Helper()
	image := dockertest.FixtureImage(t)
	poolID := "e2e-" + randomHex(6)
	d := startDaemon(t, "ringfenced", append(append(registryEnv(),
		"RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE="+image,
		"RINGFENCE_SANDBOX__POOL_ID="+poolID,
	), extra...)...)
	t.Cleanup(func() { requireNoContainers(t, poolID) })
	return d, poolID
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// poolContainers lists every container, running or not, labelled with the pool id.
func poolContainers(t testing.TB, poolID string) []string {
	t.Helper()
	docker := dockertest.RequireEngine(t)
	f := client.Filters{}
	f.Add("label", "io.ringfence.pool="+poolID)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	require.NoError(t, err)
	var ids []string
	for _, c := range list.Items {
		ids = append(ids, c.ID)
	}
	return ids
}

// requireNoContainers waits briefly for AutoRemove to finish, then asserts nothing is left.
func requireNoContainers(t testing.TB, poolID string) {
	t.Helper()
	require.Eventually(t, func() bool { return len(poolContainers(t, poolID)) == 0 },
		20*time.Second, 100*time.Millisecond, "containers of pool %s were left behind", poolID)
}

func registerServer(t *testing.T, api rest, body string) {
	t.Helper()
	code, _, raw := api.do("POST", "/v1/mcp/servers", body)
	require.Equal(t, http.StatusOK, code, raw)
}

// hostToolNames lists a binary's tools directly over stdio on the host, the reference the
// isolated discovery must match.
func hostToolNames(t *testing.T, path string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).
		Connect(ctx, &mcp.CommandTransport{Command: exec.Command(path)}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	require.NoError(t, err)
	defer cs.Close()
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		require.NoError(t, err)
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

// TestDiscoveryListsTheExampleServers registers the go-sdk and mcp-go example servers built
// into the fixture image and lists their tools through the registry's REST route: the same
// names as a direct stdio listing on the host, and hashes that are stable across runs.
func TestDiscoveryListsTheExampleServers(t *testing.T) {
	d, _ := poolDaemon(t)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	bins := fixtures.Binaries(t)
	for _, name := range []string{"sdk-everything", "sdk-memory", "mcpgo-everything", "mcpgo-structured"} {
		t.Run(name, func(t *testing.T) {
			registerServer(t, api, `{"ref":"`+name+`","command":"`+name+`","grants":["process_spawn","external_api_call"]}`)
			list := func() (names, hashes []string) {
				code, body, raw := api.do("GET", "/v1/mcp/servers/"+name+"/tools", "")
				require.Equal(t, http.StatusOK, code, raw)
				for _, tool := range body["tools"].([]any) {
					m := tool.(map[string]any)
					names = append(names, m["name"].(string))
					hashes = append(hashes, m["schema_hash"].(string))
					require.Regexp(t, `^v1:sha256:[0-9a-f]{64}$`, m["schema_hash"])
				}
				return names, hashes
			}
			names, hashes := list()
			sorted := slices.Clone(names)
			slices.Sort(sorted)
			require.Equal(t, hostToolNames(t, bins.Path(t, name)), sorted)
			names2, hashes2 := list()
			require.Equal(t, names, names2)
			require.Equal(t, hashes, hashes2, "pins are stable across runs")
		})
	}
}

// TestDiscoveryFailureClasses: every way of failing to reach a server is a classified error
// with an admin-facing stderr tail, never a trace, and never a leaked container.
func TestDiscoveryFailureClasses(t *testing.T) {
	d, poolID := poolDaemon(t)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}

	refused := testutil.FreeAddr(t) // nothing listens here
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(tlsSrv.Close)

	for _, tc := range []struct {
		ref, body string
		status    int
		class     string
	}{
		{"cmd-missing", `{"ref":"cmd-missing","command":"no-such-binary"}`, http.StatusServiceUnavailable, "command_not_found"},
		{"exits-early", `{"ref":"exits-early","command":"mcpfixture","args":["--exit-before-handshake"]}`, http.StatusServiceUnavailable, "exited_before_handshake"},
		{"garbage", `{"ref":"garbage","command":"mcpfixture","args":["--garbage"]}`, http.StatusServiceUnavailable, "not_mcp_server"},
		{"silent", `{"ref":"silent","command":"mcpfixture","args":["--never-answer"],"client_session_timeout":"1s"}`, http.StatusGatewayTimeout, "handshake_timeout"},
		{"crash-list", `{"ref":"crash-list","command":"mcpfixture","args":["--crash-during-list"]}`, http.StatusServiceUnavailable, "crashed"},
		{"remote-refused", `{"ref":"remote-refused","transport":"streamable_http","url":"http://` + refused + `/mcp"}`, http.StatusServiceUnavailable, "connection_refused"},
		{"remote-tls", `{"ref":"remote-tls","transport":"streamable_http","url":"` + tlsSrv.URL + `/mcp"}`, http.StatusServiceUnavailable, "tls_failure"},
	} {
		t.Run(tc.class, func(t *testing.T) {
			registerServer(t, api, tc.body)
			code, body, raw := api.do("GET", "/v1/mcp/servers/"+tc.ref+"/tools", "")
			require.Equal(t, tc.status, code, raw)
			require.Contains(t, body["message"], tc.class)
			require.NotContains(t, raw, "goroutine", "no stack traces")
			details := body["details"].([]any)
			require.Len(t, details, 1)
			require.Equal(t, tc.class, details[0].(map[string]any)["class"])
			requireNoContainers(t, poolID)
		})
	}
}

// TestDiscoveryImageMissing removes the isolation image after the pool started: discovery
// answers image_missing instead of pulling or falling back.
func TestDiscoveryImageMissing(t *testing.T) {
	docker := dockertest.RequireEngine(t)
	bins := fixtures.Binaries(t)
	out := runCmd(t, nil, nil, bin("ringfence"), "image", "build", "--binary", bins.Path(t, "mcpfixture"), "--binary", bins.Path(t, "sdk-memory"), "--name", "ringfence-e2e-doomed:"+randomHex(4), "--label", checkoutLabel(t), "-o", "json")
	require.Equal(t, 0, out.Code, out.Stderr)
	require.Contains(t, out.Stderr, "isoimage:", "progress is shown")
	var built struct{ Image string }
	require.NoError(t, json.Unmarshal([]byte(out.Stdout), &built))
	image := built.Image
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, image)

	poolID := "e2e-" + randomHex(6)
	d := startDaemon(t, "ringfenced", append(registryEnv(), "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE="+image, "RINGFENCE_SANDBOX__POOL_ID="+poolID)...)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	registerServer(t, api, `{"ref":"mem","command":"sdk-memory"}`)
	code, _, raw := api.do("GET", "/v1/mcp/servers/mem/tools", "")
	require.Equal(t, http.StatusOK, code, raw)

	_, err := docker.ImageRemove(t.Context(), image, client.ImageRemoveOptions{Force: true})
	require.NoError(t, err)
	code, body, raw := api.do("GET", "/v1/mcp/servers/mem/tools", "")
	require.Equal(t, http.StatusServiceUnavailable, code, raw)
	require.Contains(t, body["message"], "image_missing")
	requireNoContainers(t, poolID)
}

// TestPoolSIGKILLMidDiscoveryLeavesNothing kills ringfenced while a discovery is waiting on a
// server that never answers, restarts it, and finds no container of the pool left.
func TestPoolSIGKILLMidDiscoveryLeavesNothing(t *testing.T) {
	d, poolID := poolDaemon(t)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	registerServer(t, api, `{"ref":"silent","command":"mcpfixture","args":["--never-answer"],"client_session_timeout":"60s"}`)
	go func() {
		req, _ := http.NewRequest("GET", api.base+"/v1/mcp/servers/silent/tools", nil)
		req.Header.Set("X-API-Key", adminKey)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return len(poolContainers(t, poolID)) == 1 }, 30*time.Second, 50*time.Millisecond,
		"the discovery container never appeared")
	d.kill()
	d.start()
	requireNoContainers(t, poolID)
}

// TestStartRefusals: the pool refuses to start on a profile it cannot honour, naming why.
func TestStartRefusals(t *testing.T) {
	volumeImage := buildVolumeImage(t)
	for _, tc := range []struct {
		name string
		env  []string
		code int
		want []string
	}{
		{"development flag in production", []string{"RINGFENCE_ENV=production", "RINGFENCE_SANDBOX__ALLOW_UNISOLATED_MCP_DEVELOPMENT=true"}, 2,
			[]string{"RINGFENCE_SANDBOX__ALLOW_UNISOLATED_MCP_DEVELOPMENT", "refused in production"}},
		{"tag", []string{"RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE=ringfence-mcp:latest"}, 2,
			[]string{"not pinned by digest", "sha256:<64 hex>"}},
		{"image declares a volume", []string{"RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE=" + volumeImage}, 1,
			[]string{"VOLUME"}},
		{"image missing", []string{"RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE=sha256:" + strings.Repeat("0", 64)}, 1,
			[]string{"image_missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append([]string{"RINGFENCE_DATA_DIR=" + t.TempDir(), "RINGFENCE_GRPC_ADDR=" + testutil.FreeAddr(t), "RINGFENCE_HTTP_ADDR=" + testutil.FreeAddr(t)}, tc.env...)
			r := runCmd(t, nil, env, bin("ringfenced"))
			require.Equal(t, tc.code, r.Code, r.Stderr)
			for _, w := range tc.want {
				require.Contains(t, r.Stderr, w)
			}
		})
	}
}

// buildVolumeImage builds, with the classic builder and pulling nothing, a FROM-scratch image
// that declares a VOLUME.
func buildVolumeImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM scratch\nCOPY marker /marker\nVOLUME /data\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "marker"), []byte("x"), 0o644))
	tag := "ringfence-e2e-volume:" + randomHex(4)
	r := runCmd(t, nil, []string{"DOCKER_BUILDKIT=0"}, "docker", "build", "-q", "--label", checkoutLabel(t), "-t", tag, dir)
	require.Equal(t, 0, r.Code, r.Stderr)
	id := strings.TrimSpace(r.Stdout)
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, id)
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", tag).Run() })
	return id
}

// checkoutLabel is the label of every image a test builds, KEY=VALUE: this checkout's, so
// that its make clean removes what a killed test left behind.
func checkoutLabel(t *testing.T) string {
	return isoimage.CheckoutLabel + "=" + dockertest.CheckoutLabels(t)[isoimage.CheckoutLabel]
}
