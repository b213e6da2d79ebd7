package peers_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/peers"
	"github.com/ringfence/ringfence/internal/testutil"
)

// silentRegistry never answers AuthenticateKey.
type silentRegistry struct {
	registryinternalv1.UnimplementedRegistryInternalServiceServer
}

func (silentRegistry) AuthenticateKey(ctx context.Context, _ *registryinternalv1.AuthenticateKeyRequest) (*registryinternalv1.AuthenticateKeyResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestAKeyCheckIsBounded: a registry that stops answering makes a key check fail UNAVAILABLE
// after a bounded wait, even for a caller with no deadline of its own. Servers check keys on
// a connection's reader before admitting a stream, which must not stall for long.
func TestAKeyCheckIsBounded(t *testing.T) {
	srv := grpcserver.New(grpcserver.Options{Name: "registry", GRPCAddr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	registryinternalv1.RegisterRegistryInternalServiceServer(srv.GRPC(), silentRegistry{})
	conn, _ := testutil.Serve(t, srv)
	reg := peers.NewRegistry(conn)

	done := make(chan error, 1)
	go func() {
		_, err := reg.VerifyKey(context.Background(), auth.HashKey("rf_some-key"))
		done <- err
	}()
	select {
	case err := <-done:
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("a key check waited on a silent registry with no bound")
	}
}
