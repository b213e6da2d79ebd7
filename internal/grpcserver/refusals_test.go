package grpcserver

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRefusalsAreLoggedOncePerPeerAndInterval: the first refusal from a peer is a WARN line at
// once; the rest are counted and reported together by a later line, not one line each. Peers
// are told apart by IPv4 address and IPv6 /64.
func TestRefusalsAreLoggedOncePerPeerAndInterval(t *testing.T) {
	var logs lockedBuffer
	r := newRefusalLog(slog.New(slog.NewTextHandler(&logs, nil)), 50*time.Millisecond)
	a := &net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 40000}
	for i := range 200 {
		r.note("grpc", &net.TCPAddr{IP: a.IP, Port: 40000 + i}, "Unauthenticated")
	}
	r.note("grpc", &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::1"), Port: 1}, "Unauthenticated")
	r.note("grpc", &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::9"), Port: 2}, "Unauthenticated")

	first := "peer=203.0.113.7 reason=Unauthenticated refused=1 next_report_within=50ms"
	require.Contains(t, logs.String(), first)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "peer=203.0.113.7 reason=Unauthenticated refused=199 over=")
	}, 10*time.Second, 10*time.Millisecond, logs.String())
	require.Equal(t, 2, strings.Count(logs.String(), "peer=203.0.113.7 "), logs.String())
	require.Contains(t, logs.String(), "peer=2001:db8:1:2::/64 reason=Unauthenticated refused=1 ")
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "peer=2001:db8:1:2::/64 reason=Unauthenticated refused=1 over=")
	},
		10*time.Second, 10*time.Millisecond, "one /64 is one peer")

	// Quiet peers are forgotten, and the sweep ends with them.
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return !r.sweeping && len(r.peers) == 0
	}, 10*time.Second, 10*time.Millisecond)
}

func TestPeerKey(t *testing.T) {
	for addr, want := range map[net.Addr]string{
		&net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 5}:         "192.0.2.1",
		&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 5}:  "192.0.2.1",
		&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Zone: "eth0"}:  "2001:db8::/64",
		&net.UnixAddr{Name: "/run/ringfence.sock", Net: "unix"}:     "/run/ringfence.sock",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:0:0:8::1"), Port: 9}: "2001:db8::/64",
	} {
		require.Equal(t, want, peerKey(addr), "%v", addr)
	}
	require.Equal(t, "unknown", peerKey(nil))
}
