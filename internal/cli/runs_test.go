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

// TestACallWithoutAServerNamesTheToolAlone: tool_search and the connect tools answer for no
// server, and the line says so rather than "(/tool_search, …".
func TestACallWithoutAServerNamesTheToolAlone(t *testing.T) {
	var out bytes.Buffer
	g := &globals{stdout: &out}
	require.NoError(t, g.printCallResult(&poolv1.CallToolResponse{Result: "succeeded", ToolName: "mcp_oauth_connect_tickets", CallId: "call-1", Attempt: 1}))
	require.Contains(t, out.String(), "dispatched: succeeded (mcp_oauth_connect_tickets, call call-1 attempt 1, 0s)\n")
	out.Reset()
	require.NoError(t, g.printCallResult(&poolv1.CallToolResponse{Result: "succeeded", ServerRef: "docs", ToolName: "read_doc", CallId: "call-2", Attempt: 1}))
	require.Contains(t, out.String(), "dispatched: succeeded (docs/read_doc, call call-2 attempt 1, 0s)\n")
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
