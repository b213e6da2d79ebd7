package mcpgate

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// BenchmarkCallTool is the whole gated path of one call on an in-memory session (a stub that
// answers at once, so only the gate is measured): the capability gate with an argument-scoped
// permission, input validation of five arguments, the drift check, invoke, output validation
// and the sanitization of a 1 KiB result.
func BenchmarkCallTool(b *testing.B) {
	spec := &ToolSpec{
		Name: "search",
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"path":{"type":"string"},"query":{"type":"string","maxLength":200},"limit":{"type":"integer","minimum":1,"maximum":100},
			"exact":{"type":"boolean"},"tags":{"type":"array","items":{"type":"string"}}},"required":["path","query"]}`),
		OutputSchema: json.RawMessage(`{"type":"object","properties":{"hits":{"type":"integer"},"truncated":{"type":"boolean"}},"required":["hits"]}`),
		Permissions:  []string{"fs.read:{path}"},
	}
	spec.compile()
	tools := []*mcp.Tool{{Name: spec.Name, InputSchema: spec.InputSchema, OutputSchema: spec.OutputSchema}}
	live := ListingOf(tools)
	spec.Pin = live[spec.Name]
	body := strings.Repeat("A result line with <b>markup</b> to escape. ", 23)[:1000]
	s := &stubSession{result: &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: body}},
		StructuredContent: map[string]any{"hits": 12.0, "truncated": false}, // as a session decodes it
	}}
	// Arguments as a caller has them from a model: decoded JSON.
	var args map[string]any
	require.NoError(b, json.Unmarshal([]byte(`{"path":"/srv/docs/guide.md","query":"install","limit":10,"exact":false,"tags":["a","b"]}`), &args))
	caps := Capabilities{Claims: []Claim{{Namespace: "fs.read", Scope: "/srv/docs/**"}}}
	res, err := CallTool(b.Context(), s, spec, args, caps, WithDrift(live))
	require.NoError(b, err)
	require.Greater(b, res.Size, 1024)
	opts := []CallOption{WithDrift(live)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := CallTool(b.Context(), s, spec, args, caps, opts...); err != nil {
			b.Fatal(err)
		}
	}
}
