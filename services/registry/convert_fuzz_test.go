package registry

import (
	"regexp"
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate/capability"
)

var fuzzRef = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// FuzzCreateServerRequest drives the REST body decoder (the gateway's protojson settings) and
// the validator with arbitrary bytes: nothing panics, every refusal names a field, and every
// accepted registration satisfies the invariants the rest of the system relies on.
func FuzzCreateServerRequest(f *testing.F) {
	for _, seed := range []string{
		`{"ref":"docs-search","command":"npx","args":["-y","@modelcontextprotocol/server-filesystem","/srv/docs"],"env":{},"grants":["process_spawn","external_api_call"]}`,
		`{"ref":"tickets","transport":"streamable_http","url":"https://mcp.example.com/mcp","headers":{"Authorization":"tickets-token"}}`,
		`{"ref":"x","command":"a","env":{"APP_TOKEN":1}}`,
		`{"ref":"x","command":"a","tool_permissions":{"read_file":{"required":["fs.read:{path}"]}}}`,
		`{"ref":"x","command":"a","client_session_timeout":"5s","bogus":true}`,
		`{"ref":"BAD"}`, `[]`, `{`, `null`,
	} {
		f.Add([]byte(seed))
	}
	allowed := []string{"APP_TOKEN", "REGION"}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req registryv1.CreateServerRequest
		if err := (protojson.UnmarshalOptions{}).Unmarshal(body, &req); err != nil {
			return // the gateway answers 400 with the decoder's message
		}
		reg, _, err := registrationFromProto(&req, allowed)
		if err != nil {
			fe, ok := fielderr.As(err)
			require.True(t, ok, "refusal without a field: %v", err)
			require.NotEmpty(t, fe.Field)
			return
		}
		require.Regexp(t, fuzzRef, reg.Ref)
		require.Contains(t, []string{mcpserver.TransportStdio, mcpserver.TransportStreamableHTTP, mcpserver.TransportSSE}, reg.Transport)
		for k, v := range reg.Env {
			require.True(t, slices.Contains(allowed, k))
			require.True(t, utf8.ValidString(v))
		}
		for _, g := range reg.Grants {
			_, err := capability.Parse(g)
			require.NoError(t, err)
		}
		if reg.Transport == mcpserver.TransportStdio {
			require.NotEmpty(t, reg.Command)
			require.Empty(t, reg.URL)
		} else {
			require.NotEmpty(t, reg.URL)
			require.Empty(t, reg.Env)
		}
		require.NotNil(t, serverToProto(reg))
	})
}
