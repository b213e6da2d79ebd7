package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/services/registry/internal/store"

	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/paging"
)

// CreateServer implements RegistryService.
func (s *Service) CreateServer(ctx context.Context, req *registryv1.CreateServerRequest) (*registryv1.CreateServerResponse, error) {
	if err := mcpserver.ValidateNewRef(req.GetRef()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	reg, _, err := registrationFromProto(req, s.cfg.AllowedEnvKeys)
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if err := reg.CheckPrewarm(); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	// Nothing is stored yet, so a mask (copied from another registration's answer) has
	// nothing to stand for.
	if _, err := mcpserver.RestoreMasked("env", reg.Env, nil); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if _, err := mcpserver.RestoreMaskedURL("url", reg.URL, ""); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if err := s.checkHeaderSecrets(ctx, reg); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if err := s.store.CreateServer(ctx, reg, func(r audit.Recorder) error {
		return s.event(ctx, audit.ActionCreate, resourceServer, reg.Ref, serverToProto(reg))(r)
	}); err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil, s.errors.Status(ctx, serverExists(reg.Ref))
		}
		return nil, s.errors.Status(ctx, storeErr(err, serverNotFound(reg.Ref)))
	}
	return &registryv1.CreateServerResponse{Server: s.withWarm(ctx, serverToProto(reg))[0]}, nil
}

// GetServer implements RegistryService.
func (s *Service) GetServer(ctx context.Context, req *registryv1.GetServerRequest) (*registryv1.GetServerResponse, error) {
	if err := mcpserver.ValidateRef(req.GetRef()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	// The converted, masked registration is kept per revision and shared by every reader: it
	// is only ever marshaled.
	view, err := s.store.ServerView(ctx, req.GetRef(), func(r *mcpserver.Registration) any { return serverToProto(r) })
	if err != nil {
		return nil, s.errors.Status(ctx, s.serverStoreErr(err, req.GetRef()))
	}
	return &registryv1.GetServerResponse{Server: s.withWarm(ctx, view.(*registryv1.Server))[0]}, nil
}

// ListServers implements RegistryService.
func (s *Service) ListServers(ctx context.Context, req *registryv1.ListServersRequest) (*registryv1.ListServersResponse, error) {
	n, err := paging.Size(req.GetPageSize())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	regs, next, err := s.store.ListServers(ctx, req.GetPageToken(), n)
	if err != nil {
		return nil, s.errors.Status(ctx, storeErr(err, errServerNotFound))
	}
	resp := &registryv1.ListServersResponse{NextPageToken: next, Servers: make([]*registryv1.Server, len(regs))}
	for i, r := range regs {
		resp.Servers[i] = serverToProto(r)
	}
	resp.Servers = s.withWarm(ctx, resp.Servers...)
	return resp, nil
}

// UpdateServer implements RegistryService: the seed's PUT, which replaces the registration
// except that a request without env keeps the stored env.
func (s *Service) UpdateServer(ctx context.Context, req *registryv1.UpdateServerRequest) (*registryv1.UpdateServerResponse, error) {
	paths, err := updatePaths(req.GetUpdateMask())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	var resp *registryv1.UpdateServerResponse
	if paths == nil {
		resp, err = s.replaceServer(ctx, req, len(req.GetGrants()) == 0)
	} else {
		resp, err = s.patchServer(ctx, req, paths)
	}
	if err != nil {
		return nil, err
	}
	// Over REST the body is the registration (the seed's shape), so warnings travel as
	// Warning headers too.
	grpcserver.SetWarnings(ctx, resp.GetWarnings()...)
	return resp, nil
}

// patchServer changes the fields paths names and keeps the rest: the stored registration, as
// a GET shows it (masked env values and URL, which the update keeps), with the named fields
// taken from req, replaces the stored one at the revision it was read at. A change that
// lands between the read and the write is not overwritten: the patch is applied again on top
// of it (or, when req names a revision, refused as stale).
func (s *Service) patchServer(ctx context.Context, req *registryv1.UpdateServerRequest, paths []string) (*registryv1.UpdateServerResponse, error) {
	if err := mcpserver.ValidateRef(req.GetRef()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	for attempt := 0; ; attempt++ {
		cur, err := s.store.GetServerMasked(ctx, req.GetRef())
		if err != nil {
			return nil, s.errors.Status(ctx, s.serverStoreErr(err, req.GetRef()))
		}
		if req.GetRevision() != 0 && req.GetRevision() != cur.Revision {
			return nil, s.errors.Status(ctx, errStaleRevision)
		}
		full := patched(updateRequestOf(serverToProto(cur)), req, paths)
		resp, err := s.replaceServer(ctx, full, false)
		if status.Code(err) == codes.Aborted && req.GetRevision() == 0 && attempt < 3 {
			continue
		}
		return resp, err
	}
}

// replaceServer replaces a registration with the one req describes (PUT's semantics).
// putWithoutGrants says the request is a PUT that sent no grants, which the warnings name.
func (s *Service) replaceServer(ctx context.Context, req *registryv1.UpdateServerRequest, putWithoutGrants bool) (*registryv1.UpdateServerResponse, error) {
	reg, envPresent, err := registrationFromProto(req, s.cfg.AllowedEnvKeys)
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if err := reg.CheckPrewarm(); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if req.GetRevision() < 0 {
		return nil, s.errors.Status(ctx, fielderr.New("revision", "must not be negative"))
	}
	// An update sends every header (PUT replaces them), so each must name a secret that exists
	// now, even one the stored registration already named.
	if err := s.checkHeaderSecrets(ctx, reg); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	var previous []string
	updated, err := s.store.UpdateServer(ctx, req.GetRef(), func(cur *mcpserver.Registration) (*mcpserver.Registration, error) {
		if req.GetRevision() != 0 && req.GetRevision() != cur.Revision {
			return nil, errStaleRevision
		}
		// A copy: the store runs this again on the newer registration when another replica
		// changed it first, and the masks sent must then stand for that one's values.
		next := *reg
		// GET shows the URL masked; sending that back keeps the stored URL, which must
		// still pass today's rules (it may predate them).
		kept, err := mcpserver.RestoreMaskedURL("url", next.URL, cur.URL)
		if err != nil {
			return nil, err
		}
		if kept != next.URL {
			if err := mcpserver.ValidateURL(kept); err != nil {
				return nil, err
			}
			next.URL = kept
		}
		if envPresent {
			// GET shows every env value as the mask; sending one back keeps the stored value.
			env, err := mcpserver.RestoreMasked("env", next.Env, cur.Env)
			if err != nil {
				return nil, err
			}
			next.Env = env
		} else {
			next.Env = cur.Env
			// The kept env must still fit the new transport.
			if len(next.Env) > 0 && next.Transport != mcpserver.TransportStdio {
				return nil, fielderr.New("env", "the stored env applies to stdio only; send \"env\": {} to clear it when switching to %s", next.Transport)
			}
		}
		return &next, nil
	}, func(r audit.Recorder, before, after *mcpserver.Registration) error {
		previous = before.Grants
		return s.event(ctx, audit.ActionUpdate, resourceServer, after.Ref, updateChange(before, after))(r)
	})
	if err != nil {
		return nil, s.errors.Status(ctx, s.serverStoreErr(err, req.GetRef()))
	}
	return &registryv1.UpdateServerResponse{
		Server:   s.withWarm(ctx, serverToProto(updated))[0],
		Warnings: s.grantWarnings(ctx, updated.Ref, previous, updated.Grants, putWithoutGrants),
	}, nil
}

// DeleteServer implements RegistryService.
func (s *Service) DeleteServer(ctx context.Context, req *registryv1.DeleteServerRequest) (*registryv1.DeleteServerResponse, error) {
	if err := mcpserver.ValidateRef(req.GetRef()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if err := s.store.DeleteServer(ctx, req.GetRef(), s.event(ctx, audit.ActionDelete, resourceServer, req.GetRef(), nil)); err != nil {
		return nil, s.errors.Status(ctx, s.serverStoreErr(err, req.GetRef()))
	}
	return &registryv1.DeleteServerResponse{}, nil
}

// ListServerTools implements RegistryService: ExploreServer without a call.
func (s *Service) ListServerTools(ctx context.Context, req *registryv1.ListServerToolsRequest) (*registryv1.ListServerToolsResponse, error) {
	resp, err := s.ExploreServer(ctx, &registryv1.ExploreServerRequest{Ref: req.GetRef()})
	if err != nil {
		return nil, err
	}
	return &registryv1.ListServerToolsResponse{Tools: resp.GetTools(), ListingFindings: resp.GetListingFindings()}, nil
}

// ExploreServer implements RegistryService: the pool starts the server in isolation, lists
// its tools, and makes the one call asked for (if any) on the same session.
func (s *Service) ExploreServer(ctx context.Context, req *registryv1.ExploreServerRequest) (*registryv1.ExploreServerResponse, error) {
	p, err := auth.PrincipalFrom(ctx) // named in the explore call's audit record
	if err != nil {
		return nil, err
	}
	if err := mcpserver.ValidateRef(req.GetRef()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if c := req.GetCall(); c != nil && c.GetTool() == "" {
		return nil, s.errors.Status(ctx, fielderr.New("call.tool", "names the tool to call: one of the names the listing shows"))
	}
	if id := req.GetCall().GetCallId(); id != "" {
		// Refused before an ad-hoc server's admin record, as the pool would refuse it after.
		if err := ident.CallID.Check("call.call_id", id); err != nil {
			return nil, s.errors.Status(ctx, err)
		}
	}
	var adhoc *mcpserver.Resolved
	var toolPerms map[string][]string
	if spec := req.GetServer(); spec != nil {
		var err error
		if adhoc, err = s.resolveAdhoc(ctx, req.GetRef(), spec); err != nil {
			return nil, s.errors.Status(ctx, err)
		}
		toolPerms = adhoc.ToolPermissions
	} else {
		policy, err := s.store.ServerPolicy(ctx, req.GetRef())
		if err != nil {
			return nil, s.errors.Status(ctx, s.serverStoreErr(err, req.GetRef()))
		}
		toolPerms = policy.ToolPermissions
	}
	if s.cfg.Discoverer == nil {
		return nil, status.Error(codes.Unavailable, errNoPool)
	}
	var adhocProto *registryinternalv1.ResolveServerResponse
	if adhoc != nil {
		adhocProto = resolvedToProto(adhoc)
		// An unregistered command is about to run: record who started what before it does.
		rec, err := s.record(ctx, "", audit.ActionExplore, resourceServer, adhoc.Ref, serverToProto(&adhoc.Registration))
		if err == nil {
			err = s.spool.Enqueue(ctx, rec)
		}
		if err != nil {
			return nil, s.errors.Status(ctx, err)
		}
	}
	listing, call, err := s.cfg.Discoverer.ExploreTools(ctx, discovery.ExploreRequest{
		Ref: req.GetRef(), Call: req.GetCall(), Adhoc: adhocProto, Tenant: p.Tenant, ActorKeyID: p.KeyID, Actor: p.Actor(),
	})
	if err != nil {
		return nil, discovery.Status(ctx, s.errors, err)
	}
	tools := discovery.ToolsToProto(listing.Tools)
	for _, t := range tools {
		t.RequiredCapabilities = toolPerms[t.GetName()]
	}
	return &registryv1.ExploreServerResponse{
		Tools: tools, ListingFindings: discovery.FindingsToProto(listing.Findings), Call: call,
	}, nil
}

// resolveAdhoc validates an ad-hoc server as CreateServer would and resolves its header
// secrets, storing nothing.
func (s *Service) resolveAdhoc(ctx context.Context, ref string, spec *registryv1.CreateServerRequest) (*mcpserver.Resolved, error) {
	if spec.GetRef() != "" && spec.GetRef() != ref {
		return nil, fielderr.New("server.ref", "is %q but the request explores %q: leave it empty or make them equal", spec.GetRef(), ref)
	}
	spec = proto.CloneOf(spec)
	spec.Ref = ref
	reg, _, err := registrationFromProto(spec, s.cfg.AllowedEnvKeys)
	if err != nil {
		return nil, err
	}
	if _, err := mcpserver.RestoreMasked("server.env", reg.Env, nil); err != nil {
		return nil, err
	}
	if _, err := mcpserver.RestoreMaskedURL("server.url", reg.URL, ""); err != nil {
		return nil, err
	}
	values, err := s.headerValues(ctx, reg.Headers, unknownHeaderSecret)
	if err != nil {
		return nil, err
	}
	return &mcpserver.Resolved{Registration: *reg, HeaderValues: values}, nil
}

// PutSecret implements RegistryService.
func (s *Service) PutSecret(ctx context.Context, req *registryv1.PutSecretRequest) (*registryv1.PutSecretResponse, error) {
	if err := mcpserver.ValidateSecretName("name", req.GetName()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if len(req.GetValue()) == 0 || len(req.GetValue()) > mcpserver.MaxEnvValue {
		return nil, s.errors.Status(ctx, fielderr.New("value", "must be 1 to %d bytes", mcpserver.MaxEnvValue))
	}
	if err := checkSecretValue(req.GetValue()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if p := mcpserver.Placeholder(req.GetValue()); p != "" {
		return nil, s.errors.Status(ctx, fielderr.New("value", "%s, not a credential (the value is not shown): store the real one, e.g. export TOKEN=<the token> first, then printf %%s \"Bearer $TOKEN\" | ringfence secrets set NAME", p))
	}
	sec, err := s.store.PutSecret(ctx, req.GetName(), req.GetValue(),
		s.event(ctx, "put", resourceSecret, req.GetName(), map[string]string{"name": req.GetName(), "value": SecretMask}))
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	return &registryv1.PutSecretResponse{Secret: secretToProto(sec)}, nil
}

// checkSecretValue refuses a value no HTTP header can carry: a secret's only use is as the
// value of a header that names it, and the pool refuses such a value only when it starts the
// server, far from the PutSecret that caused it. A control character other than tab (a line
// break above all: "line1\r\nX-Evil: 1" would be a second header) and bytes that are not UTF-8
// are refused; the value is never quoted.
func checkSecretValue(v string) error {
	if !utf8.ValidString(v) {
		return fielderr.New("value", "is not valid UTF-8 (the value is not shown): a secret is sent as an HTTP header value")
	}
	trimmed := strings.TrimRight(v, "\r\n")
	switch {
	case trimmed != v && !mcpserver.HeaderValueHasControl(trimmed):
		return fielderr.New("value", "ends with a line break, which no HTTP header value can hold (the value is not shown): send it without the line break that echo or a file adds (ringfence secrets set strips it)")
	case mcpserver.HeaderValueHasControl(v):
		return fielderr.New("value", "holds a line break or another control character other than tab, which no HTTP header value can hold (the value is not shown): a secret is sent as the value of the header that names it")
	}
	return nil
}

// ListSecrets implements RegistryService.
func (s *Service) ListSecrets(ctx context.Context, _ *registryv1.ListSecretsRequest) (*registryv1.ListSecretsResponse, error) {
	secs, err := s.store.ListSecrets(ctx)
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	resp := &registryv1.ListSecretsResponse{}
	for _, sec := range secs {
		resp.Secrets = append(resp.Secrets, secretToProto(sec))
	}
	return resp, nil
}

// DeleteSecret implements RegistryService.
func (s *Service) DeleteSecret(ctx context.Context, req *registryv1.DeleteSecretRequest) (*registryv1.DeleteSecretResponse, error) {
	if err := mcpserver.ValidateSecretName("name", req.GetName()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if err := s.store.DeleteSecret(ctx, req.GetName(), s.event(ctx, audit.ActionDelete, resourceSecret, req.GetName(), nil)); err != nil {
		return nil, s.errors.Status(ctx, storeErr(err, errSecretNotFound))
	}
	warnings := s.secretWarnings(ctx, req.GetName())
	grpcserver.SetWarnings(ctx, warnings...)
	return &registryv1.DeleteSecretResponse{Warnings: warnings}, nil
}

// secretWarnings names the registrations that still name secret (a header's value, or the
// OAuth client's secret): a deletion is not refused for them, but they cannot start without
// it. The deletion stands whatever this finds; a listing that fails is logged.
func (s *Service) secretWarnings(ctx context.Context, secret string) []string {
	var warnings []string
	token := ""
	for {
		regs, next, err := s.store.ListServers(ctx, token, paging.MaxSize)
		if err != nil {
			s.log.Warn("could not list the registrations that name a deleted secret", "secret", secret, "err", err)
			return warnings
		}
		for _, r := range regs {
			var uses []string
			for _, h := range slices.Sorted(maps.Keys(r.Headers)) {
				if r.Headers[h] == secret {
					uses = append(uses, "header "+h)
				}
			}
			if r.OAuth != nil && r.OAuth.ClientSecretRef == secret {
				uses = append(uses, "its OAuth client")
			}
			if len(uses) > 0 {
				warnings = append(warnings, fmt.Sprintf("server %s still names secret %s (%s): it cannot start until the secret is set again (ringfence secrets set %s) or the server stops naming it", r.Ref, secret, strings.Join(uses, ", "), secret))
			}
		}
		if next == "" {
			return warnings
		}
		token = next
	}
}
