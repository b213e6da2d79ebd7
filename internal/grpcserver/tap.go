package grpcserver

import (
	"context"
	"slices"
	"strings"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ringfence/ringfence/internal/fielderr"
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
	server   func() *grpc.Server
	once     sync.Once
	methods  map[string]bool
	services map[string]bool
	listed   string // the Ringfence services served, for a refusal to name
}

func newServedMethods(server func() *grpc.Server) *servedMethods {
	return &servedMethods{server: server}
}

// check refuses a method the server does not serve, before anything of the stream is read.
func (m *servedMethods) check(fullMethod string) error {
	m.once.Do(func() {
		m.methods, m.services = make(map[string]bool), make(map[string]bool)
		var ours []string
		for svc, info := range m.server().GetServiceInfo() {
			m.services[svc] = true
			if strings.HasPrefix(svc, "ringfence.") {
				ours = append(ours, svc)
			}
			for _, md := range info.Methods {
				m.methods["/"+svc+"/"+md.Name] = true
			}
		}
		slices.Sort(ours)
		m.listed = strings.Join(ours, ", ")
	})
	if m.methods[fullMethod] {
		return nil
	}
	svc, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !protoreflect.FullName(svc).IsValid() {
		return status.Errorf(codes.Unimplemented, "grpcserver: unknown method %s on this listener; grpcurl ... list shows what a listener serves", fielderr.Quote(strings.TrimPrefix(fullMethod, "/")))
	}
	if m.services[svc] {
		return status.Errorf(codes.Unimplemented, "grpcserver: unknown method %s of %s; grpcurl ... describe %s lists its methods", fielderr.Quote(method), svc, svc)
	}
	// grpc-go's own words for a service nobody registered, which clients recognize (the CLI
	// turns them into a hint naming the binary to ask); the detail says the same to grpcurl.
	// The public port answers for an internal service exactly as for any other it does not
	// serve: what serves a service is read from its name, never from whether it exists.
	st := status.Newf(codes.Unimplemented, "unknown service %s", svc)
	meta := map[string]string{"service": svc, "this_listener_serves": m.listed}
	if by := servedBy(svc); by != "" {
		meta["served_by"] = by
	}
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: "SERVICE_NOT_SERVED", Domain: "ringfence", Metadata: meta}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// servedBy says which listener of which binary serves a Ringfence service, read from its
// proto package (ringfence.<service>.v1, ringfence.internal.<service>.v1), or "".
func servedBy(svc string) string {
	parts := strings.Split(svc, ".")
	internal := len(parts) == 5 && parts[1] == "internal"
	if internal {
		parts = append(parts[:1], parts[2:]...)
	}
	if len(parts) != 4 || parts[0] != "ringfence" || !slices.Contains([]string{"registry", "publisher", "pool", "audit"}, parts[1]) {
		return ""
	}
	if internal {
		return "ringfence-" + parts[1] + " on its internal listener (RINGFENCE_INTERNAL_ADDR, mutual TLS with a service certificate only); ringfenced serves internal RPCs nowhere"
	}
	return "ringfence-" + parts[1] + " on its RINGFENCE_GRPC_ADDR in a split deployment; ringfenced serves every public service"
}
