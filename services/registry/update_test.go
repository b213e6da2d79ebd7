package registry

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/testutil"
)

// restWithHeaders sends one REST request as the admin and returns the status, the decoded
// body and the response's Warning headers.
func (f *fixture) restWithHeaders(t *testing.T, method, path, body string) (int, map[string]any, []string) {
	t.Helper()
	code, raw, header := f.restHeaders(t, method, path, adminKey, body)
	var out map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &out), raw)
	return code, out, header.Values("Warning")
}

// TestPatchChangesOnlyWhatItNames: PATCH changes the fields its body holds and keeps every
// other (env included), a PUT without grants still replaces them but says so in Warning
// headers, and a PATCH that names nothing, or something that is no field, is refused.
func TestPatchChangesOnlyWhatItNames(t *testing.T) {
	f := newFixture(t)
	_, err := f.client.CreateServer(f.admin(t), &registryv1.CreateServerRequest{
		Ref: "docs-search", Command: "docs-mcp", Description: "Handbook", Env: env("APP_TOKEN", canary),
		Grants: []string{"process_spawn", "external_api_call"},
	})
	require.NoError(t, err)

	code, body, warnings := f.restWithHeaders(t, http.MethodPatch, "/v1/mcp/servers/docs-search", `{"description":"The handbook"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "The handbook", body["description"])
	require.Equal(t, "docs-mcp", body["command"], "a field the PATCH does not hold is kept")
	require.Equal(t, []any{"process_spawn", "external_api_call"}, body["grants"])
	require.Equal(t, map[string]any{"APP_TOKEN": SecretMask}, body["env"])
	require.Empty(t, warnings)
	stored, err := f.svc.store.GetServer(t.Context(), "docs-search")
	require.NoError(t, err)
	require.Equal(t, canary, stored.Env["APP_TOKEN"], "the env value is kept, not replaced by its mask")

	// PUT keeps its replace semantics, and warns.
	code, body, warnings = f.restWithHeaders(t, http.MethodPut, "/v1/mcp/servers/docs-search", `{"command":"docs-mcp"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []any{}, body["grants"], "PUT replaced the grants")
	require.Equal(t, "", body["description"])
	require.Len(t, warnings, 2, warnings)
	require.True(t, strings.HasPrefix(warnings[0], `299 - "this PUT sent no grants, and a PUT replaces the whole registration: docs-search now grants nothing (it granted process_spawn, external_api_call)`), warnings[0])
	require.Contains(t, warnings[0], "PATCH /v1/mcp/servers/docs-search")
	require.Contains(t, warnings[1], "this registry cannot see the publisher's graphs (a split deployment), so run ringfence graphs validate --graph G")

	code, body, warnings = f.restWithHeaders(t, http.MethodPatch, "/v1/mcp/servers/docs-search", `{"grants":["process_spawn","external_api_call"]}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []any{"process_spawn", "external_api_call"}, body["grants"])
	require.Equal(t, "docs-mcp", body["command"])
	require.Empty(t, warnings, "widening strands nothing")

	// An explicit update_mask wins over the body's keys; over gRPC it is the only way.
	resp, err := f.client.UpdateServer(f.admin(t), &registryv1.UpdateServerRequest{
		Ref: "docs-search", Description: "Named", Command: "ignored", UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"description"}},
	})
	require.NoError(t, err)
	require.Equal(t, "Named", resp.GetServer().GetDescription())
	require.Equal(t, "docs-mcp", resp.GetServer().GetCommand(), "a field outside the mask is kept")
	require.Empty(t, resp.GetWarnings())

	// Named and unset clears it; env named and absent clears the env.
	resp, err = f.client.UpdateServer(f.admin(t), &registryv1.UpdateServerRequest{Ref: "docs-search", UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"env", "description"}}})
	require.NoError(t, err)
	require.Empty(t, resp.GetServer().GetEnv())
	require.Empty(t, resp.GetServer().GetDescription())

	for _, tc := range []struct{ body, want string }{
		{`{}`, "a PATCH changes the fields its body holds, and this one holds none"},
		{``, "a PATCH changes the fields its body holds, and this one holds none"},
		{`{"revision":"1"}`, "update_mask: names no field to change"},
		{`{"colour":"red"}`, `unknown field "colour"`},
		{`{"description":"x","update_mask":"ref,colour"}`, `update_mask: "colour" is not a field an update changes`},
	} {
		code, body, _ := f.restWithHeaders(t, http.MethodPatch, "/v1/mcp/servers/docs-search", tc.body)
		require.Equal(t, http.StatusBadRequest, code, tc.body)
		require.Contains(t, body["message"], tc.want, tc.body)
	}
	code, body, _ = f.restWithHeaders(t, http.MethodPatch, "/v1/mcp/servers/docs-search", `{"description":"x","revision":"1"}`)
	require.Equal(t, http.StatusConflict, code, body)
	code, body, _ = f.restWithHeaders(t, http.MethodPatch, "/v1/mcp/servers/nope", `{"description":"x"}`)
	require.Equal(t, http.StatusNotFound, code, body)

	_, err = f.client.UpdateServer(testutil.WithKey(t.Context(), f.roleKeys["operator"]), &registryv1.UpdateServerRequest{Ref: "docs-search", UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"grants"}}})
	testutil.RequireStatus(t, err, codes.PermissionDenied)
}

// TestPlaceholdersAreRefused: a secret or env value that is what documentation writes where a
// credential belongs ("...", "<token>", "changeme"), or "Bearer " with the variable after it
// unset, is refused naming the field, never quoting the value; real values and the mask that
// keeps a stored env value pass.
func TestPlaceholdersAreRefused(t *testing.T) {
	f := newFixture(t)
	for _, v := range []string{"Bearer ...", "Bearer ", "...", "<token>", "changeme", "xxx", "Bearer $TICKETS_TOKEN", "********"} {
		_, err := f.client.PutSecret(f.admin(t), &registryv1.PutSecretRequest{Name: "tickets-token", Value: v})
		st := testutil.RequireStatus(t, err, codes.InvalidArgument, v)
		require.Contains(t, st.Message(), "registry: invalid value: ", v)
		require.Contains(t, st.Message(), "not a credential (the value is not shown)", v)
	}
	_, err := f.client.ListSecrets(f.admin(t), &registryv1.ListSecretsRequest{})
	require.NoError(t, err)
	_, err = f.client.PutSecret(f.admin(t), &registryv1.PutSecretRequest{Name: "tickets-token", Value: "Bearer tkt-demo-7f3a9c2e"})
	require.NoError(t, err)

	_, err = f.client.CreateServer(f.admin(t), &registryv1.CreateServerRequest{Ref: "docs", Command: "docs-mcp", Env: env("APP_TOKEN", "<your token here>")})
	st := testutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Contains(t, st.Message(), "env.APP_TOKEN: is a template or an unexpanded shell variable, not a value a server can use")
	_, err = f.client.CreateServer(f.admin(t), &registryv1.CreateServerRequest{Ref: "docs", Command: "docs-mcp", Env: env("APP_TOKEN", "s3cr3t", "REGION", "")})
	require.NoError(t, err)
	_, err = f.client.UpdateServer(f.admin(t), &registryv1.UpdateServerRequest{Ref: "docs", Command: "docs-mcp", Env: env("APP_TOKEN", SecretMask)})
	require.NoError(t, err, "the mask keeps the stored value")
	_, err = f.client.UpdateServer(f.admin(t), &registryv1.UpdateServerRequest{Ref: "docs", Command: "docs-mcp", Env: env("APP_TOKEN", "...")})
	testutil.RequireStatus(t, err, codes.InvalidArgument)
}

// TestEveryUpdatableFieldIsPatchableAndKept: a field added to UpdateServerRequest must be one
// an update_mask can name, and a PATCH that does not name it must keep its stored value
// (updateRequestOf copies it from the stored registration); forgetting either would make
// every PATCH clear it.
func TestEveryUpdatableFieldIsPatchableAndKept(t *testing.T) {
	req := (&registryv1.UpdateServerRequest{}).ProtoReflect().Descriptor().Fields()
	srv := &registryv1.Server{}
	sm := srv.ProtoReflect()
	var names []string
	for i := 0; i < req.Len(); i++ {
		fd := req.Get(i)
		name := string(fd.Name())
		// create_time, update_time and warm are output only: an update ignores them.
		if name == "ref" || name == "revision" || name == "update_mask" ||
			name == "create_time" || name == "update_time" || name == "warm" {
			continue
		}
		names = append(names, name)
		require.Contains(t, patchable, name, "update_mask cannot name %s", name)
		sf := sm.Descriptor().Fields().ByName(fd.Name())
		require.NotNil(t, sf, "Server has no field %s to keep it from", name)
		switch {
		case sf.IsList() && sf.Kind() == protoreflect.MessageKind:
			l := sm.Mutable(sf).List()
			l.Append(l.NewElement())
		case sf.IsList():
			sm.Mutable(sf).List().Append(protoreflect.ValueOfString("x"))
		case sf.IsMap() && sf.MapValue().Kind() == protoreflect.MessageKind:
			m := sm.Mutable(sf).Map()
			m.Set(protoreflect.ValueOfString("k").MapKey(), m.NewValue())
		case sf.IsMap():
			sm.Mutable(sf).Map().Set(protoreflect.ValueOfString("k").MapKey(), protoreflect.ValueOfString("v"))
		case sf.Kind() == protoreflect.StringKind:
			sm.Set(sf, protoreflect.ValueOfString("x"))
		case sf.Kind() == protoreflect.BoolKind:
			sm.Set(sf, protoreflect.ValueOfBool(true))
		case sf.Kind() == protoreflect.Int32Kind:
			sm.Set(sf, protoreflect.ValueOfInt32(1))
		case sf.Kind() == protoreflect.Int64Kind:
			sm.Set(sf, protoreflect.ValueOfInt64(1))
		case sf.Kind() == protoreflect.MessageKind:
			sm.Set(sf, sm.NewField(sf)) // present, e.g. a zero Duration
		default:
			t.Fatalf("field %s of kind %s: teach this test to fill it", name, sf.Kind())
		}
	}
	kept := updateRequestOf(srv).ProtoReflect()
	for _, name := range names {
		fd := req.ByName(protoreflect.Name(name))
		require.True(t, kept.Has(fd), "updateRequestOf drops %s", name)
	}
}
