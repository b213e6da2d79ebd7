package registry

import (
	"context"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/mcpserver"
)

// InternalServer serves the registry's internal API (ringfence.internal.registry.v1) on a split
// binary's internal listener: secrets in clear for the pool, grants, and API-key checks. It is
// a type apart from Service so that no public server can register it by accident.
type InternalServer struct {
	registryinternalv1.UnsafeRegistryInternalServiceServer
	*Service
}

var _ registryinternalv1.RegistryInternalServiceServer = (*InternalServer)(nil)

// Internal is the service's internal API.
func (s *Service) Internal() *InternalServer { return &InternalServer{Service: s} }

// ResolveServer implements RegistryInternalService: the pool resolves a server to start it.
func (s *InternalServer) ResolveServer(ctx context.Context, req *registryinternalv1.ResolveServerRequest) (*registryinternalv1.ResolveServerResponse, error) {
	if err := mcpserver.ValidateRef(req.GetRef()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	res, err := s.ResolveRegistration(ctx, req.GetRef())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	return resolvedToProto(res), nil
}

// resolvedToProto is ResolveServer's answer: the registration, and its secrets in clear,
// including the URL, which the pool connects to (the one place a Server carries it unmasked).
func resolvedToProto(res *mcpserver.Resolved) *registryinternalv1.ResolveServerResponse {
	server := serverToProto(&res.Registration)
	server.Url = res.URL
	return &registryinternalv1.ResolveServerResponse{Server: server, Env: res.Env, HeaderValues: res.HeaderValues, OauthClientSecret: res.ClientSecret}
}

// GetServerPolicy implements RegistryInternalService: the publisher and pool read grants.
func (s *InternalServer) GetServerPolicy(ctx context.Context, req *registryinternalv1.GetServerPolicyRequest) (*registryinternalv1.GetServerPolicyResponse, error) {
	if err := mcpserver.ValidateRef(req.GetRef()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	p, err := s.ServerPolicy(ctx, req.GetRef())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	out := &registryinternalv1.GetServerPolicyResponse{
		Ref: p.Ref, Description: p.Description, Grants: p.Grants, Revision: p.Revision, StrictInputs: p.StrictInputs, SignIn: p.SignIn,
		ToolFilter: &registryv1.ToolFilter{Include: p.Filter.Include, Exclude: p.Filter.Exclude},
	}
	if len(p.ToolPermissions) > 0 {
		out.ToolPermissions = make(map[string]*registryv1.ToolPermissions, len(p.ToolPermissions))
		for tool, reqs := range p.ToolPermissions {
			out.ToolPermissions[tool] = &registryv1.ToolPermissions{Required: reqs}
		}
	}
	return out, nil
}

// AuthenticateKey implements RegistryInternalService: other services verify API keys.
func (s *InternalServer) AuthenticateKey(ctx context.Context, req *registryinternalv1.AuthenticateKeyRequest) (*registryinternalv1.AuthenticateKeyResponse, error) {
	if len(req.GetKeySha256()) != 64 {
		return nil, s.errors.Status(ctx, fielderr.New("key_sha256", "must be 64 lowercase hex characters"))
	}
	p, err := s.VerifyKey(ctx, req.GetKeySha256())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	resp := &registryinternalv1.AuthenticateKeyResponse{KeyId: p.KeyID, KeyName: p.KeyName, Role: p.Role, Tenant: p.Tenant}
	for _, perm := range p.Permissions {
		resp.Permissions = append(resp.Permissions, string(perm))
	}
	return resp, nil
}
