package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// helloDigest is docs/api.md's worked example: one text item "hello", no structured content.
const helloDigest = "sha256:493466351f6341d054cec14e973f001dc7d66e5bb4a4177d42014725b2f7cb6b"

// TestAKeptResultHasTheDigestInEveryFormACallAnswers: the same result, kept as an MCP result
// (bare, or in its JSON-RPC response, naming its call in _meta), as the JSON of runs call -o
// json (is_error false and structured content null, written out) and as a REST body, has
// docs/api.md's worked digest; an empty structured content is left out, a present one counts,
// and a missing isError is false.
func TestAKeptResultHasTheDigestInEveryFormACallAnswers(t *testing.T) {
	for name, tc := range map[string]struct {
		raw, callID string
	}{
		"mcp":      {`{"content":[{"type":"text","text":"hello"}]}`, ""},
		"json-rpc": {`{"jsonrpc":"2.0","id":3,"result":{"content":[{"text":"hello","type":"text"}],"isError":false,"_meta":{"io.ringfence/call":{"call_id":"call-1","attempt":1}}}}`, "call-1"},
		"cli json": {"{\n  \"call_id\": \"c-9\",\n  \"attempt\": 1,\n  \"content\": [\n    {\n      \"text\": \"hello\",\n      \"type\": \"text\"\n    }\n  ],\n  \"structured_content\": null,\n  \"is_error\": false\n}\n", "c-9"},
		"rest":     {`{"call_id":"c-10","content":[{"type":"text","text":"hello"}],"structured_content":{},"result_digest":"ignored"}`, "c-10"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := parseKeptResult([]byte(tc.raw))
			require.NoError(t, err)
			require.Equal(t, keptResult{digest: helloDigest, size: 60, callID: tc.callID}, got)
		})
	}

	withStructured, err := parseKeptResult([]byte(`{"content":[{"type":"text","text":"hello"}],"structuredContent":{"n":1}}`))
	require.NoError(t, err)
	require.NotEqual(t, helloDigest, withStructured.digest)
	require.Equal(t, int64(60+len(`,"structuredContent":{"n":1}`)), withStructured.size)
	asError, err := parseKeptResult([]byte(`{"content":[{"type":"text","text":"hello"}],"is_error":true}`))
	require.NoError(t, err)
	require.Equal(t, int64(59), asError.size, `"isError":true is a byte shorter than false`)
	require.NotEqual(t, helloDigest, asError.digest)
}

// TestAKeptResultThatIsNoResultIsRefusedSayingWhy: text that is not a tool call's result gets a
// message naming what is wrong, not a digest of something else.
func TestAKeptResultThatIsNoResultIsRefusedSayingWhy(t *testing.T) {
	for raw, want := range map[string]string{
		`not json`:                               "is not a JSON object",
		`[1,2]`:                                  "is not a JSON object",
		`{"jsonrpc":"2.0","id":1,"error":{}}`:    "has no content",
		`{"jsonrpc":"2.0","id":1,"result":"x"}`:  "without a result object",
		`{"result":"succeeded","call_id":"c"}`:   "has no content",
		`{"content":{"type":"text"}}`:            "content is not a list",
		`{"content":[],"isError":"yes"}`:         "isError is not true or false",
		`{"content":[],"structuredContent":[1]}`: "structured content is not an object",
		`{"content":[{"n":1e400}]}`:              "no canonical JSON form",
		"{\"content\":[{\"text\":\"\xff\"}]}":    "no canonical JSON form",
	} {
		_, err := parseKeptResult([]byte(raw))
		require.ErrorContains(t, err, want, raw)
	}
}
