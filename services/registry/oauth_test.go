package registry

import (
	"encoding/json"
	"net/http"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/testutil"
)

// TestOAuthSignInIsStoredAndItsSecretResolved: a registration's sign-in round-trips (gRPC and
// REST) with its client secret named, never shown; a client_secret_ref naming no secret is
// refused without storing anything; the pool's resolution carries the secret's value, and its
// policy the fingerprint of the sign-in settings, which a change of scopes (a PATCH) moves.
func TestOAuthSignInIsStoredAndItsSecretResolved(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	secret := "client-secret-" + canary
	signIn := &registryv1.OAuthSignIn{ClientId: "ringfence", ClientSecretRef: "tickets-client", Scopes: []string{"tickets.read"}, AuthorizationServer: "https://auth.example.com"}
	req := &registryv1.CreateServerRequest{Ref: "tickets", Transport: "streamable_http", Url: remoteURL, Oauth: signIn}

	_, err := f.client.CreateServer(ctx, req)
	st := testutil.RequireStatus(t, err, codes.FailedPrecondition)
	require.Contains(t, st.Message(), "oauth.client_secret_ref names a secret that does not exist")

	_, err = f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tickets-client", Value: secret})
	require.NoError(t, err)
	created, err := f.client.CreateServer(ctx, req)
	require.NoError(t, err)
	require.Equal(t, "tickets-client", created.GetServer().GetOauth().GetClientSecretRef())
	require.Equal(t, []string{"tickets.read"}, created.GetServer().GetOauth().GetScopes())

	res, err := f.svc.ResolveRegistration(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, secret, res.ClientSecret)
	p, err := f.svc.ServerPolicy(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, res.SignInFingerprint(), p.SignIn)
	require.NotEmpty(t, p.SignIn)

	code, body := f.rest(t, http.MethodGet, "/v1/mcp/servers/tickets", adminKey, "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"client_secret_ref":"tickets-client"`)
	require.NotContains(t, body, canary)

	_, err = f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "tickets",
		Oauth: &registryv1.OAuthSignIn{ClientId: "ringfence", ClientSecretRef: "tickets-client", Scopes: []string{"tickets.read", "tickets.write"},
			AuthorizationServer: "https://auth.example.com"},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"oauth"}}})
	require.NoError(t, err)
	p2, err := f.svc.ServerPolicy(ctx, "tickets")
	require.NoError(t, err)
	require.NotEqual(t, p.SignIn, p2.SignIn, "a change of scopes moves the fingerprint")

	raw, err := os.ReadFile(f.dbPath)
	require.NoError(t, err)
	require.NotContains(t, string(raw), canary, "the client secret is sealed at rest")
	require.NotContains(t, f.logs.String(), canary)
	require.NoError(t, f.svc.Spool().Flush(ctx))
	recs, err := json.Marshal(f.audit.Records())
	require.NoError(t, err)
	require.Contains(t, string(recs), "tickets-client", "the admin events name the secret")
	require.NotContains(t, string(recs), canary)
}
