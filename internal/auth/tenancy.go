package auth

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
)

// Tenancy is the tenant scope of one call. The server's interceptor resolves it once
// (Authorizer.Resolve), from the caller's principal and the request, and handlers read it
// from the context (TenantFrom, TenancyFrom): no handler decides on its own which tenant a
// caller may act for, and one whose context carries no tenancy refuses the call.
type Tenancy struct {
	// Tenant is the tenant the call acts for, or the one tenant a read is confined to. It is
	// empty only when All is set.
	Tenant string
	// All says the call spans every tenant: the caller is bound to no tenant and named none, on
	// an RPC whose request has no tenant (Verify, ListKeys) or whose rule says that naming none
	// means every tenant (Rule.AllTenants: audit reads; CreateKey mints a key bound to none).
	All bool
}

// TenantRequest is a request that names the tenant it acts for, as Temporal's requests expose
// their namespace: every generated request message with a `tenant` field implements it.
type TenantRequest interface {
	GetTenant() string
}

// filteredRequest is an audit read, whose tenant sits in its filter.
type filteredRequest interface {
	GetFilter() *auditv1.Filter
}

// requestedTenant is the tenant a request names, and whether it has a tenant field at all.
func requestedTenant(req any) (string, bool) {
	switch r := req.(type) {
	case TenantRequest:
		return r.GetTenant(), true
	case filteredRequest:
		return r.GetFilter().GetTenant(), true
	}
	return "", false
}

// ResolveTenancy is the one rule for tenants, which the interceptor applies to every call: a
// key bound to a tenant acts for its own (naming another is ErrTenantMismatch); any other
// caller acts for the tenant it names, or, naming none, for DefaultTenant, except where
// allTenants says that naming none spans every tenant.
func ResolveTenancy(p Principal, requested string, allTenants bool) (Tenancy, error) {
	if p.Tenant != "" {
		if requested != "" && requested != p.Tenant {
			return Tenancy{}, fmt.Errorf("%w (%q): omit the tenant or use %q", ErrTenantMismatch, p.Tenant, p.Tenant)
		}
		return Tenancy{Tenant: p.Tenant}, nil
	}
	switch {
	case requested != "":
		return Tenancy{Tenant: requested}, nil
	case allTenants:
		return Tenancy{All: true}, nil
	}
	return Tenancy{Tenant: DefaultTenant}, nil
}

// Resolve resolves the tenancy of one call, whose principal Authorize attached to ctx, from
// its request message, and returns ctx carrying it. The server calls it once the message is
// read: before a unary handler, and on a stream's first received message. A request without
// a tenant field is scoped by the principal alone (its tenant, or every tenant).
func (a *Authorizer) Resolve(ctx context.Context, fullMethod string, req any) (context.Context, error) {
	rule, ok := a.rules[fullMethod]
	if !ok {
		return nil, status.Errorf(codes.PermissionDenied, "auth: %s has no authorization rule", fullMethod)
	}
	if rule.Public {
		return ctx, nil
	}
	p, ok := FromContext(ctx)
	if !ok {
		return nil, errNoCaller
	}
	requested, named := requestedTenant(req)
	t, err := ResolveTenancy(p, requested, rule.AllTenants || !named)
	if err != nil {
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	return WithTenancy(ctx, t), nil
}

type tenancyKey struct{}

// WithTenancy attaches a resolved tenancy to ctx. The interceptor calls it (through Resolve);
// so do in-process callers that reach a handler directly, with SystemContext or in tests.
func WithTenancy(ctx context.Context, t Tenancy) context.Context {
	return context.WithValue(ctx, tenancyKey{}, t)
}

// errNoTenancy refuses a call whose context has no resolved tenancy: it did not pass the
// server's interceptor, and nothing else may decide a tenant.
var errNoTenancy = status.Error(codes.PermissionDenied, "auth: this call reached its handler without a resolved tenant (it did not pass the server's interceptor), so it is refused")

// errSpansTenants refuses a call that must act for one tenant but spans every tenant.
var errSpansTenants = status.Error(codes.PermissionDenied, "auth: this call must act for one tenant, but was resolved for every tenant")

// TenancyFrom returns the tenancy the interceptor resolved for this call, or a
// PERMISSION_DENIED status when there is none: handlers fail closed.
func TenancyFrom(ctx context.Context) (Tenancy, error) {
	t, ok := ctx.Value(tenancyKey{}).(Tenancy)
	if !ok || (t.Tenant == "" && !t.All) {
		return Tenancy{}, errNoTenancy
	}
	return t, nil
}

// TenantFrom returns the one tenant this call acts for, or a PERMISSION_DENIED status when the
// call has no resolved tenancy or spans every tenant: handlers fail closed.
func TenantFrom(ctx context.Context) (string, error) {
	t, err := TenancyFrom(ctx)
	if err != nil {
		return "", err
	}
	if t.All {
		return "", errSpansTenants
	}
	return t.Tenant, nil
}
