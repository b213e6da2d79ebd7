package registry

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/testutil"
)

// recordsSince flushes the spool and returns the records forwarded after the first n.
func (f *fixture) recordsSince(t *testing.T, n int) []audit.Record {
	t.Helper()
	require.NoError(t, f.svc.Spool().Flush(t.Context()))
	all := f.audit.Records()
	require.GreaterOrEqual(t, len(all), n)
	return all[n:]
}

// TestKeyAndSecretChangesAreAdminEvents: minting and revoking a key, and putting and deleting
// a secret, each leave one admin record naming the resource, the action and the key that did
// it, with neither the key's secret nor the secret's value in it. Refused changes leave none.
func TestKeyAndSecretChangesAreAdminEvents(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	admin, err := f.svc.VerifyKey(t.Context(), auth.HashKey(adminKey))
	require.NoError(t, err)
	mark := len(f.recordsSince(t, 0))

	created, err := f.keys.CreateKey(ctx, &registryv1.CreateKeyRequest{Name: "ci", Role: auth.RoleRunner})
	require.NoError(t, err)
	id := created.GetKey().GetId()
	_, err = f.keys.RevokeKey(ctx, &registryv1.RevokeKeyRequest{Id: id})
	require.NoError(t, err)
	_, err = f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tok", Value: canary})
	require.NoError(t, err)
	_, err = f.client.DeleteSecret(ctx, &registryv1.DeleteSecretRequest{Name: "tok"})
	require.NoError(t, err)

	// Refused changes record nothing.
	_, err = f.keys.RevokeKey(ctx, &registryv1.RevokeKeyRequest{Id: "key_000000000000"})
	require.Contains(t, testutil.RequireStatus(t, err, codes.NotFound).Message(), "ListKeys (ringfence keys list) shows the keys")
	_, err = f.client.DeleteSecret(ctx, &registryv1.DeleteSecretRequest{Name: "tok"})
	require.Contains(t, testutil.RequireStatus(t, err, codes.NotFound).Message(), "ListSecrets (ringfence secrets list) shows the secrets")

	type event struct{ action, resourceType, resourceID, actor, role string }
	var got []event
	changes := map[string]map[string]any{}
	for _, r := range f.recordsSince(t, mark) {
		raw, err := json.Marshal(r)
		require.NoError(t, err)
		require.NotContains(t, string(raw), canary, "a record carries the secret's value")
		require.NotContains(t, string(raw), created.GetSecret(), "a record carries the key's secret")
		require.Equal(t, "registry", r.Producer)
		require.Equal(t, audit.KindAdmin, r.Kind)
		got = append(got, event{r.Admin.Action, r.Admin.ResourceType, r.Admin.ResourceID, r.Admin.ActorKeyID, r.Admin.ActorRole})
		if len(r.Admin.Change) > 0 {
			var c map[string]any
			require.NoError(t, json.Unmarshal(r.Admin.Change, &c))
			changes[r.Admin.Action] = c
		}
	}
	require.Equal(t, []event{
		{audit.ActionKeyCreate, resourceKey, id, admin.KeyID, auth.RoleAdmin},
		{audit.ActionKeyRevoke, resourceKey, id, admin.KeyID, auth.RoleAdmin},
		{"put", resourceSecret, "tok", admin.KeyID, auth.RoleAdmin},
		{audit.ActionDelete, resourceSecret, "tok", admin.KeyID, auth.RoleAdmin},
	}, got)
	require.Equal(t, "ci", changes[audit.ActionKeyCreate]["name"])
	require.Equal(t, auth.RoleRunner, changes[audit.ActionKeyCreate]["role"])
	require.Equal(t, SecretMask, changes["put"]["value"])
}

// TestAKeyBoundToATenantIsOnItsTenantsRecord: minting and revoking a key bound to a tenant
// are records in that tenant, which its auditors read (they were in no tenant, so a tenant's
// auditor never saw who minted its keys); an unbound key's stay in none, as registrations' and
// secrets' do.
func TestAKeyBoundToATenantIsOnItsTenantsRecord(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	mark := len(f.recordsSince(t, 0))
	bound, err := f.keys.CreateKey(ctx, &registryv1.CreateKeyRequest{Name: "acme-ci", Role: auth.RoleRunner, Tenant: "acme"})
	require.NoError(t, err)
	_, err = f.keys.RevokeKey(ctx, &registryv1.RevokeKeyRequest{Id: bound.GetKey().GetId()})
	require.NoError(t, err)
	unbound, err := f.keys.CreateKey(ctx, &registryv1.CreateKeyRequest{Name: "ci", Role: auth.RoleRunner})
	require.NoError(t, err)
	_, err = f.keys.RevokeKey(ctx, &registryv1.RevokeKeyRequest{Id: unbound.GetKey().GetId()})
	require.NoError(t, err)

	var got []string
	for _, r := range f.recordsSince(t, mark) {
		got = append(got, r.Admin.Action+" "+r.Admin.ResourceID+" in "+r.Tenant)
	}
	b, u := bound.GetKey().GetId(), unbound.GetKey().GetId()
	require.Equal(t, []string{
		audit.ActionKeyCreate + " " + b + " in acme", audit.ActionKeyRevoke + " " + b + " in acme",
		audit.ActionKeyCreate + " " + u + " in ", audit.ActionKeyRevoke + " " + u + " in ",
	}, got)
}
