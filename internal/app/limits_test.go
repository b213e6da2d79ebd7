package app

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/grpcserver"
)

// TestConnectionLimitComesFromConfig: limits.max_connections_per_address reaches both
// listeners of a binary, and its default is the server's own.
func TestConnectionLimitComesFromConfig(t *testing.T) {
	require.Equal(t, grpcserver.DefaultMaxConnsPerAddress, testConfig(t).Limits.MaxConnectionsPerAddress)

	cfg := testConfig(t, "RINGFENCE_LIMITS__MAX_CONNECTIONS_PER_ADDRESS=2")
	a, err := NewAllInOne(t.Context(), cfg, quietLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	go func() { _ = a.Server.Run(t.Context()) }()
	grpcAddr, httpAddr, err := a.Server.Addrs(t.Context())
	require.NoError(t, err)

	for _, addr := range []net.Addr{grpcAddr, httpAddr} {
		// served reports whether the server keeps a new connection: the gRPC listener speaks
		// first (its SETTINGS), the HTTP one answers a request.
		served := func() bool {
			c, err := net.Dial("tcp", addr.String())
			if err != nil {
				return false
			}
			t.Cleanup(func() { c.Close() })
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if addr == httpAddr {
				if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")); err != nil {
					return false
				}
			}
			_, err = c.Read(make([]byte, 1))
			return err == nil
		}
		require.True(t, served(), addr.String())
		require.True(t, served(), addr.String())
		require.False(t, served(), "%s: a third connection from one address", addr)
	}
}
