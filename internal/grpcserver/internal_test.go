package grpcserver

import (
	"crypto/tls"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ringfence/ringfence/internal/mtls"
)

// TestTheInternalListenerTakesMutualTLSOnly: a server whose internal listener would accept a
// client without a certificate does not start; one with mtls.InternalServerConfig serves its
// peers and refuses a client that presents no certificate at the handshake.
func TestTheInternalListenerTakesMutualTLSOnly(t *testing.T) {
	dir := t.TempDir()
	_, err := mtls.InitDevCA(dir, mtls.DevCAOptions{})
	require.NoError(t, err)
	files := func(svc string) mtls.Files {
		return mtls.Files{CertFile: filepath.Join(dir, svc+".pem"), KeyFile: filepath.Join(dir, svc+"-key.pem"), CAFile: filepath.Join(dir, "ca.pem")}
	}
	lax, err := mtls.ServerConfig(files(mtls.Registry)) // verifies a certificate only when given
	require.NoError(t, err)
	for _, cfg := range []*tls.Config{nil, lax} {
		srv := New(Options{Name: "x", GRPCAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", InternalTLS: cfg, Authorizer: allowAll{}})
		require.ErrorIs(t, srv.Run(t.Context()), errInternalTLS)
	}

	strict, err := mtls.InternalServerConfig(files(mtls.Registry))
	require.NoError(t, err)
	srv := New(Options{Name: "x", GRPCAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", InternalTLS: strict, Authorizer: allowAll{}})
	go func() { _ = srv.Run(t.Context()) }()
	addr, err := srv.InternalAddr(t.Context())
	require.NoError(t, err)

	dial := func(cfg *tls.Config) error {
		conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		require.NoError(t, err)
		defer conn.Close()
		_, err = grpc_health_v1.NewHealthClient(conn).Check(t.Context(), &grpc_health_v1.HealthCheckRequest{})
		return err
	}
	peer, err := mtls.ClientConfig(files(mtls.Pool), mtls.Registry)
	require.NoError(t, err)
	require.NoError(t, dial(peer), "a peer with its service certificate is served")
	anon, err := mtls.CAOnlyConfig(filepath.Join(dir, "ca.pem"), "", mtls.Registry)
	require.NoError(t, err)
	err = dial(anon)
	require.Equal(t, codes.Unavailable, status.Code(err), "no certificate, no request: %v", err)
}
