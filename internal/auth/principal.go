package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
)

// DefaultTenant is the tenant of requests from keys not bound to one that name none.
const DefaultTenant = "default"

// Principal is who is calling: an API key's holder, or a service by its certificate.
type Principal struct {
	KeyID       string
	KeyName     string
	Role        string
	Permissions []Permission
	// Tenant binds a key to one tenant; empty means the key may act for any tenant.
	Tenant string
	// Service is set instead of the key fields when a service certificate authenticated the call.
	Service string
}

// Has reports whether the principal holds p.
func (p Principal) Has(perm Permission) bool { return slices.Contains(p.Permissions, perm) }

// Actor names the principal for a person reading a log line, an audit record or a
// version's published_by: what the key is and its id, "key:ci (runner, key_0a1b…)";
// "service:<name>" for a service certificate; "system" for no caller at all.
func (p Principal) Actor() string {
	switch {
	case p.Service != "":
		return "service:" + p.Service
	case p.KeyID == "":
		return "system"
	case p.KeyName == "":
		return "key:" + p.KeyID
	}
	return fmt.Sprintf("key:%s (%s, %s)", p.KeyName, p.Role, p.KeyID)
}

// AuditActor is how admin records name the principal: its key id, name and role,
// "service:<name>" for a service certificate, or "system" for changes no caller made (a
// bootstrap at start).
func (p Principal) AuditActor() (id, name, role string) {
	switch {
	case p.Service != "":
		return "service:" + p.Service, "", "service"
	case p.KeyID != "":
		return p.KeyID, p.KeyName, p.Role
	}
	return "system", "", "system"
}

type principalKey struct{}

// WithPrincipal attaches the caller to ctx.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the authenticated caller.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// ErrTenantMismatch refuses a request for another tenant than the key's.
var ErrTenantMismatch = errors.New("auth: this API key is bound to another tenant")

// ResolveTenant returns the tenant a request acts for: a tenant-bound key always acts for its
// own (naming another is refused), other keys act for the requested one or DefaultTenant.
func ResolveTenant(p Principal, requested string) (string, error) {
	if p.Tenant != "" {
		if requested != "" && requested != p.Tenant {
			return "", fmt.Errorf("%w (%q): omit the tenant or use %q", ErrTenantMismatch, p.Tenant, p.Tenant)
		}
		return p.Tenant, nil
	}
	if requested == "" {
		return DefaultTenant, nil
	}
	return requested, nil
}

// HashKey is the lowercase hex SHA-256 of an API key: what is stored and what services send
// each other instead of the key. Keys are 32 random bytes, so a fast hash is enough.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}
