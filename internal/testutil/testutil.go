// Package testutil holds the helpers every package's tests share: serving a real
// grpcserver.Server on loopback, dialing it with an API key, and asserting status codes.
package testutil

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/testutil/freeport"
)

// RequireStatus asserts that err is a gRPC status with code.
func RequireStatus(t testing.TB, err error, code codes.Code, msgAndArgs ...any) *status.Status {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status error: %v", err)
	require.Equal(t, code.String(), st.Code().String(), "message: %s", st.Message())
	return st
}

// WithKey returns ctx carrying an API key.
func WithKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, auth.MetadataKey, key)
}

// Serve runs srv on loopback until the test ends and returns a client connection and the
// HTTP base URL (empty when HTTP is disabled). srv must be built with port-0 addresses.
func Serve(t testing.TB, srv *grpcserver.Server) (*grpc.ClientConn, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("server did not stop within 30s")
		}
	})
	addrCtx, addrCancel := context.WithTimeout(ctx, 10*time.Second)
	defer addrCancel()
	grpcAddr, httpAddr, err := srv.Addrs(addrCtx)
	require.NoError(t, err)
	conn, err := grpc.NewClient(grpcAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	base := ""
	if httpAddr != nil {
		base = "http://" + httpAddr.String()
	}
	return conn, base
}

// FreeAddr is a loopback address nothing listens on (freeport.Addr).
func FreeAddr(t testing.TB) string { return freeport.Addr(t) }

// SyncBuffer collects output written from several goroutines (a child process's copiers, a
// logger) for assertions while it is still being written.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
