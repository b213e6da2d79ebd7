package mcpgate

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/mcpgate/mcpdecl/jcs"
	"github.com/ringfence/ringfence/mcpgate/sanitize"
)

// auditorDigest is a result digest as an auditor computes it from the JSON a caller received:
// the RFC 8785 form of {"content", "isError", "structuredContent"} by jcs.Canonicalize over
// the raw JSON, not the one pass ResultDigest makes over decoded values.
func auditorDigest(t testing.TB, content json.RawMessage, isError bool, structured json.RawMessage) (string, int64) {
	t.Helper()
	if len(content) == 0 {
		content = json.RawMessage("[]")
	}
	doc := `{"content":` + string(content) + `,"isError":` + map[bool]string{true: "true", false: "false"}[isError]
	if s := strings.TrimSpace(string(structured)); s != "" && s != "null" && s != "{}" {
		doc += `,"structuredContent":` + s
	}
	canonical, err := jcs.Canonicalize([]byte(doc + "}"))
	require.NoError(t, err, doc)
	sum := sha256.Sum256(canonical)
	return "sha256:" + hex.EncodeToString(sum[:]), int64(len(canonical))
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestResultDigestOfBuiltValues: a result a program built with Go values no JSON decoder
// makes ([]string, as Ringfence's pool builds its connect tool's) has the digest of its JSON
// form, which is what the caller reads; nil content is [], an empty structured content is left
// out, and docs/api.md's worked example holds.
func TestResultDigestOfBuiltValues(t *testing.T) {
	content := []map[string]any{{"type": "text", "text": "ok"}}
	sum, size, err := ResultDigest(content, map[string]any{"tools": []string{"b", "a"}, "n": 1}, false)
	require.NoError(t, err)
	want, wantSize := auditorDigest(t, json.RawMessage(`[{"text":"ok","type":"text"}]`), false, json.RawMessage(`{"n":1,"tools":["b","a"]}`))
	require.Equal(t, want, sum)
	require.Equal(t, wantSize, size)
	// The same with JSON values, and with an empty structured content, which is left out.
	sum, _, err = ResultDigest(content, map[string]any{"tools": []any{"b", "a"}, "n": 1.0}, false)
	require.NoError(t, err)
	require.Equal(t, want, sum)
	sum, _, err = ResultDigest(content, map[string]any{}, true)
	require.NoError(t, err)
	want, _ = auditorDigest(t, json.RawMessage(`[{"type":"text","text":"ok"}]`), true, nil)
	require.Equal(t, want, sum)
	sum, size, err = ResultDigest(nil, nil, false)
	require.NoError(t, err)
	require.Equal(t, `{"content":[],"isError":false}`, string(must(canonicalResult(nil, nil, nil, false))))
	require.Equal(t, int64(len(`{"content":[],"isError":false}`)), size)
	want, _ = auditorDigest(t, nil, false, nil)
	require.Equal(t, want, sum)
	// The example docs/api.md gives.
	sum, size, err = ResultDigest([]map[string]any{{"type": "text", "text": "hello"}}, nil, false)
	require.NoError(t, err)
	require.Equal(t, "sha256:493466351f6341d054cec14e973f001dc7d66e5bb4a4177d42014725b2f7cb6b", sum)
	require.Equal(t, int64(60), size)
}

// BenchmarkResultDigest: the CPU a dispatched call's result digest costs (once per call): a
// small result, 64 KiB of text, and 64 KiB of structured content (numbers and short strings).
func BenchmarkResultDigest(b *testing.B) {
	words := strings.Repeat("lorem ipsum dolor sit amet, ", 64<<10/28+1)[:64<<10]
	rows := make([]any, 0, 2048)
	for i := range cap(rows) {
		rows = append(rows, map[string]any{"id": float64(i), "name": "row", "score": float64(i) / 7})
	}
	for _, bc := range []struct {
		name       string
		content    []map[string]any
		structured map[string]any
	}{
		{"small", []map[string]any{{"type": "text", "text": "hello"}}, map[string]any{"sum": 42.0}},
		{"text-64KiB", []map[string]any{{"type": "text", "text": words}}, nil},
		{"structured-64KiB", []map[string]any{{"type": "text", "text": "2048 rows"}}, map[string]any{"rows": rows}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			_, size, err := ResultDigest(bc.content, bc.structured, false)
			require.NoError(b, err)
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := ResultDigest(bc.content, bc.structured, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestTheDigestOfAResultNestedAsDeepAsItIsDelivered: a server's result whose content item or
// structured content nests as deep as the output checks pass on (sanitize.MaxDepth levels,
// counted from the item or the structured content, as they are checked) reaches its caller,
// so it has a digest: the canonical form's depth is counted from the same place, not from
// the content list around the items, which would refuse an item one level short of what is
// delivered and leave the record without a digest.
func TestTheDigestOfAResultNestedAsDeepAsItIsDelivered(t *testing.T) {
	spec := &ToolSpec{Name: "deep"}
	// nest is n objects, each the only member "a" of the one around it, around 1.
	nest := func(n int) string {
		return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n)
	}
	for _, tc := range []struct{ name, raw, canonical string }{
		{
			"a content item",
			`{"content":[{"type":"text","text":"x","_meta":` + nest(sanitize.MaxDepth-1) + `}]}`,
			`{"content":[{"_meta":` + nest(sanitize.MaxDepth-1) + `,"text":"x","type":"text"}],"isError":false}`,
		},
		{
			"the structured content",
			`{"content":[],"structuredContent":` + nest(sanitize.MaxDepth) + `}`,
			`{"content":[],"isError":false,"structuredContent":` + nest(sanitize.MaxDepth) + `}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ProcessRawResult(spec, json.RawMessage(tc.raw))
			require.NoError(t, err, "the result is delivered")
			sum, size, err := got.Digest()
			require.NoError(t, err, "a result delivered has a digest")
			want := sha256.Sum256([]byte(tc.canonical))
			require.Equal(t, "sha256:"+hex.EncodeToString(want[:]), sum)
			require.Equal(t, int64(len(tc.canonical)), size)
		})
	}
	// One level deeper is not delivered at all.
	_, err := ProcessRawResult(spec, json.RawMessage(`{"content":[{"type":"text","text":"x","_meta":`+nest(sanitize.MaxDepth)+`}]}`))
	require.ErrorContains(t, err, "nested too deeply")
}
