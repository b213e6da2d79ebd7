package grpcserver

import (
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// refusalLog reports what the server refuses before it does any work (streams of callers that
// did not prove who they are, connections over the per-address bound) as WARN lines naming the
// peer, at most one per peer, listener and reason per interval: the first refusal at once,
// later ones counted and reported together by a sweep. A flood is thus visible without the
// log becoming the flood. Every refusal is also counted in ringfence_refused_total.
type refusalLog struct {
	log     *slog.Logger
	every   time.Duration
	counter *prometheus.CounterVec

	mu       sync.Mutex
	peers    map[refusalKey]*refusalCount
	sweeping bool
}

type refusalKey struct{ listener, peer, reason string }

type refusalCount struct {
	n    int
	last time.Time // when this key was last logged
}

// maxRefusalPeers bounds the peers tracked at once; refusals from further peers are reported
// under one key, so many addresses cannot grow the map without bound.
const maxRefusalPeers = 4096

func newRefusalLog(log *slog.Logger, every time.Duration) *refusalLog {
	return &refusalLog{
		log: log, every: every, peers: make(map[refusalKey]*refusalCount),
		counter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringfence_refused_total",
			Help: "Streams and connections refused before any request was read, by listener and reason.",
		}, []string{"listener", "reason"}),
	}
}

// note records one refusal from addr on listener ("grpc" or "http") for reason (a gRPC code
// name, or "max_connections_per_address").
func (r *refusalLog) note(listener string, addr net.Addr, reason string) {
	r.counter.WithLabelValues(listener, reason).Inc()
	k := refusalKey{listener: listener, peer: peerKey(addr), reason: reason}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.peers) >= maxRefusalPeers {
		if _, ok := r.peers[k]; !ok {
			k.peer = "(other peers)"
		}
	}
	c, ok := r.peers[k]
	if ok {
		c.n++
		return
	}
	r.peers[k] = &refusalCount{last: now}
	r.write(k, 1, 0)
	if !r.sweeping {
		r.sweeping = true
		go r.sweep()
	}
}

// sweep reports the counts gathered since each key's last line and forgets keys that had
// nothing to report for an interval; it ends when nothing is left.
func (r *refusalLog) sweep() {
	t := time.NewTicker(r.every / 2)
	defer t.Stop()
	for now := range t.C {
		r.mu.Lock()
		for k, c := range r.peers {
			if now.Sub(c.last) < r.every {
				continue
			}
			if c.n == 0 {
				delete(r.peers, k)
				continue
			}
			r.write(k, c.n, now.Sub(c.last))
			c.n, c.last = 0, now
		}
		if len(r.peers) == 0 {
			r.sweeping = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

func (r *refusalLog) write(k refusalKey, n int, over time.Duration) {
	msg := "refused a peer before reading a request"
	if k.reason == reasonConnLimit {
		msg = "refused a connection over the per-address limit"
	}
	attrs := []any{"listener", k.listener, "peer", k.peer, "reason", k.reason, "refused", n}
	if over > 0 {
		attrs = append(attrs, "over", over.Round(time.Second))
	} else {
		attrs = append(attrs, "next_report_within", r.every)
	}
	r.log.Warn(msg, attrs...)
}

// remoteAddr is the peer of an HTTP request as a net.Addr (nil when net/http left it unset).
func remoteAddr(r *http.Request) net.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return nil
	}
	return net.TCPAddrFromAddrPort(ap)
}

// peerKey is what connections and refusals are counted under: the IP of an IPv4 peer, the /64
// of an IPv6 peer (one host commonly holds a whole /64), and the address itself otherwise.
func peerKey(a net.Addr) string {
	if a == nil {
		return "unknown"
	}
	var ip netip.Addr
	switch v := a.(type) {
	case *net.TCPAddr:
		ip = v.AddrPort().Addr()
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return a.String()
		}
		ip = ap.Addr()
	}
	ip = ip.Unmap()
	switch {
	case ip.Is4():
		return ip.String()
	case ip.Is6():
		p, _ := ip.WithZone("").Prefix(64)
		return p.String()
	}
	return a.String()
}
