package freeport

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFreeAddrStaysOutOfTheKernelsWay: Addr's ports are never ones the kernel hands to a
// listener on port 0 or an outgoing connection, and none is handed out twice.
func TestFreeAddrStaysOutOfTheKernelsWay(t *testing.T) {
	low := ephemeralLow()
	seen := map[string]bool{}
	for range 200 {
		addr := Addr(t)
		require.False(t, seen[addr], "%s handed out twice", addr)
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		port, err := strconv.Atoi(p)
		require.NoError(t, err)
		require.Less(t, port, low, "%s is in the ephemeral range starting at %d", addr, low)
		require.GreaterOrEqual(t, port, 1024)
	}
}
