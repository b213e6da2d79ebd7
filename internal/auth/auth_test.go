package auth

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestBuiltinRoles(t *testing.T) {
	rs, err := NewRoles("")
	require.NoError(t, err)
	op, ok := rs.Lookup(RoleOperator)
	require.True(t, ok)
	require.False(t, op.Has(MCPAdmin), "operator must not hold mcp:admin: it authors the graphs the registry constrains")
	require.True(t, op.Has(WorkflowAdmin))
	require.True(t, op.Has(ConnectorAdmin))
	runner, _ := rs.Lookup(RoleRunner)
	require.False(t, runner.Has(RunApprove), "a runner makes the calls that ask first, so it must not approve them")
	approver, ok := rs.Lookup(RoleApprover)
	require.True(t, ok)
	require.Equal(t, []Permission{RunApprove}, approver.Permissions)
	admin, _ := rs.Lookup(RoleAdmin)
	for _, p := range AllPermissions {
		require.True(t, admin.Has(p))
	}
	require.Empty(t, rs.Warnings())
}

func TestCustomRoles(t *testing.T) {
	rs, err := NewRoles(`{"deployer": ["run:execute", "audit:read"], "superop": ["mcp:admin", "workflow:admin"], "platform": ["mcp:admin", "workflow:write"], "registrar": ["mcp:admin", "keys:admin"], "selfie": ["run:execute", "run:approve"], "gate": ["run:approve", "audit:read"]}`)
	require.NoError(t, err)
	d, ok := rs.Lookup("deployer")
	require.True(t, ok)
	require.True(t, d.Has(RunExecute))
	require.False(t, d.Builtin)
	w := strings.Join(rs.Warnings(), "\n")
	require.Len(t, rs.Warnings(), 3, w)
	require.Contains(t, w, `"superop" pairs mcp:admin with workflow:admin`)
	require.Contains(t, w, `"platform" pairs mcp:admin with workflow:write`, "authoring takes workflow:write alone")
	require.Contains(t, w, `"selfie" pairs run:execute with run:approve`, "a key that makes calls and approves them approves its own")

	for _, bad := range []string{`[`, `{"admin": ["audit:read"]}`, `{"x": ["fly"]}`, `{"Bad Name": []}`} {
		_, err := NewRoles(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "service_roles_json (RINGFENCE_SERVICE_ROLES_JSON)")
		_, err = NewRolesFrom(bad, "ZEROTH_SERVICE_ROLES_JSON, read as RINGFENCE_SERVICE_ROLES_JSON")
		require.ErrorContains(t, err, "auth: service_roles_json (ZEROTH_SERVICE_ROLES_JSON, read as RINGFENCE_SERVICE_ROLES_JSON)", "names the variable the value came from")
	}
}

type fakeKeys map[string]Principal

func (f fakeKeys) VerifyKey(_ context.Context, h string) (Principal, error) {
	p, ok := f[h]
	if !ok {
		return Principal{}, ErrUnknownKey
	}
	return p, nil
}

func TestAuthorize(t *testing.T) {
	keys := fakeKeys{
		HashKey("admin-key"):    {KeyID: "a", Role: RoleAdmin, Permissions: AllPermissions},
		HashKey("operator-key"): {KeyID: "o", Role: RoleOperator, Permissions: BuiltinRoles[RoleOperator]},
	}
	rules := map[string]Rule{
		"/x.S/Admin":    perm(MCPAdmin),
		"/x.S/Internal": internal("pool"),
		"/x.S/Health":   public,
	}
	a := NewAuthorizer(keys, rules)
	withKey := func(k string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(MetadataKey, k))
	}
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		method string
		code   codes.Code
	}{
		{"admin may", withKey("admin-key"), "/x.S/Admin", codes.OK},
		{"operator may not", withKey("operator-key"), "/x.S/Admin", codes.PermissionDenied},
		{"no key", context.Background(), "/x.S/Admin", codes.Unauthenticated},
		{"unknown key", withKey("nope"), "/x.S/Admin", codes.Unauthenticated},
		{"internal refuses api keys", withKey("admin-key"), "/x.S/Internal", codes.PermissionDenied},
		{"public", context.Background(), "/x.S/Health", codes.OK},
		{"method without a rule", withKey("admin-key"), "/x.S/Unlisted", codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, err := a.Authorize(tc.ctx, tc.method)
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			if err == nil && tc.method == "/x.S/Admin" {
				p, ok := FromContext(ctx)
				require.True(t, ok)
				require.Equal(t, "a", p.KeyID)
			}
		})
	}
}

func TestResolveTenancy(t *testing.T) {
	bound := Principal{Tenant: "acme"}
	for _, tc := range []struct {
		name      string
		p         Principal
		requested string
		all       bool
		want      Tenancy
		mismatch  bool
	}{
		{"bound, naming none", bound, "", false, Tenancy{Tenant: "acme"}, false},
		{"bound, naming its own", bound, "acme", false, Tenancy{Tenant: "acme"}, false},
		{"bound, naming another", bound, "globex", false, Tenancy{}, true},
		{"bound, naming none where none spans all", bound, "", true, Tenancy{Tenant: "acme"}, false},
		{"bound, naming another where none spans all", bound, "globex", true, Tenancy{}, true},
		{"unbound, naming none", Principal{}, "", false, Tenancy{Tenant: DefaultTenant}, false},
		{"unbound, naming one", Principal{}, "globex", false, Tenancy{Tenant: "globex"}, false},
		{"unbound, naming none where none spans all", Principal{}, "", true, Tenancy{All: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveTenancy(tc.p, tc.requested, tc.all)
			if tc.mismatch {
				require.True(t, errors.Is(err, ErrTenantMismatch), "%v", err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestHandlersFailClosed: without a resolved tenancy or a caller, the accessors handlers use
// refuse; "no principal" is never "every tenant".
func TestHandlersFailClosed(t *testing.T) {
	ctx := context.Background()
	_, err := TenantFrom(ctx)
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	_, err = TenancyFrom(ctx)
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	_, err = PrincipalFrom(ctx)
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	_, err = TenantFrom(WithTenancy(ctx, Tenancy{All: true}))
	require.Equal(t, codes.PermissionDenied, status.Code(err), "a call that must act for one tenant refuses one that spans all")

	sys := SystemContext(ctx, "startup")
	p, err := PrincipalFrom(sys)
	require.NoError(t, err)
	require.Equal(t, "system:startup", p.Actor())
	require.False(t, p.IsKey())
	id, name, role := p.AuditActor()
	require.Equal(t, [3]string{"system", "", "system"}, [3]string{id, name, role})
	ten, err := TenancyFrom(sys)
	require.NoError(t, err)
	require.True(t, ten.All)
}

// TestActorSaysWhatTheKeyIs: logs, audit records and published_by name a key by its name and
// role, keeping its id.
func TestActorSaysWhatTheKeyIs(t *testing.T) {
	require.Equal(t, "key:ci (runner, key_0a1b)", Principal{KeyID: "key_0a1b", KeyName: "ci", Role: RoleRunner}.Actor())
	require.Equal(t, "key:key_0a1b", Principal{KeyID: "key_0a1b"}.Actor())
	require.Equal(t, "service:pool", Principal{Service: "pool"}.Actor())
	require.Equal(t, "system", Principal{}.Actor())
	id, name, role := Principal{KeyID: "key_0a1b", KeyName: "ci", Role: RoleRunner}.AuditActor()
	require.Equal(t, []string{"key_0a1b", "ci", RoleRunner}, []string{id, name, role})
}
