package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultTenant is the tenant of requests from keys not bound to one that name none.
const DefaultTenant = "default"

// Principal is who is calling: an API key's holder, a service by its certificate, or the
// deployment itself (System) for in-process callers no key or certificate stands behind.
type Principal struct {
	KeyID       string
	KeyName     string
	Role        string
	Permissions []Permission
	// Tenant binds a key to one tenant; empty means the key may act for any tenant.
	Tenant string
	// Service is set instead of the key fields when a service certificate authenticated the call.
	Service string
	// System names what an in-process caller acting for the deployment does (SystemContext),
	// instead of the key and service fields. It is never reachable over the network.
	System string
	// AgentToken is the id of the MCP front door's agent token that authenticated the call,
	// instead of the key fields: it acts for one agent of one run, in Tenant, and holds
	// RunExecute alone.
	AgentToken string
}

// Has reports whether the principal holds p.
func (p Principal) Has(perm Permission) bool { return slices.Contains(p.Permissions, perm) }

// Actor names the principal for a person reading a log line, an audit record or a
// version's published_by: what the key is and its id, "key:ci (runner, key_0a1b…)";
// "service:<name>" for a service certificate; "system:<purpose>" for an in-process caller.
func (p Principal) Actor() string {
	switch {
	case p.Service != "":
		return "service:" + p.Service
	case p.System != "":
		return "system:" + p.System
	case p.AgentToken != "":
		return "agent-token:" + p.AgentToken
	case p.KeyID == "":
		return "system"
	case p.KeyName == "":
		return "key:" + p.KeyID
	}
	return fmt.Sprintf("key:%s (%s, %s)", p.KeyName, p.Role, p.KeyID)
}

// IsKey reports whether an API key authenticated the call (not a certificate, not System).
func (p Principal) IsKey() bool { return p.KeyID != "" }

// AuditActor is how admin records name the principal: its key id, name and role,
// "service:<name>" for a service certificate, or "system" for changes no caller made (a
// bootstrap at start, an in-process caller).
func (p Principal) AuditActor() (id, name, role string) {
	switch {
	case p.Service != "":
		return "service:" + p.Service, "", "service"
	case p.KeyID != "":
		return p.KeyID, p.KeyName, p.Role
	case p.AgentToken != "":
		return "agent-token:" + p.AgentToken, "", "agent_token"
	}
	return "system", "", "system"
}

type principalKey struct{}

// WithPrincipal attaches the caller to ctx.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the authenticated caller, for what only describes it (logs). A decision
// about what the caller may do reads PrincipalFrom, which fails closed.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// errNoCaller refuses a call whose context names no caller: "no principal" is never "the
// deployment itself" (that is SystemContext).
var errNoCaller = status.Error(codes.Unauthenticated, "auth: this call carries no authenticated caller (it did not pass the server's authorization), so it is refused")

// PrincipalFrom returns the authenticated caller, or an UNAUTHENTICATED status when the
// context names none: handlers fail closed.
func PrincipalFrom(ctx context.Context) (Principal, error) {
	p, ok := FromContext(ctx)
	if !ok {
		return Principal{}, errNoCaller
	}
	return p, nil
}

// SystemContext returns ctx with the deployment itself as the caller, acting for every tenant:
// for in-process callers that no API key or certificate stands behind (a start-up check, the
// bootstrap key). purpose names it in logs ("system:<purpose>"); audit records name it
// "system".
func SystemContext(ctx context.Context, purpose string) context.Context {
	return WithTenancy(WithPrincipal(ctx, Principal{System: purpose}), Tenancy{All: true})
}

// ErrTenantMismatch refuses a request for another tenant than the key's.
var ErrTenantMismatch = errors.New("auth: this API key is bound to another tenant")

// HashKey is the lowercase hex SHA-256 of an API key: what is stored and what services send
// each other instead of the key. Keys are 32 random bytes, so a fast hash is enough.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}
