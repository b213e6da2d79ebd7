package registry

import (
	"context"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/mcpserver"
)

// WarmTargets lists the registrations that ask for warm containers (prewarm above 0), with
// their revisions: what the pool polls to keep its warm sets (in-process, or through
// ListWarmTargets).
func (s *Service) WarmTargets(ctx context.Context) ([]mcpserver.WarmTarget, error) {
	return s.store.WarmTargets(ctx)
}

// ListWarmTargets implements RegistryInternalService: the pool polls the registrations that
// ask for warm containers.
func (s *InternalServer) ListWarmTargets(ctx context.Context, _ *registryinternalv1.ListWarmTargetsRequest) (*registryinternalv1.ListWarmTargetsResponse, error) {
	targets, err := s.WarmTargets(ctx)
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	resp := &registryinternalv1.ListWarmTargetsResponse{Targets: make([]*registryinternalv1.WarmTarget, len(targets))}
	for i, t := range targets {
		resp.Targets[i] = &registryinternalv1.WarmTarget{Ref: t.Ref, Prewarm: int32(t.Prewarm), Revision: t.Revision}
	}
	return resp, nil
}

// warmStatusTimeout bounds asking the pool for its warm containers while answering a read: a
// pool that does not answer leaves them out of the answer rather than holding it up.
const warmStatusTimeout = 2 * time.Second

// withCallback fills the callback URL of each registration with sign-in (OAuthSignIn is the
// registry's to show, the URL the deployment's: oauth.callback_url), on copies: a registration
// read from the store's view is shared.
func (s *Service) withCallback(servers []*registryv1.Server) []*registryv1.Server {
	out := servers
	for i, sv := range servers {
		if sv.GetOauth() == nil || s.cfg.OAuthCallbackURL == "" {
			continue
		}
		if &out[0] == &servers[0] {
			out = slices.Clone(servers)
		}
		c := proto.CloneOf(sv)
		c.Oauth.CallbackUrl = s.cfg.OAuthCallbackURL
		out[i] = c
	}
	return out
}

// withWarm returns servers with the pool's warm containers set on each that asks for some
// (Server.warm). The registry holds no such state: the pool that runs the containers is asked,
// once per answer. A pool that cannot be asked leaves warm out, which the field's absence says;
// the read itself still succeeds. servers may be shared views (GetServer's): any changed is
// a copy.
func (s *Service) withWarm(ctx context.Context, servers ...*registryv1.Server) []*registryv1.Server {
	servers = s.withCallback(servers)
	var refs []string
	for _, sv := range servers {
		if sv.GetPrewarm() > 0 {
			refs = append(refs, sv.GetRef())
		}
	}
	if len(refs) == 0 || s.cfg.Warm == nil {
		return servers
	}
	wctx, cancel := context.WithTimeout(ctx, warmStatusTimeout)
	defer cancel()
	status, err := s.cfg.Warm.WarmStatus(wctx, refs)
	if err != nil {
		s.log.Warn("the pool could not be asked for its warm containers: the answer leaves them out", "servers", len(refs), "err", err)
		return servers
	}
	out := slices.Clone(servers)
	for i, sv := range out {
		if sv.GetPrewarm() == 0 {
			continue
		}
		st := status[sv.GetRef()]
		c := proto.CloneOf(sv)
		c.Warm = &registryv1.WarmStatus{Ready: int32(st.Ready), Starting: int32(st.Starting)}
		out[i] = c
	}
	return out
}
