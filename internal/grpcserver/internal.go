package grpcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	goruntime "runtime"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
)

// The internal plane: the RPCs services call each other with (ringfence.internal.*), served
// on a listener apart from the public one. Only a peer presenting a certificate that chains to
// the configured CA completes the TLS handshake there, so an API-key client or a stranger
// without one is refused before any request is read; which service may call which RPC is then
// decided by the same authorization rules (auth.Rules) as on the public port. The public port
// never serves, nor reflects, an internal service.

// errInternalTLS refuses an internal listener that would accept anything but mutual TLS.
var errInternalTLS = errors.New("grpcserver: the internal listener accepts mutual TLS only: its TLS configuration must require and verify a client certificate (mtls.InternalServerConfig)")

// newInternal is the internal listener's gRPC server: the same interceptors and message bound
// as the public one, a health service and reflection of what it serves (only peers with a
// service certificate reach it). Its health service is its own: the public port's names only
// the services the public port serves, as its reflection does.
func (s *Server) newInternal() *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
		grpc.MaxRecvMsgSize(s.opts.MaxRecvMsgSize),
		grpc.NumStreamWorkers(uint32(max(16, 2*goruntime.GOMAXPROCS(0)))),
	}
	if s.opts.InternalTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.opts.InternalTLS)))
	}
	opts = append(opts, s.opts.Tracing.ServerOptions(false)...)
	// The same per-peer bounds and admission tap as the public listener: the handshake already
	// demands a service certificate, and the tap decides each method by its identity before the
	// message is read.
	var srv *grpc.Server
	srv = grpc.NewServer(append(opts, s.networkOptions("internal", newServedMethods(func() *grpc.Server { return srv }))...)...)
	s.internalHealth = health.NewServer()
	grpc_health_v1.RegisterHealthServer(srv, s.internalHealth)
	reflection.Register(srv)
	return srv
}

// Internal is the server to register internal services on; nil without InternalAddr.
func (s *Server) Internal() *grpc.Server { return s.internal }

// InternalAddr reports the internal listener's bound address once Run is listening (nil
// without one).
func (s *Server) InternalAddr(ctx context.Context) (net.Addr, error) {
	select {
	case <-s.listening:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.internalAddr, nil
}

// listenInternal opens the internal listener, refusing one that is not mutual TLS.
func (s *Server) listenInternal() (net.Listener, error) {
	if s.internal == nil {
		return nil, nil
	}
	if t := s.opts.InternalTLS; t == nil || t.ClientAuth != tls.RequireAndVerifyClientCert || t.MinVersion < tls.VersionTLS13 {
		return nil, errInternalTLS
	}
	lis, err := net.Listen("tcp", s.opts.InternalAddr)
	if err != nil {
		return nil, fmt.Errorf("grpcserver: listen on internal_addr %s: %w (is another server running there?)", s.opts.InternalAddr, err)
	}
	return limitConns(lis, "internal", s.opts.Limits.MaxConnsPerAddress, s.refusals), nil
}

func closeListener(l net.Listener) {
	if l != nil {
		l.Close()
	}
}

// PropagateRequestID passes the request id of the call being served (RequestID) on to a
// peer, so the peer's access log and errors name the same request. Dial peers with both.
func PropagateRequestID() (grpc.UnaryClientInterceptor, grpc.StreamClientInterceptor) {
	withID := func(ctx context.Context) context.Context {
		if rid := RequestID(ctx); rid != "" {
			return metadata.AppendToOutgoingContext(ctx, RequestIDKey, rid)
		}
		return ctx
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(withID(ctx), method, req, reply, cc, opts...)
		}, func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(withID(ctx), desc, cc, method, opts...)
		}
}
