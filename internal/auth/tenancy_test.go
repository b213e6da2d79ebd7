package auth

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// tenantField finds where a request message names its tenant: a top-level string field
// `tenant`, or the `tenant` of its `filter` message (audit reads).
func tenantField(md protoreflect.MessageDescriptor) (path []protoreflect.FieldDescriptor, ok bool) {
	if f := md.Fields().ByName("tenant"); f != nil && f.Kind() == protoreflect.StringKind {
		return []protoreflect.FieldDescriptor{f}, true
	}
	if f := md.Fields().ByName("filter"); f != nil && f.Kind() == protoreflect.MessageKind {
		if t := f.Message().Fields().ByName("tenant"); t != nil && t.Kind() == protoreflect.StringKind {
			return []protoreflect.FieldDescriptor{f, t}, true
		}
	}
	return nil, false
}

// requestNaming is a fresh request of method's input type naming tenant.
func requestNaming(t *testing.T, md protoreflect.MessageDescriptor, path []protoreflect.FieldDescriptor, tenant string) proto.Message {
	t.Helper()
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	require.NoError(t, err)
	msg := mt.New()
	m := msg
	for _, f := range path[:len(path)-1] {
		m = m.Mutable(f).Message()
	}
	m.Set(path[len(path)-1], protoreflect.ValueOfString(tenant))
	return msg.Interface()
}

// TestEveryRPCThatTakesATenantResolvesItInTheInterceptor is generated from the proto
// descriptors: every RPC of every Ringfence service (public and internal) whose request names
// a tenant is resolved by Authorizer.Resolve, for a key bound to a tenant (naming none, its
// own, another: refused) and for a caller bound to none (naming one, naming none: the default
// tenant, or every tenant where the rule says so). A new RPC with a tenant field is covered
// without anyone adding it here; one whose request the interceptor cannot read fails.
func TestEveryRPCThatTakesATenantResolvesItInTheInterceptor(t *testing.T) {
	a := NewAuthorizer(nil, Rules)
	covered := 0
	for _, m := range ringfenceMethodDescs(t) {
		path, ok := tenantField(m.Input())
		if !ok {
			continue
		}
		covered++
		method := fullMethod(m)
		rule, ok := Rules[method]
		require.True(t, ok, "%s has no rule", method)
		t.Run(method, func(t *testing.T) { checkTenancy(t, a, method, rule, m.Input(), path) })
	}
	require.GreaterOrEqual(t, covered, 20, "the public graph, run and audit RPCs and the internal ones take a tenant")
}

func checkTenancy(t *testing.T, a *Authorizer, method string, rule Rule, md protoreflect.MessageDescriptor, path []protoreflect.FieldDescriptor) {
	resolve := func(p Principal, tenant string) (Tenancy, error) {
		ctx, err := a.Resolve(WithPrincipal(context.Background(), p), method, requestNaming(t, md, path, tenant))
		if err != nil {
			return Tenancy{}, err
		}
		return TenancyFrom(ctx)
	}
	unbound := Principal{KeyID: "k", Role: RoleAdmin, Permissions: AllPermissions}
	if len(rule.Internal) > 0 {
		unbound = Principal{Service: rule.Internal[0]} // only service certificates call it
	} else {
		bound := Principal{KeyID: "b", Role: RoleAdmin, Permissions: AllPermissions, Tenant: "acme"}
		got, err := resolve(bound, "")
		require.NoError(t, err)
		require.Equal(t, Tenancy{Tenant: "acme"}, got, "a bound key naming none acts for its own tenant")
		got, err = resolve(bound, "acme")
		require.NoError(t, err)
		require.Equal(t, Tenancy{Tenant: "acme"}, got)
		_, err = resolve(bound, "globex")
		require.Equal(t, codes.PermissionDenied, status.Code(err), "a bound key naming another tenant: %v", err)
		require.Contains(t, status.Convert(err).Message(), `bound to another tenant ("acme")`)
	}
	got, err := resolve(unbound, "globex")
	require.NoError(t, err)
	require.Equal(t, Tenancy{Tenant: "globex"}, got, "a caller bound to none acts for the tenant it names")
	got, err = resolve(unbound, "")
	require.NoError(t, err)
	want := Tenancy{Tenant: DefaultTenant}
	if rule.AllTenants {
		want = Tenancy{All: true}
	}
	require.Equal(t, want, got)
}

// TestResolveScopesRequestsWithoutATenantByTheCaller: a request that names no tenant (Verify,
// ListKeys) is confined to a bound key's tenant; a caller bound to none spans every tenant.
// Public methods (health, reflection) carry no tenancy.
func TestResolveScopesRequestsWithoutATenantByTheCaller(t *testing.T) {
	a := NewAuthorizer(nil, map[string]Rule{"/x.S/Read": perm(AuditRead), "/x.S/Health": public})
	ctx, err := a.Resolve(WithPrincipal(context.Background(), Principal{KeyID: "b", Tenant: "acme"}), "/x.S/Read", struct{}{})
	require.NoError(t, err)
	got, err := TenancyFrom(ctx)
	require.NoError(t, err)
	require.Equal(t, Tenancy{Tenant: "acme"}, got)
	ctx, err = a.Resolve(WithPrincipal(context.Background(), Principal{KeyID: "u"}), "/x.S/Read", struct{}{})
	require.NoError(t, err)
	got, err = TenancyFrom(ctx)
	require.NoError(t, err)
	require.Equal(t, Tenancy{All: true}, got)

	_, err = a.Resolve(context.Background(), "/x.S/Read", struct{}{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "no principal is refused, never every tenant")
	_, err = a.Resolve(context.Background(), "/x.S/Health", struct{}{})
	require.NoError(t, err)
}
