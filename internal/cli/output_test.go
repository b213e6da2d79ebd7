package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
)

// TestServerChosenTextCannotDriveTheTerminal: escape sequences in a hostile declaration
// (a window-title OSC, a "conceal" SGR hiding the findings below, a C1 CSI) print as
// visible escapes, in tables and in `servers explore`.
func TestServerChosenTextCannotDriveTheTerminal(t *testing.T) {
	const osc, conceal, c1 = "\x1b]0;pwned\a", "\x1b[8m", "\u009b31m"
	schema, err := structpb.NewStruct(map[string]any{"description": "x" + c1})
	require.NoError(t, err)
	var out bytes.Buffer
	g := &globals{stdout: &out}
	g.printExplored(&registryv1.ExploreServerResponse{Tools: []*typesv1.ToolDeclaration{{
		Name: "read" + osc, Title: "t" + conceal, Description: "d" + conceal, InputSchema: schema,
		Findings: []*typesv1.Finding{{Severity: "warning", Code: "hidden_unicode", Location: "description", Message: "m" + c1}},
	}}})
	tbl := newTable(&out, "NAME")
	tbl.row("n" + osc)
	require.NoError(t, tbl.flush())

	printed := out.String()
	for _, raw := range []string{"\x1b", "\a", "\u009b"} {
		require.NotContains(t, printed, raw)
	}
	require.Contains(t, printed, `read\u001b]0;pwned\u0007`)
	require.Contains(t, printed, `\u009b31m`)
	require.Contains(t, printed, "hidden_unicode", "the findings still print")
}

// TestDescribeRecordNamesWhatTheCallNamed: a call refused before its binding resolved has no
// server; its line shows the binding asked for, not "agent→/tool".
func TestDescribeRecordNamesWhatTheCallNamed(t *testing.T) {
	rec := func(server string) *auditv1.Record {
		return &auditv1.Record{Kind: "tool_call", Event: &auditv1.Record_ToolCall{ToolCall: &auditv1.ToolCallAttempt{
			RunId: "r1", AgentNode: "researcher", ServerRef: server, ToolName: "docs__search", CallId: "c1", Attempt: 1,
			Outcome: "refused_before_dispatch", Reason: "unknown_run"}}}
	}
	what, outcome := describeRecord(rec(""))
	require.Equal(t, "run r1 researcher→docs__search call c1#1", what)
	require.Equal(t, "refused_before_dispatch: unknown_run", outcome)
	what, _ = describeRecord(rec("docs"))
	require.Equal(t, "run r1 researcher→docs/docs__search call c1#1", what)

	admin := func(name string) *auditv1.Record {
		return &auditv1.Record{Kind: "admin", Event: &auditv1.Record_Admin{Admin: &auditv1.AdminEvent{
			ActorKeyId: "key_0a1b", ActorKeyName: name, ActorRole: "operator", Action: "create", ResourceType: "mcp_server", ResourceId: "docs"}}}
	}
	what, _ = describeRecord(admin("ops"))
	require.Equal(t, "create mcp_server docs by key:ops (operator, key_0a1b)", what, "what the key is, and its id")
	what, _ = describeRecord(admin(""))
	require.Equal(t, "create mcp_server docs by key:key_0a1b (operator)", what, "a record from before names were recorded")
}
