package registry

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/mcpgate/capability"
)

// StrandFinder names the published graphs whose tools of server ref declare capabilities
// grants do not cover: calls the ceiling refuses at run time. The publisher implements it in
// ringfenced; a registry without one (a split deployment: the registry has no publisher peer)
// says in its warning how to find them instead.
type StrandFinder interface {
	StrandedBy(ctx context.Context, ref string, grants []string) ([]graph.Stranded, error)
}

// SetStrandFinder sets the publisher that names stranded graphs; the publisher is built after
// the registry it asks for grants.
func (s *Service) SetStrandFinder(f StrandFinder) { s.cfg.Strands = f }

// patchable are the fields an update_mask may name, as the proto names them.
var patchable = []string{
	"description", "transport", "command", "args", "env", "url", "headers", "grants",
	"tool_filter", "tool_permissions", "client_session_timeout", "tool_call_timeout",
	"keep_markup", "strict_inputs", "prewarm", "max_result_bytes", "oauth",
}

// updatePaths returns the fields an update_mask names, or nil when the update replaces the
// whole registration (no mask, or "*"). ref and revision may be named (a PATCH body that
// carries them has them in its mask) and change nothing: they say which registration, and
// at which revision.
func updatePaths(mask *fieldmaskpb.FieldMask) ([]string, error) {
	if len(mask.GetPaths()) == 0 || slices.Equal(mask.GetPaths(), []string{"*"}) {
		return nil, nil
	}
	paths := []string{}
	for _, p := range mask.GetPaths() {
		switch {
		case p == "ref" || p == "revision":
		case slices.Contains(patchable, p):
			if !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		default:
			return nil, fielderr.New("update_mask", "%s is not a field an update changes: use %s (or none, or \"*\", to replace the whole registration)", fielderr.Quote(p), strings.Join(patchable, ", "))
		}
	}
	if len(paths) == 0 {
		return nil, fielderr.New("update_mask", "names no field to change: name one or more of %s", strings.Join(patchable, ", "))
	}
	return paths, nil
}

// updateRequestOf is the update that would store srv again as it is: srv as a response shows
// it, env values and URL masked, which an update keeps as stored.
func updateRequestOf(srv *registryv1.Server) *registryv1.UpdateServerRequest {
	env := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(srv.GetEnv()))}
	for k, v := range srv.GetEnv() {
		env.Fields[k] = structpb.NewStringValue(v)
	}
	return &registryv1.UpdateServerRequest{
		Ref: srv.GetRef(), Description: srv.GetDescription(), Transport: srv.GetTransport(),
		Command: srv.GetCommand(), Args: srv.GetArgs(), Env: env, Url: srv.GetUrl(),
		Headers: srv.GetHeaders(), Grants: srv.GetGrants(), ToolFilter: srv.GetToolFilter(),
		ToolPermissions: srv.GetToolPermissions(), ClientSessionTimeout: srv.GetClientSessionTimeout(),
		ToolCallTimeout: srv.GetToolCallTimeout(), KeepMarkup: srv.GetKeepMarkup(),
		Revision: srv.GetRevision(), StrictInputs: srv.GetStrictInputs(), Prewarm: srv.GetPrewarm(),
		MaxResultBytes: srv.GetMaxResultBytes(), Oauth: srv.GetOauth(),
	}
}

// patched is base with the fields paths names taken from req; a named field req leaves
// unset is cleared (an env named and absent is cleared too, where a PUT without env keeps
// it).
func patched(base, req *registryv1.UpdateServerRequest, paths []string) *registryv1.UpdateServerRequest {
	out := proto.Clone(base).(*registryv1.UpdateServerRequest)
	dst, src := out.ProtoReflect(), req.ProtoReflect()
	fields := dst.Descriptor().Fields()
	for _, p := range paths {
		fd := fields.ByName(protoreflect.Name(p))
		if src.Has(fd) {
			dst.Set(fd, src.Get(fd))
		} else {
			dst.Clear(fd)
		}
	}
	if slices.Contains(paths, "env") && out.GetEnv() == nil {
		out.Env = &structpb.Struct{}
	}
	return out
}

// maxStrandedNamed bounds how many stranded graphs a warning names.
const maxStrandedNamed = 10

// grantWarnings says what an update's grants leave broken: when grants that were there are
// no longer covered, the published graphs whose tools of ref ask for what is gone (refused at
// run time by the ceiling), named when the publisher can be asked, and how to find them when
// it cannot; and a PUT that sent no grants is told that PUT replaced them all.
func (s *Service) grantWarnings(ctx context.Context, ref string, before, after []string, putWithoutGrants bool) []string {
	now, _ := parseGrants(after)
	var lost []string
	for _, g := range before {
		c, err := capability.Parse(g)
		if err == nil && !now.Covers(c) {
			lost = append(lost, g)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	var out []string
	if putWithoutGrants && len(after) == 0 {
		out = append(out, fmt.Sprintf("this PUT sent no grants, and a PUT replaces the whole registration: %s now grants nothing (it granted %s), which denies every graph node that uses it; to change some fields and keep the others, send PATCH /v1/mcp/servers/%s (UpdateServer with an update_mask) or use ringfence servers update",
			ref, strings.Join(before, ", "), ref))
	}
	if s.cfg.Strands == nil {
		return append(out, fmt.Sprintf("%s no longer grants %s: every published graph whose tools of %s declare it is refused at run time (ceiling); this registry cannot see the publisher's graphs (a split deployment), so run ringfence graphs validate --graph G on each graph that imports %s to find them",
			ref, strings.Join(lost, ", "), ref, ref))
	}
	stranded, err := s.cfg.Strands.StrandedBy(ctx, ref, after)
	if err != nil {
		s.log.WarnContext(ctx, "cannot ask the publisher which graphs a change of grants strands", "server", ref, "err", err)
		return append(out, fmt.Sprintf("%s no longer grants %s, and the publisher could not be asked which published graphs use it (%v): ringfence graphs validate --graph G finds them, graph by graph",
			ref, strings.Join(lost, ", "), err))
	}
	if len(stranded) == 0 {
		return out
	}
	named := make([]string, 0, min(len(stranded), maxStrandedNamed))
	for _, st := range stranded[:min(len(stranded), maxStrandedNamed)] {
		named = append(named, fmt.Sprintf("%s/%s v%d (asks for %s)", st.Tenant, st.GraphID, st.Version, strings.Join(st.Excess, ", ")))
	}
	if more := len(stranded) - len(named); more > 0 {
		named = append(named, fmt.Sprintf("and %d more", more))
	}
	return append(out, fmt.Sprintf("%d published graph(s) ask %s for capabilities it no longer grants, so their calls to it are refused at run time (ceiling): %s; grant them again (ringfence servers update %s --grant CAPABILITY), or re-import the tools and publish",
		len(stranded), ref, strings.Join(named, "; "), ref))
}

// parseGrants parses what it can: stored grants were validated when written.
func parseGrants(grants []string) (capability.Set, error) {
	set := make(capability.Set, 0, len(grants))
	for _, g := range grants {
		c, err := capability.Parse(g)
		if err != nil {
			return set, err
		}
		set = append(set, c)
	}
	return set, nil
}
