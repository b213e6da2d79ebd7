package cli

import (
	"testing"

	"github.com/stretchr/testify/require"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
)

// TestADeliveredCallNamesItsApproverAsTheApprover: the record of the retry that got an approved
// call's outcome names the approver as the one who approved it, not as the one who delivered
// it (the retry was the agent's, under another key).
func TestADeliveredCallNamesItsApproverAsTheApprover(t *testing.T) {
	record := func(state string) *auditv1.Record {
		return &auditv1.Record{Event: &auditv1.Record_ToolCall{ToolCall: &auditv1.ToolCallAttempt{
			RunId: "r1", AgentNode: "researcher", ServerRef: "docs", ToolName: "search_docs", CallId: "call-1", Attempt: 1,
			Outcome: "dispatched", Result: "succeeded",
			Approval: &auditv1.ToolCallApproval{ApprovalId: "apr-1", State: state, DecidedBy: "key:alice (approver, key_1)"},
		}}}
	}
	_, outcome := describeRecord(record("delivered"))
	require.Equal(t, "dispatched: succeeded [approval apr-1 delivered, approved by key:alice (approver, key_1)]", outcome)
	_, outcome = describeRecord(record("approved"))
	require.Equal(t, "dispatched: succeeded [approval apr-1 approved by key:alice (approver, key_1)]", outcome)
}

// TestADeliveredCallNamesTheDispatchedCall: the retry's record, as audit list shows it, names
// the call the approver dispatched as that call's own line names it (call ID#N), so the one
// leads to the other.
func TestADeliveredCallNamesTheDispatchedCall(t *testing.T) {
	approval := &auditv1.ToolCallApproval{ApprovalId: "apr-1", State: "approved", DecidedBy: "key:alice (approver, key_1)"}
	dispatched := &auditv1.Record{Event: &auditv1.Record_ToolCall{ToolCall: &auditv1.ToolCallAttempt{
		RunId: "r1", AgentNode: "researcher", ServerRef: "docs", ToolName: "search_docs", CallId: "call-1", Attempt: 2,
		Outcome: "dispatched", Result: "succeeded", Approval: approval,
	}}}
	what, _ := describeRecord(dispatched)
	require.Contains(t, what, "call call-1#2")
	retry := &auditv1.Record{Event: &auditv1.Record_ToolCall{ToolCall: &auditv1.ToolCallAttempt{
		RunId: "r1", AgentNode: "researcher", ServerRef: "docs", ToolName: "search_docs", CallId: "call-9", Attempt: 1,
		Outcome: "dispatched", Result: "succeeded",
		Approval: &auditv1.ToolCallApproval{ApprovalId: "apr-1", State: "delivered", DecidedBy: "key:alice (approver, key_1)",
			DispatchedCallId: "call-1", DispatchedAttempt: 2},
	}}}
	what, outcome := describeRecord(retry)
	require.Contains(t, what, "call call-9#1")
	require.Equal(t, "dispatched: succeeded [approval apr-1 delivered, approved by key:alice (approver, key_1), dispatched as call call-1#2]", outcome)
}
