package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
)

// TestAToolResultPrintsItsStructuredContentOverItsTextMirror: the text block of a structured
// result mirrors it, escaped like every text leaf; the structured JSON is what reads well.
func TestAToolResultPrintsItsStructuredContentOverItsTextMirror(t *testing.T) {
	text := func(s string) *structpb.Struct {
		c, err := structpb.NewStruct(map[string]any{"type": "text", "text": s})
		require.NoError(t, err)
		return c
	}
	structured, err := structpb.NewStruct(map[string]any{"paths": []any{"/handbook/leave.md"}})
	require.NoError(t, err)

	var out bytes.Buffer
	g := &globals{stdout: &out}
	g.printToolResult([]*structpb.Struct{text(`{&#34;paths&#34;:[&#34;/handbook/leave.md&#34;]}`)}, structured)
	require.Equal(t, "{\"paths\":[\"/handbook/leave.md\"]}\n", out.String())

	out.Reset()
	g.printToolResult([]*structpb.Struct{text("Employees accrue 2 days of leave per month.")}, nil)
	require.Equal(t, "Employees accrue 2 days of leave per month.\n", out.String())

	// A URL in a result stays one the user can copy: & is not printed as \u0026.
	connect, err := structpb.NewStruct(map[string]any{"authorization_url": "https://auth.example/authorize?a=1&b=<2>"})
	require.NoError(t, err)
	out.Reset()
	g.printToolResult(nil, connect)
	require.Equal(t, `{"authorization_url":"https://auth.example/authorize?a=1&b=<2>"}`+"\n", out.String())
}

// TestArgsErrorsPointAtTheFault: a --args that is not a JSON object is a usage error that
// names where it breaks and shows the shape it takes.
func TestArgsErrorsPointAtTheFault(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      []string
	}{
		{"shell ate the quotes", `{path:/handbook/leave.md}`, []string{"at byte 2:", "  {path:/handbook/leave.md}\n   ^", "did the shell remove them?"}},
		{"trailing comma", `{"path":"/x",}`, []string{"at byte 14:", "\n               ^"}},
		{"cut short", `{"path":`, []string{"it ends early, after byte 8"}},
		{"a list", `["/x"]`, []string{"must be a JSON object of the tool's arguments, not a list"}},
		{"empty", ``, []string{"--args is empty: give {}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseArgs(tc.raw)
			require.True(t, isUsage(err), "%v", err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.Contains(t, err.Error(), `e.g. --args '{"path":"/handbook/leave.md"}'`)
		})
	}
	got, err := parseArgs(`{"path":"/handbook/leave.md","n":2}`)
	require.NoError(t, err)
	require.Equal(t, "/handbook/leave.md", got.GetFields()["path"].GetStringValue())
}

// TestARunShowsItsUserAndHost: runs show names the user a run acts for and the pool host that
// owns it, when it has them, and says nothing of them otherwise.
func TestARunShowsItsUserAndHost(t *testing.T) {
	var out bytes.Buffer
	g := &globals{stdout: &out}
	require.NoError(t, g.printRun(&poolv1.Run{RunId: "r1", State: "running"}))
	require.NotContains(t, out.String(), "user:")
	require.NotContains(t, out.String(), "host")
	out.Reset()
	require.NoError(t, g.printRun(&poolv1.Run{RunId: "r1", State: "failed", User: "alice@example.com", Host: "ph1", HostLost: "ph1"}))
	require.Regexp(t, `(?m)^user: +alice@example.com$`, out.String())
	require.Regexp(t, `(?m)^host: +ph1$`, out.String())
	require.Regexp(t, `(?m)^host lost: +ph1 \(runs resume places the run on a live host\)$`, out.String())
}

// TestARetryNamesTheDispatchedCall: the retry that gets an approved call's result names the
// call the approver dispatched (as audit list shows it, call ID#N) beside its own.
func TestARetryNamesTheDispatchedCall(t *testing.T) {
	var out bytes.Buffer
	g := &globals{stdout: &out, output: "table"}
	require.NoError(t, g.printCallResult(&poolv1.CallToolResponse{CallId: "call-9", Attempt: 1, Result: "succeeded", ServerRef: "docs-search",
		ToolName: "search_docs", ApprovalId: "apr-1", DispatchedCallId: "call-1", DispatchedAttempt: 2}))
	require.Equal(t, "approved: the result of approval apr-1: succeeded (docs-search/search_docs, dispatched as call call-1#2 when it was approved: the server was reached once; this retry is call call-9 attempt 1)\n", out.String())
	out.Reset()
	require.NoError(t, g.printCallResult(&poolv1.CallToolResponse{CallId: "call-1", Attempt: 2, Result: "succeeded", ServerRef: "docs-search",
		ToolName: "search_docs", ApprovalId: "apr-1"}))
	require.Equal(t, "approved: the result of approval apr-1: succeeded (docs-search/search_docs, call call-1 attempt 2; the server was reached once, when it was approved)\n", out.String(),
		"the approver's answer is the dispatched call itself")
}

// TestACallNamesWhatItReached: a tool call names server/tool; tool_search, which the pool
// answers itself, is named without a server rather than as "/tool_search".
func TestACallNamesWhatItReached(t *testing.T) {
	for _, tc := range []struct {
		server, tool, want string
	}{
		{"docs-search", "read_doc", "dispatched: succeeded (docs-search/read_doc, call call-1 attempt 1, 2ms)\n"},
		{"", "tool_search", "dispatched: succeeded (tool_search, answered by Ringfence itself, call call-1 attempt 1, 2ms)\n"},
	} {
		var out bytes.Buffer
		g := &globals{stdout: &out, output: "table"}
		require.NoError(t, g.printCallResult(&poolv1.CallToolResponse{CallId: "call-1", Attempt: 1, Result: "succeeded", ServerRef: tc.server, ToolName: tc.tool, LatencyMicros: 2000}))
		require.Equal(t, tc.want, out.String())
	}
}
