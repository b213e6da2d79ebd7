package peers_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/peers"
	"github.com/ringfence/ringfence/internal/testutil"
)

// TestASplitServiceKeepsTheKeysTenant: in a split deployment the publisher and the pool learn
// who a key is from the registry over mutual TLS. A key bound to a tenant must stay bound on
// that side: its principal carries the tenant, so the pool's RPCs act in that tenant and the
// deployment-wide RPCs refuse it, as they do in-process.
func TestASplitServiceKeepsTheKeysTenant(t *testing.T) {
	dir := t.TempDir()
	_, err := mtls.InitDevCA(dir, mtls.DevCAOptions{})
	require.NoError(t, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := openRegistry(t, dir, quiet)

	tlsCfg, err := mtls.ServerConfig(certFiles(dir, mtls.Registry))
	require.NoError(t, err)
	internalTLS, err := mtls.InternalServerConfig(certFiles(dir, mtls.Registry))
	require.NoError(t, err)
	registryAuthz := auth.NewAuthorizer(reg, auth.Rules)
	srv := grpcserver.New(grpcserver.Options{Name: "registry", GRPCAddr: "127.0.0.1:0", TLS: tlsCfg,
		InternalAddr: "127.0.0.1:0", InternalTLS: internalTLS, Authorizer: registryAuthz, Logger: quiet})
	registryv1.RegisterRegistryServiceServer(srv.GRPC(), reg)
	registryinternalv1.RegisterRegistryInternalServiceServer(srv.Internal(), reg.Internal())
	testutil.Serve(t, srv) // its plaintext connection goes unused: callers dial with peers.Dial
	internalAddr, err := srv.InternalAddr(t.Context())
	require.NoError(t, err)

	// Keys are minted by an unbound admin, in-process: what KeyService.CreateKey does once
	// the interceptor resolved the request's tenant.
	admin := auth.WithPrincipal(t.Context(), auth.Principal{KeyID: "key_admin", Role: auth.RoleAdmin, Permissions: auth.AllPermissions})
	mint := func(name, tenant string) *registryv1.CreateKeyResponse {
		req := &registryv1.CreateKeyRequest{Name: name, Role: auth.RoleAdmin, Tenant: tenant}
		ctx, err := registryAuthz.Resolve(admin, registryv1.KeyService_CreateKey_FullMethodName, req)
		require.NoError(t, err)
		resp, err := reg.CreateKey(ctx, req)
		require.NoError(t, err)
		return resp
	}
	acme, unbound := mint("acme-admin", "acme"), mint("ops", "")

	conn, err := peers.Dial(mtls.Registry, internalAddr.String(), certFiles(dir, mtls.Pool), nil)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	remote := peers.NewRegistry(conn)

	p, err := remote.VerifyKey(t.Context(), auth.HashKey(acme.GetSecret()))
	require.NoError(t, err)
	require.Equal(t, acme.GetKey().GetId(), p.KeyID)
	require.Equal(t, auth.RoleAdmin, p.Role)
	require.Equal(t, "acme", p.Tenant, "the tenant crossed the wire")
	p, err = remote.VerifyKey(t.Context(), auth.HashKey(unbound.GetSecret()))
	require.NoError(t, err)
	require.Empty(t, p.Tenant)

	// What a split pool or publisher does with that answer: authorize with the remote registry.
	authz := auth.NewAuthorizer(remote, auth.Rules)
	withKey := func(key string) context.Context {
		return metadata.NewIncomingContext(t.Context(), metadata.Pairs(auth.MetadataKey, key))
	}
	authed, err := authz.Authorize(withKey(acme.GetSecret()), poolv1.PoolService_StartRun_FullMethodName)
	require.NoError(t, err)
	caller, ok := auth.FromContext(authed)
	require.True(t, ok)
	require.Equal(t, "acme", caller.Tenant)
	authed, err = authz.Resolve(authed, poolv1.PoolService_StartRun_FullMethodName, &poolv1.StartRunRequest{GraphId: "g"})
	require.NoError(t, err)
	tenant, err := auth.TenantFrom(authed)
	require.NoError(t, err)
	require.Equal(t, "acme", tenant, "the pool would run in the key's tenant")

	_, err = authz.Authorize(withKey(acme.GetSecret()), registryv1.RegistryService_ListServers_FullMethodName)
	st := testutil.RequireStatus(t, err, codes.PermissionDenied)
	require.Contains(t, st.Message(), `bound to tenant "acme"`)
	_, err = authz.Authorize(withKey(unbound.GetSecret()), registryv1.RegistryService_ListServers_FullMethodName)
	require.NoError(t, err, "an unbound admin key may")
}
