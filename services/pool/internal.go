package pool

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/mtls"
)

// InternalServer serves the pool's internal API (ringfence.internal.pool.v1) on a split
// binary's internal listener: discovery for the control plane, and its warm containers for the
// registry.
type InternalServer struct {
	poolinternalv1.UnsafePoolInternalServiceServer
	svc *Service
}

var _ poolinternalv1.PoolInternalServiceServer = (*InternalServer)(nil)

// NewInternalServer wraps the service's internal API for gRPC.
func NewInternalServer(svc *Service) *InternalServer { return &InternalServer{svc: svc} }

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
