package cli

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
)

// TestExploreOutcomesNameTheirRecords: every outcome of `servers explore --call` that is not a
// plain success says which audit list command shows its records. A refused or failed call
// names its call id (the pool's, from the answer), which finds it alone; a call that got no
// answer has no id the CLI knows (ExploreCall has no call_id a caller could choose), so the
// command narrows to the server's tool call since the request was sent, not every tool call.
func TestExploreOutcomesNameTheirRecords(t *testing.T) {
	refused := exploreCallExit(&typesv1.ExploreCallResult{CallId: "call-0a1b", Outcome: "refused_before_dispatch", Reason: "unknown_tool", Message: `server "fx" lists no tool named "nosuch"`})
	require.Error(t, refused)
	require.Equal(t, ExitRefused, refused.(*exitError).code)
	require.Contains(t, refused.Error(), "nothing reached the server (its record: ringfence audit list --call call-0a1b)")

	failed := exploreCallExit(&typesv1.ExploreCallResult{CallId: "call-2c3d", Outcome: "dispatched", Result: "failed", FailureClass: "tool_error"})
	require.Error(t, failed)
	require.Equal(t, ExitFailed, failed.(*exitError).code)
	require.Contains(t, failed.Error(), "may have taken effect (its records: ringfence audit list --call call-2c3d)")

	require.NoError(t, exploreCallExit(&typesv1.ExploreCallResult{CallId: "call-4e5f", Outcome: "dispatched", Result: "succeeded"}))

	g := &globals{timeout: 20 * time.Second}
	sent := time.Date(2026, 12, 4, 23, 1, 2, 700_000_000, time.FixedZone("CET", 3600))
	msg := g.unknownExploreOutcome("fx", "sleep", sent)
	require.Contains(t, msg, "the explore call's outcome is unknown: no answer within --timeout 20s")
	require.Contains(t, msg, "ringfence audit list --kind tool_call --server fx --tool sleep --since 2026-12-04T22:01:02Z (needs audit:read), the latest sleep call of fx",
		"the server's calls of that tool since the request was sent (to the second, in UTC, so the call is not left out)")
}
