package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/documents"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/humanize"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate"
	"github.com/ringfence/ringfence/mcpgate/capability"
	"github.com/ringfence/ringfence/mcpgate/sanitize"
	"github.com/ringfence/ringfence/services/pool/spawner"
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
	// AgentTokenID names the MCP front door's token the call came through, for its records.
	AgentTokenID string
	// decision is set when ApproveCall dispatches an approved call.
	decision *approvalDecision
	// decoded, when not nil, is the arguments as the gRPC front read them from their protobuf
	// form (structArguments), Arguments then nil: the JSON object decodeArguments would have
	// made of them, not encoded and decoded again.
	decoded map[string]any
}

// arguments are the call's arguments as decodeArguments reads them: the object and its
// canonical encoding. Arguments from the gRPC front are held to maxArgumentBytes by their
// canonical encoding (what args_size records), as they no longer exist in another.
func (req *CallRequest) arguments() (map[string]any, []byte, error) {
	if req.decoded == nil {
		return decodeArguments(req.Arguments)
	}
	canonical, err := canonicalArguments(req.decoded)
	if err != nil {
		return nil, nil, err
	}
	if len(canonical) > maxArgumentBytes {
		return nil, nil, refusal(reasonInvalidInput, fmt.Errorf("arguments are %d bytes; at most %d", len(canonical), maxArgumentBytes))
	}
	return req.decoded, canonical, nil
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
	// ApprovalID names the approval of an approved call's result. DispatchedCallID and
	// DispatchedAttempt, on the result a retry got, name the call the approver dispatched
	// (CallID and Attempt are then the retry's own).
	ApprovalID        string
	DispatchedCallID  string
	DispatchedAttempt int32
	// ResultDigest and ResultSize are the result's as its outcome record has them
	// (ResultDigest): the caller can tie what it got to the record.
	ResultDigest string
	ResultSize   int64
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
	// The agent surface's refusals (docs/agents.md): a filter removed the tool (the level
	// names which), a deferred tool tool_search has not loaded.
	reasonFilteredOut = "filtered_out"
	reasonNotLoaded   = "not_loaded"
	// Sign-in (docs/oauth.md): the tool's server signs each user in and the run's user has not
	// connected it (or has no token it takes); the user connected it and it did not declare
	// the tool to them.
	reasonSignInRequired = "sign_in_required"
	reasonNotDeclared    = "not_declared"
	// Approvals: the call waits for an approver; the run waits for another call's approval;
	// an approver denied it; nobody decided in time.
	reasonApprovalRequired = audit.ReasonApprovalRequired
	reasonApprovalPending  = "approval_pending"
	reasonDeniedByApprover = "denied_by_approver"
	reasonApprovalExpired  = "approval_expired"
	// reasonDocumentUnavailable: a my-documents:// reference names no document of the run's
	// tenant, or one that cannot be fetched.
	reasonDocumentUnavailable = "document_unavailable"
)

// Failure classes of a dispatched call (audit.Failure… plus the pool's own).
const (
	failureToolError     = audit.FailureToolError
	failureTimeout       = audit.FailureTimeout
	failureTransport     = audit.FailureTransportError
	failureCrashed       = audit.FailureCrashed
	failureOutputInvalid = audit.FailureOutputInvalid
	// failureResultTooLarge: the answer was past a bound on what the pool holds of one
	// result (the registration's max_result_bytes, the JSON values or content items of one
	// result) or the pool's budget for results in flight had no room for it. Records from
	// before it was named say output_too_large.
	failureResultTooLarge = "result_too_large"
	// failureProtocolViolation: the server broke the protocol during the call (it flooded
	// the pool with requests, say) and was stopped.
	failureProtocolViolation = "protocol_violation"
	failureCanceled          = "canceled"
	// failureResultNotKept: an approved call's result was too large to keep for the caller's
	// retry (the approver's answer had it); the call is not run again.
	failureResultNotKept = "result_not_kept"
	// failureInternal: the pool could not finish what it answers itself (tool_search's loaded
	// tools could not be stored).
	failureInternal = "internal_error"
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
	// Level names the filter of a filtered_out refusal.
	Level string
	// ApprovalID names the approval of an approval_required, approval_pending,
	// denied_by_approver or approval_expired refusal; ArgsDigest is the call's.
	ApprovalID string
	ArgsDigest string
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
	req.decision = nil // only ApproveCall approves
	res, _, err := s.call(ctx, req)
	if e := s.elsewhereFor(ctx, err); e != nil {
		return s.callElsewhere(ctx, e, req)
	}
	return res, err
}

// call is CallTool, returning the attempt as recorded too.
func (s *Service) call(ctx context.Context, req CallRequest) (*CallResult, audit.ToolCallAttempt, error) {
	start := time.Now()
	if req.CallID == "" {
		req.CallID = "call-" + newRunID()[4:]
	}
	var out outcome
	if s.inflight.enter() {
		defer s.inflight.leave()
		out = s.callTool(ctx, req)
	} else {
		out = outcome{attempt: newAttempt(req), tenant: req.Tenant, err: refusal(reasonShuttingDown, errShuttingDown)}
	}
	att, res, err := out.attempt, out.res, out.err
	if errors.Is(err, errRunElsewhere) {
		// Not an attempt here: the owner serves it (forwarded), records it, and numbers it, and
		// its access line names it (with the same request id).
		grpcserver.LogAttrs(ctx, slog.String("run_id", req.RunID))
		return nil, att, err
	}
	// The RPC's access line names the attempt, which finds its audit records.
	grpcserver.LogAttrs(ctx, slog.String("run_id", req.RunID), slog.String("call_id", att.CallID), slog.Int("attempt", int(att.Attempt)))
	att.LatencyMicros = time.Since(start).Microseconds()
	setArgs(&att, out.args)
	settle(&att, res, err)
	identify(err, att.CallID, att.Attempt)
	s.metrics.calls.WithLabelValues(att.Outcome, orDash(att.Result), orDash(att.Reason+att.FailureClass)).Inc()
	rec := audit.NewToolCallRecord("pool", orDefaultTenant(out.tenant), att)
	if att.Outcome == audit.OutcomeDispatched {
		// The pending record is durable already; the outcome does not hold up the answer.
		s.recordOutcome(rec)
	} else if aerr := s.spool.Enqueue(context.WithoutCancel(ctx), rec); aerr != nil {
		s.log.Error("a refused tool-call attempt could not be recorded in the audit spool", "run", req.RunID, "call", req.CallID, "err", aerr)
		err = notRecorded(err, aerr)
	}
	if res != nil {
		res.Latency, res.Advisory = time.Since(start), att.Advisory
		res.ResultDigest, res.ResultSize = att.ResultDigest, att.ResultSize
	}
	return res, att, err
}

// agentOf reports whether the run's graph has the agent.
func agentOf(snap runSnapshot, agent string) bool {
	_, ok := snap.index.Agent(agent)
	return ok
}

// outcome is what a call came to: the attempt as its gates left it, the tenant its record
// belongs to, the canonical arguments (for the digest), and the result or the error.
type outcome struct {
	attempt audit.ToolCallAttempt
	tenant  string
	args    []byte
	res     *CallResult
	err     error
}

// callTool is the I/O around the gate pipeline (pipeline.go): it takes the run's snapshot and
// fetches what the gates read (the graph version, the live server policy), asks decide, starts
// or reuses the run's session, refreshes its listing for checkLive, records the attempt and
// dispatches.
func (s *Service) callTool(ctx context.Context, req CallRequest) outcome {
	out := outcome{attempt: newAttempt(req), tenant: req.Tenant}
	// Gate 0: the audit spool can take the record (fail closed before anything happens).
	if err := s.spool.CanAccept(); err != nil {
		out.err = refusal(reasonAuditUnavailable, err)
		return out
	}
	r, err := s.lookup(ctx, req.RunID, req.Tenant)
	if err != nil {
		out.err = refusal(reasonUnknownRun, err)
		return out
	}
	snap, done := r.begin(req.CallID, req.Agent)
	defer done()
	out.tenant = r.id.Tenant

	in := gateInput{req: req, run: snap, allowAdvisory: s.cfg.AllowAdvisory, allowInline: s.cfg.AllowInlineMCPServers, schemas: s.schemas, decision: req.decision}
	if snap.state == StateRunning {
		if snap.loadErr = s.load(ctx, r); snap.loadErr == nil {
			snap.version, snap.index = r.version, r.index
		}
		in.run = snap
	}
	// Only an agent of the graph: the run caches each agent's set and surface, and a caller
	// must not grow those caches with names of its choosing.
	if snap.version != nil && agentOf(snap, req.Agent) {
		in.effective, in.caps = s.effective(r, req.Agent)
		if in.surface, err = s.surfaceAgent(ctx, r, req.Agent); err != nil {
			in.surface = nil // gateSurface refuses
		}
	}
	in.args.value, in.args.canonical, in.args.err = req.arguments()
	// The registry is asked once per call: for a tool, its server's policy (the ceiling and
	// the surface read it); for tool_search, every server's of the agent.
	if node, ok := boundTool(snap, req); ok {
		in.policy, in.policyErr = s.cfg.Registry.ServerPolicy(ctx, node.MCPTool.ServerRef)
		in.policyCanceled = in.policyErr != nil && ctx.Err() != nil
	} else if req.Tool == graph.ToolSearchName && in.surface != nil {
		in.searchPolicies, in.searchPolicyErr = s.policies(ctx, in.surface.Servers())
		in.policyCanceled = in.searchPolicyErr != nil && ctx.Err() != nil
	} else if ref, ok := strings.CutPrefix(req.Tool, graph.ConnectToolPrefix); ok && in.surface != nil && slices.Contains(in.surface.Servers(), ref) {
		p, err := s.cfg.Registry.ServerPolicy(ctx, ref)
		switch {
		case errors.Is(err, mcpserver.ErrNotRegistered):
		case err != nil:
			in.connectPolicyErr, in.policyCanceled = err, ctx.Err() != nil
		default:
			in.connectPolicy = &p
		}
	}
	in.connections, in.connectionsErr = s.callConnections(ctx, r, &in)

	d := decide(&in)
	for d.deliver != nil {
		// The retry of a decided call gets the decision once: another retry may have
		// claimed it meanwhile, and this one is then decided again as a new call.
		was, ok := s.claimDelivery(ctx, r, d.deliver.ID)
		if ok {
			out.attempt, out.args = d.attempt, d.args.canonical
			out.res, out.err = delivered(was, &out.attempt, req.CallID)
			return out
		}
		r.mu.Lock()
		in.run.approvals = r.approvalViews()
		r.mu.Unlock()
		d = decide(&in)
	}
	if d.search != nil {
		return s.answerSearch(ctx, r, req, d)
	}
	if d.connect != "" {
		return s.answerConnect(ctx, r, d)
	}
	if d.err == nil && len(d.docRefs) > 0 {
		in.documents = s.fetchDocuments(ctx, r.id.Tenant, d.docRefs)
	}
	if ref, ok := d.err.(*RefusedError); ok && ref.Reason == reasonSignInRequired && d.serverRef != "" && r.id.User != "" {
		d.err = s.withSignInURL(ctx, r, d.serverRef, ref)
	}
	d = decideArguments(&in, d)
	if d.ask {
		d.err = s.requestApproval(ctx, r, req, &d)
	}
	out.attempt, out.args = d.attempt, d.args.canonical
	if d.err != nil {
		out.err = d.err
		return out
	}

	// Isolation, spawn and handshake (on first use in the run).
	var inline *mcpserver.Resolved
	if d.target.inline != nil {
		inline = inlineRegistration(d.target.inline)
	}
	sess, err := s.session(ctx, r, d.serverRef, inline)
	if err != nil {
		out.err = sessionRefusal(err)
		return out
	}
	d.attempt.WarmSession = sess.warm
	out.attempt = d.attempt
	if sess.refillDue.CompareAndSwap(true, false) {
		// The replacement of a warm session starts once the call that took it has its answer:
		// a container start competes for the host's CPU with the call it would slow down. The
		// keeper's own turn (every few seconds) starts it should the call last longer.
		defer s.warm.wake()
	}
	live, err := s.listing(ctx, sess)
	if err != nil {
		out.err = err
		return out
	}
	d = checkLive(&in, d, live)
	out.attempt = d.attempt
	if d.err != nil {
		out.err = d.err
		return out
	}

	// Dispatch, on record first.
	if out.err = s.admit(ctx, sess); out.err != nil {
		return out
	}
	if err = s.recordPending(ctx, &out.attempt, out.args, out.tenant); err != nil {
		out.err = err
		return out
	}
	out.res, out.err = s.dispatchInRun(ctx, sess, d, req.CallID)
	return out
}

// answerSearch answers tool_search: on record first like any dispatch (loading tools is an
// effect), then the matches are loaded for the agent for the rest of the run, durably, and
// returned as the call's result, each as the listing shows it.
func (s *Service) answerSearch(ctx context.Context, r *run, req CallRequest, d decision) outcome {
	out := outcome{attempt: d.attempt, tenant: r.id.Tenant, args: d.args.canonical}
	names := d.search.names()
	out.attempt.LoadedTools = names
	var err error
	if err = s.recordPending(ctx, &out.attempt, out.args, out.tenant); err != nil {
		out.err = err
		return out
	}
	if err := s.loadTools(context.WithoutCancel(ctx), r, req.Agent, names); err != nil {
		out.err = &FailedError{Class: failureInternal, Err: fmt.Errorf("the tools tool_search found could not be loaded: %v", err)}
		return out
	}
	out.res = searchResult(d.search, req.CallID, d.attempt.Attempt)
	return out
}

// searchResult is tool_search's result: the tools found, each as ListAgentTools shows it
// (its name is what the model calls), as structured content and as its JSON in a text block.
func searchResult(a *searchAnswer, callID string, attempt int32) *CallResult {
	tools := make([]any, 0, len(a.matches))
	for _, m := range a.matches {
		t := m.Tool
		entry := map[string]any{"name": t.Name, "server": t.ServerRef, "description": t.Description, "requires_confirmation": t.RequiresConfirmation}
		if t.Title != "" {
			entry["title"] = t.Title
		}
		for key, raw := range map[string]json.RawMessage{"inputSchema": t.InputSchema, "outputSchema": t.OutputSchema, "annotations": t.Annotations} {
			var v any
			if len(raw) > 0 && json.Unmarshal(raw, &v) == nil {
				entry[key] = v
			}
		}
		tools = append(tools, entry)
	}
	structured := map[string]any{"tools": tools}
	text, _ := json.Marshal(structured)
	return &CallResult{CallID: callID, Attempt: attempt, ToolName: graph.ToolSearchName, Result: audit.ResultSucceeded,
		Content: []map[string]any{{"type": "text", "text": string(text)}}, StructuredContent: structured}
}

// fetchDocuments fetches the documents a call references from the resolver, each bounded by
// what the call may still receive (documents.max_bytes for one, documents.max_call_bytes for
// all of them together).
func (s *Service) fetchDocuments(ctx context.Context, tenant string, ids []string) map[string]fetched {
	out := make(map[string]fetched, len(ids))
	budget := s.cfg.DocumentMaxCallBytes
	for _, id := range ids {
		if budget <= 0 {
			out[id] = fetched{err: fmt.Errorf("%w: the documents this call references are more than documents.max_call_bytes (%d bytes) together", documents.ErrUnavailable, s.cfg.DocumentMaxCallBytes)}
			break
		}
		content, err := s.documents.Document(ctx, tenant, id, min(budget, s.cfg.DocumentMaxBytes))
		out[id] = fetched{content: content, err: err}
		if err != nil {
			break
		}
		budget -= int64(len(content))
	}
	return out
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
// It sets the pending record's ID as att.PendingID, which the outcome record names
// (pending_id), and the arguments' digest and size on att, which the outcome record carries
// too (the digest is computed once for both).
func (s *Service) recordPending(ctx context.Context, att *audit.ToolCallAttempt, argsCanonical []byte, tenant string) error {
	setArgs(att, argsCanonical)
	pending := *att
	pending.Pending()
	rec := audit.NewToolCallRecord("pool", orDefaultTenant(tenant), pending)
	if err := s.spool.Enqueue(context.WithoutCancel(ctx), rec); err != nil {
		return refusal(reasonAuditUnavailable, fmt.Errorf("the attempt could not be recorded before dispatch: %w", err))
	}
	att.PendingID = rec.ID
	return nil
}

// setArgs sets the attempt's arguments digest and size, unless recordPending did.
func setArgs(att *audit.ToolCallAttempt, argsCanonical []byte) {
	if len(argsCanonical) > 0 && att.ArgsDigest == "" {
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
		setResult(att, res)
	default:
		att.Succeeded()
		setResult(att, res)
	}
}

// setResult sets the attempt's result digest and size: those of the result the caller gets
// (mcpgate.ResultDigest), so an auditor can tie the record to what the caller received. A result
// without a canonical form (none the pool delivers) leaves them unset.
func setResult(att *audit.ToolCallAttempt, res *CallResult) {
	sum, size, err := mcpgate.ResultDigest(res.Content, res.StructuredContent, res.IsError)
	if err == nil {
		att.ResultDigest, att.ResultSize = sum, size
	}
}

// resultToProto is a result's content and structured content as the API carries them.
func resultToProto(res *CallResult) (content []*structpb.Struct, structured *structpb.Struct) {
	for _, c := range res.Content {
		if st, err := toStruct(c); err == nil {
			content = append(content, st)
		}
	}
	if res.StructuredContent != nil {
		if st, err := toStruct(res.StructuredContent); err == nil {
			structured = st
		}
	}
	return content, structured
}

// toStruct is m as a Struct. A value structpb does not take, which no JSON decoder makes (the
// []string of a result the pool built itself), is read as its JSON, as the MCP front door
// writes it and the result's digest reads it.
func toStruct(m map[string]any) (*structpb.Struct, error) {
	st, err := structpb.NewStruct(m)
	if err == nil {
		return st, nil
	}
	raw, jerr := json.Marshal(m)
	if jerr != nil {
		return nil, err
	}
	st = &structpb.Struct{}
	if err := protojson.Unmarshal(raw, st); err != nil {
		return nil, err
	}
	return st, nil
}

// recordOutcome spools a dispatched call's outcome record without holding up the answer: it
// joins the next commit of the spool (the next call's pending record, most of the time), and
// Close commits what still waits. If it cannot be written the pending record stands, which
// says the call may have taken effect.
func (s *Service) recordOutcome(rec audit.Record) {
	failed := func(err error) {
		s.log.Error("a tool call's outcome could not be recorded; its pending record stands", "run", rec.ToolCall.RunID, "call", rec.ToolCall.CallID, "err", err)
	}
	if err := s.spool.EnqueueAsync(rec, failed); err != nil {
		failed(err)
	}
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

// effective returns the agent's effective capabilities, computed once per run, in both forms
// the gates read.
func (s *Service) effective(r *run, agentID string) (capability.Effective, mcpgate.Capabilities) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.effective[agentID]; ok {
		return c.eff, c.caps
	}
	eff, err := graph.Effective(r.version.Graph, agentID)
	if err != nil {
		// An agent with unparsable bindings holds nothing.
		eff = capability.Effective{}
	}
	c := agentCaps{eff: eff, caps: mcpgate.CapabilitiesOf(eff)}
	r.effective[agentID] = c
	return c.eff, c.caps
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
	canonical, err := canonicalArguments(args)
	if err != nil {
		return nil, nil, err
	}
	return args, canonical, nil
}

// canonicalArguments is the canonical encoding of decoded arguments (json.Marshal: keys sorted).
func canonicalArguments(args map[string]any) ([]byte, error) {
	canonical, err := json.Marshal(args)
	if err != nil {
		return nil, refusal(reasonInvalidInput, fmt.Errorf("arguments cannot be encoded as JSON: %v", err))
	}
	return canonical, nil
}

// admit lets a call be dispatched once the pool's budget for results in flight has room for
// an answer as large as its server's max_result_bytes, waiting for it within
// pool.result_budget_wait; otherwise the call is refused before dispatch (limit_exceeded).
func (s *Service) admit(ctx context.Context, sess *session) error {
	err := sess.sess.AwaitResultRoom(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, spawner.ErrNoRoom):
		return refusal(reasonLimitExceeded, fmt.Errorf("the results in flight on this pool fill its budget for them (pool.result_budget) and none made room within pool.result_budget_wait for an answer of up to %s, the max_result_bytes of server %q: retry, or raise RINGFENCE_POOL__RESULT_BUDGET", humanize.Bytes(sess.reg.ResultCap()), sess.ref))
	}
	return refusal(failedToStart(err), err)
}

// dispatch sends tools/call and turns the answer into a result or a classified failure.
func (s *Service) dispatch(ctx context.Context, sess *session, d decision, callID string) (res *CallResult, err error) {
	sess.calls.Add(1)
	cctx, cancel := context.WithTimeout(ctx, sess.reg.CallTimeout())
	defer cancel()
	began := time.Now()
	ans, err := sess.sess.CallToolRaw(cctx, &mcp.CallToolParams{Name: d.spec.Name, Arguments: d.args.value})
	took := time.Since(began)
	defer func() { s.metrics.observeServerCall(sess.ref, took, res, err) }()
	if err != nil {
		if scoped := s.answerScopeChallenge(ctx, sess, err); scoped != nil {
			return nil, &FailedError{Class: failureSignInRequired, Err: scoped}
		}
		return nil, &FailedError{Class: s.classifyCallError(ctx, cctx, sess, err), Err: callErrMessage(err, sess.reg)}
	}
	// The answer holds its share of the result budget until it is the call's result.
	defer ans.Release()
	// Secrets are masked too: a server's output is its one way out of the sandbox, for the
	// env values it was given as for anything else.
	keep := sanitize.Options{KeepMarkup: sess.reg.KeepMarkup, Redact: sess.sess.Redact}
	return s.result(d.spec, d.serverRef, sess.reg, ans, keep, sess.sess.SafeText, callID, d.attempt.Attempt)
}

// result checks what a tools/call answered (mcpgate.ProcessRawResult or ProcessResult: output
// schema, bounds, sanitization of every string) and turns it into the call's result or a
// classified failure. reg is the server's registration (serverRef names it in results); keep
// says how strings are sanitized; safe cleans a failure's message, which may quote what the
// server returned (a key the schema does not allow).
func (s *Service) result(spec *mcpgate.ToolSpec, serverRef string, reg *mcpserver.Resolved, ans *spawner.ToolAnswer, keep sanitize.Options, safe func(string) string, callID string, attempt int32) (*CallResult, error) {
	opts := []mcpgate.CallOption{mcpgate.WithSanitize(keep), mcpgate.WithSafeText(safe), mcpgate.WithSchemaCache(s.schemas), mcpgate.WithMaxResultBytes(int(reg.ResultCap()))}
	var got *mcpgate.Result
	var err error
	if ans.Raw != nil {
		got, err = mcpgate.ProcessRawResult(spec, ans.Raw, opts...)
	} else {
		got, err = mcpgate.ProcessResult(spec, ans.Result, opts...)
	}
	var invalid *mcpgate.ValidationError
	var notMCP *mcpgate.ProtocolError
	var tooLarge *mcpgate.TooLargeError
	switch {
	case errors.As(err, &invalid):
		return nil, &FailedError{Class: failureOutputInvalid, Err: errors.New(invalid.Message)}
	case errors.As(err, &notMCP):
		// The answer is not an MCP tool result (a content type MCP does not define): the
		// server broke the protocol, and the connection is intact, so the session stays.
		return nil, &FailedError{Class: failureProtocolViolation, Err: fmt.Errorf("the server's answer to tools/call is not MCP: %s", notMCP.Message)}
	case errors.As(err, &tooLarge) && tooLarge.What == "content items":
		return nil, &FailedError{Class: failureResultTooLarge, Err: fmt.Errorf("the result has %d content items, more than the %d a result may carry", tooLarge.Size, tooLarge.Limit)}
	case errors.As(err, &tooLarge):
		return nil, &FailedError{Class: failureResultTooLarge, Err: overCap(reg, fmt.Sprintf("the result is %d bytes", tooLarge.Size), "")}
	case err != nil:
		return nil, err
	}
	out := &CallResult{CallID: callID, Attempt: attempt, ServerRef: serverRef, ToolName: spec.Name, Result: audit.ResultSucceeded,
		IsError: got.IsError, Content: got.Content, StructuredContent: got.StructuredContent}
	if got.IsError {
		out.Result, out.FailureClass = audit.ResultFailed, failureToolError
	}
	return out, nil
}

// overCap says that a result was past its registration's max_result_bytes, and how to raise it.
func overCap(reg *mcpserver.Resolved, what, then string) error {
	return fmt.Errorf("%s, more than the %s the registration of server %q allows a result (max_result_bytes)%s: raise it (ringfence servers update %s --max-result-bytes SIZE, at most %s), or ask the tool for less",
		what, humanize.Bytes(reg.ResultCap()), reg.Ref, then, reg.Ref, humanize.Bytes(mcpserver.MaxMaxResultBytes))
}

// livenessTimeout bounds the ping that follows a timed-out call.
const livenessTimeout = 5 * time.Second

// dispatchInRun is dispatch on a run's session. After a call that timed out it pings the
// server: one that was only slow in that tool answers (the call was cancelled) and keeps its
// session; one that answers nothing (stopped, stuck, its stream blocked) is stopped, so the
// run's next call starts a fresh one instead of waiting out the timeout again.
func (s *Service) dispatchInRun(ctx context.Context, sess *session, d decision, callID string) (*CallResult, error) {
	res, err := s.dispatch(ctx, sess, d, callID)
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
		return failureResultTooLarge
	case spawner.ClassOf(err) == spawner.ClassProtocolViolation:
		return failureProtocolViolation
	}
	return ""
}

// callErrMessage is what the caller is told about a failed tools/call. The spawner made every
// server-chosen part of it safe already (a JSON-RPC error's message included).
func callErrMessage(err error, reg *mcpserver.Resolved) error {
	var se *spawner.Error
	var rpcErr *jsonrpc.Error
	switch {
	case errors.As(err, &se) && se.TooLarge && se.OverBudget:
		return fmt.Errorf("the pool's budget for results in flight (pool.result_budget, %s) had no room for this answer while it was read, so it was not read: retry, or raise RINGFENCE_POOL__RESULT_BUDGET", humanize.Bytes(se.Limit))
	case errors.As(err, &se) && se.TooLarge && se.Limit == reg.ResultCap():
		return overCap(reg, fmt.Sprintf("the server's answer is more than %d bytes", se.Limit), ", so it was not read further")
	case errors.As(err, &se):
		return errors.New(se.Message)
	case errors.As(err, &rpcErr):
		// Wrapped, so a front end can answer with the server's code (the MCP front door does).
		return fmt.Errorf("the server answered tools/call with JSON-RPC error %d: %w", rpcErr.Code, rpcErr)
	}
	return err
}
