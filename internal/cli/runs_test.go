package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"
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
}
