package grpcserver

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
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
		{"unknown field", `{"ref":"a","colour":"` + secret + `"}`, `unknown field "colour"`, &registryv1.CreateServerRequest{}},
		{"syntax", `{"value": "` + secret + `",`, "not valid JSON", &registryv1.PutSecretRequest{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := decode(tc.body, tc.msg)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), secret)
			require.NotContains(t, err.Error(), "12345678")
		})
	}
	require.NoError(t, decode(`{"ref":"a","env":{"APP_TOKEN":"`+secret+`"}}`, &registryv1.CreateServerRequest{}))
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
		require.ErrorContains(t, err, "nested too deeply (at most 1000 levels", levels)
	}
}
