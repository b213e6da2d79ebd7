package auditpb

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/audit"
)

// TestToolCallRoundTrips: every field of an attempt survives the trip a split deployment's
// producer makes to the audit service.
func TestToolCallRoundTrips(t *testing.T) {
	att := audit.ToolCallAttempt{
		RunID: "r1", GraphID: "g", GraphVersion: 3, AgentNode: "a", ToolNode: "fx__echo", ServerRef: "fx",
		ToolName: "echo", CallID: "turn-7", Attempt: 2, PendingID: audit.NewID(), PinnedHash: "v1:sha256:aa",
		LiveHash: "v1:sha256:bb", ArgsDigest: "sha256:cc", ArgsSize: 12, ResultDigest: "sha256:dd", ResultSize: 34,
		LatencyMicros: 56, Advisory: []string{"agent_floor: x"}, WarmSession: true, LoadedTools: []string{"docs__read_file"}, AgentTokenID: "tok-0123456789abcdef",
		Approval: &audit.ToolCallApproval{ID: "apr-1", State: audit.ApprovalApproved, DecidedBy: "key:ops (approver, key_1)",
			DecideTime: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Note: "fine"},
	}
	att.Failed(audit.FailureTimeout)
	rec := audit.NewToolCallRecord("pool", "acme", att)
	got, err := RecordFromProto(RecordToProto(rec))
	require.NoError(t, err)
	require.Equal(t, rec.ID, got.ID)
	require.Equal(t, *rec.ToolCall, *got.ToolCall)
	require.NoError(t, got.Validate())
}
