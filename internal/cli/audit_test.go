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
