package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/capability"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/humanize"
	"github.com/ringfence/ringfence/internal/mcpdecl/sanitize"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/schemas"
	"github.com/ringfence/ringfence/services/pool/internal/spawner"
)

// CallRequest is one tool call by one agent of a run.
type CallRequest struct {
	RunID  string
	Tenant string // the run's tenant ("" is the default tenant)
	Agent  string
	// Tool is the name the agent binds the tool by.
	Tool string
	// Arguments is the JSON object of arguments (nil means {}).
	Arguments json.RawMessage
	CallID    string
}

// CallResult is a dispatched call's sanitized result.
type CallResult struct {
	CallID    string
	Attempt   int32
	ServerRef string
	ToolName  string
	// Result is audit.ResultSucceeded, or audit.ResultFailed for a tool error result.
	Result       string
	FailureClass string
	IsError      bool
	// Content is the MCP content list and StructuredContent the structured result, every
	// string sanitized.
	Content           []map[string]any
	StructuredContent map[string]any
	Advisory          []string
	Latency           time.Duration
}

// Refusal reasons (audit.Reason… where one exists).
const (
	reasonUnknownRun       = "unknown_run"
	reasonUnknownAgent     = "unknown_agent"
	reasonRunNotRunning    = "run_not_running"
	reasonLimitExceeded    = "limit_exceeded"
	reasonAuditUnavailable = "audit_unavailable"
	// reasonRegistryUnavailable: the registry could not be asked (the ceiling, or the
	// registration to start the server); nothing was started.
	reasonRegistryUnavailable = "registry_unavailable"
	reasonShuttingDown        = "shutting_down"
	// reasonCanceled: the caller cancelled, or its deadline passed, before dispatch.
	reasonCanceled          = "canceled"
	reasonUnknownTool       = audit.ReasonUnknownTool
	reasonUnknownServer     = audit.ReasonUnknownServer
	reasonCapability        = audit.ReasonCapability
	reasonCeiling           = audit.ReasonCeiling
	reasonAgentFloor        = audit.ReasonAgentFloor
	reasonArgumentScope     = audit.ReasonArgumentScope
	reasonInvalidInput      = audit.ReasonInvalidInput
	reasonIsolationRequired = audit.ReasonIsolationRequired
	reasonSpawnFailed       = audit.ReasonSpawnFailed
	reasonHandshakeFailed   = audit.ReasonHandshakeFailed
	reasonSchemaDrift       = audit.ReasonSchemaDrift
	reasonUnusableSchema    = audit.ReasonUnusableSchema
	reasonDeclarationScreen = audit.ReasonDeclarationScreen
)

// Failure classes of a dispatched call (audit.Failure… plus the pool's own).
const (
	failureToolError      = audit.FailureToolError
	failureTimeout        = audit.FailureTimeout
	failureTransport      = audit.FailureTransportError
	failureCrashed        = audit.FailureCrashed
	failureOutputInvalid  = audit.FailureOutputInvalid
	failureOutputTooLarge = "output_too_large"
	// failureProtocolViolation: the server broke the protocol during the call (it flooded
	// the pool with requests, say) and was stopped.
	failureProtocolViolation = "protocol_violation"
	failureCanceled          = "canceled"
)

// RefusedError is a call refused before dispatch: nothing reached the server.
type RefusedError struct {
	// CallID and Attempt identify the attempt as its audit record does (the pool generates a
	// call id when the caller gave none).
	CallID  string
	Attempt int32
	Reason  string
	Err     error
	Pinned  string
	Live    string
	Missing []string
	// Server classifies a failure to start or reach the server.
	Server *discovery.Failure
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("pool: refused before dispatch (%s): %s; nothing reached the server", e.Reason, e.Problem())
}

// Problem is what refused the call, without the "pool: " that the sentinels it wraps carry
// when they stand alone: the refusal says once that the pool speaks.
func (e *RefusedError) Problem() string { return unprefixed(e.Err) }

func (e *RefusedError) Unwrap() error { return e.Err }

func refusal(reason string, err error) *RefusedError { return &RefusedError{Reason: reason, Err: err} }

// FailedError is a call that reached the server and failed: it may have taken effect.
type FailedError struct {
	CallID  string
	Attempt int32
	Class   string
	Err     error
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("pool: the call reached the server and failed (%s): %s; it may have taken effect", e.Class, e.Problem())
}

// Problem is how the call failed, without a "pool: " prefix of its own.
func (e *FailedError) Problem() string { return unprefixed(e.Err) }

// unprefixed is err's message without a leading "pool: ", so an error the pool wraps in its
// own sentence does not name the pool twice.
func unprefixed(err error) string {
	if err == nil {
		return ""
	}
	return strings.TrimPrefix(err.Error(), "pool: ")
}

func (e *FailedError) Unwrap() error { return e.Err }

var (
	errDrift             = errors.New("the server's live declaration of the tool does not hash to the pin taken at import: re-import the tool (ringfence mcp-import) and publish again to accept the change")
	errIsolationRequired = discovery.ErrIsolationRequired
)

// reasonForRegistryErr classifies a failure to ask the registry about a server: an outage is
// not a failure to spawn, since nothing was started.
func reasonForRegistryErr(err error) string {
	if errors.Is(err, mcpserver.ErrNotRegistered) {
		return reasonUnknownServer
	}
	return reasonRegistryUnavailable
}

// spawnRefusal classifies a failure to start, handshake with or list a server.
func spawnRefusal(err error) error {
	var se *spawner.Error
	if !errors.As(err, &se) {
		return refusal(failedToStart(err), err)
	}
	reason := reasonSpawnFailed
	switch se.Class {
	case spawner.ClassIsolationRequired:
		return refusal(reasonIsolationRequired, errIsolationRequired)
	case spawner.ClassHandshakeTimeout, spawner.ClassExitedBeforeHandshake, spawner.ClassNotMCPServer:
		reason = reasonHandshakeFailed
	}
	r := refusal(reason, errors.New(se.Message))
	r.Server = &discovery.Failure{Class: string(se.Class), Message: se.Message, StderrTail: se.StderrTail}
	return r
}

// CallTool calls a tool through every gate, in order, and returns the sanitized result. The
// attempt is on record before the server is reached (a pending record, durable) and its outcome
// after; a refusal is recorded, durably, before the answer. A *RefusedError means nothing
// reached the server; a *FailedError means it did and may have taken effect.
func (s *Service) CallTool(ctx context.Context, req CallRequest) (*CallResult, error) {
	start := time.Now()
	if req.CallID == "" {
		req.CallID = "call-" + newRunID()[4:]
	}
	// ToolName starts as the binding name the agent asked for, so a refused unknown binding is
	// still legible in the audit log; it becomes the server's tool name once resolved.
	att := audit.ToolCallAttempt{RunID: req.RunID, CallID: req.CallID, Attempt: 1, AgentNode: req.Agent, ToolName: req.Tool}
	tenant := req.Tenant
	var argsCanonical []byte
	intent := func() (err error) {
		att.PendingID, err = s.recordPending(ctx, att, argsCanonical, tenant)
		return err
	}
	var res *CallResult
	var err error
	if s.inflight.enter() {
		defer s.inflight.leave()
		res, err = s.callTool(ctx, req, &att, &tenant, &argsCanonical, intent)
	} else {
		err = refusal(reasonShuttingDown, errShuttingDown)
	}
	att.LatencyMicros = time.Since(start).Microseconds()
	setArgs(&att, argsCanonical)
	settle(&att, res, err)
	identify(err, att.CallID, att.Attempt)
	s.metrics.calls.WithLabelValues(att.Outcome, orDash(att.Result), orDash(att.Reason+att.FailureClass)).Inc()
	rec := audit.NewToolCallRecord("pool", orDefaultTenant(tenant), att)
	if att.Outcome == audit.OutcomeDispatched {
		// The pending record is durable already; the outcome does not hold up the answer.
		s.recordOutcome(rec)
	} else if aerr := s.spool.Enqueue(context.WithoutCancel(ctx), rec); aerr != nil {
		s.log.Error("a refused tool-call attempt could not be recorded in the audit spool", "run", req.RunID, "call", req.CallID, "err", aerr)
		err = notRecorded(err, aerr)
	}
	if res != nil {
		res.Latency, res.Advisory = time.Since(start), att.Advisory
	}
	return res, err
}

// identify puts the attempt's call id and number into a refusal or failure, for the details
// the caller gets.
func identify(err error, callID string, attempt int32) {
	var refused *RefusedError
	var failed *FailedError
	switch {
	case errors.As(err, &refused):
		refused.CallID, refused.Attempt = callID, attempt
	case errors.As(err, &failed):
		failed.CallID, failed.Attempt = callID, attempt
	}
}

// notRecorded says, in the error the caller gets, that a refused attempt is not in the audit
// log: no attempt may go missing from it silently.
func notRecorded(err, aerr error) error {
	note := fmt.Errorf("this attempt could not be recorded in the audit log: %v", aerr)
	var refused *RefusedError
	if errors.As(err, &refused) {
		refused.Err = fmt.Errorf("%w; %v", refused.Err, note)
		return err
	}
	return fmt.Errorf("%w; %v", err, note)
}

// recordPending puts an attempt on record, durably, after every gate and before anything
// reaches the server: a crash mid-call still leaves a trail that says the call may have
// happened. A failure refuses the call.
//
// It returns the pending record's ID, which the outcome record names (pending_id).
func (s *Service) recordPending(ctx context.Context, att audit.ToolCallAttempt, argsCanonical []byte, tenant string) (string, error) {
	att.Pending()
	setArgs(&att, argsCanonical)
	rec := audit.NewToolCallRecord("pool", orDefaultTenant(tenant), att)
	if err := s.spool.Enqueue(context.WithoutCancel(ctx), rec); err != nil {
		return "", refusal(reasonAuditUnavailable, fmt.Errorf("the attempt could not be recorded before dispatch: %w", err))
	}
	return rec.ID, nil
}

func setArgs(att *audit.ToolCallAttempt, argsCanonical []byte) {
	if len(argsCanonical) > 0 {
		att.ArgsDigest, att.ArgsSize = digest(argsCanonical), int64(len(argsCanonical))
	}
}

// settle sets an attempt's outcome from what the call returned.
func settle(att *audit.ToolCallAttempt, res *CallResult, err error) {
	var refused *RefusedError
	var failed *FailedError
	switch {
	case errors.As(err, &refused):
		att.Refused(refused.Reason)
		att.PinnedHash, att.LiveHash = orKeep(att.PinnedHash, refused.Pinned), orKeep(att.LiveHash, refused.Live)
	case errors.As(err, &failed):
		att.Failed(failed.Class)
	case err != nil:
		// Context errors before dispatch and internal errors: nothing was sent.
		att.Refused(failedToStart(err))
	case res.Result == audit.ResultFailed:
		att.Failed(res.FailureClass)
	default:
		att.Succeeded()
	}
}

// resultToProto is a result's content and structured content as the API carries them.
func resultToProto(res *CallResult) (content []*structpb.Struct, structured *structpb.Struct) {
	for _, c := range res.Content {
		if st, err := structpb.NewStruct(c); err == nil {
			content = append(content, st)
		}
	}
	if res.StructuredContent != nil {
		if st, err := structpb.NewStruct(res.StructuredContent); err == nil {
			structured = st
		}
	}
	return content, structured
}

// recordOutcome spools a dispatched call's outcome record in the background; Close waits for
// every one. If it cannot be written the pending record stands, which says the call may have
// taken effect.
func (s *Service) recordOutcome(rec audit.Record) {
	s.outcomes.Go(func() {
		if err := s.spool.Enqueue(context.Background(), rec); err != nil {
			s.log.Error("a tool call's outcome could not be recorded; its pending record stands", "run", rec.ToolCall.RunID, "call", rec.ToolCall.CallID, "err", err)
		}
	})
}

// orDefaultTenant is the tenant a run is looked up in, and an attempt on an unknown run
// recorded under, when none was given: the default one.
func orDefaultTenant(tenant string) string {
	if tenant == "" {
		return auth.DefaultTenant
	}
	return tenant
}

func orKeep(a, b string) string {
	if b != "" {
		return b
	}
	return a
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (s *Service) callTool(ctx context.Context, req CallRequest, att *audit.ToolCallAttempt, tenant *string, argsCanonical *[]byte, intent func() error) (*CallResult, error) {
	// Gate 0: the audit spool can take the record (fail closed before anything happens).
	if err := s.spool.CanAccept(); err != nil {
		return nil, refusal(reasonAuditUnavailable, err)
	}

	// Gate 1: a known run, agent and tool binding.
	r, err := s.lookup(ctx, req.RunID, req.Tenant)
	if err != nil {
		return nil, refusal(reasonUnknownRun, err)
	}
	// busy is taken under the run's lock, as the idle reaper checks it (end), so a run is
	// either ended before this call or seen busy by the reaper, never ended under it.
	r.mu.Lock()
	r.busy.Add(1)
	defer func() {
		// The idle clock starts again when a call ends: a run whose long call just returned
		// is not abandoned.
		r.mu.Lock()
		r.touch()
		r.busy.Add(-1)
		r.mu.Unlock()
	}()
	*tenant = r.id.Tenant
	att.GraphID, att.GraphVersion, att.AgentNode = r.id.GraphID, r.id.Version, req.Agent
	r.touch()
	r.calls++
	if len(r.attempts) >= maxTrackedCallIDs {
		clear(r.attempts)
	}
	r.attempts[req.CallID]++
	att.Attempt = r.attempts[req.CallID]
	state := r.rec.State
	r.mu.Unlock()
	switch state {
	case StateRunning:
	case StatePaused:
		return nil, refusal(reasonRunNotRunning, fmt.Errorf("%w (it is paused): resume it first", errRunNotRunning))
	default:
		return nil, refusal(reasonRunNotRunning, fmt.Errorf("%w (it %s): start a new run", errRunEnded, state))
	}
	if err := s.load(ctx, r); err != nil {
		return nil, refusal(reasonUnknownRun, err)
	}
	agent, ok := r.index.Agent(req.Agent)
	if !ok {
		return nil, refusal(reasonUnknownAgent, fmt.Errorf("graph %s v%d has no agent node %q (its agents: %s)", r.id.GraphID, r.id.Version, req.Agent, listed(r.index.AgentIDs())))
	}
	node, ok := r.index.BoundTool(req.Agent, req.Tool)
	if !ok || node.MCPTool == nil {
		if inline, toolName, found := inlineTool(agent, req.Tool); found {
			return s.callInline(ctx, r, req, inline, toolName, att, argsCanonical, intent)
		}
		return nil, refusal(reasonUnknownTool, fmt.Errorf("agent %q binds no mcp_tool named %q in graph %s v%d (it binds: %s; imported tools are named <server>__<tool>)",
			req.Agent, req.Tool, r.id.GraphID, r.id.Version, listed(r.index.BindingNames(req.Agent))))
	}
	tool := node.MCPTool
	att.ToolNode, att.ServerRef, att.ToolName, att.PinnedHash = node.ID, tool.ServerRef, tool.ToolName, tool.SchemaHash

	// Gate 2: the node's floor, and the ceiling against the registry's grants now,
	// unconditionally. Publish proved the floor; it is checked again as the gate still
	// standing should a version ever reach the pool without it (grants: [] then denies it).
	if v := graph.CheckFloor(node); v != nil {
		ref := refusal(reasonCapability, errors.New(v.Message))
		ref.Missing = v.Missing
		return nil, ref
	}
	policy, err := s.cfg.Registry.ServerPolicy(ctx, tool.ServerRef)
	if err != nil {
		switch {
		case errors.Is(err, mcpserver.ErrNotRegistered):
			return nil, refusal(reasonUnknownServer, fmt.Errorf("server %q is no longer registered: the graph is stranded until it is registered again", tool.ServerRef))
		case ctx.Err() != nil:
			return nil, err
		}
		return nil, refusal(reasonRegistryUnavailable, fmt.Errorf("the registry could not be asked for the grants of server %q, so the ceiling cannot be checked; nothing was started: %w", tool.ServerRef, err))
	}
	if v := graph.CheckCeiling(node, policy); v != nil {
		ref := refusal(reasonCeiling, errors.New(v.Message))
		ref.Missing = v.Excess
		return nil, ref
	}
	if v := graph.CheckToolFilter(node, policy); v != nil {
		return nil, refusal(reasonCeiling, errors.New(v.Message))
	}

	// Gate 3: the agent floor against the agent's effective set after the graph's policies.
	if err := s.agentFloor(r, req.Agent, node, att); err != nil {
		return nil, err
	}
	eff := s.effective(r, req.Agent)

	// Gate 4: argument-scoped permissions declared by the registration (default-deny).
	args, canonical, err := decodeArguments(req.Arguments)
	if err != nil {
		return nil, err
	}
	*argsCanonical = canonical
	if reqs, declared := policy.ToolPermissions[tool.ToolName]; declared {
		if err := checkArgumentScopes(reqs, args, eff); err != nil {
			return nil, err
		}
	}

	// Gate 5: the pinned schemas compile, and the arguments match the input schema.
	if err := s.checkSchemas(tool, safePinned, reimport); err != nil {
		return nil, err
	}
	if err := s.validateInput(tool, *argsCanonical, policy.StrictInputs); err != nil {
		return nil, err
	}

	// Gates 6 and 7: isolation, spawn and handshake (on first use in the run).
	sess, err := s.session(ctx, r, tool.ServerRef, nil)
	if err != nil {
		return nil, sessionRefusal(err)
	}

	// Gate 8: drift of the live declaration against the pin.
	live, err := s.checkDrift(ctx, sess, tool.ToolName, tool.SchemaHash)
	if err != nil {
		if errors.Is(err, errDrift) {
			ref := refusal(reasonSchemaDrift, fmt.Errorf("%w (pinned %s, live %s)", errDrift, tool.SchemaHash, live))
			ref.Pinned, ref.Live = tool.SchemaHash, live
			return nil, ref
		}
		return nil, err
	}

	// Dispatch, on record first.
	if err := intent(); err != nil {
		return nil, err
	}
	return s.dispatchInRun(ctx, sess, tool, args, req.CallID, att.Attempt)
}

// agentFloor checks that the agent effectively holds what node declares: enforced in enforce
// mode, recorded as the attempt's advisory in advisory mode.
func (s *Service) agentFloor(r *run, agent string, node *graph.Node, att *audit.ToolCallAttempt) error {
	v := graph.CheckAgentFloorWith(r.version.Graph, agent, s.effective(r, agent), node)
	if v == nil {
		return nil
	}
	if r.version.Graph.Mode() != graph.ModeAdvisory || !s.cfg.AllowAdvisory {
		msg := v.Message
		if r.version.Graph.Mode() == graph.ModeAdvisory {
			msg += " (the graph's capability_mode is advisory, which this pool does not honour: pool.allow_advisory is off)"
		}
		ref := refusal(reasonAgentFloor, errors.New(msg))
		ref.Missing = v.Missing
		return ref
	}
	// Bounded as an audit record's field must be, or the attempt could not be recorded.
	att.Advisory = append(att.Advisory, truncateTo(reasonAgentFloor+": "+v.Message, audit.MaxFieldLen))
	return nil
}

// sessionRefusal classifies a failure to get a run's session for a server.
func sessionRefusal(err error) error {
	var ref *RefusedError
	switch {
	case errors.As(err, &ref):
		return ref
	case errors.Is(err, errTooManySessions):
		return refusal(reasonLimitExceeded, err)
	case errors.Is(err, errShuttingDown):
		return refusal(reasonShuttingDown, err)
	case errors.Is(err, errRunNotRunning):
		return refusal(reasonRunNotRunning, err)
	}
	return refusal(failedToStart(err), err)
}

// listed renders names for an error: the first few, and how many more.
func listed(names []string) string { return humanize.List(names, 20, "none") }

// failedToStart names why a call that never reached a server did not: the caller gave up
// (cancelled, or its deadline passed), or the server could not be started.
func failedToStart(err error) string {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return reasonCanceled
	}
	return reasonSpawnFailed
}

// effective returns the agent's effective capabilities, computed once per run.
func (s *Service) effective(r *run, agentID string) capability.Effective {
	r.mu.Lock()
	defer r.mu.Unlock()
	if eff, ok := r.effective[agentID]; ok {
		return eff
	}
	eff, err := graph.Effective(r.version.Graph, agentID)
	if err != nil {
		// An agent with unparsable bindings holds nothing.
		eff = capability.Effective{}
	}
	r.effective[agentID] = eff
	return eff
}

// maxArgumentBytes bounds one call's arguments.
const maxArgumentBytes = 1 << 20

// decodeArguments reads a call's arguments, a JSON object (empty means {}), and returns them
// with their canonical encoding (sorted keys: stable for digests and schema checks). A refusal
// (invalid_input) names what is wrong.
func decodeArguments(raw json.RawMessage) (map[string]any, []byte, error) {
	if len(raw) > maxArgumentBytes {
		return nil, nil, refusal(reasonInvalidInput, fmt.Errorf("arguments are %d bytes; at most %d", len(raw), maxArgumentBytes))
	}
	var args map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &args); err != nil {
			return nil, nil, refusal(reasonInvalidInput, fmt.Errorf("arguments must be a JSON object: %v", err))
		}
	}
	if args == nil {
		args = map[string]any{}
	}
	canonical, err := json.Marshal(args)
	if err != nil {
		return nil, nil, refusal(reasonInvalidInput, fmt.Errorf("arguments cannot be encoded as JSON: %v", err))
	}
	return args, canonical, nil
}

// argumentScopeWork bounds the glob comparisons of one call's argument-scope gate (tens of
// ms of CPU at most; see capability.Meter): arguments are the caller's to choose, and
// without a bound a scope shaped against wildcard revoke entries cost seconds per call. It
// is what publishing allows a whole graph's agent floor, so no ordinary scope under a
// publishable graph's policies comes near it.
const argumentScopeWork = graph.MaxGlobWork

// checkArgumentScopes expands each requirement with the call's arguments (e.g.
// "fs.read:{path}" with path "/srv/a") and demands that the agent hold a covering claim.
func checkArgumentScopes(reqs []string, args map[string]any, eff capability.Effective) error {
	var missing []string
	checked := make(map[string]bool, len(reqs))
	meter := &capability.Meter{Limit: argumentScopeWork}
	for _, req := range reqs {
		expanded, err := mcpserver.ExpandRequirement(req, func(arg string) (string, bool) {
			v, ok := args[arg].(string)
			return v, ok
		})
		if err != nil {
			return refusal(reasonArgumentScope, err)
		}
		if checked[expanded] {
			continue
		}
		checked[expanded] = true
		c, err := capability.Parse(expanded)
		if err != nil {
			return refusal(reasonArgumentScope, fmt.Errorf("requirement %q with these arguments is %q, which is not a capability: %v", req, expanded, err))
		}
		if !eff.CoversMetered(c, meter) {
			missing = append(missing, expanded)
		}
		if meter.Exceeded() {
			return refusal(reasonArgumentScope, fmt.Errorf("comparing this call's argument scopes with the agent's claims and the graph's revoke entries needs more than the per-call limit of %d units of work: simplify the wildcard revoke entries in the graph's policies, or call with a plainer argument", argumentScopeWork))
		}
	}
	if len(missing) > 0 {
		ref := refusal(reasonArgumentScope, fmt.Errorf("the agent holds no claim covering %s (the registration requires it for this tool and these arguments): bind a covering capability to the agent, e.g. with a glob scope", strings.Join(missing, ", ")))
		ref.Missing = missing
		return ref
	}
	return nil
}

// What to do about a schema that cannot be used, pinned or live.
const (
	reimport  = "fix the server's declaration, then re-import the tool (ringfence mcp-import) and publish again"
	fixServer = "the server must declare a schema that compiles"
)

// checkSchemas compiles a tool's input and output schemas before anything reaches the server.
// A schema that cannot be compiled is the declaration's fault, not the caller's; and an output
// schema found broken only after the call would turn a refusal into a call that may have
// taken effect. safe cleans the compiler's message, which may quote the schema.
func (s *Service) checkSchemas(tool *graph.MCPToolNode, safe func(string) string, fix string) error {
	if _, err := s.schema(tool, "input"); err != nil {
		return refusal(reasonUnusableSchema, fmt.Errorf("the input schema of tool %q cannot be compiled: %s; %s", tool.ToolName, safe(err.Error()), fix))
	}
	if len(tool.OutputSchema) > 0 {
		if _, err := s.schema(tool, "output"); err != nil {
			return refusal(reasonUnusableSchema, fmt.Errorf("the output schema of tool %q cannot be compiled: %s; %s", tool.ToolName, safe(err.Error()), fix))
		}
	}
	return nil
}

// strictInput names the input schema read as strict_inputs asks.
const strictInput = "input-strict"

// schema compiles the tool's input, strict input or output schema, cached by its pin (or its
// live hash).
func (s *Service) schema(tool *graph.MCPToolNode, which string) (*schemas.Schema, error) {
	raw := tool.InputSchema
	if which == "output" {
		raw = tool.OutputSchema
	}
	strict := which == strictInput
	switch {
	case tool.SchemaHash == "" && strict: // nothing to key a cache entry by
		return schemas.CompileStrict(raw)
	case tool.SchemaHash == "":
		return schemas.Compile(raw)
	case strict:
		return s.schemas.GetStrict(tool.SchemaHash+"/"+which, raw)
	}
	return s.schemas.Get(tool.SchemaHash+"/"+which, raw)
}

// safePinned cleans text taken from a pinned declaration (it has no session whose secrets
// could be masked; a declaration holds none of them).
func safePinned(text string) string {
	return sanitize.String(truncateTo(text, 512), sanitize.Options{})
}

// validateInput checks the arguments against the input schema (checkSchemas compiled it),
// read strictly when the registration asks (strict_inputs: no undeclared arguments).
func (s *Service) validateInput(tool *graph.MCPToolNode, args []byte, strict bool) error {
	which := "input"
	if strict {
		which = strictInput
	}
	sch, err := s.schema(tool, which)
	if err != nil {
		return refusal(reasonUnusableSchema, fmt.Errorf("the input schema of tool %q cannot be compiled", tool.ToolName))
	}
	v, err := schemas.Decode(args)
	if err != nil {
		return refusal(reasonInvalidInput, err)
	}
	var tooMuch *schemas.BudgetError
	if err := sch.Validate(v); errors.As(err, &tooMuch) {
		return refusal(reasonInvalidInput, fmt.Errorf("the arguments cannot be checked against the tool's input schema with bounded work, so they are refused: %v", err))
	} else if err != nil {
		return refusal(reasonInvalidInput, fmt.Errorf("the arguments do not match the tool's input schema: %v", err))
	}
	return nil
}

// maxContentItems bounds the content items of one result: each becomes a map the result
// is sanitized and encoded through, so a 15 MiB message of empty items cost ~400 MiB.
const maxContentItems = 10_000

// dispatch sends tools/call and turns the answer into a result or a classified failure.
func (s *Service) dispatch(ctx context.Context, sess *session, tool *graph.MCPToolNode, args map[string]any, callID string, attempt int32) (*CallResult, error) {
	sess.calls.Add(1)
	cctx, cancel := context.WithTimeout(ctx, sess.reg.CallTimeout())
	defer cancel()
	res, err := sess.sess.CallTool(cctx, &mcp.CallToolParams{Name: tool.ToolName, Arguments: args})
	if err != nil {
		return nil, &FailedError{Class: s.classifyCallError(ctx, cctx, sess, err), Err: callErrMessage(err)}
	}
	// Secrets are masked too: a server's output is its one way out of the sandbox, for the
	// env values it was given as for anything else.
	keep := sanitize.Options{KeepMarkup: sess.reg.KeepMarkup, Redact: sess.sess.Redact}
	return s.result(tool, res, keep, sess.sess.SafeText, callID, attempt)
}

// result checks what a tools/call answered and turns it into a sanitized result (keep says
// how) or a classified failure. safe cleans a failure's message, which may quote what the
// server returned (a key the schema does not allow).
func (s *Service) result(tool *graph.MCPToolNode, res *mcp.CallToolResult, keep sanitize.Options, safe func(string) string, callID string, attempt int32) (*CallResult, error) {
	out := &CallResult{CallID: callID, Attempt: attempt, ServerRef: tool.ServerRef, ToolName: tool.ToolName, Result: audit.ResultSucceeded, IsError: res.IsError}
	if res.IsError {
		out.Result, out.FailureClass = audit.ResultFailed, failureToolError
	}
	invalid := func(err error) error {
		return &FailedError{Class: failureOutputInvalid, Err: errors.New(safe(err.Error()))}
	}
	if !res.IsError && len(tool.OutputSchema) > 0 {
		if err := s.validateOutput(tool, res.StructuredContent); err != nil {
			return nil, invalid(err)
		}
	}
	if len(res.Content) > maxContentItems {
		return nil, &FailedError{Class: failureOutputTooLarge, Err: fmt.Errorf("the result has %d content items, more than the %d a result may carry", len(res.Content), maxContentItems)}
	}
	// A value nested deeper than the sanitizer (and the schema check) goes is refused, not
	// passed on with its deep parts cut off.
	tooDeep := func(what string) error {
		return invalid(fmt.Errorf("%s is %v: the pool checks and sanitizes a result no deeper, so it is not passed on", what, sanitize.ErrTooDeep))
	}
	for i, c := range res.Content {
		item, err := contentItem(c)
		if err != nil {
			return nil, invalid(err)
		}
		clean, err := sanitize.ValueWithin(item, keep)
		if err != nil {
			return nil, tooDeep(fmt.Sprintf("content item %d", i))
		}
		out.Content = append(out.Content, clean.(map[string]any))
	}
	if res.StructuredContent != nil {
		sc, err := asObject(res.StructuredContent)
		switch {
		case err != nil && res.IsError:
			// An error result needs no structured content and no schema applies to it: one
			// that is not an object cannot be carried, so it is left out, and the result stays
			// the tool's error (its content says what went wrong).
		case err != nil:
			return nil, invalid(err)
		default:
			clean, err := sanitize.ValueWithin(sc, keep)
			if err != nil {
				return nil, tooDeep("the structured content")
			}
			out.StructuredContent = clean.(map[string]any)
		}
	}
	return out, nil
}

// livenessTimeout bounds the ping that follows a timed-out call.
const livenessTimeout = 5 * time.Second

// dispatchInRun is dispatch on a run's session. After a call that timed out it pings the
// server: one that was only slow in that tool answers (the call was cancelled) and keeps its
// session; one that answers nothing (stopped, stuck, its stream blocked) is stopped, so the
// run's next call starts a fresh one instead of waiting out the timeout again.
func (s *Service) dispatchInRun(ctx context.Context, sess *session, tool *graph.MCPToolNode, args map[string]any, callID string, attempt int32) (*CallResult, error) {
	res, err := s.dispatch(ctx, sess, tool, args, callID, attempt)
	var failed *FailedError
	if errors.As(err, &failed) && failed.Class == failureTimeout {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), livenessTimeout)
		defer cancel()
		if perr := sess.sess.Ping(pctx); perr != nil {
			s.log.Warn("a server let a call time out and does not answer a ping either: stopping it; the run's next call starts a fresh one", "server", sess.ref)
			s.stop(sess)
		}
	}
	return res, err
}

func (s *Service) classifyCallError(parent, cctx context.Context, sess *session, err error) string {
	// A dead server explains the failure whatever the clocks say: check it first.
	select {
	case <-sess.sess.Done():
		if c := violationFailure(sess.sess.Err()); c != "" {
			return c
		}
		return failureCrashed
	default:
	}
	if c := violationFailure(err); c != "" {
		return c
	}
	if spawner.ClassOf(err) == spawner.ClassCrashed {
		return failureCrashed
	}
	switch {
	case parent.Err() != nil:
		return failureCanceled
	case cctx.Err() != nil, spawner.ClassOf(err) == spawner.ClassTimeout:
		return failureTimeout
	}
	return failureTransport
}

// violationFailure is the failure class of a protocol violation, or "" for anything else.
func violationFailure(err error) string {
	switch {
	case spawner.IsTooLarge(err):
		return failureOutputTooLarge
	case spawner.ClassOf(err) == spawner.ClassProtocolViolation:
		return failureProtocolViolation
	}
	return ""
}

// callErrMessage is what the caller is told about a failed tools/call. The spawner made every
// server-chosen part of it safe already (a JSON-RPC error's message included).
func callErrMessage(err error) error {
	var se *spawner.Error
	var rpcErr *jsonrpc.Error
	switch {
	case errors.As(err, &se):
		return errors.New(se.Message)
	case errors.As(err, &rpcErr):
		return fmt.Errorf("the server answered tools/call with JSON-RPC error %d: %s", rpcErr.Code, rpcErr.Message)
	}
	return err
}

func (s *Service) validateOutput(tool *graph.MCPToolNode, structured any) error {
	if structured == nil {
		return errors.New("the tool declares an output schema but returned no structured content")
	}
	raw, err := json.Marshal(structured)
	if err != nil {
		return fmt.Errorf("the structured content is not JSON: %v", err)
	}
	sch, err := s.schema(tool, "output")
	if err != nil {
		return fmt.Errorf("the tool's output schema cannot be compiled: %v", err)
	}
	v, err := schemas.Decode(raw)
	if err != nil {
		return err
	}
	var tooMuch *schemas.BudgetError
	if err := sch.Validate(v); errors.As(err, &tooMuch) {
		return fmt.Errorf("the structured content cannot be checked against the tool's output schema with bounded work, so it is not passed on: %v", err)
	} else if err != nil {
		return fmt.Errorf("the structured content does not match the tool's output schema: %v", err)
	}
	return nil
}

// contentItem turns one MCP content item into its JSON object form.
func contentItem(c mcp.Content) (map[string]any, error) {
	raw, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("a content item cannot be encoded: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("a content item is not an object: %v", err)
	}
	return m, nil
}

func asObject(v any) (map[string]any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, errors.New("the structured content is not a JSON object")
	}
	return m, nil
}
