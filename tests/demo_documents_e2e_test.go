package tests

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil/dockertest"
)

// TestDemoServerTakesADocument walks the README's documents step against the demo's own MCP
// server (examples/docs-mcp, built static into an isolation image as make run builds it): a
// file stored with documents put and named in a call as my-documents://<id> reaches the
// server's read_upload as its content, and comes back as the document's text; the audit
// trail keeps the reference and never the content.
func TestDemoServerTakesADocument(t *testing.T) {
	dir := t.TempDir()
	server := filepath.Join(dir, "docs-mcp")
	goCmd(t, bins.root, []string{"CGO_ENABLED=0"}, "build", "-trimpath", "-o", server, "./examples/docs-mcp")
	built := runCmd(t, nil, nil, bin("ringfence"), "image", "build", "--binary", server, "--name", "ringfence-e2e-docs-mcp:"+randomHex(4),
		"--label", checkoutLabel(t), "-o", "json")
	require.Equal(t, 0, built.Code, built.Stderr)
	var image struct{ Image string }
	require.NoError(t, json.Unmarshal([]byte(built.Stdout), &image))
	docker := dockertest.RequireEngine(t)
	t.Cleanup(func() {
		_, err := docker.ImageRemove(context.Background(), image.Image, client.ImageRemoveOptions{Force: true})
		require.NoError(t, err, "the test's image is removed")
	})

	poolID := "e2e-" + randomHex(6)
	d := startDaemon(t, "ringfenced", append(registryEnv(), "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE="+image.Image, "RINGFENCE_SANDBOX__POOL_ID="+poolID)...)
	t.Cleanup(func() { requireNoContainers(t, poolID) })
	rf := func(args ...string) string {
		t.Helper()
		r := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), args...)
		require.Equal(t, 0, r.Code, "%v\nstdout: %s\nstderr: %s", args, r.Stdout, r.Stderr)
		return r.Stdout
	}

	// As the README has it, up to the documents step.
	rf("servers", "add", "docs-search", "--command", "docs-mcp", "--grant", "process_spawn", "--grant", "external_api_call",
		"--tool-permission", "read_doc=docs.read:{path}")
	rf("graphs", "create", "--graph", "triage", "--agent", "researcher")
	rf("mcp-import", "--server", "docs-search", "--graph", "triage", "--agent", "researcher", "--tool", "search_docs", "--tool", "read_doc")
	rf("graphs", "mount", "--graph", "triage", "--agent", "researcher", "--server", "docs-search", "--include-tool", "search_docs", "--include-tool", "read_doc")
	rf("graphs", "settings", "--graph", "triage", "--agent", "researcher", "--defer-tools", "--confirmation-default", "none")

	// The documents step.
	receipt := filepath.Join(dir, "receipt.txt")
	const text = "Taxi to the airport: 42.50 EUR, 3 March.\n"
	require.NoError(t, os.WriteFile(receipt, []byte(text), 0o600))
	doc := strings.TrimSpace(rf("documents", "put", receipt))
	rf("mcp-import", "--server", "docs-search", "--graph", "triage", "--agent", "researcher", "--tool", "read_upload")
	rf("graphs", "mount", "--graph", "triage", "--agent", "researcher", "--server", "docs-search",
		"--include-tool", "search_docs", "--include-tool", "read_doc", "--include-tool", "read_upload")
	rf("graphs", "settings", "--graph", "triage", "--agent", "researcher", "--defer-tools=false", "--document-resolver", "--document-servers", "docs-search")
	rf("graphs", "publish", "--graph", "triage")
	run := strings.TrimSpace(rf("runs", "start", "--graph", "triage"))
	out := rf("runs", "call", "--run", run, "--agent", "researcher", "--tool", "docs-search__read_upload", "--args", `{"content":"my-documents://`+doc+`"}`)
	require.Contains(t, out, "dispatched: succeeded (docs-search/read_upload")
	var got struct {
		Bytes int    `json:"bytes"`
		Text  string `json:"text"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.Split(strings.TrimSpace(out), "\n")[1]), &got), out)
	require.Equal(t, text, got.Text, "the server got the document's content")
	require.Equal(t, len(text), got.Bytes)
	rf("runs", "end", "--run", run)

	var trail string
	require.Eventually(t, func() bool {
		trail = rf("audit", "export")
		return strings.Contains(trail, `"result":"succeeded"`) && strings.Contains(trail, "read_upload")
	}, 10*time.Second, 50*time.Millisecond, "the call's outcome reaches the audit log")
	require.NotContains(t, trail, "42.50")
	require.NotContains(t, trail, base64.StdEncoding.EncodeToString([]byte(text)))
}
