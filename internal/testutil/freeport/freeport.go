// Package freeport hands out loopback ports for daemons a test starts, apart from testutil so
// that packages testutil depends on (internal/audit, through etcdtest) can use it too.
package freeport

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Addr is a loopback address nothing listens on, for a daemon started after it is known.
// A port from net.Listen(":0") is free only until the kernel hands it out again: to another
// listener on port 0 (a test package running beside this one) or as the local port of an
// outgoing connection, and then the daemon fails to bind it (CI saw that once). So ports come
// from just below the kernel's ephemeral range, which neither ever uses, and each is handed
// out once per test binary.
func Addr(t testing.TB) string {
	t.Helper()
	ports.Lock()
	defer ports.Unlock()
	if ports.next == 0 {
		ports.low = ephemeralLow() - 16384
		ports.next = ports.low + rand.IntN(8192)
	}
	for range 16384 {
		port := ports.next
		if ports.next++; ports.next >= ports.low+16384 {
			ports.next = ports.low
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken by something outside this binary
		}
		require.NoError(t, l.Close())
		return l.Addr().String()
	}
	t.Fatalf("no free loopback port in [%d, %d)", ports.low, ports.low+16384)
	return ""
}

// ports hands out Addr's ports, each once.
var ports struct {
	sync.Mutex
	low, next int
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 if it cannot be read).
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if low, err := strconv.Atoi(f[0]); err == nil && low >= 16384+1024 {
				return low
			}
		}
	}
	return 32768
}
