package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRemoteURLCredentialStaysMaskedThroughTheCLI: a remote server registered with a
// credential in its URL's query. The real CLI and daemon never print it (add, show, list, JSON
// or table, a refusal), an update through the CLI (which sends back the masked URL it read)
// keeps the stored URL, and neither the daemon's logs nor registry.db hold it.
func TestRemoteURLCredentialStaysMaskedThroughTheCLI(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	cli := func(args ...string) result {
		return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), args...)
	}
	const masked = "https://tickets.example.com/mcp?api_key=********&region=********"
	var printed []string
	r := cli("servers", "add", "tickets", "--transport", "http", "--url", "https://tickets.example.com/mcp?api_key="+canary+"&region=eu")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, masked)
	printed = append(printed, r.Stdout, r.Stderr)

	r = cli("servers", "update", "tickets", "--description", "The ticket system", "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var s map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &s))
	require.Equal(t, masked, s["url"], "an update that does not pass --url keeps the stored URL")
	require.Equal(t, "The ticket system", s["description"])
	printed = append(printed, r.Stdout, r.Stderr)

	for _, args := range [][]string{{"servers", "show", "tickets"}, {"servers", "list"}, {"servers", "list", "-o", "json"}} {
		r = cli(args...)
		require.Equal(t, 0, r.Code, r.Stderr)
		require.Contains(t, r.Stdout, "api_key=****") // the table clips the target
		printed = append(printed, r.Stdout, r.Stderr)
	}

	r = cli("servers", "add", "plain", "--transport", "http", "--url", "http://tickets.example.com/mcp?api_key="+canary)
	require.Equal(t, 1, r.Code, r.Stdout)
	require.Contains(t, r.Stderr, "must use https")
	printed = append(printed, r.Stdout, r.Stderr)

	for _, out := range printed {
		require.NotContains(t, out, canary)
	}
	require.NotContains(t, d.Logs.String(), canary)
	raw, err := os.ReadFile(filepath.Join(d.DataDir, "registry.db"))
	require.NoError(t, err)
	require.False(t, strings.Contains(string(raw), canary), "registry.db holds the URL's credential in clear")
}
