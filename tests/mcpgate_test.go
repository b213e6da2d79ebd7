package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goCmd runs the go command in dir with env added, failing the test with its output.
func goCmd(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// TestMCPGateImportsNothingOfRingfence: the mcpgate module, its tests included, builds on the
// MCP go-sdk, the JSON Schema validator, golang.org/x/text and the standard library: no Docker,
// gRPC, bbolt, Prometheus, or any package of Ringfence's own module.
func TestMCPGateImportsNothingOfRingfence(t *testing.T) {
	deps := goCmd(t, bins.root, nil, "list", "-deps", "-test", "./mcpgate/...")
	for _, pkg := range strings.Fields(deps) {
		for _, banned := range []string{"github.com/moby/", "github.com/docker/", "github.com/containerd/", "google.golang.org/grpc",
			"google.golang.org/protobuf", "go.etcd.io/bbolt", "github.com/prometheus/"} {
			require.False(t, strings.HasPrefix(pkg, banned), "mcpgate depends on %s", pkg)
		}
		if strings.HasPrefix(pkg, "github.com/ringfence/ringfence/") {
			require.True(t, strings.HasPrefix(pkg, "github.com/ringfence/ringfence/mcpgate"), "mcpgate depends on %s", pkg)
		}
	}
	require.Contains(t, deps, "github.com/modelcontextprotocol/go-sdk/mcp")
	require.Contains(t, deps, "github.com/santhosh-tekuri/jsonschema/v6")
}

// TestEmbedExampleBuildsOutsideTheRepository builds examples/embed as a module of its own in
// a directory outside the checkout, with only a replace that points at mcpgate, and runs it
// against the demo docs server: the import path works without the rest of Ringfence.
func TestEmbedExampleBuildsOutsideTheRepository(t *testing.T) {
	root := bins.root
	dir, mods := buildOutside(t, "embed", "mcpgate")
	require.NotContains(t, mods, "github.com/ringfence/ringfence ", "the rest of Ringfence is not a dependency")
	require.NotContains(t, mods, "github.com/moby/")
	require.NotContains(t, mods, "google.golang.org/grpc")

	server := filepath.Join(dir, "docs-mcp")
	goCmd(t, root, nil, "build", "-o", server, "./examples/docs-mcp")
	out, err := exec.Command(filepath.Join(dir, "embed"), "-server", server).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "bound mcp/read_doc v1 pin=v1:sha256:")
	require.Contains(t, string(out), "permissions=[docs.read:{path}]")
	require.Contains(t, string(out), "allowed: Employees accrue 2 days of leave per month.")
	require.Contains(t, string(out), `refused: mcpgate: tool "read_doc" requires permissions not granted: docs.read:/restricted/payroll.md`)
	require.Contains(t, string(out), `refused: mcpgate: tool "search_docs": it was given no permissions, and calls are default-deny`)

	// Run with the server not built (its comment's first command skipped), it says how to
	// build it.
	out, err = exec.Command(filepath.Join(dir, "embed"), "-server", filepath.Join(dir, "missing", "docs-mcp")).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "build the demo server with `go build -o /tmp/docs-mcp ./examples/docs-mcp` and pass -server /tmp/docs-mcp")
}

// buildOutside builds examples/<example> as a module of its own in a directory outside the
// checkout, whose one requirement is the repository's module in directory module (mcpgate,
// gen/go), replaced by its path. That module's checksums are the program's: the modules they
// name are all the tidy and the build may use (they run with the proxy off), so neither may
// reach for anything the module does not already need. It
// returns the directory, which holds the binary named example, and `go list -m all` there.
func buildOutside(t *testing.T, example, module string) (dir, mods string) {
	t.Helper()
	root := bins.root
	dir = t.TempDir()
	src, err := os.ReadFile(filepath.Join(root, "examples", example, "main.go"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), src, 0o600))
	path := "github.com/ringfence/ringfence/" + module
	gomod := "module example.com/" + example + "\n\ngo 1.26.0\n\nrequire " + path + " v0.0.0\n\n" +
		"replace " + path + " => " + filepath.Join(root, filepath.FromSlash(module)) + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o600))
	sums, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(module), "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o600))
	// The module cache is given every module the go.sum names, and nothing else, from the
	// machine's proxy: a fresh machine's cache holds only what the repository's own builds
	// needed, which leaves out modules the module's graph names for their tests alone.
	var named []string
	seen := map[string]bool{}
	for line := range strings.Lines(string(sums)) {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		if mod := f[0] + "@" + strings.TrimSuffix(f[1], "/go.mod"); !seen[mod] {
			seen[mod] = true
			named = append(named, mod)
		}
	}
	goCmd(t, t.TempDir(), []string{"GOWORK=off", "GOFLAGS="}, append([]string{"mod", "download"}, named...)...)
	offline := []string{"GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off"}
	goCmd(t, dir, offline, "mod", "tidy")
	goCmd(t, dir, offline, "build", "-o", example, ".")
	return dir, goCmd(t, dir, []string{"GOWORK=off"}, "list", "-m", "all")
}
