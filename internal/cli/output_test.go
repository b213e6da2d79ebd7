package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

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
	require.Contains(t, printed, `read\x1b]0;pwned\x07`)
	require.Contains(t, printed, `\u009b31m`)
	require.Contains(t, printed, "hidden_unicode", "the findings still print")
}
