package grpcserver

import (
	"context"

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
func (s *Server) admit(a Admitter) func(context.Context, *tap.Info) (context.Context, error) {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if err := a.Admit(ctx, info.FullMethodName); err != nil {
			if p, ok := peer.FromContext(ctx); ok {
				s.refusals.note("grpc", p.Addr, status.Code(err).String())
			}
			return ctx, err
		}
		return ctx, nil
	}
}
