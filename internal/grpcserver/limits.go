package grpcserver

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Limits bound what one peer can make a server hold on its network listeners. Zero fields
// take the defaults. docs/security.md states what each one leaves a stranger and a key holder.
type Limits struct {
	// MaxConnsPerAddress bounds the connections one peer address holds open on each listener
	// (gRPC and HTTP counted apart); an IPv6 peer is counted by its /64. A connection over the
	// bound is closed as soon as it is accepted, before anything is read from it. Default 128.
	MaxConnsPerAddress int
	// MaxStreamsPerConn bounds the concurrent gRPC streams of one connection. It is announced
	// to the client (SETTINGS_MAX_CONCURRENT_STREAMS), so grpc-go clients queue calls beyond
	// it; a stream over it is reset (REFUSED_STREAM) before anything is allocated for it.
	// Default 100.
	MaxStreamsPerConn uint32
	// MaxHeaderBytes bounds the metadata of one gRPC request (grpc-go's own default is
	// 16 MiB, read before any check). Default 64 KiB, as on the HTTP listener.
	MaxHeaderBytes uint32
	// HandshakeTimeout bounds a gRPC connection's TLS handshake and HTTP/2 preface.
	// Default 10s.
	HandshakeTimeout time.Duration
	// IdleTimeout closes (GOAWAY) a gRPC connection that has had no admitted stream for this
	// long; refused streams do not count. Clients reconnect on their next call. Default 5m.
	IdleTimeout time.Duration
}

// Defaults of Limits.
const (
	DefaultMaxConnsPerAddress = 128
	DefaultMaxStreamsPerConn  = 100
	DefaultMaxHeaderBytes     = 64 << 10
	DefaultHandshakeTimeout   = 10 * time.Second
	DefaultIdleTimeout        = 5 * time.Minute
)

// Keepalive policy of the gRPC listener. A client may ping at most every pingMinInterval, and
// only while it has a stream open (an idle connection is closed by IdleTimeout anyway); a
// third ping too early ends the connection with GOAWAY ENHANCE_YOUR_CALM "too_many_pings".
// The server pings a connection that was silent for pingAfter and closes it when the answer
// takes longer than pingTimeout, so a vanished client's watch streams do not linger.
const (
	pingMinInterval = 20 * time.Second
	pingAfter       = 2 * time.Minute
	pingTimeout     = 20 * time.Second
)

func (l Limits) withDefaults() Limits {
	if l.MaxConnsPerAddress == 0 {
		l.MaxConnsPerAddress = DefaultMaxConnsPerAddress
	}
	if l.MaxStreamsPerConn == 0 {
		l.MaxStreamsPerConn = DefaultMaxStreamsPerConn
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	return l
}

// networkOptions are the options of the gRPC server behind the network listener, on top of
// those it shares with the gateway's in-process server: the per-connection bounds, the
// keepalive policy and the admission tap. The in-process server has none of them: its one
// client is the REST gateway, behind the HTTP listener's own bounds and authenticateFirst, and
// a stream limit there would cap every REST call in flight together (audit watches included).
func (s *Server) networkOptions(listener string, served *servedMethods) []grpc.ServerOption {
	l := s.opts.Limits
	opts := []grpc.ServerOption{
		grpc.MaxConcurrentStreams(l.MaxStreamsPerConn),
		grpc.MaxHeaderListSize(l.MaxHeaderBytes),
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: pingMinInterval}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.IdleTimeout, Time: pingAfter, Timeout: pingTimeout}),
	}
	if a, ok := s.opts.Authorizer.(Admitter); ok {
		opts = append(opts, grpc.InTapHandle(s.admit(a, listener, served)))
	}
	return opts
}
