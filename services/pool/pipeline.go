package pool

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate"
	"github.com/ringfence/ringfence/mcpgate/capability"
	"github.com/ringfence/ringfence/mcpgate/schemas"
)

// The gate pipeline of a call, as pure decisions: every function here reads a snapshot of
// what the I/O around it (callTool) fetched, and returns a decision with the attempt as the
// audit log will record it. Nothing here asks the registry, starts a server or writes a
// record, so every gate is tested table-driven without an engine (pipeline_test.go).
//
// The order is the contract: a call is refused by the first gate it fails. Two stages run
// before dispatch:
//
//   - decide, before any server is reached: the run is running and its graph loaded, the
//     agent exists, the run is not waiting for another call's approval (and a retry of a
//     decided call is answered with its decision), tool_search is answered, the binding
//     exists; then for a registered tool the node's floor, the ceiling against the live
//     server policy, the agent's surface (the filter levels and deferral: filtered_out,
//     not_loaded), the agent floor, the arguments' form and their my-documents:// references;
//     for an inline server the flag, the agent floor and the arguments' form.
//   - decideArguments, once callTool fetched the referenced documents: the references
//     replaced by the documents' content, the strict form the model saw (and its nulls taken
//     out), mcpgate.Check (argument-scoped permissions, then the pinned input and output
//     schemas), and confirmation: a call that asks a person first waits for an approval.
//   - checkLive, once the run's session is up and its listing fresh: drift against the pin
//     (mcpgate.CheckDrift), or for an inline server the tool in the live listing, its screen
//     and mcpgate.Check against its live schemas.
//
// A gate added later (a sign-in) is a function added to the list where its refusal belongs;
// what it needs from I/O comes in on gateInput.

// runSnapshot is what the gates read of a run, taken under its lock at the call's start.
type runSnapshot struct {
	id      runIdentity
	state   string
	attempt int32
	// version and index are the run's graph; loadErr says why it could not be loaded (nil
	// while the run is not running: nothing is fetched for a call that is refused anyway).
	version *graph.Version
	index   *graph.Index
	loadErr error
	// selected is the run's selection; loaded the calling agent's loaded deferred tools.
	selected []string
	loaded   map[string]bool
	// approvals are copies of the run's approvals (approvals.go), for the approval gate.
	approvals []approvalView
}

// arguments are a call's decoded arguments: the object, its canonical encoding (for the
// digest), or the refusal decoding gave.
type arguments struct {
	value     map[string]any
	canonical []byte
	err       error
}

// gateInput is everything the gates decide on.
type gateInput struct {
	req CallRequest
	run runSnapshot
	// agent's capabilities after the graph's policies, in both forms the gates read.
	effective capability.Effective
	caps      mcpgate.Capabilities
	// policy is the live server policy of a registered tool's server; policyErr says why it
	// could not be read, and policyCanceled that the caller had gone by then.
	policy         mcpserver.Policy
	policyErr      error
	policyCanceled bool
	args           arguments
	allowAdvisory  bool
	allowInline    bool
	// schemas caches compiled schemas by pin across calls.
	schemas *schemas.Cache
	// surface is the agent's tools and settings as agentsurface read them (nil for an agent
	// the graph does not have).
	surface *agentsurface.Agent
	// searchPolicies are the policies of every server of the agent, read for a call to
	// tool_search only (policy above is a tool's own server's: a call asks the registry once);
	// searchPolicyErr says why they could not be read.
	searchPolicies  map[string]mcpserver.Policy
	searchPolicyErr error
	// connections are the run's user's connections of the servers whose policies the call
	// read (policy, searchPolicies, connectPolicy) that sign users in; connectionsErr says why
	// they could not be read.
	connections    map[string]agentsurface.Connection
	connectionsErr error
	// connectPolicy is the policy of the server a call to a connect tool names
	// (mcp_oauth_connect_<ref>); connectPolicyErr why it could not be read.
	connectPolicy    *mcpserver.Policy
	connectPolicyErr error
	// documents are the fetched my-documents:// references of the call (decideArguments).
	documents map[string]fetched
	// decision is set when ApproveCall runs the gates again for an approved call.
	decision *approvalDecision
}

// fetched is one referenced document as callTool fetched it: its content, or why not.
type fetched struct {
	content []byte
	err     error
}

// target is what a call names in the run's graph: a registered tool's node, or a tool of one
// of the agent's inline servers.
type target struct {
	agent      *graph.AgentNode
	node       *graph.Node
	inline     *graph.InlineMCPServer
	inlineTool string
}

// decision is what the gates concluded: refused (err: a *RefusedError, or the caller's own
// context error) or cleared for the next stage, with the attempt as it stands.
type decision struct {
	attempt audit.ToolCallAttempt
	err     error
	target  target
	// spec is the tool as mcpgate checks and dispatches it (an inline tool's comes from the
	// live listing, in checkLive).
	spec *mcpgate.ToolSpec
	// serverRef names the server in the run's sessions, results and records.
	serverRef string
	strict    bool
	// args are the call's arguments once gateArguments read them: a refusal before it records
	// none. args.value is what the server gets (documents in, strict nulls out); args.canonical
	// stays as the caller wrote them, for the digest.
	args arguments
	// tool is the agent surface's entry of a registered tool the call may reach.
	tool *agentsurface.Tool
	// docRefs are the document ids the arguments reference, in a call to a server the agent's
	// document_resolver lists.
	docRefs []string
	// ask says the call asks a person first: callTool requests the approval.
	ask bool
	// answered is set by a gate that answers the call without a server: search is
	// tool_search's answer, deliver a decided approval's for the caller's retry.
	answered bool
	search   *searchAnswer
	deliver  *approvalView
	// connect names the server a call to its connect tool connects (answerConnect).
	connect string
}

// gate is one step of a stage: nil lets the call on.
type gate func(in *gateInput, d *decision) error

// Stages of decide and decideArguments, in order.
var (
	targetGates     = []gate{gateRunning, gateLoaded, gateAgent, gateApprovals, gateToolSearch, gateConnect, gateBinding}
	registeredGates = []gate{gateFloor, gateCeiling, gateSurface, gateAgentFloor, gateArguments, gateDocumentRefs}
	argumentGates   = []gate{gateDocuments, gateStrict, gateCall, gateConfirmation}
	inlineGates     = []gate{gateInlineAllowed, gateAgentFloor, gateArguments}
)

// newAttempt is the audit attempt of a call before any gate: what the caller asked for.
// ToolName starts as the binding name the agent asked for, so a refused unknown binding is
// still legible in the audit log; it becomes the server's tool name once resolved.
func newAttempt(req CallRequest) audit.ToolCallAttempt {
	return audit.ToolCallAttempt{RunID: req.RunID, CallID: req.CallID, Attempt: 1, AgentNode: req.Agent, ToolName: req.Tool, AgentTokenID: req.AgentTokenID}
}

// decide runs the gates before the documents a call references are fetched. A decision
// that is answered (tool_search, a decided approval's retry) runs no further gate.
func decide(in *gateInput) decision {
	d := decision{attempt: newAttempt(in.req)}
	d.attempt.GraphID, d.attempt.GraphVersion, d.attempt.Attempt = in.run.id.GraphID, in.run.id.Version, in.run.attempt
	if d.err = runGates(targetGates, in, &d); d.err != nil || d.answered {
		return d
	}
	if d.target.inline != nil {
		d.err = runGates(inlineGates, in, &d)
	} else {
		d.err = runGates(registeredGates, in, &d)
	}
	return d
}

// decideArguments runs the gates on a registered tool's arguments once the documents they
// reference are in in.documents: the last before any server is reached.
func decideArguments(in *gateInput, d decision) decision {
	if d.err == nil && !d.answered && d.target.inline == nil {
		d.err = runGates(argumentGates, in, &d)
	}
	return d
}

func runGates(gates []gate, in *gateInput, d *decision) error {
	for _, g := range gates {
		if err := g(in, d); err != nil || d.answered {
			return err
		}
	}
	return nil
}

func gateRunning(in *gateInput, _ *decision) error {
	switch in.run.state {
	case StateRunning:
		return nil
	case StatePaused:
		// Named as the approval gate names its command: the caller may be an MCP client's
		// user, who knows neither the RPC nor the run's id.
		return refusal(reasonRunNotRunning, fmt.Errorf("%w (it is paused): resume it first (ringfence runs resume --run %s%s)",
			errRunNotRunning, in.run.id.ID, tenantFlag(in.run.id.Tenant)))
	}
	return refusal(reasonRunNotRunning, fmt.Errorf("%w (it %s): start a new run", errRunEnded, in.run.state))
}

func gateLoaded(in *gateInput, _ *decision) error {
	if in.run.loadErr != nil {
		return refusal(reasonUnknownRun, in.run.loadErr)
	}
	return nil
}

func gateAgent(in *gateInput, d *decision) error {
	agent, ok := in.run.index.Agent(in.req.Agent)
	if !ok {
		return refusal(reasonUnknownAgent, fmt.Errorf("graph %s v%d has no agent node %q (its agents: %s)", in.run.id.GraphID, in.run.id.Version, in.req.Agent, listed(in.run.index.AgentIDs())))
	}
	d.target.agent = agent
	return nil
}

// gateBinding resolves the tool: a bound mcp_tool node, else a tool of an inline server.
func gateBinding(in *gateInput, d *decision) error {
	node, ok := boundTool(in.run, in.req)
	if !ok {
		if inline, toolName, found := inlineTool(d.target.agent, in.req.Tool); found {
			d.target.inline, d.target.inlineTool = inline, toolName
			d.serverRef = inlineRef(in.req.Agent, inline.Name)
			d.attempt.ServerRef, d.attempt.ToolName = d.serverRef, toolName
			return nil
		}
		return refusal(reasonUnknownTool, fmt.Errorf("agent %q binds no mcp_tool named %q in graph %s v%d (it binds: %s; imported tools are named <server>__<tool>)",
			in.req.Agent, in.req.Tool, in.run.id.GraphID, in.run.id.Version, listed(in.run.index.BindingNames(in.req.Agent))))
	}
	tool := node.MCPTool
	d.target.node, d.serverRef = node, tool.ServerRef
	d.attempt.ToolNode, d.attempt.ServerRef, d.attempt.ToolName, d.attempt.PinnedHash = node.ID, tool.ServerRef, tool.ToolName, tool.SchemaHash
	return nil
}

// boundTool is the registered tool a call names, if it names one: what callTool fetches the
// server policy for.
func boundTool(snap runSnapshot, req CallRequest) (*graph.Node, bool) {
	if snap.index == nil {
		return nil, false
	}
	node, ok := snap.index.BoundTool(req.Agent, req.Tool)
	return node, ok && node.MCPTool != nil
}

// gateFloor: the node's floor. Publish proved it; it is checked again as the gate still
// standing should a version ever reach the pool without it (grants: [] then denies it).
func gateFloor(_ *gateInput, d *decision) error {
	if v := graph.CheckFloor(d.target.node); v != nil {
		ref := refusal(reasonCapability, errors.New(v.Message))
		ref.Missing = v.Missing
		return ref
	}
	return nil
}

// gateCeiling: the ceiling and the tool filter against the registry's grants now,
// unconditionally.
func gateCeiling(in *gateInput, d *decision) error {
	ref := d.target.node.MCPTool.ServerRef
	if err := in.policyErr; err != nil {
		switch {
		case errors.Is(err, mcpserver.ErrNotRegistered):
			return refusal(reasonUnknownServer, fmt.Errorf("server %q is no longer registered: the graph is stranded until it is registered again", ref))
		case in.policyCanceled:
			return err
		}
		return refusal(reasonRegistryUnavailable, fmt.Errorf("the registry could not be asked for the grants of server %q, so the ceiling cannot be checked; nothing was started: %w", ref, err))
	}
	if v := graph.CheckCeiling(d.target.node, in.policy); v != nil {
		r := refusal(reasonCeiling, errors.New(v.Message))
		r.Missing = v.Excess
		return r
	}
	// The registration's tool_filter is the agent surface's registration level (gateSurface):
	// a call and the listing name it alike, filtered_out.
	return nil
}

// gateAgentFloor: the agent effectively holds what the node declares (an inline tool declares
// the floor): enforced, or recorded as the attempt's advisory in an advisory graph on a pool
// that honours it.
func gateAgentFloor(in *gateInput, d *decision) error {
	node := d.target.node
	if d.target.inline != nil {
		// An inline tool declares nothing, but reaching its server spawns a process that
		// calls out all the same: the agent must hold the floor.
		node = &graph.Node{ID: d.serverRef, MCPTool: &graph.MCPToolNode{ServerRef: d.serverRef, ToolName: d.target.inlineTool, CapabilityBindings: capability.Floor}}
	}
	g := in.run.version.Graph
	v := graph.CheckAgentFloorWith(g, in.req.Agent, in.effective, node)
	if v == nil {
		return nil
	}
	if g.Mode() != graph.ModeAdvisory || !in.allowAdvisory {
		msg := v.Message
		if g.Mode() == graph.ModeAdvisory {
			msg += " (the graph's capability_mode is advisory, which this pool does not honour: pool.allow_advisory is off)"
		}
		ref := refusal(reasonAgentFloor, errors.New(msg))
		ref.Missing = v.Missing
		return ref
	}
	// Bounded as an audit record's field must be, or the attempt could not be recorded.
	d.attempt.Advisory = append(d.attempt.Advisory, truncateTo(reasonAgentFloor+": "+v.Message, audit.MaxFieldLen))
	return nil
}

// gateArguments: the arguments are a JSON object.
func gateArguments(in *gateInput, d *decision) error {
	if in.args.err != nil {
		return in.args.err
	}
	d.args = in.args
	return nil
}

// argumentScopeWork bounds the glob comparisons of one call's argument-scope gate (tens of
// ms of CPU at most; see capability.Meter): arguments are the caller's to choose, and
// without a bound a scope shaped against wildcard revoke entries cost seconds per call. It
// is what publishing allows a whole graph's agent floor, so no ordinary scope under a
// publishable graph's policies comes near it.
const argumentScopeWork = graph.MaxGlobWork

// gateCall is mcpgate's own gates before dispatch: the registration's argument-scoped
// permissions (tool_permissions, default-deny) against the agent's effective set, then the
// pinned schemas compile and the arguments match the input schema (read strictly when the
// registration asks: strict_inputs, no undeclared arguments). A pinned declaration holds no
// secret of a session, so text quoted from it is cleaned as mcpgate does by default.
func gateCall(in *gateInput, d *decision) error {
	tool := d.target.node.MCPTool
	d.spec, d.strict = pinnedSpec(tool), in.policy.StrictInputs
	opts := []mcpgate.CallOption{mcpgate.WithStrictInputs(d.strict), mcpgate.WithSchemaCache(in.schemas), mcpgate.WithWorkLimit(argumentScopeWork)}
	if reqs, declared := in.policy.ToolPermissions[tool.ToolName]; declared {
		opts = append(opts, mcpgate.WithPermissions(reqs...))
	}
	return gateRefusal(mcpgate.Check(d.spec, d.args.value, in.caps, opts...), reimport)
}

// pinnedSpec is a pinned tool as mcpgate checks it. Its permissions are the registration's,
// given per call (they may change); the node's own were proven at the floor and ceiling, so
// it needs none of its own (NoPermissionNeeded: past mcpgate's default-deny).
func pinnedSpec(tool *graph.MCPToolNode) *mcpgate.ToolSpec {
	return &mcpgate.ToolSpec{
		Namespace: mcpgate.Namespace, Name: tool.ToolName, Version: mcpgate.Version,
		InputSchema: tool.InputSchema, OutputSchema: tool.OutputSchema, Pin: tool.SchemaHash,
		SideEffects: mcpgate.SideEffectsExternal, ReplayPolicy: mcpgate.ReplayMustStub, NoPermissionNeeded: true,
	}
}

// What to do about a schema that cannot be used, pinned or live.
const (
	reimport  = "fix the server's declaration, then re-import the tool (ringfence mcp-import) and publish again"
	fixServer = "the server must declare a schema that compiles"
)

// gateRefusal is an mcpgate refusal before dispatch as the pool's: its reason, and the
// message the pool has always given.
func gateRefusal(err error, fix string) error {
	var ce *mcpgate.CapabilityError
	var ve *mcpgate.ValidationError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return argumentScopeRefusal(ce)
	case errors.As(err, &ve) && ve.Stage == mcpgate.StageDeclaration:
		return refusal(reasonDeclarationScreen, errors.New(ve.Message))
	case errors.As(err, &ve) && ve.SchemaUnusable:
		return refusal(reasonUnusableSchema, fmt.Errorf("%s; %s", ve.Message, fix))
	case errors.As(err, &ve):
		return refusal(reasonInvalidInput, errors.New(ve.Message))
	}
	return err
}

func argumentScopeRefusal(ce *mcpgate.CapabilityError) *RefusedError {
	switch {
	case ce.WorkLimit > 0:
		return refusal(reasonArgumentScope, fmt.Errorf("comparing this call's argument scopes with the agent's claims and the graph's revoke entries needs more than the per-call limit of %d units of work: simplify the wildcard revoke entries in the graph's policies, or call with a plainer argument", ce.WorkLimit))
	case ce.Problem != "":
		return refusal(reasonArgumentScope, errors.New(ce.Problem))
	}
	ref := refusal(reasonArgumentScope, fmt.Errorf("the agent holds no claim covering %s (the registration requires it for this tool and these arguments): bind a covering capability to the agent, e.g. with a glob scope", strings.Join(ce.Missing, ", ")))
	ref.Missing = ce.Missing
	return ref
}

// gateInlineAllowed: this pool runs inline servers at all. Every inline attempt, refused or
// not, says in its advisory what did not apply to it.
func gateInlineAllowed(in *gateInput, d *decision) error {
	d.attempt.Advisory = append(d.attempt.Advisory, inlineAdvisory)
	if !in.allowInline {
		return refusal(reasonInlineServers, fmt.Errorf("agent %q calls %q on its inline server %q, and this pool runs inline mcp_servers only with dev.allow_inline_mcp_servers (refused in production): register the server, run `ringfence mcp-import`, publish, and delete the inline entry", in.req.Agent, d.target.inlineTool, d.target.inline.Name))
	}
	return nil
}

// liveListing is a session's tool listing as the live gates read it, taken fresh (see
// Service.listing). Its maps are replaced, never changed, by a re-listing.
type liveListing struct {
	hashes mcpgate.Listing
	// tools and findings are an inline session's declarations as the screen saw them.
	tools    map[string]discovery.Tool
	findings []discovery.Finding
	// safe cleans the server's text for a message.
	safe func(string) string
}

// checkLive runs the gates on the session's live listing, the last before the attempt is
// recorded and dispatched.
func checkLive(in *gateInput, d decision, live liveListing) decision {
	if d.target.inline != nil {
		return checkInlineLive(in, d, live)
	}
	var drift *mcpgate.DriftError
	if err := mcpgate.CheckDrift(d.spec, live.hashes); errors.As(err, &drift) {
		ref := refusal(reasonSchemaDrift, fmt.Errorf("%w (pinned %s, live %s)", errDrift, drift.Pinned, drift.Live))
		ref.Pinned, ref.Live = drift.Pinned, drift.Live
		d.err = ref
	}
	return d
}

// checkInlineLive: an inline server's tool is in its live listing, readable, passes the
// declaration screen, and its live schemas compile and accept the arguments (no
// registration, so no strict_inputs: the live schema as the server wrote it).
func checkInlineLive(in *gateInput, d decision, live liveListing) decision {
	ref, name := d.serverRef, d.target.inlineTool
	t, ok := live.tools[name]
	if !ok {
		// The names are the server's own text.
		d.err = refusal(reasonUnknownTool, fmt.Errorf("the inline server %s lists no tool %q; it lists %s", ref, name, live.safe(clipList(slices.Sorted(maps.Keys(live.tools))))))
		return d
	}
	hash := live.hashes[name]
	if strings.HasPrefix(hash, mcpgate.NotHashable) {
		d.err = refusal(reasonUnknownTool, fmt.Errorf("the inline server %s declares tool %q in a form that cannot be read (%s)", ref, name, hash))
		return d
	}
	if err := screenRefusal(ref, t, live.findings, live.safe); err != nil {
		d.err = err
		return d
	}
	d.attempt.LiveHash = hash
	// The agent floor was the inline tool's permissions (gateAgentFloor): the spec needs none.
	d.spec = &mcpgate.ToolSpec{Namespace: mcpgate.Namespace, Name: name, Version: mcpgate.Version, InputSchema: t.InputSchema, OutputSchema: t.OutputSchema, Pin: hash, NoPermissionNeeded: true}
	d.err = gateRefusal(mcpgate.Check(d.spec, in.args.value, mcpgate.Capabilities{}, mcpgate.WithSchemaCache(in.schemas), mcpgate.WithSafeText(live.safe)), fixServer)
	return d
}
