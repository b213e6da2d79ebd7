package pool

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// InternalServer serves the pool's internal API (ringfence.internal.pool.v1) on a split
// binary's internal listener: discovery for the control plane, and its warm containers for the
// registry, and requests other pool hosts forward to the owner of their run (ForwardRun, and
// ForwardCallTool for their front doors' calls).
type InternalServer struct {
	poolinternalv1.UnsafePoolInternalServiceServer
	svc     *Service
	calls   *Server
	forward map[string]func(context.Context, []byte) (proto.Message, error)
}

var _ poolinternalv1.PoolInternalServiceServer = (*InternalServer)(nil)

// NewInternalServer wraps the service's internal API for gRPC.
func NewInternalServer(svc *Service) *InternalServer {
	calls := NewServer(svc)
	return &InternalServer{svc: svc, calls: calls, forward: forwardable(calls)}
}

// Discover implements PoolInternalService.Discover.
func (g *InternalServer) Discover(ctx context.Context, req *poolinternalv1.DiscoverRequest) (*poolinternalv1.DiscoverResponse, error) {
	if err := mcpserver.ValidateRef(req.GetServerRef()); err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	if err := mayExplore(ctx, req); err != nil {
		return nil, err
	}
	tenant, err := auth.TenantFrom(ctx)
	if err != nil {
		return nil, err
	}
	listing, call, err := g.svc.ExploreTools(ctx, discovery.ExploreRequest{
		Ref: req.GetServerRef(), Call: req.GetCall(), Adhoc: req.GetAdhoc(), Tenant: tenant, ActorKeyID: req.GetActorKeyId(), Actor: req.GetActor(),
		User: req.GetUser(),
	})
	if err != nil {
		return nil, discovery.Status(ctx, g.svc.errors, err)
	}
	return &poolinternalv1.DiscoverResponse{
		Tools: discovery.ToolsToProto(listing.Tools), ListingFindings: discovery.FindingsToProto(listing.Findings),
		RegistrationRevision: listing.Revision, Call: call,
	}, nil
}

// mayExplore refuses what only the registry may ask of Discover. The publisher lists a
// registered server's tools to import them; a call, an ad hoc spec, or the tenant and key a
// call is made for run tools and start unregistered commands, which is the registry's
// ExploreServer, checked there against the operator's key. Without this, a publisher
// certificate would run any tool of any server outside a run.
func mayExplore(ctx context.Context, req *poolinternalv1.DiscoverRequest) error {
	if req.GetCall() == nil && req.GetAdhoc() == nil && req.GetActorKeyId() == "" && req.GetActor() == "" &&
		(req.GetTenant() == "" || req.GetUser() != "") {
		return nil // a listing, for everyone's imports or one user's
	}
	if p, err := auth.PrincipalFrom(ctx); err == nil && p.Service == mtls.Registry {
		return nil
	}
	return status.Error(codes.PermissionDenied, "pool: only the registry's certificate may explore with a call, an ad hoc spec, a tenant or an actor key; other callers may only list a registered server's tools (leave call, adhoc, tenant and actor_key_id empty)")
}

// maxWarmStatusRefs bounds one GetWarmStatus: the registry asks for a page of ListServers.
const maxWarmStatusRefs = 1000

// GetWarmStatus implements PoolInternalService.GetWarmStatus: the registry shows this pool's
// warm containers in GetServer and ListServers.
func (g *InternalServer) GetWarmStatus(ctx context.Context, req *poolinternalv1.GetWarmStatusRequest) (*poolinternalv1.GetWarmStatusResponse, error) {
	refs := req.GetServerRefs()
	if len(refs) > maxWarmStatusRefs {
		return nil, g.svc.errors.Status(ctx, fieldError("server_refs", "has %d refs; at most %d", len(refs), maxWarmStatusRefs))
	}
	for _, ref := range refs {
		if err := mcpserver.ValidateRef(ref); err != nil {
			return nil, g.svc.errors.Status(ctx, err)
		}
	}
	status, err := g.svc.WarmStatus(ctx, refs)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	resp := &poolinternalv1.GetWarmStatusResponse{Warm: make(map[string]*registryv1.WarmStatus, len(status))}
	for ref, st := range status {
		resp.Warm[ref] = &registryv1.WarmStatus{Ready: int32(st.Ready), Starting: int32(st.Starting)}
	}
	return resp, nil
}

// forwardable are the public RPCs one pool host forwards to another: every request about one
// run, and StartRun (placement). Each decodes its request and calls the public handler, which
// serves it here (a forwarded request is never forwarded again).
func forwardable(g *Server) map[string]func(context.Context, []byte) (proto.Message, error) {
	return map[string]func(context.Context, []byte) (proto.Message, error){
		poolv1.PoolService_StartRun_FullMethodName:         served(g.StartRun),
		poolv1.PoolService_GetRun_FullMethodName:           served(g.GetRun),
		poolv1.PoolService_PauseRun_FullMethodName:         served(g.PauseRun),
		poolv1.PoolService_ResumeRun_FullMethodName:        served(g.ResumeRun),
		poolv1.PoolService_EndRun_FullMethodName:           served(g.EndRun),
		poolv1.PoolService_CallTool_FullMethodName:         served(g.CallTool),
		poolv1.PoolService_ListAgentTools_FullMethodName:   served(g.ListAgentTools),
		poolv1.PoolService_ListApprovals_FullMethodName:    served(g.ListApprovals),
		poolv1.PoolService_ApproveCall_FullMethodName:      served(g.ApproveCall),
		poolv1.PoolService_DenyCall_FullMethodName:         served(g.DenyCall),
		poolv1.PoolService_CreateAgentToken_FullMethodName: served(g.CreateAgentToken),
		poolv1.PoolService_ListAgentTokens_FullMethodName:  served(g.ListAgentTokens),
		poolv1.PoolService_RevokeAgentToken_FullMethodName: served(g.RevokeAgentToken),
	}
}

// served adapts a public handler to a request in the wire format.
func served[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](h func(context.Context, PReq) (Resp, error)) func(context.Context, []byte) (proto.Message, error) {
	return func(ctx context.Context, body []byte) (proto.Message, error) {
		req := PReq(new(Req))
		if err := proto.Unmarshal(body, req); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "pool: the forwarded request does not decode as %T: %v", req, err)
		}
		return h(ctx, req)
	}
}

// ForwardRun implements PoolInternalService.ForwardRun: a request another pool host received
// and authorized, served here as its caller's.
func (g *InternalServer) ForwardRun(ctx context.Context, req *poolinternalv1.ForwardRunRequest) (*poolinternalv1.ForwardRunResponse, error) {
	h, ok := g.forward[req.GetMethod()]
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "pool: %s is not a request pool hosts forward", fielderr.Quote(req.GetMethod()))
	}
	ctx, err := g.forwardedCaller(ctx, req.GetCaller(), req.GetTenant(), req.GetMethod(), req.GetRequest())
	if err != nil {
		return nil, err
	}
	resp, err := h(ctx, req.GetRequest())
	if err != nil {
		return nil, err
	}
	body, err := proto.Marshal(resp)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	return &poolinternalv1.ForwardRunResponse{Response: body}, nil
}

// ForwardCallTool implements PoolInternalService.ForwardCallTool: a front door's call another
// pool host received, served here as its caller's through the public handler, as ForwardRun
// serves it, with the server's progress reports sent on the stream while the call runs.
// The reports come from the session's relay (spawner.WithProgress), one at a time, and it
// drops those that come faster than the stream takes them: a receiving host that reads slowly
// holds up the stream, never this host's memory.
func (g *InternalServer) ForwardCallTool(req *poolinternalv1.ForwardCallToolRequest, stream grpc.ServerStreamingServer[poolinternalv1.ForwardCallToolResponse]) error {
	ctx, err := g.forwardedCaller(stream.Context(), req.GetCaller(), req.GetTenant(), poolv1.PoolService_CallTool_FullMethodName, nil)
	if err != nil {
		return err
	}
	// mu orders the relay's sends before the response's: a stream takes one sender at a time,
	// and nothing follows the response.
	var mu sync.Mutex
	answered := false
	if req.GetProgress() {
		ctx = spawner.WithProgress(ctx, func(p spawner.Progress) {
			mu.Lock()
			defer mu.Unlock()
			if answered {
				return
			}
			_ = stream.Send(&poolinternalv1.ForwardCallToolResponse{Event: &poolinternalv1.ForwardCallToolResponse_Progress{
				Progress: &poolinternalv1.CallProgress{Progress: p.Progress, Total: p.Total, Message: p.Message}}})
		})
	}
	resp, err := g.calls.CallTool(ctx, req.GetRequest())
	mu.Lock()
	defer mu.Unlock()
	answered = true
	if err != nil {
		return err
	}
	return stream.Send(&poolinternalv1.ForwardCallToolResponse{Event: &poolinternalv1.ForwardCallToolResponse_Response{Response: resp}})
}

// WatchAgentTools implements PoolInternalService.WatchAgentTools: another pool host's front
// door hears of the changes of a run's listings here (toolwatch.go). A message carries what
// changed since the last one; the first, none.
func (g *InternalServer) WatchAgentTools(req *poolinternalv1.WatchAgentToolsRequest, stream grpc.ServerStreamingServer[poolinternalv1.WatchAgentToolsResponse]) error {
	ctx := stream.Context()
	w, err := g.svc.watchListings(ctx, req.GetTenant(), req.GetRunId())
	if err != nil {
		return g.svc.errors.Status(ctx, err)
	}
	defer g.svc.unwatchListings(runKey{req.GetTenant(), req.GetRunId()}, w)
	if err := stream.Send(&poolinternalv1.WatchAgentToolsResponse{}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return g.svc.errors.Status(ctx, ctx.Err())
		case <-w.gone:
			return g.svc.errors.Status(ctx, w.why)
		case <-w.wake:
		}
		if changes := w.take(); len(changes) > 0 {
			if err := stream.Send(&poolinternalv1.WatchAgentToolsResponse{Changes: changes}); err != nil {
				return err
			}
		}
	}
}

// forwardedCaller is the context a forwarded request for method is served in, as its caller's
// (callerContext), once the caller's permission for the method and tenant binding are checked
// again, so a pool certificate alone never widens what a caller may do. body is the request,
// for an agent token's approval decision.
func (g *InternalServer) forwardedCaller(ctx context.Context, c *poolinternalv1.Caller, tenant, method string, body []byte) (context.Context, error) {
	ctx, err := callerContext(ctx, c, tenant)
	if err != nil {
		return nil, err
	}
	p, _ := auth.FromContext(ctx)
	allowed := p.Has(auth.Rules[method].Permission) && (p.Tenant == "" || p.Tenant == tenant)
	if !allowed && p.AgentToken != "" {
		allowed = g.svc.tokenDecides(ctx, p, tenant, method, body)
	}
	if !allowed {
		return nil, status.Errorf(codes.PermissionDenied, "pool: the forwarded caller %s may not make this request in tenant %q", p.Actor(), tenant)
	}
	return ctx, nil
}
