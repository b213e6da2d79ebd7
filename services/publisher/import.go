package publisher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/humanize"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate/capability"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
	"github.com/ringfence/ringfence/mcpgate/screen"
)

// ImportRequest is one mcp-import: the server's tools (all it offers when Tools is empty)
// into a graph's draft, bound by one agent.
type ImportRequest struct {
	Tenant    string
	GraphID   string
	ServerRef string
	Agent     string
	Tools     []string
	// User, for a server that signs each user in, is the user of Tenant whose connection
	// lists the tools (docs/oauth.md).
	User string
}

// Import outcomes, per tool.
const (
	OutcomeAdded     = "added"
	OutcomeUpdated   = "updated"
	OutcomeUnchanged = "unchanged"
)

// ImportedTool says what an import did with one tool.
type ImportedTool struct {
	ToolName string
	NodeID   string
	Outcome  string
	// OldHash is the pin the node had before (updated and unchanged); NewHash the one it has.
	OldHash string
	NewHash string
	// Flags are the screen's heuristic findings, stored on the node.
	Flags []discovery.Finding
}

// ImportResult reports an import.
type ImportResult struct {
	Tools         []ImportedTool
	DraftRevision int64
	// AgentCapabilitiesAdded are the floor capabilities added to the agent's bindings.
	AgentCapabilitiesAdded []string
	// Discovery is the time spent starting the server and taking its listing; Apply is the
	// import's own work after that (selection, screen verdicts, the draft transaction).
	Discovery time.Duration
	Apply     time.Duration
}

// importViolations refuses an import whose result could not be published.
type importViolations struct {
	violations []graph.Violation
}

func (e *importViolations) Error() string {
	return "publisher: mcp-import refused: the result could not be published: " + e.violations[0].Message
}

// refusef is an import refusal with its reason (FAILED_PRECONDITION).
func refusef(format string, args ...any) error {
	return &wrapped{msg: errImportRefused.Error() + ": " + fmt.Sprintf(format, args...), err: errImportRefused}
}

var floorSet = capability.MustParseSet(capability.Floor)

// maxListed bounds the names and findings one refusal message lists.
const maxListed = 20

// ImportTools implements PublisherService.
func (s *Service) ImportTools(ctx context.Context, req *publisherv1.ImportToolsRequest) (*publisherv1.ImportToolsResponse, error) {
	tenant, err := target(ctx, req.GetGraphId())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if req.GetUser() != "" {
		if err := mayActFor(ctx, req.GetUser()); err != nil {
			return nil, s.errors.Status(ctx, err)
		}
	}
	res, err := s.Import(ctx, ImportRequest{Tenant: tenant, GraphID: req.GetGraphId(), ServerRef: req.GetServerRef(), Agent: req.GetAgent(), Tools: req.GetTools(),
		User: req.GetUser()})
	var iv *importViolations
	switch {
	case errors.As(err, &iv):
		return nil, violationsStatus("publisher: mcp-import refused: the result could not be published", iv.violations)
	case err != nil:
		return nil, importStatus(ctx, s, req.GetServerRef(), err)
	}
	resp := &publisherv1.ImportToolsResponse{DraftRevision: res.DraftRevision, AgentCapabilitiesAdded: res.AgentCapabilitiesAdded}
	for _, t := range res.Tools {
		resp.Tools = append(resp.Tools, &publisherv1.ImportedTool{
			ToolName: t.ToolName, NodeId: t.NodeID, Outcome: t.Outcome, OldHash: t.OldHash, NewHash: t.NewHash,
			Flags: discovery.FindingsToProto(t.Flags),
		})
	}
	return resp, nil
}

// errActForUser: importing as a user lists a server's tools with that user's token, which only
// a key that may assert users does (run:execute, as StartRun's user).
var errActForUser = errors.New("publisher: importing as a user lists the server's tools with that user's token: the key needs run:execute as well as workflow:write, as a run's user is asserted (docs/oauth.md)")

// mayActFor checks an import's user: a well-formed subject, and a key that may assert users.
func mayActFor(ctx context.Context, user string) error {
	if err := ident.User.Check("user", user); err != nil {
		return err
	}
	p, err := auth.PrincipalFrom(ctx)
	if err != nil {
		return err
	}
	if p.System == "" && !p.Has(auth.RunExecute) {
		return errActForUser
	}
	return nil
}

// importStatus renders a failure to reach or list the server as an import failure (with the
// ServerFailure detail that classifies it) and everything else through the error table.
func importStatus(ctx context.Context, s *Service, ref string, err error) error {
	_, failure := discovery.AsFailure(err)
	if !failure && !errors.Is(err, discovery.ErrIsolationRequired) {
		return s.errors.Status(ctx, err)
	}
	st := status.Convert(discovery.Status(ctx, s.errors, err))
	p := st.Proto()
	p.Message = fmt.Sprintf("publisher: mcp-import of server %s failed, nothing was written: %s", quote(ref), p.Message)
	return status.FromProto(p).Err()
}

// Import runs mcp-import: it checks the draft, the agent and the server's grants, discovers the
// server's tools (outside any transaction), and applies them to the freshly read draft in one
// transaction: all or nothing. The pins are the discovery's, verbatim.
func (s *Service) Import(ctx context.Context, req ImportRequest) (*ImportResult, error) {
	if err := checkImportRequest(&req); err != nil {
		return nil, err
	}
	// Refuse what can be refused before anything is started.
	g, err := s.store.Draft(ctx, req.Tenant, req.GraphID)
	if err != nil {
		return nil, storeErr(err, req.GraphID)
	}
	if _, ok := g.Agent(req.Agent); !ok {
		return nil, agentNotFound(req.GraphID, req.Agent)
	}
	notRegistered := func() error {
		return refusef("server %s is not registered: an operator (mcp:admin) registers it first (ringfence servers add %s --command ...)", quote(req.ServerRef), req.ServerRef)
	}
	policy, err := s.cfg.Policies.ServerPolicy(ctx, req.ServerRef)
	if errors.Is(err, mcpserver.ErrNotRegistered) {
		return nil, notRegistered()
	}
	if err != nil {
		return nil, registryErr(err)
	}
	if err := grantsCoverFloor(policy); err != nil {
		return nil, err
	}
	if s.cfg.Discoverer == nil {
		return nil, discovery.ErrIsolationRequired
	}

	start := time.Now()
	var listing *discovery.Listing
	if req.User == "" {
		listing, err = s.cfg.Discoverer.DiscoverTools(ctx, req.ServerRef)
	} else if ud, ok := s.cfg.Discoverer.(UserDiscoverer); ok {
		listing, err = ud.DiscoverToolsAs(ctx, req.Tenant, req.User, req.ServerRef)
	} else {
		return nil, refusef("this publisher's pool cannot list tools as a user: import without --user")
	}
	res := &ImportResult{Discovery: time.Since(start)}
	if errors.Is(err, mcpserver.ErrNotRegistered) {
		return nil, notRegistered()
	}
	if err != nil {
		return nil, err
	}

	applyStart := time.Now()
	tools, err := selectTools(listing, req)
	if err != nil {
		return nil, err
	}
	stored, err := s.store.UpdateDraft(ctx, req.Tenant, req.GraphID, func(cur *graph.Graph) error {
		res.Tools, res.AgentCapabilitiesAdded = nil, nil
		return applyImport(cur, req, tools, policy, res)
	}, func(r audit.Recorder) error {
		return s.event(ctx, req.Tenant, audit.ActionImport, req.GraphID, importChange(req, res))(r)
	})
	if err != nil {
		return nil, storeErr(err, req.GraphID)
	}
	res.DraftRevision = stored.Revision
	res.Apply = time.Since(applyStart)
	s.log.DebugContext(ctx, "tools imported", "tenant", req.Tenant, "graph", req.GraphID, "server", req.ServerRef,
		"tools", len(res.Tools), "discovery", res.Discovery, "apply", res.Apply)
	return res, nil
}

func checkImportRequest(req *ImportRequest) error {
	if err := graph.ValidateGraphID("graph_id", req.GraphID); err != nil {
		return err
	}
	if err := mcpserver.ValidateRef(req.ServerRef); err != nil {
		if fe, ok := fielderr.As(err); ok {
			return fielderr.New("server_ref", "%s", fe.Problem)
		}
		return err
	}
	if err := graph.ValidateNodeID("agent", req.Agent); err != nil {
		return err
	}
	if len(req.Tools) > screen.MaxTools {
		return fielderr.New("tools", "names %d tools; at most %d", len(req.Tools), screen.MaxTools)
	}
	seen := make(map[string]bool, len(req.Tools))
	var tools []string
	for i, t := range req.Tools {
		if t == "" || len(t) > mcpserver.MaxToolName || strings.Trim(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") != "" {
			return fielderr.New(fmt.Sprintf("tools[%d]", i), "%s is not a tool name ([A-Za-z0-9_.-]{1,128})", quote(t))
		}
		if !seen[t] {
			seen[t] = true
			tools = append(tools, t)
		}
	}
	req.Tools = tools
	return nil
}

func agentNotFound(graphID, agent string) error {
	return &wrapped{msg: fmt.Sprintf("publisher: graph %s has no agent node %s: add it to the draft (ringfence graphs show --graph %s -o json > draft.json, add an agent node with that id, ringfence graphs edit --graph %s --file draft.json)", quote(graphID), quote(agent), graphID, graphID), err: errAgentNotFound}
}

// grantsCoverFloor refuses a server whose grants do not cover the floor: every node the import
// writes declares it, and the ceiling would refuse every one of them at publish.
func grantsCoverFloor(p mcpserver.Policy) error {
	grants, _ := capability.ParseSet(validOnly(p.Grants))
	var missing []string
	for _, f := range floorSet {
		if !grants.Covers(f) {
			missing = append(missing, f.String())
		}
	}
	if len(missing) == 0 {
		return nil
	}
	shown := "[]"
	if len(p.Grants) > 0 {
		shown = "[" + strings.Join(p.Grants, ", ") + "]"
	}
	// update replaces the grants, so the suggestion lists every one to keep, less near-misses
	// of the floor (a "proces_spawn" kept beside the real one helps nobody).
	var flags []string
	for _, g := range append(append([]string(nil), p.Grants...), missing...) {
		if _, typo := capability.NearFloor(g); !typo {
			flags = append(flags, "--grant "+g)
		}
	}
	return refusef("server %s grants %s, which does not cover %s. Every imported tool node declares process_spawn and external_api_call "+
		"(the floor: a tool runs code outside Ringfence, in a stdio server's process or on a remote server's host, that reaches outside systems), and a node may declare only what its server grants, "+
		"so the import would write a graph that cannot publish. grants: [] is the default for a newly registered server; "+
		"an operator (mcp:admin) must add %s to the server's grants, e.g. ringfence servers update %s %s",
		quote(p.Ref), shown, strings.Join(missing, " and "), strings.Join(missing, " and "), p.Ref, strings.Join(flags, " "))
}

func validOnly(ss []string) []string {
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		if _, err := capability.Parse(s); err == nil {
			out = append(out, s)
		}
	}
	return out
}

// selectTools picks the tools to import and refuses what cannot be: tools the server does not
// offer or its filter excludes, and declarations the screen found unrepresentable.
func selectTools(listing *discovery.Listing, req ImportRequest) ([]discovery.Tool, error) {
	var listingFailures []string
	for _, f := range listing.Findings {
		if f.Severity == discovery.SeverityHardFailure {
			listingFailures = append(listingFailures, fmt.Sprintf("%s at %s: %s", f.Code, f.Location, f.Message))
		}
	}
	if len(listingFailures) > 0 {
		return nil, refusef("the declaration screen refused server %s's tool listing: %s", quote(req.ServerRef), listed(listingFailures))
	}
	var selected []discovery.Tool
	if len(req.Tools) == 0 {
		excluded := 0
		for _, t := range listing.Tools {
			if t.Excluded {
				excluded++
				continue
			}
			selected = append(selected, t)
		}
		if len(selected) == 0 {
			if excluded > 0 {
				return nil, refusef("server %s offers no tool its tool_filter lets through (%d excluded)", quote(req.ServerRef), excluded)
			}
			return nil, refusef("server %s offers no tools", quote(req.ServerRef))
		}
	} else {
		byName := make(map[string]int, len(listing.Tools))
		for i, t := range listing.Tools {
			if _, dup := byName[t.Name]; !dup {
				byName[t.Name] = i
			}
		}
		var missing, excluded []string
		for _, name := range req.Tools {
			i, ok := byName[name]
			switch {
			case !ok:
				missing = append(missing, quote(name))
			case listing.Tools[i].Excluded:
				excluded = append(excluded, quote(name))
			default:
				selected = append(selected, listing.Tools[i])
			}
		}
		var problems []string
		if len(missing) > 0 {
			var offered []string
			for _, t := range listing.Tools {
				if !t.Excluded {
					offered = append(offered, t.Name)
				}
			}
			sort.Strings(offered)
			// Names come from the server: quoted, so hidden or control characters show.
			for i, name := range offered {
				offered[i] = quote(name)
			}
			problems = append(problems, fmt.Sprintf("server %s does not offer %s (it offers: %s)", quote(req.ServerRef), listed(missing), listed(offered)))
		}
		if len(excluded) > 0 {
			problems = append(problems, fmt.Sprintf("server %s's tool_filter excludes %s: an operator can change the filter (ringfence servers update %s --include-tool/--exclude-tool)",
				quote(req.ServerRef), listed(excluded), req.ServerRef))
		}
		if len(problems) > 0 {
			return nil, refusef("%s", strings.Join(problems, "; "))
		}
	}
	var failures []string
	for _, t := range selected {
		// The listing's findings are the pool's; the publisher screens what it stores itself,
		// as every draft write and publish does, so a pool of another version cannot make the
		// import write a draft that publish would refuse.
		refusals := graph.ScreenDeclaration(declarationOf(t)).Refusals
		for _, f := range t.Findings {
			if f.Severity == discovery.SeverityHardFailure {
				refusals = append(refusals, f)
			}
		}
		seen := make(map[string]bool, len(refusals))
		for _, f := range refusals {
			if key := f.Code + "\x00" + f.Location; !seen[key] {
				seen[key] = true
				failures = append(failures, fmt.Sprintf("tool %s: %s at %s: %s", quote(t.Name), f.Code, f.Location, f.Message))
			}
		}
		if t.SchemaHash == "" && len(refusals) == 0 {
			failures = append(failures, fmt.Sprintf("tool %s: its declaration cannot be pinned", quote(t.Name)))
		}
	}
	if len(failures) > 0 {
		return nil, refusef("the declaration screen refused %s: they cannot be represented or pinned safely, so nothing was imported: %s",
			plural(len(failures), "declaration"), listed(failures))
	}
	return selected, nil
}

// applyImport writes the selected tools into the draft cur (inside the draft's transaction).
func applyImport(cur *graph.Graph, req ImportRequest, tools []discovery.Tool, policy mcpserver.Policy, res *ImportResult) error {
	agentIdx := -1
	for i := range cur.Nodes {
		if cur.Nodes[i].ID == req.Agent && cur.Nodes[i].Kind == graph.KindAgent && cur.Nodes[i].Agent != nil {
			agentIdx = i
			break
		}
	}
	if agentIdx < 0 {
		return agentNotFound(req.GraphID, req.Agent)
	}
	ids := make(map[string]bool, len(cur.Nodes)+len(tools))
	byTool := make(map[string]int)
	for i := range cur.Nodes {
		n := &cur.Nodes[i]
		ids[n.ID] = true
		if n.Kind == graph.KindMCPTool && n.MCPTool != nil && n.MCPTool.ServerRef == req.ServerRef {
			if _, dup := byTool[n.MCPTool.ToolName]; !dup {
				byTool[n.MCPTool.ToolName] = i
			}
		}
	}
	edges := make(map[string]bool)
	for _, e := range cur.Edges {
		if e.Kind == graph.EdgeTool && e.From == req.Agent {
			edges[e.To] = true
		}
	}
	agent := cur.Nodes[agentIdx].Agent
	bound := make(map[string]bool, len(agent.ToolBindings))
	names := make(map[string]string, len(agent.ToolBindings))
	for _, b := range agent.ToolBindings {
		bound[b.NodeID] = true
		names[b.Name] = b.NodeID
	}
	held, _ := capability.ParseSet(validOnly(agent.CapabilityBindings))
	for _, f := range floorSet {
		if !held.Covers(f) {
			agent.CapabilityBindings = append(agent.CapabilityBindings, f.String())
			res.AgentCapabilitiesAdded = append(res.AgentCapabilitiesAdded, f.String())
		}
	}

	touched := make([]int, 0, len(tools))
	for _, t := range tools {
		out := ImportedTool{ToolName: t.Name, NewHash: t.SchemaHash, Flags: flagsOf(t)}
		idx, exists := byTool[t.Name]
		if exists {
			m := cur.Nodes[idx].MCPTool
			out.OldHash = m.SchemaHash
			out.Outcome = OutcomeUnchanged
			if m.SchemaHash != t.SchemaHash {
				out.Outcome = OutcomeUpdated
			}
		} else {
			id := nodeIDFor(req.ServerRef, t.Name, ids)
			ids[id] = true
			cur.Nodes = append(cur.Nodes, graph.Node{ID: id, Kind: graph.KindMCPTool, MCPTool: &graph.MCPToolNode{ServerRef: req.ServerRef, ToolName: t.Name}})
			idx = len(cur.Nodes) - 1
			byTool[t.Name] = idx
			out.Outcome = OutcomeAdded
		}
		n := &cur.Nodes[idx]
		pin(n.MCPTool, t)
		out.NodeID = n.ID
		if !edges[n.ID] {
			cur.Edges = append(cur.Edges, graph.Edge{From: req.Agent, To: n.ID, Kind: graph.EdgeTool})
			edges[n.ID] = true
		}
		if !bound[n.ID] {
			name := req.ServerRef + "__" + t.Name
			if other, taken := names[name]; taken && other != n.ID {
				return refusef("agent %s already calls node %s%s by the name %s, which the import gives tool %s of server %s: rename or remove that binding first",
					quote(req.Agent), quote(other), sourceOf(cur, other), quote(name), quote(t.Name), quote(req.ServerRef))
			}
			agent.ToolBindings = append(agent.ToolBindings, graph.ToolBinding{Name: name, NodeID: n.ID})
			bound[n.ID], names[name] = true, n.ID
		}
		touched = append(touched, idx)
		res.Tools = append(res.Tools, out)
	}
	if err := cur.Validate(); err != nil {
		return refusef("the import would leave the draft malformed, so nothing was written: %v", err)
	}
	// The import writes a graph that would publish, or nothing: check every rule the imported
	// nodes and the importing agent are subject to.
	eff, err := graph.Effective(cur, req.Agent)
	if err != nil {
		return err
	}
	var violations []graph.Violation
	for _, i := range touched {
		n := &cur.Nodes[i]
		for _, v := range []*graph.Violation{graph.CheckFloor(n), graph.CheckCeiling(n, policy), graph.CheckAgentFloorWith(cur, req.Agent, eff, n)} {
			if v != nil {
				violations = append(violations, *v)
			}
		}
	}
	if len(violations) > 0 {
		return &importViolations{violations: violations}
	}
	return nil
}

// sourceOf says which server's tool node id is, when it is an mcp_tool node: a ref ending in
// '_' and a tool name starting with '_' join to the same <ref>__<tool> as another pair
// ("a_"+"__"+"b" and "a"+"__"+"_b"), so a clash names both pairs.
func sourceOf(g *graph.Graph, id string) string {
	for i := range g.Nodes {
		if n := &g.Nodes[i]; n.ID == id && n.Kind == graph.KindMCPTool && n.MCPTool != nil {
			return fmt.Sprintf(" (tool %s of server %s)", quote(n.MCPTool.ToolName), quote(n.MCPTool.ServerRef))
		}
	}
	return ""
}

// pin copies a discovered declaration into a node verbatim, with its hash: the hash is never
// recomputed here, and never over a screened form. The floor is added to the node's bindings.
func pin(m *graph.MCPToolNode, t discovery.Tool) {
	m.ToolName, m.Title, m.Description = t.Name, t.Title, t.Description
	m.InputSchema, m.OutputSchema, m.Annotations = t.InputSchema, t.OutputSchema, t.Annotations
	m.SchemaHash = t.SchemaHash
	m.Flags = flagsOf(t)
	held, _ := capability.ParseSet(validOnly(m.CapabilityBindings))
	for _, f := range floorSet {
		if !held.Covers(f) {
			m.CapabilityBindings = append(m.CapabilityBindings, f.String())
		}
	}
}

// flagsOf is the screen's flags for a discovered declaration: what the node stores, the same
// a later draft write or publish computes.
func flagsOf(t discovery.Tool) []discovery.Finding {
	return slices.Clone(graph.ScreenDeclaration(declarationOf(t)).Flags)
}

func declarationOf(t discovery.Tool) mcpdecl.Declaration {
	return mcpdecl.Declaration{
		Name: t.Name, Title: t.Title, Description: t.Description,
		InputSchema: t.InputSchema, OutputSchema: t.OutputSchema, Annotations: t.Annotations,
	}
}

// nodeIDFor is "<ref>__<tool>", shortened with a digest when too long for a node id, and
// suffixed when another node already has it. A re-import finds nodes by (ref, tool), never by
// id, so the id only has to be stable once assigned.
func nodeIDFor(ref, tool string, taken map[string]bool) string {
	base := ref + "__" + tool
	const max = 128
	if len(base) > max {
		sum := sha256.Sum256([]byte(ref + "\x00" + tool))
		base = base[:max-9] + "-" + hex.EncodeToString(sum[:4])
	}
	id := base
	for i := 2; taken[id]; i++ {
		suffix := fmt.Sprintf("-%d", i)
		trimmed := base
		if len(trimmed)+len(suffix) > max {
			trimmed = trimmed[:max-len(suffix)]
		}
		id = trimmed + suffix
	}
	return id
}

func listed(items []string) string { return humanize.List(items, maxListed, "nothing") }

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
