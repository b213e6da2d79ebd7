package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// Approvals: a call whose tool asks a person first (the agent surface's confirmation) is not
// dispatched. CallTool answers approval_required with an approval id, and the run waits at an
// approval gate: it takes no new call until an approver decides (ApproveCall, DenyCall) or
// the approval expires (pool.approval_timeout). Meanwhile a retry of the same call (the same
// agent, tool and arguments, whatever its call id) answers with the same approval.
//
// The run keeps its sessions while it waits, unlike an operator's pause: an approver decides
// in seconds to minutes, and the approved call must run against the session state the agent
// saw when it made the call (the files a server wrote, the page it opened); an operator's
// pause is open-ended, and holding a container for it would hold a place under
// pool.max_sessions for nothing.
//
// An approval and its decision are durable (pool.db, with the run) before anyone is told, so
// a restarted pool keeps them: a pending approval still holds its run and expires by its own
// clock; an approval is marked approved before its call is dispatched, so a pool that stops
// mid-call never runs it a second time.
//
// The decision reaches the agent through its retry of the same call: the outcome of an
// approved call (its result, or how it failed) is kept for pool.approval_timeout after the
// decision, and the first retry gets it without reaching the server again; a denial or an
// expiry is told to the first retry as its refusal. A retry after that is a new call.

// Approval states.
const (
	approvalPending  = "pending"
	approvalApproved = "approved"
	approvalRefused  = "refused"
	approvalDenied   = "denied"
	approvalExpired  = "expired"
)

// Bounds on what a run keeps.
const (
	// maxApprovalsPerRun bounds the approvals a run keeps: the oldest decided ones go first.
	maxApprovalsPerRun = 64
	// maxKeptResult bounds an approved call's result kept for the caller's retry (as JSON).
	maxKeptResult = 4 << 20
	// maxDenyReason bounds a denial's reason (it lands in the audit record).
	maxDenyReason = audit.MaxFieldLen
)

// Errors of deciding an approval.
var (
	errApprovalNotFound = errors.New("pool: no such approval in this run")
	errApprovalDecided  = errors.New("pool: the approval is decided already")
)

// approvalView is one approval of a run; executing marks an approved call being dispatched.
type approvalView struct {
	store.Approval
	executing bool
	// life and keptLife are the lifetimes (clock.go) of the pending approval and of the
	// outcome kept for a retry, once judged; nil before.
	life, keptLife *lifetime
}

// pendingLife is pending approval a's lifetime: pool.approval_timeout from its request by the
// monotonic clock, ended early by its stored expiry. Must hold the run's lock.
func (s *Service) pendingLife(a *approvalView) lifetime {
	if a.life == nil || !a.life.expire.Equal(a.ExpireTime) {
		l := s.lifetimeOf(a.RequestTime, a.ExpireTime, s.cfg.ApprovalTimeout)
		a.life = &l
	}
	return *a.life
}

// outcomeLife is the lifetime of the outcome a keeps for its call's retry, as pendingLife's.
// Must hold the run's lock.
func (s *Service) outcomeLife(a *approvalView) lifetime {
	if a.keptLife == nil || !a.keptLife.expire.Equal(a.Outcome.Until) {
		l := s.lifetimeOf(a.Outcome.Until.Add(-s.cfg.ApprovalTimeout), a.Outcome.Until, s.cfg.ApprovalTimeout)
		a.keptLife = &l
	}
	return *a.keptLife
}

// approvalDecision is an approver's decision to approve, as the gates and records carry it.
type approvalDecision struct {
	id, by string
	at     time.Time
}

// Approval is an approval as callers read it.
type Approval struct {
	ID, RunID, Tenant, Agent, Tool, ServerRef, ToolName, CallID string
	// Arguments are the call's as the agent wrote them.
	Arguments  json.RawMessage
	ArgsDigest string
	// State is pending, approved, refused, denied or expired.
	State                   string
	RequestTime, ExpireTime time.Time
	DecidedBy               string
	DecideTime              time.Time
	Note                    string
	// ResultWaiting says an approved call's outcome waits for the caller's retry.
	ResultWaiting bool
}

func (a *approvalView) public() Approval {
	return Approval{
		ID: a.ID, RunID: a.RunID, Tenant: a.Tenant, Agent: a.Agent, Tool: a.Tool, ServerRef: a.ServerRef, ToolName: a.ToolName,
		CallID: a.CallID, Arguments: a.Arguments, ArgsDigest: a.ArgsDigest, State: a.State, RequestTime: a.RequestTime,
		ExpireTime: a.ExpireTime, DecidedBy: a.DecidedBy, DecideTime: a.DecideTime, Note: a.Note,
		ResultWaiting: a.Outcome != nil && !a.Delivered,
	}
}

// same reports whether a call by agent to tool with arguments of digest is a's call.
func (a *approvalView) same(agent, tool, digest string) bool {
	return digest != "" && a.Agent == agent && a.Tool == tool && a.ArgsDigest == digest
}

// ArgsDigest is the digest of a call's arguments as an approval, a refusal's args_digest and
// the audit log name them: SHA-256 over the arguments' canonical JSON (keys sorted), as the
// caller wrote them. A caller (the MCP front door) finds the approval of a call with it.
func ArgsDigest(arguments json.RawMessage) (string, error) {
	_, canonical, err := decodeArguments(arguments)
	if err != nil {
		return "", err
	}
	return digest(canonical), nil
}

// pending is the approval the run waits for, if any. Must hold r.mu.
func (r *run) pending() *approvalView {
	for _, a := range r.approvals {
		if a.State == approvalPending {
			return a
		}
	}
	return nil
}

// approval finds one of the run's approvals. Must hold r.mu.
func (r *run) approval(id string) *approvalView {
	for _, a := range r.approvals {
		if a.ID == id {
			return a
		}
	}
	return nil
}

// approvalViews copies the run's approvals for a call's snapshot. Must hold r.mu.
func (r *run) approvalViews() []approvalView {
	if len(r.approvals) == 0 {
		return nil
	}
	out := make([]approvalView, len(r.approvals))
	for i, a := range r.approvals {
		out[i] = *a
	}
	return out
}

func sortApprovals(as []*approvalView) {
	slices.SortStableFunc(as, func(x, y *approvalView) int { return x.RequestTime.Compare(y.RequestTime) })
}

func newApprovalID() string { return "apr-" + newRunID()[4:] }

// approvalRequired is the refusal of a call that waits for approval a.
func approvalRequired(a *approvalView, runID, tenant string) *RefusedError {
	r := refusal(reasonApprovalRequired, fmt.Errorf("agent %q's call to %s asks a person first: it waits for approval %s, and the run takes no other call until it is decided (an approver runs: ringfence runs approve --run %s --approval %s%s, or runs deny; this same call answers with the same approval until then)",
		a.Agent, a.Tool, a.ID, runID, a.ID, tenantFlag(tenant)))
	r.ApprovalID, r.ArgsDigest = a.ID, a.ArgsDigest
	return r
}

// tenantFlag is the --tenant a suggested command needs for a run outside the default tenant.
func tenantFlag(tenant string) string {
	if tenant == "" || tenant == orDefaultTenant("") {
		return ""
	}
	return " --tenant " + tenant
}

// pendingAttempt is how the records of a call that waits name its approval.
func pendingAttempt(a *approvalView) *audit.ToolCallApproval {
	return &audit.ToolCallApproval{ID: a.ID, State: audit.ApprovalPending}
}

// decidedAttempt is how the records of a decided call name its approval.
func decidedAttempt(a *approvalView, state string) *audit.ToolCallApproval {
	return &audit.ToolCallApproval{ID: a.ID, State: state, DecidedBy: a.DecidedBy, DecideTime: a.DecideTime, Note: a.Note}
}

// gateApprovals: the run's approvals. A call ApproveCall runs again passes, naming the
// decision. Otherwise, while the run waits for an approval, the same call answers
// approval_required with it and any other call is refused as approval_pending; a retry of a
// decided call whose decision it has not been told is answered with it (once: callTool
// claims it).
func gateApprovals(in *gateInput, d *decision) error {
	if dec := in.decision; dec != nil {
		d.attempt.Approval = &audit.ToolCallApproval{ID: dec.id, State: audit.ApprovalApproved, DecidedBy: dec.by, DecideTime: dec.at}
		return nil
	}
	if len(in.run.approvals) == 0 {
		return nil
	}
	var sum string
	if in.args.err == nil {
		sum = digest(in.args.canonical)
	}
	for i := range in.run.approvals {
		a := &in.run.approvals[i]
		switch {
		case a.State == approvalPending && a.same(in.req.Agent, in.req.Tool, sum):
			// The call is the approval's: its record carries the arguments' digest that
			// names it.
			d.args = in.args
			d.attempt.Approval = pendingAttempt(a)
			return approvalRequired(a, in.req.RunID, in.req.Tenant)
		case a.State == approvalPending:
			r := refusal(reasonApprovalPending, fmt.Errorf("the run waits for approval %s of agent %q's call to %s and takes no other call until it is decided or expires (%s): ringfence runs approvals --run %s%s",
				a.ID, a.Agent, a.Tool, a.ExpireTime.UTC().Format(time.RFC3339), in.req.RunID, tenantFlag(in.req.Tenant)))
			r.ApprovalID = a.ID
			return r
		case a.executing && a.same(in.req.Agent, in.req.Tool, sum):
			r := refusal(reasonApprovalPending, fmt.Errorf("approval %s of this call was approved and the call is being dispatched: retry in a moment for its result", a.ID))
			r.ApprovalID = a.ID
			return r
		}
	}
	for i := len(in.run.approvals) - 1; i >= 0; i-- {
		a := &in.run.approvals[i]
		if a.Delivered || a.executing || !a.same(in.req.Agent, in.req.Tool, sum) {
			continue
		}
		if a.State == approvalDenied || a.State == approvalExpired || a.State == approvalApproved && a.Outcome != nil {
			d.args, d.deliver, d.answered = in.args, a, true
			return nil
		}
	}
	return nil
}

// gateConfirmation: a call whose tool asks a person first waits for an approval (callTool
// requests it), unless it is the approved call itself.
func gateConfirmation(in *gateInput, d *decision) error {
	if d.tool == nil || !d.tool.RequiresConfirmation || in.decision != nil {
		return nil
	}
	d.ask = true
	r := refusal(reasonApprovalRequired, fmt.Errorf("agent %q's call to %s asks a person first (the binding's confirmation rule, else the agent's confirmation_default)", in.req.Agent, in.req.Tool))
	r.ArgsDigest = digest(d.args.canonical)
	return r
}

// requestApproval makes the approval a call asks for, durably, and returns the refusal the
// caller gets: approval_required naming it. A call that finds the run waiting already (a
// concurrent call asked first) is answered as the gate would have answered it.
func (s *Service) requestApproval(ctx context.Context, r *run, req CallRequest, d *decision) error {
	sum := digest(d.args.canonical)
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pending(); p != nil {
		if p.same(req.Agent, req.Tool, sum) {
			d.attempt.Approval = pendingAttempt(p)
			return approvalRequired(p, req.RunID, req.Tenant)
		}
		ref := refusal(reasonApprovalPending, fmt.Errorf("the run waits for approval %s of agent %q's call to %s and takes no other call until it is decided", p.ID, p.Agent, p.Tool))
		ref.ApprovalID = p.ID
		return ref
	}
	now := s.now().UTC()
	a := &approvalView{Approval: store.Approval{
		ID: newApprovalID(), Tenant: r.id.Tenant, RunID: r.id.ID, Agent: req.Agent, Tool: req.Tool,
		ServerRef: d.serverRef, ToolName: d.attempt.ToolName, CallID: req.CallID,
		Arguments: d.args.canonical, ArgsDigest: sum, State: approvalPending,
		RequestTime: now, ExpireTime: now.Add(s.cfg.ApprovalTimeout),
	}}
	if err := s.store.PutApproval(ctx, a.Approval); err != nil {
		return refusal(reasonApprovalRequired, fmt.Errorf("agent %q's call to %s asks a person first, and its approval could not be stored (%v): nothing was dispatched; retry the call", req.Agent, req.Tool, err))
	}
	s.pendingLife(a) // its monotonic deadline starts now
	s.keepApproval(ctx, r, a)
	d.attempt.Approval = pendingAttempt(a)
	return approvalRequired(a, req.RunID, req.Tenant)
}

// keepApproval adds a to the run, dropping the oldest decided approvals past the bound. Must
// hold r.mu.
func (s *Service) keepApproval(ctx context.Context, r *run, a *approvalView) {
	r.approvals = append(r.approvals, a)
	var drop []string
	for len(r.approvals) > maxApprovalsPerRun {
		i := slices.IndexFunc(r.approvals, func(x *approvalView) bool { return x.State != approvalPending && !x.executing })
		if i < 0 {
			break
		}
		drop = append(drop, r.approvals[i].ID)
		r.approvals = slices.Delete(r.approvals, i, i+1)
	}
	if len(drop) > 0 {
		if err := s.store.DeleteApprovals(ctx, r.id.Tenant, r.id.ID, drop...); err != nil {
			s.log.Warn("old approvals could not be removed from the pool's database", "run", r.id.ID, "err", err)
		}
	}
}

// claimDelivery marks a decided approval as told to the caller's retry, durably, unless
// another retry claimed it first. It returns the approval as it was.
func (s *Service) claimDelivery(ctx context.Context, r *run, id string) (approvalView, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.approval(id)
	if a == nil || a.Delivered || a.executing {
		return approvalView{}, false
	}
	was := *a
	next := a.Approval
	next.Delivered, next.Outcome = true, nil
	if err := s.store.PutApproval(ctx, next); err != nil {
		// Not marked durably: a restarted pool could hand it out again, which is no worse
		// than this retry getting it now.
		s.log.Warn("an approval's delivery could not be stored", "run", r.id.ID, "approval", id, "err", err)
	}
	a.Approval = next
	return was, true
}

// delivered is what the caller's retry of a decided call gets: the approved call's outcome,
// or the refusal the denial or expiry was.
func delivered(a approvalView, att *audit.ToolCallAttempt, callID string) (*CallResult, error) {
	att.ServerRef, att.ToolName = a.ServerRef, a.ToolName
	switch a.State {
	case approvalDenied:
		att.Approval = decidedAttempt(&a, audit.ApprovalDenied)
		r := refusal(reasonDeniedByApprover, fmt.Errorf("approval %s of this call was denied by %s at %s%s", a.ID, a.DecidedBy, a.DecideTime.Format(time.RFC3339), noteSuffix(a.Note)))
		r.ApprovalID, r.ArgsDigest = a.ID, a.ArgsDigest
		return nil, r
	case approvalExpired:
		att.Approval = decidedAttempt(&a, audit.ApprovalExpired)
		r := refusal(reasonApprovalExpired, fmt.Errorf("approval %s of this call expired at %s: %s", a.ID, a.DecideTime.Format(time.RFC3339), a.Note))
		r.ApprovalID, r.ArgsDigest = a.ID, a.ArgsDigest
		return nil, r
	}
	o := a.Outcome
	att.Approval = decidedAttempt(&a, audit.ApprovalDelivered)
	att.Approval.DispatchedCallID, att.Approval.DispatchedAttempt = a.CallID, o.Attempt
	att.PendingID = o.PendingID
	if o.FailureClass != "" {
		return nil, &FailedError{Class: o.FailureClass, Err: fmt.Errorf("the call approved as %s, dispatched as call %s attempt %d: %s", a.ID, a.CallID, o.Attempt, o.FailureMessage)}
	}
	var res CallResult
	if err := json.Unmarshal(o.Result, &res); err != nil {
		return nil, &FailedError{Class: failureResultNotKept, Err: fmt.Errorf("the result of the call approved as %s cannot be read back: %v; the call is not run again", a.ID, err)}
	}
	res.CallID, res.Attempt, res.ApprovalID = callID, att.Attempt, a.ID
	res.DispatchedCallID, res.DispatchedAttempt = a.CallID, o.Attempt
	return &res, nil
}

func noteSuffix(note string) string {
	if note == "" {
		return ""
	}
	return ": " + note
}

// keptOutcome is what an approved call came to, as its retry will get it.
func keptOutcome(res *CallResult, err error, att audit.ToolCallAttempt, until time.Time) *store.Outcome {
	o := &store.Outcome{PendingID: att.PendingID, Attempt: att.Attempt, Until: until}
	var failed *FailedError
	switch {
	case errors.As(err, &failed):
		o.FailureClass, o.FailureMessage = failed.Class, failed.Problem()
	case res != nil:
		b, merr := json.Marshal(res)
		switch {
		case merr != nil:
			o.FailureClass, o.FailureMessage = failureResultNotKept, fmt.Sprintf("the result could not be kept: %v", merr)
		case len(b) > maxKeptResult:
			o.FailureClass, o.FailureMessage = failureResultNotKept, fmt.Sprintf("its result (%d bytes) was larger than the %d kept for a retry: the approver's answer had it, and the call is not run again", len(b), maxKeptResult)
		default:
			o.Result = b
		}
	}
	return o
}

// ListApprovals lists a run's approvals: the pending one first, then the others, newest
// first.
func (s *Service) ListApprovals(ctx context.Context, runID, tenant string) ([]Approval, error) {
	views, err := s.approvalsOf(ctx, runID, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]Approval, 0, len(views))
	for i := len(views) - 1; i >= 0; i-- {
		out = append(out, views[i].public())
	}
	slices.SortStableFunc(out, func(x, y Approval) int {
		switch {
		case x.State == approvalPending && y.State != approvalPending:
			return -1
		case y.State == approvalPending && x.State != approvalPending:
			return 1
		}
		return 0
	})
	return out, nil
}

// approvalsOf reads one of tenant's runs' approvals, oldest first: from memory while it is
// active, from the store once it ended (lookup reads an ended run back without them).
func (s *Service) approvalsOf(ctx context.Context, runID, tenant string) ([]approvalView, error) {
	r, err := s.lookup(ctx, runID, tenant)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	state := r.rec.State
	views := r.approvalViews()
	r.mu.Unlock()
	if state == StateRunning || state == StatePaused {
		return views, nil
	}
	kept, err := s.store.RunApprovals(ctx, r.id.Tenant, r.id.ID)
	if err != nil {
		return nil, err
	}
	out := make([]approvalView, len(kept))
	for i := range kept {
		out[i] = approvalView{Approval: kept[i]}
	}
	slices.SortStableFunc(out, func(x, y approvalView) int { return x.RequestTime.Compare(y.RequestTime) })
	return out, nil
}

// FindApproval finds the approval of a call: the one pending, or the newest decided one, of
// the same agent, tool (its binding name) and arguments (ArgsDigest). It is how the MCP front
// door learns what became of a call it was told waits for approval; nil when there is none.
func (s *Service) FindApproval(ctx context.Context, runID, tenant, agent, tool, argsDigest string) (*Approval, error) {
	views, err := s.approvalsOf(ctx, runID, tenant)
	if err != nil {
		return nil, err
	}
	var found *Approval
	for i := range views {
		if views[i].same(agent, tool, argsDigest) {
			a := views[i].public()
			if a.State == approvalPending {
				return &a, nil
			}
			found = &a
		}
	}
	return found, nil
}

// ApproveCall approves a pending call as approver: every gate runs again on the call as it
// was made, and it is dispatched; the result goes to the approver and is kept for the
// caller's retry. The approval is durable as approved before the call is dispatched.
func (s *Service) ApproveCall(ctx context.Context, runID, tenant, id, approver string) (*Approval, *CallResult, error) {
	r, err := s.lookup(ctx, runID, tenant)
	if e := s.elsewhereFor(ctx, err); e != nil {
		return s.approveElsewhere(ctx, e, runID, tenant, id)
	}
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	a, err := decidable(r, id)
	if err == nil && r.rec.State == StatePaused {
		err = fmt.Errorf("%w (it is paused): the approval stays pending; resume the run, then approve it", errRunNotRunning)
	}
	if err != nil {
		r.mu.Unlock()
		return nil, nil, err
	}
	now := time.Now().UTC()
	next := a.Approval
	next.State, next.DecidedBy, next.DecideTime = approvalApproved, approver, now
	if err := s.store.PutApproval(ctx, next); err != nil {
		r.mu.Unlock()
		return nil, nil, err
	}
	a.Approval, a.executing = next, true
	call := CallRequest{RunID: r.id.ID, Tenant: r.id.Tenant, Agent: a.Agent, Tool: a.Tool, Arguments: a.Arguments, CallID: a.CallID,
		decision: &approvalDecision{id: a.ID, by: approver, at: now}}
	r.mu.Unlock()

	res, att, callErr := s.call(ctx, call)

	r.mu.Lock()
	next = a.Approval
	var refused *RefusedError
	switch {
	case errors.As(callErr, &refused):
		next.State, next.Note = approvalRefused, truncateTo(refused.Reason+": "+refused.Problem(), audit.MaxFieldLen)
	case res != nil || callErr != nil && att.Outcome == audit.OutcomeDispatched:
		next.Outcome = keptOutcome(res, callErr, att, s.now().Add(s.cfg.ApprovalTimeout))
	default:
		next.State, next.Note = approvalRefused, truncateTo(fmt.Sprintf("not dispatched: %v", callErr), audit.MaxFieldLen)
	}
	if err := s.store.PutApproval(context.WithoutCancel(ctx), next); err != nil {
		s.log.Error("an approved call's outcome could not be stored; its retry will not get it", "run", r.id.ID, "approval", id, "err", err)
	}
	a.Approval, a.executing = next, false
	if a.Outcome != nil {
		s.outcomeLife(a) // its monotonic deadline starts now
	}
	view := a.public()
	r.mu.Unlock()
	if res != nil {
		res.ApprovalID = id
	}
	return &view, res, callErr
}

// DenyCall denies a pending call as approver, with a reason: the refusal is recorded as the
// call's (denied_by_approver), and the run takes calls again.
func (s *Service) DenyCall(ctx context.Context, runID, tenant, id, approver, reason string) (*Approval, error) {
	if len(reason) > maxDenyReason {
		return nil, fieldError("reason", "is %d bytes; at most %d", len(reason), maxDenyReason)
	}
	r, err := s.lookup(ctx, runID, tenant)
	if e := s.elsewhereFor(ctx, err); e != nil {
		return s.denyElsewhere(ctx, e, runID, tenant, id, reason)
	}
	if err != nil {
		return nil, err
	}
	if err := s.spool.CanAccept(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	a, err := decidable(r, id)
	if err != nil {
		r.mu.Unlock()
		return nil, err
	}
	next := a.Approval
	next.State, next.DecidedBy, next.DecideTime, next.Note, next.Reason = approvalDenied, approver, time.Now().UTC(), reason, reasonDeniedByApprover
	if err := s.store.PutApproval(ctx, next); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	a.Approval = next
	r.lastActivity = time.Now() // the run's idle clock starts again
	closed := closedApproval{view: *a, attempt: r.nextAttempt(a.CallID), state: audit.ApprovalDenied, reason: reasonDeniedByApprover,
		message: fmt.Sprintf("denied by %s%s", approver, noteSuffix(reason))}
	view := a.public()
	r.mu.Unlock()
	s.recordClosed(ctx, r, []closedApproval{closed})
	return &view, nil
}

// decidable finds a pending approval of the run. Must hold r.mu.
func decidable(r *run, id string) (*approvalView, error) {
	if st := r.rec.State; st != StateRunning && st != StatePaused {
		return nil, fmt.Errorf("%w (it %s): its approvals expired with it", errRunEnded, st)
	}
	a := r.approval(id)
	switch {
	case a == nil:
		return nil, fmt.Errorf("%w: %q (ringfence runs approvals --run %s lists them)", errApprovalNotFound, id, r.id.ID)
	case a.State != approvalPending:
		by := ""
		if a.DecidedBy != "" {
			by = " by " + a.DecidedBy
		}
		return nil, fmt.Errorf("%w: approval %s was %s%s at %s", errApprovalDecided, id, a.State, by, a.DecideTime.Format(time.RFC3339))
	}
	return a, nil
}

// closedApproval is an approval closed without a dispatch (denied, expired), whose refusal is
// recorded as its call's.
type closedApproval struct {
	view    approvalView
	attempt int32
	state   string
	reason  string
	message string
}

// closeApprovals expires the run's pending approval (the run ended) and drops the outcomes
// kept for retries, which no call can take any more. Must hold r.mu; the caller records what
// it returns (recordClosed) once it let go of the lock.
func (s *Service) closeApprovals(ctx context.Context, r *run, why string) []closedApproval {
	var closed []closedApproval
	now := time.Now().UTC()
	for _, a := range r.approvals {
		next := a.Approval
		expire := a.State == approvalPending
		switch {
		case expire:
			next.State, next.DecideTime, next.Note, next.Reason = approvalExpired, now, why, reasonApprovalExpired
		case a.Outcome != nil:
			next.Outcome = nil
		default:
			continue
		}
		if err := s.store.PutApproval(ctx, next); err != nil {
			s.log.Warn("an approval closed with its run could not be stored", "run", r.id.ID, "approval", a.ID, "err", err)
		}
		a.Approval = next
		if expire {
			closed = append(closed, closedApproval{view: *a, attempt: r.nextAttempt(a.CallID), state: audit.ApprovalExpired, reason: reasonApprovalExpired, message: why})
		}
	}
	return closed
}

// expireApprovals expires r's pending approval once its time passed, and drops approved
// calls' outcomes nobody took in time, by either clock (clock.go): a clock set back keeps
// neither longer than pool.approval_timeout.
func (s *Service) expireApprovals(ctx context.Context, r *run) {
	r.mu.Lock()
	var closed []closedApproval
	for _, a := range r.approvals {
		next := a.Approval
		switch {
		case a.State == approvalPending && s.over(s.pendingLife(a)):
			why := fmt.Sprintf("nobody decided it within pool.approval_timeout (%s)", s.cfg.ApprovalTimeout)
			next.State, next.DecideTime, next.Note, next.Reason = approvalExpired, s.now().UTC(), why, reasonApprovalExpired
			a.Approval = next
			closed = append(closed, closedApproval{view: *a, attempt: r.nextAttempt(a.CallID), state: audit.ApprovalExpired, reason: reasonApprovalExpired, message: why})
			r.lastActivity = time.Now() // the run's idle clock starts again
		case a.Outcome != nil && s.over(s.outcomeLife(a)):
			next.Outcome = nil
			a.Approval = next
		default:
			continue
		}
		if err := s.store.PutApproval(ctx, next); err != nil {
			s.log.Warn("an expired approval could not be stored", "run", r.id.ID, "approval", a.ID, "err", err)
		}
	}
	r.mu.Unlock()
	s.recordClosed(ctx, r, closed)
}

// recordClosed records the refusal of each closed approval as an attempt of its call.
func (s *Service) recordClosed(ctx context.Context, r *run, closed []closedApproval) {
	for _, c := range closed {
		a := c.view
		att := audit.ToolCallAttempt{RunID: a.RunID, GraphID: r.id.GraphID, GraphVersion: r.id.Version, AgentNode: a.Agent,
			ServerRef: a.ServerRef, ToolName: orKeep(a.Tool, a.ToolName), CallID: a.CallID, Attempt: max(c.attempt, 1),
			Approval: decidedAttempt(&a, c.state)}
		setArgs(&att, a.Arguments)
		att.Refused(c.reason)
		s.metrics.calls.WithLabelValues(att.Outcome, "-", c.reason).Inc()
		if err := s.spool.Enqueue(context.WithoutCancel(ctx), audit.NewToolCallRecord("pool", orDefaultTenant(a.Tenant), att)); err != nil {
			s.log.Error("a closed approval's refusal could not be recorded in the audit spool", "run", a.RunID, "approval", a.ID, "err", err)
		}
	}
}
