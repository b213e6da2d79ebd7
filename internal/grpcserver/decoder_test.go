package grpcserver

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
)

// TestDecodeErrorsNameTheFieldNeverTheValue: bodies carry secrets, so a value that does not
// decode is described by its field and the type expected, and never quoted.
func TestDecodeErrorsNameTheFieldNeverTheValue(t *testing.T) {
	const secret = "sk-live-0123456789"
	m := newJSONMarshaler()
	decode := func(body string, msg any) error {
		return m.NewDecoder(strings.NewReader(body)).Decode(msg)
	}
	for _, tc := range []struct {
		name, body, want string
		msg              any
	}{
		{"secret value as a number", `{"value": 12345678}`, `field "value": expected a string`, &registryv1.PutSecretRequest{}},
		{"env as a string", `{"ref":"a","env":"APP_TOKEN=` + secret + `"}`, `field "env": expected an object`, &registryv1.CreateServerRequest{}},
		{"nested field", `{"ref":"a","tool_filter":{"include":"` + secret + `"}}`, `field "tool_filter.include": expected a list, each a string`, &registryv1.CreateServerRequest{}},
		{"map value", `{"ref":"a","headers":{"Authorization":["` + secret + `"]}}`, `field "headers": expected an object whose values are a string`, &registryv1.CreateServerRequest{}},
		{"duration", `{"ref":"a","tool_call_timeout":"` + secret + `"}`, `field "tool_call_timeout": expected a duration string`, &registryv1.CreateServerRequest{}},
		{"a fraction for an integer", `{"ref":"a","prewarm":1.5}`, `field "prewarm": expected a whole number (e.g. 2 or "2")`, &registryv1.CreateServerRequest{}},
		{"text for an int64", `{"ref":"a","max_result_bytes":"` + secret + `"}`, `field "max_result_bytes": expected a whole number (e.g. 2 or "2")`, &registryv1.CreateServerRequest{}},
		{"unknown field", `{"ref":"a","colour":"` + secret + `"}`, `unknown field "colour"`, &registryv1.CreateServerRequest{}},
		{"syntax", `{"value": "` + secret + `",`, "not valid JSON", &registryv1.PutSecretRequest{}},
		// protojson refuses a key given twice (either could be the one meant) and bytes that
		// are not UTF-8; encoding/json lets both through, so they read as a type mismatch.
		{"top-level key twice", `{"ref":"a","ref":"` + secret + `","command":"x"}`, `field "ref" is given twice: send each key of an object once`, &registryv1.CreateServerRequest{}},
		{"map key twice", `{"ref":"a","command":"x","env":{"APP_TOKEN":"one","APP_TOKEN":"` + secret + `"}}`, `field "env.APP_TOKEN" is given twice`, &registryv1.CreateServerRequest{}},
		{"nested key twice", `{"ref":"a","tool_filter":{"include":["a"],"include":["` + secret + `"]}}`, `field "tool_filter.include" is given twice`, &registryv1.CreateServerRequest{}},
		{"key twice in arguments", `{"run_id":"r","arguments":{"q":[{"k":1,"k":2}]}}`, `field "arguments.q[0].k" is given twice`, &poolv1.CallToolRequest{}},
		{"secret value not UTF-8", "{\"value\":\"" + secret + "\xff\"}", `field "value" is not valid UTF-8 (its value is not shown)`, &registryv1.PutSecretRequest{}},
		{"env value not UTF-8", "{\"ref\":\"a\",\"env\":{\"APP_TOKEN\":\"" + secret + "\xff\"}}", `field "env.APP_TOKEN" is not valid UTF-8`, &registryv1.CreateServerRequest{}},
		{"list item not UTF-8", "{\"ref\":\"a\",\"args\":[\"ok\",\"" + secret + "\xc3\"]}", `field "args[1]" is not valid UTF-8`, &registryv1.CreateServerRequest{}},
		{"key not UTF-8", "{\"ref\":\"a\",\"env\":{\"" + secret + "\xff\":\"v\"}}", `a key in field "env" is not valid UTF-8 (it is not shown)`, &registryv1.CreateServerRequest{}},
		// Inside a list or map of messages the failing field is named with its element, not
		// blamed on the list ("expected a list, each an object").
		{"unknown field in a list element", `{"graph_id":"g","draft":{"nodes":[{"id":"a","kind":"agent"},{"id":"t","mcp_tool":{"server_ref":"s","capabilities":["` + secret + `"]}}]}}`,
			`unknown field "draft.nodes[1].mcp_tool.capabilities"`, &publisherv1.ReplaceDraftRequest{}},
		{"wrong type in a list element", `{"graph_id":"g","draft":{"nodes":[{"id":"t","mcp_tool":{"schema_hash":12345678}}]}}`,
			`field "draft.nodes[0].mcp_tool.schema_hash": expected a string`, &publisherv1.ReplaceDraftRequest{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := decode(tc.body, tc.msg)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), secret)
			require.NotContains(t, err.Error(), "12345678")
		})
	}
	require.NoError(t, decode(`{"ref":"a","env":{"APP_TOKEN":"`+secret+`"}}`, &registryv1.CreateServerRequest{}))
	require.NoError(t, decode(`{"value":"pässwörd \u00e9"}`, &registryv1.PutSecretRequest{}), "UTF-8 beyond ASCII decodes")
	require.NoError(t, decode(`{"run_id":"r","arguments":{"a":{"k":1},"b":{"k":2}}}`, &poolv1.CallToolRequest{}), "one key in two objects is no duplicate")
}

// TestDeepBodiesAreRefusedByTheGateway: a body nested deeper than the gRPC server decodes
// is a 400 that says so, not a message the server then fails to decode (a 500).
func TestDeepBodiesAreRefusedByTheGateway(t *testing.T) {
	m := newJSONMarshaler()
	nested := func(levels int) string {
		return `{"run_id":"r","arguments":{"a":` + strings.Repeat("[", levels) + strings.Repeat("]", levels) + `}}`
	}
	require.NoError(t, m.NewDecoder(strings.NewReader(nested(100))).Decode(&poolv1.CallToolRequest{}))
	for _, levels := range []int{1200, 6000} {
		err := m.NewDecoder(strings.NewReader(nested(levels))).Decode(&poolv1.CallToolRequest{})
		require.ErrorContains(t, err, "nested too deeply: more than 1000 levels of arrays and objects", levels)
	}
}

// TestBodiesOfTooManyValuesAreRefused: a value decodes to ~80 times its JSON size, so a body
// is bounded in values as well as bytes, before anything is decoded; and a message that
// still decodes past the server's limit is a 413, never a 429 a client would retry.
func TestBodiesOfTooManyValuesAreRefused(t *testing.T) {
	m := newJSONMarshaler()
	body := func(n int) string {
		return `{"run_id":"r","arguments":{"x":[` + strings.Repeat("0,", n-1) + `0]}}`
	}
	require.NoError(t, m.NewDecoder(strings.NewReader(body(1000))).Decode(&poolv1.CallToolRequest{}))
	err := m.NewDecoder(strings.NewReader(body(maxBodyValues))).Decode(&poolv1.CallToolRequest{})
	require.ErrorContains(t, err, "request body too large: it holds more than 524288 JSON values")
	values, depth := shape([]byte(`{"a":[1,2],"b":{"c":"x,[{"}}`), 100, 100)
	require.Equal(t, 6, values, "commas and brackets inside strings do not count")
	require.Equal(t, 2, depth)

	// A body past the server's byte bound says the bound and what to do instead.
	rec := httptest.NewRecorder()
	bounded := http.MaxBytesReader(rec, io.NopCloser(strings.NewReader(body(5000))), 4<<10)
	err = m.NewDecoder(bounded).Decode(&poolv1.CallToolRequest{})
	require.EqualError(t, err, "request body too large: a REST body may hold at most 4 KiB; send less in one request, or use gRPC (documents: ringfence documents put, which sends chunks)")

	rec = httptest.NewRecorder()
	writeError(t.Context(), nil, nil, rec, httptest.NewRequest(http.MethodPost, "/v1/runs/r:call", nil),
		status.Error(codes.ResourceExhausted, "grpc: received message larger than max (22000000 vs. 4194304)"))
	require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
	require.Contains(t, rec.Body.String(), "send less in one request")
	require.NotContains(t, rec.Body.String(), "grpc:")
}
