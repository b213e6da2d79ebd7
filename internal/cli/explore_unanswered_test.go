package cli_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/cli"
)

// TestAnUnansweredExploreCallNamesItsCall: `servers explore --call` whose answer does not come
// within --timeout names the call by the id the CLI sent (ExploreCall.call_id), and that
// command finds the call's records, with no other search. The server is a real MCP server over
// streamable HTTP whose tool holds its call until the caller gives up.
func TestAnUnansweredExploreCallNamesItsCall(t *testing.T) {
	reached := make(chan struct{}, 1)
	release := make(chan struct{})
	mcpServer := mcp.NewServer(&mcp.Implementation{Name: "slow", Version: "1"}, nil)
	mcp.AddTool(mcpServer, &mcp.Tool{Name: "hold", Description: "Hold the call until the caller gives up."},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			select {
			case reached <- struct{}{}:
			default:
			}
			select {
			case <-ctx.Done():
			case <-release: // the test is over: Close waits for this handler
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "late"}}}, nil, nil
		})
	remote := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcpServer }, nil))
	t.Cleanup(remote.Close)
	t.Cleanup(func() { close(release) }) // before Close

	s := agentServer(t)
	// --timeout leaves the listing room on a loaded machine; the call then holds past it.
	code, _, errOut := s.cli("servers", "explore", "--url", remote.URL, "--transport", "streamable_http", "--call", "hold", "--timeout", "5s")
	require.Equal(t, cli.ExitFailed, code, errOut)
	require.Contains(t, errOut, "the explore call's outcome is unknown: no answer within --timeout 5s")
	select {
	case <-reached:
	default:
		t.Fatalf("the call never reached the server within --timeout 5s, so it has no records to find: %s", errOut)
	}
	m := regexp.MustCompile(`look up call (call-[0-9a-f]{24}) before calling again: ringfence audit list --call (\S+) \(needs audit:read\)`).FindStringSubmatch(errOut)
	require.NotNil(t, m, "the message names the call and the command that finds it:\n%s", errOut)
	require.Equal(t, m[1], m[2])
	require.NotContains(t, errOut, "--since", "the call id alone finds it")

	// The records reach the log through the pool's spool, a moment after the call.
	var out string
	require.Eventually(t, func() bool {
		out = s.must("audit", "list", "--call", m[1])
		return strings.Contains(out, "call "+m[1]+"#1")
	}, 10*time.Second, 20*time.Millisecond, "the call's records, under the id the CLI sent")
	require.Contains(t, out, "hold")
	require.Contains(t, out, "explore-", "the explore call's run")
}
