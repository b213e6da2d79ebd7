package pool

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/graph"
)

// The call-time agent surface through the real pool, registry and publisher, with the fixture
// server run on the host (the gates under test do not depend on the container): tool search,
// approvals, and what the audit log says of each.

// deskHarness registers server fx (the fixture with its read-only peek) and publishes graph
// g: agent a binds echo and peek of fx, with settings as edit writes them.
func deskHarness(t *testing.T, opts harnessOpts, edit func(a *publisherv1.AgentNode)) *harness {
	t.Helper()
	opts.host = true
	h := newHarness(t, opts)
	h.server("fx", func(r *registryv1.CreateServerRequest) { r.Description = "The fixture." }, "--read-only-tools")
	h.publish("g", []string{"a"}, []imp{{server: "fx", agent: "a", tools: []string{"echo", "peek"}}}, func(d *publisherv1.Graph) {
		if edit != nil {
			edit(d.GetNodes()[0].GetAgent())
		}
	})
	return h
}

func askNonReadOnly(a *publisherv1.AgentNode) { a.ConfirmationDefault = graph.ConfirmNonReadOnly }

// TestToolSearchLoadsForTheRest: a deferred tool is refused until tool_search finds it; the
// search answers with the tools' entries, loads them for the agent (on record, with the
// names), and the call then goes through.
func TestToolSearchLoadsForTheRest(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, func(a *publisherv1.AgentNode) { a.DeferTools = true })
	run := h.start("g")

	_, err := h.call(run, "a", "fx__peek", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonNotLoaded)
	require.Contains(t, ref.Error(), "tool_search")

	res, err := h.call(run, "a", graph.ToolSearchName, map[string]any{"query": "changes nothing"})
	require.NoError(t, err)
	searched := res
	tools := res.StructuredContent["tools"].([]any)
	require.Len(t, tools, 1)
	entry := tools[0].(map[string]any)
	require.Equal(t, "fx__peek", entry["name"])
	require.Equal(t, true, entry["annotations"].(map[string]any)["readOnlyHint"])
	require.NotNil(t, entry["inputSchema"])
	require.Equal(t, 0.0, h.spawned(), "tool_search reaches no server")

	res, err = h.call(run, "a", "fx__peek", map[string]any{"text": "loaded"})
	require.NoError(t, err)
	require.Equal(t, "loaded", res.Content[0]["text"])
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	requireRefused(t, err, reasonNotLoaded)

	l, err := h.pool.ListAgentTools(h.ctx, run, "", "a")
	require.NoError(t, err)
	require.Equal(t, []string{"fx__peek", "tool_search"}, toolNames(listingToProto(l)))

	all := h.attempts()
	search := all[1]
	require.Equal(t, graph.ToolSearchName, search.ToolName)
	require.Equal(t, audit.OutcomeDispatched, search.Outcome)
	require.Equal(t, audit.ResultSucceeded, search.Result)
	require.Equal(t, []string{"fx__peek"}, search.LoadedTools)
	require.NotEmpty(t, search.PendingID, "loading is an effect: on record before it happens")
	content, err := json.Marshal(searched.Content)
	require.NoError(t, err)
	structured, err := json.Marshal(searched.StructuredContent)
	require.NoError(t, err)
	sum, size := auditorDigest(t, content, searched.IsError, structured)
	require.Equal(t, sum, search.ResultDigest, "the digest of the answer the agent got")
	require.Equal(t, size, search.ResultSize)
	require.Equal(t, reasonNotLoaded, all[0].Reason)
}

// TestApproveCall: a call that asks first waits for an approval and holds the run; a retry of
// it gets the same approval, any other call is refused naming it; the approver's approval
// runs it and returns its result, which the caller's retry then gets once without reaching
// the server again; the audit log names the approver and when.
func TestApproveCall(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	run := h.start("g")

	res, err := h.call(run, "a", "fx__peek", map[string]any{"text": "read-only"})
	require.NoError(t, err, "a tool annotated read-only asks nobody")
	require.Equal(t, "read-only", res.Content[0]["text"])

	args := map[string]any{"text": "write it"}
	_, err = h.call(run, "a", "fx__echo", args)
	ref := requireRefused(t, err, reasonApprovalRequired)
	id := ref.ApprovalID
	require.NotEmpty(t, id)
	raw, _ := json.Marshal(args)
	sum, err := ArgsDigest(raw)
	require.NoError(t, err)
	require.Equal(t, sum, ref.ArgsDigest)
	require.Contains(t, ref.Error(), "ringfence runs approve --run "+run+" --approval "+id)

	_, err = h.call(run, "a", "fx__echo", args)
	require.Equal(t, id, requireRefused(t, err, reasonApprovalRequired).ApprovalID, "a retry of the same call: the same approval")
	_, err = h.call(run, "a", "fx__peek", map[string]any{"text": "meanwhile"})
	require.Equal(t, id, requireRefused(t, err, reasonApprovalPending).ApprovalID, "the run takes no other call")

	info, err := h.pool.GetRun(h.ctx, run, "")
	require.NoError(t, err)
	require.Equal(t, id, info.PendingApproval)
	require.Len(t, info.Sessions, 1, "its sessions are kept while it waits")
	found, err := h.pool.FindApproval(h.ctx, run, "", "a", "fx__echo", sum)
	require.NoError(t, err)
	require.Equal(t, approvalPending, found.State)
	require.JSONEq(t, string(raw), string(found.Arguments))
	calls := info.Sessions[0].Calls

	a, res, err := h.pool.ApproveCall(h.ctx, run, "", id, "key:ops (approver, key_1)")
	require.NoError(t, err)
	require.Equal(t, "write it", res.Content[0]["text"])
	require.Equal(t, id, res.ApprovalID)
	require.Equal(t, approvalApproved, a.State)
	require.True(t, a.ResultWaiting)
	_, _, err = h.pool.ApproveCall(h.ctx, run, "", id, "key:ops (approver, key_1)")
	require.ErrorIs(t, err, errApprovalDecided)

	dispatchedCall, dispatchedAttempt := res.CallID, res.Attempt
	res, err = h.call(run, "a", "fx__echo", args)
	require.NoError(t, err, "the caller's retry gets the approved call's result")
	require.Equal(t, "write it", res.Content[0]["text"])
	require.Equal(t, id, res.ApprovalID)
	require.NotEqual(t, dispatchedCall, res.CallID, "the retry is a call of its own")
	require.Equal(t, dispatchedCall, res.DispatchedCallID, "the retry's result names the call the approver dispatched")
	require.Equal(t, dispatchedAttempt, res.DispatchedAttempt)
	info, err = h.pool.GetRun(h.ctx, run, "")
	require.NoError(t, err)
	require.Equal(t, calls+1, info.Sessions[0].Calls, "the server was reached once, at the approval")
	require.Empty(t, info.PendingApproval)

	_, err = h.call(run, "a", "fx__echo", args)
	next := requireRefused(t, err, reasonApprovalRequired)
	require.NotEqual(t, id, next.ApprovalID, "once: calling again is a new call that asks again")

	recs := h.toolCallRecords(func(tc *audit.ToolCallAttempt) bool { return tc.Approval != nil && tc.Approval.ID == id })
	var states []string
	for _, r := range recs {
		states = append(states, r.Approval.State+"/"+r.Outcome+"/"+r.Result+r.Reason)
		require.Equal(t, sum, r.ArgsDigest)
	}
	require.Equal(t, []string{
		"pending/refused_before_dispatch/approval_required",
		"pending/refused_before_dispatch/approval_required",
		"approved/dispatched/pending",
		"approved/dispatched/succeeded",
		"delivered/dispatched/succeeded",
	}, states)
	approved := recs[3]
	require.Equal(t, "key:ops (approver, key_1)", approved.Approval.DecidedBy)
	require.False(t, approved.Approval.DecideTime.IsZero())
	require.Equal(t, recs[0].CallID, approved.CallID, "the approved execution is an attempt of the same call")
	require.Equal(t, recs[2].PendingID, "")
	require.Equal(t, approved.PendingID, recs[4].PendingID, "the retry's record names the one execution")
	require.Equal(t, approved.CallID, recs[4].Approval.DispatchedCallID, "and its call, as the execution's records have it")
	require.Equal(t, approved.Attempt, recs[4].Approval.DispatchedAttempt)
	require.Empty(t, approved.Approval.DispatchedCallID, "the execution's own records are that call")
}

// TestARetryOfAFailedApprovedCallNamesIt: an approved call that failed after dispatch is told
// to the caller's retry as that failure, naming the call the approver dispatched, as the
// retry's record does.
func TestARetryOfAFailedApprovedCallNamesIt(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", nil, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"crash"}}}, func(d *publisherv1.Graph) { askNonReadOnly(d.GetNodes()[0].GetAgent()) })
	run := h.start("g")

	_, err := h.call(run, "a", "fx__crash", map[string]any{})
	id := requireRefused(t, err, reasonApprovalRequired).ApprovalID
	_, _, err = h.pool.ApproveCall(h.ctx, run, "", id, "key:ops (approver, key_1)")
	requireFailed(t, err, failureCrashed)
	var dispatched *FailedError
	require.ErrorAs(t, err, &dispatched)

	_, err = h.call(run, "a", "fx__crash", map[string]any{})
	requireFailed(t, err, failureCrashed)
	var retry *FailedError
	require.ErrorAs(t, err, &retry)
	require.NotEqual(t, dispatched.CallID, retry.CallID, "the retry is a call of its own")
	require.Contains(t, retry.Error(), fmt.Sprintf("dispatched as call %s attempt %d", dispatched.CallID, dispatched.Attempt))

	recs := h.toolCallRecords(func(tc *audit.ToolCallAttempt) bool {
		return tc.Approval != nil && tc.Approval.State == audit.ApprovalDelivered
	})
	require.Len(t, recs, 1)
	require.Equal(t, dispatched.CallID, recs[0].Approval.DispatchedCallID)
	require.Equal(t, dispatched.Attempt, recs[0].Approval.DispatchedAttempt)
}

// TestApproveAfterGrantsNarrowed: every gate runs again at approval; an operator who took a
// grant away meanwhile gets the call refused, the approval closed, and the run free again.
func TestApproveAfterGrantsNarrowed(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	run := h.start("g")
	_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	id := requireRefused(t, err, reasonApprovalRequired).ApprovalID

	_, err = h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture", Args: []string{"--read-only-tools"},
		Grants: []string{"process_spawn"}})
	require.NoError(t, err)
	a, res, err := h.pool.ApproveCall(h.ctx, run, "", id, "key:ops")
	requireRefused(t, err, reasonCeiling)
	require.Nil(t, res)
	require.Equal(t, approvalRefused, a.State)
	require.Contains(t, a.Note, "ceiling")
	require.Equal(t, 0.0, h.spawned(), "nothing was started")

	last := h.last()
	require.Equal(t, reasonCeiling, last.Reason)
	require.Equal(t, audit.ApprovalApproved, last.Approval.State, "the record says it was approved, and what refused it then")

	info, err := h.pool.GetRun(h.ctx, run, "")
	require.NoError(t, err)
	require.Empty(t, info.PendingApproval, "the approval is closed")
}

// TestDenyCall: a denial is recorded as the call's refusal with the approver, time and
// reason; the caller's retry is told once, and the run takes calls again.
func TestDenyCall(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	run := h.start("g")
	args := map[string]any{"text": "x"}
	_, err := h.call(run, "a", "fx__echo", args)
	id := requireRefused(t, err, reasonApprovalRequired).ApprovalID

	a, err := h.pool.DenyCall(h.ctx, run, "", id, "key:ops (approver, key_1)", "not on a Friday")
	require.NoError(t, err)
	require.Equal(t, approvalDenied, a.State)
	_, err = h.pool.DenyCall(h.ctx, run, "", id, "key:ops", "")
	require.ErrorIs(t, err, errApprovalDecided)
	_, err = h.pool.DenyCall(h.ctx, run, "", "apr-nope", "key:ops", "")
	require.ErrorIs(t, err, errApprovalNotFound)

	last := h.last()
	require.Equal(t, reasonDeniedByApprover, last.Reason)
	require.Equal(t, &audit.ToolCallApproval{ID: id, State: audit.ApprovalDenied, DecidedBy: "key:ops (approver, key_1)", DecideTime: last.Approval.DecideTime, Note: "not on a Friday"}, last.Approval)
	require.Equal(t, "echo", last.ToolName)
	require.NotEmpty(t, last.ArgsDigest)

	_, err = h.call(run, "a", "fx__echo", args)
	ref := requireRefused(t, err, reasonDeniedByApprover)
	require.Contains(t, ref.Error(), "not on a Friday")
	res, err := h.call(run, "a", "fx__peek", map[string]any{"text": "free"})
	require.NoError(t, err, "the run takes calls again")
	require.Equal(t, "free", res.Content[0]["text"])
	_, err = h.call(run, "a", "fx__echo", args)
	requireRefused(t, err, reasonApprovalRequired)
}

// TestApprovalExpires: an approval nobody decides expires as refused, on record; the caller's
// retry is told, and the run is free.
func TestApprovalExpires(t *testing.T) {
	h := deskHarness(t, harnessOpts{approvalTimeout: time.Second}, askNonReadOnly)
	run := h.start("g")
	args := map[string]any{"text": "x"}
	_, err := h.call(run, "a", "fx__echo", args)
	id := requireRefused(t, err, reasonApprovalRequired).ApprovalID

	require.Eventually(t, func() bool {
		recs := h.toolCallRecords(func(tc *audit.ToolCallAttempt) bool { return tc.Reason == reasonApprovalExpired })
		return len(recs) == 1 && recs[0].Approval.ID == id && recs[0].Approval.State == audit.ApprovalExpired
	}, 20*time.Second, 20*time.Millisecond)
	_, err = h.call(run, "a", "fx__echo", args)
	requireRefused(t, err, reasonApprovalExpired)
	_, _, err = h.pool.ApproveCall(h.ctx, run, "", id, "key:late")
	require.ErrorIs(t, err, errApprovalDecided)
	res, err := h.call(run, "a", "fx__peek", map[string]any{"text": "free"})
	require.NoError(t, err)
	require.Equal(t, "free", res.Content[0]["text"])
}

// TestAWaitingRunIsNotIdle: the idle reaper leaves a run that waits for an approval alone,
// however long ago its last call ended; once decided, the run is idle like any other.
func TestAWaitingRunIsNotIdle(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	run := h.start("g")
	_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	id := requireRefused(t, err, reasonApprovalRequired).ApprovalID
	r, err := h.pool.lookup(h.ctx, run, "")
	require.NoError(t, err)
	later := time.Now().Add(2 * h.pool.cfg.RunIdleTimeout)
	r.mu.Lock()
	_, idle := h.pool.abandoned(r, later)
	r.mu.Unlock()
	require.False(t, idle, "it waits for someone")

	_, err = h.pool.DenyCall(h.ctx, run, "", id, "key:ops", "")
	require.NoError(t, err)
	r.mu.Lock()
	why, idle := h.pool.abandoned(r, later)
	r.mu.Unlock()
	require.True(t, idle)
	require.Contains(t, why, "pool.run_idle_timeout")
}

// TestApprovalsSurviveARestart: a pending approval outlives the pool: it still holds the run
// and can be approved, and the call runs on a fresh session.
func TestApprovalsSurviveARestart(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	run := h.start("g")
	args := map[string]any{"text": "after"}
	_, err := h.call(run, "a", "fx__echo", args)
	id := requireRefused(t, err, reasonApprovalRequired).ApprovalID

	h.reopen()
	_, err = h.call(run, "a", "fx__peek", map[string]any{"text": "x"})
	require.Equal(t, id, requireRefused(t, err, reasonApprovalPending).ApprovalID)
	list, err := h.pool.ListApprovals(h.ctx, run, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, approvalPending, list[0].State)
	_, res, err := h.pool.ApproveCall(h.ctx, run, "", id, "key:ops")
	require.NoError(t, err)
	require.Equal(t, "after", res.Content[0]["text"])

	h.reopen()
	res, err = h.call(run, "a", "fx__echo", args)
	require.NoError(t, err, "the outcome kept for the retry outlives the restart too")
	require.Equal(t, id, res.ApprovalID)
}

// TestRunEndExpiresItsApproval: ending a run closes its pending approval, on record.
func TestRunEndExpiresItsApproval(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	run := h.start("g")
	_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	id := requireRefused(t, err, reasonApprovalRequired).ApprovalID
	_, err = h.pool.EndRun(h.ctx, run, "", StateCompleted, "done")
	require.NoError(t, err)
	last := h.last()
	require.Equal(t, reasonApprovalExpired, last.Reason)
	require.Equal(t, id, last.Approval.ID)
	list, err := h.pool.ListApprovals(h.ctx, run, "")
	require.NoError(t, err)
	require.Equal(t, approvalExpired, list[0].State)
	require.Contains(t, list[0].Note, "the run ended")
	_, _, err = h.pool.ApproveCall(h.ctx, run, "", id, "key:ops")
	require.ErrorIs(t, err, errRunEnded)
}

// TestApprovalsAreTheirTenants: another tenant's run, and so its approvals, are not found.
func TestApprovalsAreTheirTenants(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	run := h.start("g")
	_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	id := requireRefused(t, err, reasonApprovalRequired).ApprovalID
	_, _, err = h.pool.ApproveCall(h.ctx, run, "globex", id, "key:ops")
	require.ErrorIs(t, err, errRunNotFound)
	_, err = h.pool.ListApprovals(h.ctx, run, "globex")
	require.ErrorIs(t, err, errRunNotFound)
	a, err := h.pool.FindApproval(h.ctx, run, auth.DefaultTenant, "a", "fx__echo", "sha256:other")
	require.NoError(t, err)
	require.Nil(t, a)
}

// TestApprovalsUnderConcurrency: concurrent calls that ask first make one approval (the same
// call gets it, another is told to wait for it), and of two approvers deciding at once, one
// runs the call and the other is told it is decided.
func TestApprovalsUnderConcurrency(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	run := h.start("g")
	ids := make(chan string, 16)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			text := "same"
			if i%4 == 3 {
				text = fmt.Sprint("other ", i)
			}
			_, err := h.call(run, "a", "fx__echo", map[string]any{"text": text})
			var ref *RefusedError
			if errors.As(err, &ref) && (ref.Reason == reasonApprovalRequired || ref.Reason == reasonApprovalPending) {
				ids <- ref.ApprovalID
				return
			}
			ids <- "unexpected: " + fmt.Sprint(err)
		})
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		seen[id] = true
	}
	require.Len(t, seen, 1, "one approval, which every call names: %v", seen)
	var id string
	for k := range seen {
		id = k
	}

	results := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			_, _, err := h.pool.ApproveCall(h.ctx, run, "", id, "key:ops")
			results <- err
		})
	}
	wg.Wait()
	close(results)
	var ok, decided int
	for err := range results {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, errApprovalDecided):
			decided++
		default:
			t.Fatalf("unexpected: %v", err)
		}
	}
	require.Equal(t, []int{1, 1}, []int{ok, decided})
}
