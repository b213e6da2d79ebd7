package grpcserver

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Admitter is implemented by an Authorizer that can tell from a stream's headers and its
// connection alone whether the caller has proven who it is (auth.Authorizer.Admit). When the
// server's Authorizer has it, every stream on the gRPC listener is admitted or refused before
// a byte of its request is read; Authorize still decides the permission afterwards.
//
// Admit runs on the connection's reader goroutine, holding the transport's lock: while it
// runs, nothing else is read from that connection and its finishing streams wait, so it must
// not block for long. auth.Authorizer.Admit costs a SHA-256 and one key lookup: in-process
// (ringfenced, ringfence-registry) a map lookup; in a split deployment a key not seen for 5 s
// costs one AuthenticateKey round trip to the registry, bounded at 2 s (peers.Registry), and
// is then cached, refusals included. Only the connection whose stream is being checked waits,
// so a stranger stalls no one but itself, and its checks on one connection run one at a time.
type Admitter interface {
	// Admit returns a status error for a caller that has not proven who it is. ctx carries
	// the stream's incoming metadata and its peer (with the TLS state).
	Admit(ctx context.Context, fullMethod string) error
}

// admit is the grpc.InTapHandle of the gRPC listener. grpc-go calls it once the stream's
// headers are in, before the stream is registered: a refusal is answered at once with its
// status (trailers only), the stream never exists, and DATA frames that follow it are dropped
// unread.
//
// A method the listener does not serve is refused first, as UNIMPLEMENTED: the public port
// answers for an internal method exactly as for one that does not exist.
func (s *Server) admit(a Admitter, listener string, served *servedMethods) func(context.Context, *tap.Info) (context.Context, error) {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		err := served.check(info.FullMethodName)
		if err == nil {
			err = a.Admit(ctx, info.FullMethodName)
		}
		if err != nil {
			if p, ok := peer.FromContext(ctx); ok {
				s.refusals.note(listener, p.Addr, status.Code(err).String())
			}
			return ctx, err
		}
		return ctx, nil
	}
}

// servedMethods is the set of methods one gRPC server serves, read from it once, at the first
// stream: services are registered before the server starts serving.
type servedMethods struct {
	server  func() *grpc.Server
	once    sync.Once
	methods map[string]bool
	// services are the services of methods.
	services map[string]bool
}

func newServedMethods(server func() *grpc.Server) *servedMethods {
	return &servedMethods{server: server}
}

// check refuses a method the server does not serve, before anything of the stream is read.
func (m *servedMethods) check(fullMethod string) error {
	m.once.Do(func() {
		m.methods, m.services = make(map[string]bool), make(map[string]bool)
		for svc, info := range m.server().GetServiceInfo() {
			m.services[svc] = true
			for _, md := range info.Methods {
				m.methods["/"+svc+"/"+md.Name] = true
			}
		}
	})
	if m.methods[fullMethod] {
		return nil
	}
	// The refusals grpc-go itself gives an unknown service or method, given before the request
	// is read, with their usual causes: in a split deployment each binary serves its own
	// services (the CLI reads "unknown service <name>" to name the binary that serves it), and
	// the public API and the internal plane are served on different listeners.
	if svc, _, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/"); ok && !m.services[svc] {
		return status.Errorf(codes.Unimplemented, "unknown service %s: this listener does not serve it: in a split deployment each binary serves its own services, the public API on RINGFENCE_GRPC_ADDR and internal RPCs (mutual TLS) on RINGFENCE_INTERNAL_ADDR; grpcurl ... list shows what a listener serves", svc)
	}
	return status.Errorf(codes.Unimplemented, "grpcserver: unknown method %s on this listener: the public API is served on RINGFENCE_GRPC_ADDR and internal RPCs (mutual TLS) on RINGFENCE_INTERNAL_ADDR; grpcurl ... list shows what a listener serves", strings.TrimPrefix(fullMethod, "/"))
}
