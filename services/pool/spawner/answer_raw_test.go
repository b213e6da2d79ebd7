package spawner

import (
	"encoding/json"
	"runtime"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
)

// TestRawAnswersAndTheResultCap: a local server's answer reaches CallToolRaw as the server
// wrote it, holding its size in the result budget until it is released; an answer past the
// registration's cap fails its call alone, unread, and the session goes on.
func TestRawAnswersAndTheResultCap(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	budget, err := NewBudget(8<<20, 0)
	require.NoError(t, err)
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs, func(c *Config) { c.ResultBudget = budget })
	spec := hostSpec(fixture, "--runtime-tools")
	spec.MaxResultBytes = 1 << 20
	s := spawn(t, r, spec)
	blob := func(n int) *mcp.CallToolParams {
		return &mcp.CallToolParams{Name: "blob", Arguments: map[string]any{"bytes": n}}
	}

	ans, err := s.CallToolRaw(t.Context(), blob(200_000))
	require.NoError(t, err)
	require.Nil(t, ans.Result, "nothing decoded it")
	var res struct {
		Content []struct{ Text string } `json:"content"`
	}
	require.NoError(t, json.Unmarshal(ans.Raw, &res))
	require.Len(t, res.Content[0].Text, 200_000)
	require.Greater(t, budget.InUse(), int64(200_000), "the answer holds its size until it is released")
	ans.Release()
	require.Zero(t, budget.InUse())

	_, err = s.CallToolRaw(t.Context(), blob(3<<20))
	require.True(t, IsTooLarge(err), "%v", err)
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, int64(1<<20), e.Limit)
	require.False(t, e.OverBudget)
	require.Zero(t, budget.InUse())
	require.NoError(t, s.Err(), "the session goes on")

	ans, err = s.CallToolRaw(t.Context(), blob(10))
	require.NoError(t, err, "the next call on the same session works")
	require.Contains(t, string(ans.Raw), `"lorem ipsu"`)
	ans.Release()
	full, err := s.CallTool(t.Context(), blob(10))
	require.NoError(t, err, "CallTool still decodes as the SDK does")
	require.Equal(t, "lorem ipsu", full.Content[0].(*mcp.TextContent).Text)
}

// TestRawAnswerIsNotDecoded: a CallToolRaw call on a local server costs the client no decoding
// of the answer: the SDK is handed a stand-in it returns as it is, where decoding even an
// empty result takes it two decoder buffers of 32 KiB. Measured as bytes allocated per call
// by this process (the server is a process of its own) against the lean server.
func TestRawAnswerIsNotDecoded(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	var logs testutil.SyncBuffer
	s := spawn(t, hostRouter(t, &logs), hostSpec(fixture, "--lean"))
	params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "ping"}}
	call := func() {
		ans, err := s.CallToolRaw(t.Context(), params)
		require.NoError(t, err)
		require.JSONEq(t, `{"content":[{"type":"text","text":"ping"}]}`, string(ans.Raw))
		ans.Release()
	}
	call()
	const calls = 200
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range calls {
		call()
	}
	runtime.ReadMemStats(&after)
	perCall := (after.TotalAlloc - before.TotalAlloc) / calls
	t.Logf("%d bytes allocated per raw call", perCall)
	require.Less(t, perCall, uint64(32<<10), "bytes allocated per raw call")
	ans, err := s.CallTool(t.Context(), params)
	require.NoError(t, err, "CallTool still decodes as the SDK does")
	require.Equal(t, "ping", ans.Content[0].(*mcp.TextContent).Text)
}
