package registry

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/internal/paging"
	"github.com/ringfence/ringfence/services/registry/internal/store"
)

// KeyPrefix starts every minted API key, so leaked keys are recognizable by scanners.
const KeyPrefix = "rf_"

var (
	keyIDPattern = regexp.MustCompile(`^key_[0-9a-f]{12,32}$`)
)

// VerifyKey implements auth.KeyVerifier from the in-memory key table. An admission is answered
// from the keys this replica holds when they admit the key (on etcd, without the round trip
// that confirms the mirror is current: auth.Admitting says why that is safe); every other
// answer is current.
func (s *Service) VerifyKey(ctx context.Context, keySHA256 string) (auth.Principal, error) {
	if auth.Admitting(ctx) {
		if k, ok := s.store.HeldKeyByHash(keySHA256); ok && !k.Revoked {
			return s.principalOf(k), nil
		}
	}
	k, ok, err := s.store.KeyByHash(ctx, keySHA256)
	if err != nil {
		return auth.Principal{}, err
	}
	if !ok || k.Revoked {
		return auth.Principal{}, auth.ErrUnknownKey
	}
	return s.principalOf(k), nil
}

// principalOf is the caller a valid key makes, with its role's permissions.
func (s *Service) principalOf(k store.Key) auth.Principal {
	p := auth.Principal{KeyID: k.ID, KeyName: k.Name, Role: k.Role, Tenant: k.Tenant}
	if role, ok := s.cfg.Roles.Lookup(k.Role); ok {
		p.Permissions = role.Permissions
	}
	return p
}

// EnsureBootstrapAdmin makes key an admin key (RINGFENCE_BOOTSTRAP_ADMIN_KEY). It is idempotent,
// and a bootstrap key an operator revoked stays revoked.
func (s *Service) EnsureBootstrapAdmin(ctx context.Context, key string) error {
	hash := auth.HashKey(key)
	k, ok, err := s.store.KeyByHash(ctx, hash)
	if err != nil {
		return fmt.Errorf("registry: look up the bootstrap admin key: %w", err)
	}
	if ok {
		if k.Revoked {
			s.log.Warn("the bootstrap admin key was revoked and stays revoked; unset RINGFENCE_BOOTSTRAP_ADMIN_KEY", "key_id", k.ID)
		}
		return nil
	}
	// A random id, like every key's: ids are shown to auditors and authors (audit records,
	// published_by), and one taken from the key's hash would let them test guesses of an
	// operator-chosen key offline.
	k = store.Key{
		ID: newKeyID(), Name: "bootstrap-admin", Role: auth.RoleAdmin,
		Hash: hash, CreateTime: time.Now().UTC(),
	}
	err = s.store.CreateKey(ctx, k, s.event(ctx, audit.ActionKeyCreate, resourceKey, k.ID, keyToProto(k)))
	if errors.Is(err, store.ErrExists) {
		// Another replica starting at the same moment created it first.
		if _, ok, lerr := s.store.KeyByHash(ctx, hash); lerr == nil && ok {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("registry: create the bootstrap admin key: %w", err)
	}
	s.log.Info("bootstrap admin key enabled", "key_id", k.ID)
	return nil
}

// CreateKey implements KeyService.
func (s *Service) CreateKey(ctx context.Context, req *registryv1.CreateKeyRequest) (*registryv1.CreateKeyResponse, error) {
	if err := ident.KeyName.Check("name", req.GetName()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	role, ok := s.cfg.Roles.Lookup(req.GetRole())
	if !ok {
		return nil, s.errors.Status(ctx, fielderr.New("role", "%s is not a role; ListRoles (ringfence roles check) shows them", fielderr.Quote(req.GetRole())))
	}
	if req.GetTenant() != "" {
		if err := ident.Ref.Check("tenant", req.GetTenant()); err != nil {
			return nil, s.errors.Status(ctx, err)
		}
	}
	tenant, err := mintable(ctx, role)
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	secret, id := newKeySecret(), newKeyID()
	k := store.Key{
		ID: id, Name: req.GetName(), Role: req.GetRole(), Tenant: tenant,
		Hash: auth.HashKey(secret), CreateTime: time.Now().UTC(),
	}
	if err := s.store.CreateKey(ctx, k, s.tenantEvent(ctx, k.Tenant, audit.ActionKeyCreate, resourceKey, k.ID, keyToProto(k))); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	return &registryv1.CreateKeyResponse{Key: keyToProto(k), Secret: secret}, nil
}

// mintable checks that the caller may mint a key with role, and returns the tenant the key is
// bound to: the tenancy the interceptor resolved from the request's tenant (a tenant-bound
// caller's own; for a caller bound to none, the tenant it named, or none). keys:admin must not
// be a way up: a custom role holding it could otherwise mint an admin key, and a tenant-bound
// key one for every tenant.
func mintable(ctx context.Context, role auth.Role) (string, error) {
	caller, err := auth.PrincipalFrom(ctx)
	if err != nil {
		return "", err
	}
	t, err := auth.TenancyFrom(ctx)
	if err != nil {
		return "", err
	}
	if caller.IsKey() {
		if missing := missingPermissions(caller, role); len(missing) > 0 {
			return "", fmt.Errorf("%w: role %q carries %s, which this key (role %q) does not hold", errKeyEscalation, role.Name, strings.Join(missing, ", "), caller.Role)
		}
	}
	return t.Tenant, nil // "" when t.All: a key bound to no tenant
}

// revocable checks that the caller may revoke k. keys:admin is no way up here either: a key
// revokes only keys whose role's every permission it holds (its own key among them), or a
// custom role holding keys:admin could lock the admins out by revoking every admin key, the
// bootstrap key included. A key whose role is no longer configured holds nothing, so any
// keys:admin key may revoke it. The system principal and service certificates are not keys.
func (s *Service) revocable(ctx context.Context, k store.Key) error {
	caller, err := auth.PrincipalFrom(ctx)
	if err != nil {
		return err
	}
	if !caller.IsKey() {
		return nil
	}
	role, ok := s.cfg.Roles.Lookup(k.Role)
	if !ok {
		return nil
	}
	missing := missingPermissions(caller, role)
	if len(missing) == 0 {
		return nil
	}
	return &detailed{sentinel: errRevokeEscalation,
		msg: fmt.Sprintf("registry: key %s has role %q, which carries %s, which this key (role %q) does not hold: a key may revoke only keys whose every permission it holds itself, so revoke it with a key that holds them (an admin key holds every permission)",
			k.ID, role.Name, strings.Join(missing, ", "), caller.Role)}
}

// missingPermissions lists the permissions of role that caller does not hold.
func missingPermissions(caller auth.Principal, role auth.Role) []string {
	var missing []string
	for _, p := range role.Permissions {
		if !caller.Has(p) {
			missing = append(missing, string(p))
		}
	}
	return missing
}

// visibleKey reports whether the caller may see or revoke k, by the tenancy the interceptor
// resolved: a tenant-bound caller only its own tenant's keys; without a tenancy, none.
func visibleKey(ctx context.Context, k store.Key) bool {
	t, err := auth.TenancyFrom(ctx)
	return err == nil && (t.All || t.Tenant == k.Tenant)
}

// ListKeys implements KeyService.
func (s *Service) ListKeys(ctx context.Context, req *registryv1.ListKeysRequest) (*registryv1.ListKeysResponse, error) {
	if _, err := auth.TenancyFrom(ctx); err != nil {
		return nil, err
	}
	n, err := paging.Size(req.GetPageSize())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	all, err := s.store.ListKeys(ctx)
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	keys := slices.DeleteFunc(all, func(k store.Key) bool { return !visibleKey(ctx, k) })
	start := 0
	if tok := req.GetPageToken(); tok != "" {
		start = -1
		for i, k := range keys {
			if k.ID == tok {
				start = i + 1
				break
			}
		}
		if start < 0 {
			return nil, s.errors.Status(ctx, errBadPageToken)
		}
	}
	resp := &registryv1.ListKeysResponse{}
	for i := start; i < len(keys) && len(resp.Keys) < n; i++ {
		resp.Keys = append(resp.Keys, keyToProto(keys[i]))
	}
	if end := start + len(resp.Keys); end < len(keys) && len(resp.Keys) > 0 {
		resp.NextPageToken = keys[end-1].ID
	}
	return resp, nil
}

// RevokeKey implements KeyService.
func (s *Service) RevokeKey(ctx context.Context, req *registryv1.RevokeKeyRequest) (*registryv1.RevokeKeyResponse, error) {
	if _, err := auth.TenancyFrom(ctx); err != nil {
		return nil, err
	}
	if !keyIDPattern.MatchString(req.GetId()) {
		return nil, s.errors.Status(ctx, fielderr.New("id", "%q is not a key id (key_<hex>); ListKeys shows them", req.GetId()))
	}
	k, ok, err := s.store.KeyByID(ctx, req.GetId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if ok {
		if !visibleKey(ctx, k) {
			return nil, s.errors.Status(ctx, errKeyNotFound)
		}
		if err := s.revocable(ctx, k); err != nil {
			return nil, s.errors.Status(ctx, err)
		}
	}
	// k.Tenant is the tenant of the key found above; a key not found records nothing.
	k, err = s.store.RevokeKey(ctx, req.GetId(), s.tenantEvent(ctx, k.Tenant, audit.ActionKeyRevoke, resourceKey, req.GetId(), nil))
	if err != nil {
		return nil, s.errors.Status(ctx, storeErr(err, errKeyNotFound))
	}
	return &registryv1.RevokeKeyResponse{Key: keyToProto(k)}, nil
}

// ListRoles implements KeyService.
func (s *Service) ListRoles(ctx context.Context, _ *registryv1.ListRolesRequest) (*registryv1.ListRolesResponse, error) {
	resp := &registryv1.ListRolesResponse{}
	for _, r := range s.cfg.Roles.All() {
		pr := &registryv1.Role{Name: r.Name, Builtin: r.Builtin, Warnings: r.Warnings()}
		for _, p := range r.Permissions {
			pr.Permissions = append(pr.Permissions, string(p))
		}
		resp.Roles = append(resp.Roles, pr)
	}
	return resp, nil
}

func newKeySecret() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return KeyPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func newKeyID() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return "key_" + hex.EncodeToString(b)
}
