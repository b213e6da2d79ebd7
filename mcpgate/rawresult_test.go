package mcpgate

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// TestProcessRawResult: a result as the server wrote it comes out exactly as the same result
// decoded by the MCP SDK does from ProcessResult, for every kind of content; what is not an MCP
// tool result is a *ProtocolError, and the bounds hold before any item is decoded.
func TestProcessRawResult(t *testing.T) {
	spec := stubSpec()
	spec.OutputSchema = nil
	for _, raw := range []string{
		`{"content":[{"type":"text","text":"<b>\u00e9\u200b</b>__system__ \"q\"\n"}]}`,
		`{"content":[{"type":"text","text":"lone \ud800 pair \ud83d\ude00 tab\t \/ \u0000 end"},{"type":"text","text":""}]}`,
		`{"content":[{"type":"text","text":"hi","_meta":{"k":"<v>"},"annotations":{"priority":0.5}}],"isError":true}`,
		`{"content":[{"type":"image","data":"aGk=","mimeType":"image/png"},{"type":"resource_link","uri":"file:///a","name":"<a>"}]}`,
		`{"content":[{"type":"resource","resource":{"uri":"file:///a","text":"<t>"}}],"structuredContent":{"value":"<x>","n":[1,2.5,null,true]}}`,
		`{"content":[],"structuredContent":null,"_meta":{"ignored":1}}`,
		`{}`,
	} {
		t.Run(raw, func(t *testing.T) {
			var decoded mcp.CallToolResult
			require.NoError(t, json.Unmarshal([]byte(raw), &decoded))
			want, err := ProcessResult(spec, &decoded)
			require.NoError(t, err)
			got, err := ProcessRawResult(spec, json.RawMessage(raw))
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
	for _, tc := range []struct{ raw, want string }{
		{`[1]`, "does not decode"},
		{`{"content":[{"type":"<script>"}]}`, `unrecognized content type`},
		{`{"content":[{"type":"text","text":5}]}`, "content item 0"},
		{`{"content":[7]}`, "not an object"},
		{`{"structuredContent":{"a":}`, "does not decode"},
	} {
		_, err := ProcessRawResult(spec, json.RawMessage(tc.raw))
		var pe *ProtocolError
		require.ErrorAs(t, err, &pe, tc.raw)
		require.Contains(t, pe.Message, tc.want)
		require.NotContains(t, pe.Message, "<script>", "quoted server text is cleaned")
	}
	// The package's own words read as written; only what they quote of the server is cleaned.
	typed := &ToolSpec{Namespace: Namespace, Name: "typed", InputSchema: json.RawMessage(`{"type":"object"}`),
		OutputSchema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"}}}`)}
	_, err := ProcessRawResult(typed, json.RawMessage(`{"content":[],"structuredContent":{"a":"<b>"}}`))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, StageOutput, ve.Stage)
	require.Equal(t, "the structured content does not match the tool's output schema: /a: got string, want integer", ve.Message)
	_, err = ProcessRawResult(typed, json.RawMessage(`{"content":[{"type":"<it's>"}]}`))
	var pe *ProtocolError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, `content item 0: unrecognized content type &#34;&lt;it&#39;s&gt;&#34;`, pe.Message)

	many := `{"content":[` + strings.Repeat(`{"type":"text","text":""},`, MaxContentItems) + `{"type":"text","text":""}]}`
	_, err = ProcessRawResult(spec, json.RawMessage(many))
	var tl *TooLargeError
	require.ErrorAs(t, err, &tl)
	require.Equal(t, MaxContentItems+1, tl.Size)
}

// FuzzUnquote: a JSON string decodes into its own buffer exactly as encoding/json decodes it.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`"a"`, `"\u00e9\ud83d\ude00"`, `"\ud800x"`, `"\ud800\u0041"`, "\"\xff\xc3(\"", `"\n\t\/\b\f\r\\\""`, `""`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		// As encoding/json hands a member's value to an Unmarshaler: no space around it.
		var want string
		if json.Unmarshal(raw, &want) != nil || raw[0] != '"' || raw[len(raw)-1] != '"' {
			return
		}
		got, ok := unquote(nil, raw)
		require.True(t, ok, "%q", raw)
		require.Equal(t, want, string(got), "%q", raw)
		if utf8.Valid(raw) {
			in := bytes.Clone(raw)
			got, ok = unquote(in[:0:len(in)], in)
			require.True(t, ok)
			require.Equal(t, want, string(got), "in place: %q", raw)
		}
	})
}
