package publisher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/graph/graphpb"
	"github.com/ringfence/ringfence/internal/paging"
)

const (
	// maxDetailViolations bounds the PublishViolations detail before grpcserver bounds the
	// whole status; ValidateDraft returns every violation in its body.
	maxDetailViolations = 500
)

func fielderrNegative(field string) error { return fielderr.New(field, "must not be negative") }

func quote(s string) string {
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return strconv.Quote(s)
}

// target is the tenant a request acts for, once its graph id is checked.
func target(ctx context.Context, graphID string) (string, error) {
	t, err := actingTenant(ctx)
	if err != nil {
		return "", err
	}
	if err := graph.ValidateGraphID("graph_id", graphID); err != nil {
		return "", err
	}
	return t, nil
}

// CreateGraph implements PublisherService.
func (s *Service) CreateGraph(ctx context.Context, req *publisherv1.CreateGraphRequest) (*publisherv1.CreateGraphResponse, error) {
	tenant, err := target(ctx, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if err := graph.ValidateMode(req.GetCapabilityMode()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	g := &graph.Graph{ID: req.GetGraphId(), Tenant: tenant, CapabilityMode: req.GetCapabilityMode(), Nodes: []graph.Node{}, Edges: []graph.Edge{}}
	if g.CapabilityMode == "" {
		g.CapabilityMode = graph.ModeEnforce
	}
	if len(req.GetAgents()) > graph.MaxNodes {
		return nil, s.errors.Status(ctx, fielderr.New("agents", "has %d entries; at most %d", len(req.GetAgents()), graph.MaxNodes))
	}
	for i, a := range req.GetAgents() {
		if err := graph.ValidateNodeID(fmt.Sprintf("agents[%d]", i), a); err != nil {
			return nil, s.errors.Status(ctx, err)
		}
		if _, dup := g.Node(a); dup {
			return nil, s.errors.Status(ctx, fielderr.New(fmt.Sprintf("agents[%d]", i), "%q is named twice", a))
		}
		g.Nodes = append(g.Nodes, graph.Node{ID: a, Kind: graph.KindAgent, Agent: &graph.AgentNode{}})
	}
	agents := make([]string, 0, len(req.GetAgents()))
	agents = append(agents, req.GetAgents()...)
	if err := s.store.CreateGraph(ctx, g, s.event(ctx, tenant, audit.ActionCreate, g.ID,
		map[string]any{"capability_mode": g.Mode(), "agents": bounded(agents)})); err != nil {
		return nil, s.errors.Status(ctx, storeErr(err, g.ID))
	}
	return &publisherv1.CreateGraphResponse{Draft: graphpb.GraphToProto(g, true)}, nil
}

// GetDraft implements PublisherService.
func (s *Service) GetDraft(ctx context.Context, req *publisherv1.GetDraftRequest) (*publisherv1.GetDraftResponse, error) {
	tenant, err := target(ctx, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	g, err := s.store.Draft(ctx, tenant, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, storeErr(err, req.GetGraphId()))
	}
	return &publisherv1.GetDraftResponse{Draft: graphpb.GraphToProto(g, true)}, nil
}

// ReplaceDraft implements PublisherService: the whole draft is replaced when the revision
// still matches. Pinned declarations cannot be edited by hand (re-import instead).
func (s *Service) ReplaceDraft(ctx context.Context, req *publisherv1.ReplaceDraftRequest) (*publisherv1.ReplaceDraftResponse, error) {
	tenant, err := target(ctx, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	d := req.GetDraft()
	if d == nil {
		return nil, s.errors.Status(ctx, fielderr.New("draft", "is required: send the graph, e.g. as ringfence graphs show -o json prints it"))
	}
	if d.GetId() != "" && d.GetId() != req.GetGraphId() {
		return nil, s.errors.Status(ctx, fielderr.New("draft.id", "%s does not match graph_id (%s; over REST, the graph in the path): omit it or make them equal", quote(d.GetId()), quote(req.GetGraphId())))
	}
	if d.GetTenant() != "" && d.GetTenant() != tenant {
		return nil, s.errors.Status(ctx, fielderr.New("draft.tenant", "%s is not the tenant this request acts for (%s); omit it", quote(d.GetTenant()), quote(tenant)))
	}
	if d.GetRevision() < 0 {
		return nil, s.errors.Status(ctx, fielderrNegative("draft.revision"))
	}
	next, err := graphpb.GraphFromProto(d)
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	next.ID, next.Tenant = req.GetGraphId(), tenant
	if next.CapabilityMode == "" {
		next.CapabilityMode = graph.ModeEnforce
	}
	// Shape, pins and the declaration screen are checked before the write transaction: hashing
	// and screening every pinned node of a large graph should not hold the file's write lock.
	// A hand-written node with a correct pin is still refused when the screen refuses its
	// declaration, and every node's flags become the screen's.
	if err := draftField(next.Validate()); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if err := draftField(graph.VerifyPins(next)); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if err := draftField(graph.ScreenDeclarations(next)); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	var before, after *graph.Graph
	sent := inlineEnvs(next)
	stored, err := s.store.UpdateDraft(ctx, tenant, req.GetGraphId(), func(cur *graph.Graph) error {
		if d.GetRevision() != 0 && d.GetRevision() != cur.Revision {
			return errStaleRevision
		}
		setInlineEnvs(next, sent)
		if err := restoreMaskedEnv(next, cur); err != nil {
			return err
		}
		old := *cur
		before = &old
		*cur = *next
		after = cur
		return nil
	}, func(r audit.Recorder) error {
		return s.event(ctx, tenant, audit.ActionUpdate, req.GetGraphId(), draftChange(before, after))(r)
	})
	if err != nil {
		return nil, s.errors.Status(ctx, storeErr(err, req.GetGraphId()))
	}
	return &publisherv1.ReplaceDraftResponse{Draft: graphpb.GraphToProto(stored, true)}, nil
}

// draftField prefixes a graph field error with "draft.", the field's name in the request.
func draftField(err error) error {
	if fe, ok := fielderr.As(err); ok {
		return fielderr.New("draft."+fe.Field, "%s", fe.Problem)
	}
	return err
}

// ValidateDraft implements PublisherService: a dry-run publish.
func (s *Service) ValidateDraft(ctx context.Context, req *publisherv1.ValidateDraftRequest) (*publisherv1.ValidateDraftResponse, error) {
	tenant, err := target(ctx, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	res, _, err := s.Validate(ctx, tenant, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	return &publisherv1.ValidateDraftResponse{Ok: res.OK(), Violations: violationsToProto(res.Violations), Warnings: res.Warnings}, nil
}

// Validate runs every publish rule on a graph's draft and returns the result and the draft
// that was validated.
func (s *Service) Validate(ctx context.Context, tenant, graphID string) (graph.Result, *graph.Graph, error) {
	g, err := s.store.Draft(ctx, tenant, graphID)
	if err != nil {
		return graph.Result{}, nil, storeErr(err, graphID)
	}
	res, err := s.validator.Validate(ctx, g)
	if err != nil {
		return graph.Result{}, nil, registryErr(err)
	}
	return res, g, nil
}

// registryErr reports a failure to read grants: without them no rule can be decided, so the
// caller is told to retry rather than given a verdict.
func registryErr(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if _, ok := status.FromError(err); ok {
		return status.Errorf(codes.Unavailable, "publisher: the registry could not be asked for grants, so nothing was decided; try again: %v", err)
	}
	return err
}

// Publish implements PublisherService.
func (s *Service) Publish(ctx context.Context, req *publisherv1.PublishRequest) (*publisherv1.PublishResponse, error) {
	tenant, err := target(ctx, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	res, g, err := s.Validate(ctx, tenant, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if !res.OK() {
		return nil, violationsStatus(fmt.Sprintf("publisher: graph %s cannot be published", quote(g.ID)), res.Violations)
	}
	// The version stores the screen's flags, whatever the draft holds (a draft stored before
	// the screen changed).
	g = graph.WithScreenedFlags(g, res.Flags)
	p, err := auth.PrincipalFrom(ctx)
	if err != nil {
		return nil, err
	}
	v := &graph.Version{Graph: g, PublishTime: time.Now().UTC(), PublishedBy: p.Actor(), Warnings: res.Warnings}
	n, err := s.store.Publish(ctx, tenant, g.ID, g.Revision, v, func(r audit.Recorder) error {
		return s.event(ctx, tenant, audit.ActionPublish, g.ID, map[string]any{
			"draft_revision": g.Revision, "nodes": len(g.Nodes), "warnings": len(res.Warnings),
		})(r)
	})
	if err != nil {
		return nil, s.errors.Status(ctx, storeErr(err, g.ID))
	}
	s.log.DebugContext(ctx, "graph published", "tenant", tenant, "graph", g.ID, "version", n, "draft_revision", g.Revision, "by", p.Actor())
	return &publisherv1.PublishResponse{Version: n, Warnings: res.Warnings}, nil
}

// violationsStatus is FAILED_PRECONDITION with every violation in a PublishViolations detail
// (over REST, also a top-level "violations" array).
func violationsStatus(prefix string, vs []graph.Violation) error {
	msg := fmt.Sprintf("%s: %d violation(s); the first: %s", prefix, len(vs), vs[0].Message)
	detail := vs
	if len(detail) > maxDetailViolations {
		detail = detail[:maxDetailViolations]
	}
	if len(vs) > 1 {
		// A status stays within a few KiB (grpcserver.MaxStatusBytes), so a long list is
		// shortened on the way; the validation's response body has no such bound.
		msg += " (ringfence graphs validate lists every one)"
	}
	st := status.New(codes.FailedPrecondition, msg)
	if withDetail, err := st.WithDetails(&publisherv1.PublishViolations{Violations: violationsToProto(detail)}); err == nil {
		st = withDetail
	}
	return st.Err()
}

// GetVersion implements PublisherService.
func (s *Service) GetVersion(ctx context.Context, req *publisherv1.GetVersionRequest) (*publisherv1.GetVersionResponse, error) {
	v, err := s.versionProto(ctx, req.GetGraphId(), req.GetVersion(), true)
	if err != nil {
		return nil, err
	}
	return &publisherv1.GetVersionResponse{Version: v}, nil
}

// versionProto is a published version of the tenant the call acts for, inline env values
// masked or, for the pool that runs them, in clear.
func (s *Service) versionProto(ctx context.Context, graphID string, version int64, masked bool) (*publisherv1.GraphVersion, error) {
	tenant, err := target(ctx, graphID)
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	v, err := s.PublishedVersion(ctx, tenant, graphID, version)
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	return graphpb.VersionToProto(v, masked), nil
}

// ListVersions implements PublisherService.
func (s *Service) ListVersions(ctx context.Context, req *publisherv1.ListVersionsRequest) (*publisherv1.ListVersionsResponse, error) {
	tenant, err := target(ctx, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	n, err := paging.Size(req.GetPageSize())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	vs, next, err := s.store.ListVersions(ctx, tenant, req.GetGraphId(), req.GetPageToken(), n)
	if err != nil {
		return nil, s.errors.Status(ctx, storeErr(err, req.GetGraphId()))
	}
	resp := &publisherv1.ListVersionsResponse{NextPageToken: next, Versions: make([]*publisherv1.GraphVersion, len(vs))}
	for i := range vs {
		resp.Versions[i] = graphpb.VersionToProto(&vs[i], true)
	}
	return resp, nil
}

// ListGraphs implements PublisherService.
func (s *Service) ListGraphs(ctx context.Context, req *publisherv1.ListGraphsRequest) (*publisherv1.ListGraphsResponse, error) {
	tenant, err := actingTenant(ctx)
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	n, err := paging.Size(req.GetPageSize())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	sums, next, err := s.store.ListGraphs(ctx, tenant, req.GetPageToken(), n)
	if err != nil {
		return nil, s.errors.Status(ctx, storeErr(err, ""))
	}
	resp := &publisherv1.ListGraphsResponse{NextPageToken: next, Graphs: make([]*publisherv1.GraphSummary, len(sums))}
	for i, sum := range sums {
		resp.Graphs[i] = summaryToProto(sum)
	}
	return resp, nil
}

// DeleteGraph implements PublisherService.
func (s *Service) DeleteGraph(ctx context.Context, req *publisherv1.DeleteGraphRequest) (*publisherv1.DeleteGraphResponse, error) {
	tenant, err := target(ctx, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if err := s.store.DeleteGraph(ctx, tenant, req.GetGraphId(), s.event(ctx, tenant, audit.ActionDelete, req.GetGraphId(), nil)); err != nil {
		return nil, s.errors.Status(ctx, storeErr(err, req.GetGraphId()))
	}
	return &publisherv1.DeleteGraphResponse{}, nil
}
