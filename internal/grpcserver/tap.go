package grpcserver

import (
	"context"
	"time"

	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Admitter is implemented by an Authorizer that can tell from a stream's headers and its
// connection alone whether the caller has proven who it is (auth.Authorizer.Admit). When the
// server's Authorizer has it, every stream on the gRPC listener is admitted or refused before
// a byte of its request is read; Authorize still decides the permission afterwards.
type Admitter interface {
	// Admit returns a status error for a caller that has not proven who it is. ctx carries
	// the stream's incoming metadata and its peer (with the TLS state).
	Admit(ctx context.Context, fullMethod string) error
}

// admitTimeout bounds one admission check. The check runs on the connection's reader
// goroutine, holding the transport's lock: while it runs, nothing else is read from that
// connection and its finishing streams wait. In-process (ringfenced, ringfence-registry) it is
// a SHA-256 and a map lookup. In a split deployment a key not seen for 5 s costs one
// AuthenticateKey round trip to the registry (then it is cached, refusals included); the
// bound keeps a registry that stopped answering from stalling a connection for longer. Only
// the connection whose stream is being checked waits, so a stranger stalls no one but
// itself, and its checks on one connection run one at a time.
const admitTimeout = 2 * time.Second

// admit is the grpc.InTapHandle of the gRPC listener. grpc-go calls it once the stream's
// headers are in, before the stream is registered: a refusal is answered at once with its
// status (trailers only), the stream never exists, and DATA frames that follow it are dropped
// unread.
func (s *Server) admit(a Admitter) func(context.Context, *tap.Info) (context.Context, error) {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		actx, cancel := context.WithTimeout(ctx, admitTimeout)
		err := a.Admit(actx, info.FullMethodName)
		cancel()
		if err != nil {
			if p, ok := peer.FromContext(ctx); ok {
				s.refusals.note("grpc", p.Addr, status.Code(err).String())
			}
			return ctx, err
		}
		return ctx, nil
	}
}
