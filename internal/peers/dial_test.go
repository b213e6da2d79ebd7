package peers_test

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/peers"
)

// lenientRegistry answers every key as the admin's: what an impersonator would say.
type lenientRegistry struct {
	registryinternalv1.UnimplementedRegistryInternalServiceServer
}

func (lenientRegistry) AuthenticateKey(context.Context, *registryinternalv1.AuthenticateKeyRequest) (*registryinternalv1.AuthenticateKeyResponse, error) {
	return &registryinternalv1.AuthenticateKeyResponse{KeyId: "k", Role: auth.RoleAdmin, Permissions: []string{"mcp:admin"}}, nil
}

// listeningPool records the ad-hoc env it was sent: what an impersonator would collect.
type listeningPool struct {
	poolinternalv1.UnimplementedPoolInternalServiceServer
	mu   sync.Mutex
	seen []map[string]string
}

func (p *listeningPool) Discover(_ context.Context, req *poolinternalv1.DiscoverRequest) (*poolinternalv1.DiscoverResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, req.GetAdhoc().GetEnv())
	return &poolinternalv1.DiscoverResponse{}, nil
}

func (p *listeningPool) received() []map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen
}

func certFiles(dir, svc string) mtls.Files {
	return mtls.Files{
		CertFile: filepath.Join(dir, svc+".pem"),
		KeyFile:  filepath.Join(dir, svc+"-key.pem"),
		CAFile:   filepath.Join(dir, "ca.pem"),
	}
}

// serveAs runs a gRPC server on loopback presenting svc's certificate from dir.
func serveAs(t *testing.T, dir, svc string, register func(*grpc.Server)) string {
	t.Helper()
	cfg, err := mtls.ServerConfig(certFiles(dir, svc))
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestDialRefusesAnotherServiceInThePeersPlace: the audit service's certificate chains to the
// deployment's CA and is valid for 127.0.0.1, yet a server presenting it can neither vouch for
// an API key as the registry nor receive ad-hoc secrets as the pool.
func TestDialRefusesAnotherServiceInThePeersPlace(t *testing.T) {
	dir := t.TempDir()
	_, err := mtls.InitDevCA(dir, mtls.DevCAOptions{})
	require.NoError(t, err)
	regAddr := func(svc string) string {
		return serveAs(t, dir, svc, func(s *grpc.Server) { registryinternalv1.RegisterRegistryInternalServiceServer(s, lenientRegistry{}) })
	}

	t.Run("registry", func(t *testing.T) {
		for _, tc := range []struct {
			served string
			ok     bool
		}{{mtls.Registry, true}, {mtls.Audit, false}, {mtls.Pool, false}} {
			t.Run("answered by "+tc.served, func(t *testing.T) {
				conn, err := peers.Dial(mtls.Registry, regAddr(tc.served), certFiles(dir, mtls.Publisher), nil)
				require.NoError(t, err)
				t.Cleanup(func() { conn.Close() })
				p, err := peers.NewRegistry(conn).VerifyKey(t.Context(), auth.HashKey("any key"))
				if tc.ok {
					require.NoError(t, err)
					require.Equal(t, auth.RoleAdmin, p.Role)
					return
				}
				require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
				require.ErrorContains(t, err, "expected peer identity spiffe://ringfence/service/registry")
				require.ErrorContains(t, err, "the server presented spiffe://ringfence/service/"+tc.served)
				require.Empty(t, p.Role, "the impersonator's answer never reaches the caller")
			})
		}
	})

	t.Run("pool", func(t *testing.T) {
		for _, tc := range []struct {
			served string
			ok     bool
		}{{mtls.Pool, true}, {mtls.Audit, false}, {mtls.Registry, false}} {
			t.Run("answered by "+tc.served, func(t *testing.T) {
				listener := &listeningPool{}
				addr := serveAs(t, dir, tc.served, func(s *grpc.Server) { poolinternalv1.RegisterPoolInternalServiceServer(s, listener) })
				conn, err := peers.Dial(mtls.Pool, addr, certFiles(dir, mtls.Registry), nil)
				require.NoError(t, err)
				t.Cleanup(func() { conn.Close() })
				_, _, err = peers.NewPool(conn).ExploreTools(t.Context(), discovery.ExploreRequest{
					Ref:   "adhoc",
					Adhoc: &registryinternalv1.ResolveServerResponse{Env: map[string]string{"APP_TOKEN": "s3cret"}},
				})
				if tc.ok {
					require.NoError(t, err)
					require.Equal(t, []map[string]string{{"APP_TOKEN": "s3cret"}}, listener.received())
					return
				}
				require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
				require.ErrorContains(t, err, "expected peer identity spiffe://ringfence/service/pool")
				require.ErrorContains(t, err, "the server presented spiffe://ringfence/service/"+tc.served)
				require.Empty(t, listener.received(), "no request, so no secret, reached the impersonator")
			})
		}
	})
}

// TestDialRefusesAnUnknownPeer: the peer's name is checked when dialing, so swapped arguments
// fail at start instead of at every handshake.
func TestDialRefusesAnUnknownPeer(t *testing.T) {
	dir := t.TempDir()
	_, err := mtls.InitDevCA(dir, mtls.DevCAOptions{})
	require.NoError(t, err)
	_, err = peers.Dial("127.0.0.1:50051", mtls.Registry, certFiles(dir, mtls.Pool), nil)
	require.ErrorContains(t, err, `unknown peer service "127.0.0.1:50051"`)
}
