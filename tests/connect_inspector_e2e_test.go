package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunsConnectPrintsAnInspectorLineThatWorks: the MCP Inspector command line runs connect
// prints names the Inspector version scripts/mcp-clients.sh pins (npx without a version runs
// whatever its cache holds, and an old Inspector refuses the line), and that line, run as
// printed with npx answered by the pinned Inspector, lists the agent's tools.
func TestRunsConnectPrintsAnInspectorLineThatWorks(t *testing.T) {
	pins, err := os.ReadFile(filepath.Join(bins.root, "scripts", "mcp-clients.sh"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^INSPECTOR_VERSION=(\S+)`).FindSubmatch(pins)
	require.NotNil(t, m, "scripts/mcp-clients.sh pins INSPECTOR_VERSION")
	pkg := "@modelcontextprotocol/inspector@" + string(m[1])

	d, _ := poolDaemon(t)
	cli := adminCLI(t, d)
	cli("servers", "add", "docs", "--command", "mcpfixture", "--grant", "process_spawn", "--grant", "external_api_call")
	cli("graphs", "create", "--graph", "desk", "--agent", "researcher")
	cli("mcp-import", "--server", "docs", "--graph", "desk", "--agent", "researcher", "--tool", "echo")
	cli("graphs", "publish", "--graph", "desk")
	cli("runs", "start", "--graph", "desk", "--run", "r1")
	out := cli("runs", "connect", "--run", "r1", "--agent", "researcher")
	_, after, ok := strings.Cut(out, "MCP Inspector:\n")
	require.True(t, ok, out)
	line, _, _ := strings.Cut(strings.TrimSpace(after), "\n")
	require.True(t, strings.HasPrefix(line, "npx "+pkg+" --cli "), "the line names the pinned Inspector: %s", line)

	inspector, env := mcpClient(t, "inspector", "mcp-inspector")
	script := `npx() { [ "$1" = "` + pkg + `" ] || { echo "npx got $1" >&2; return 9; }; shift; "$INSPECTOR" "$@"; }; ` + line
	r := runCmd(t, nil, append(env, "INSPECTOR="+inspector), "bash", "-c", script)
	require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stdout, `"name": "docs__echo"`)
	cli("runs", "end", "--run", "r1")
}
