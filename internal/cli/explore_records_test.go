package cli

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
)

// TestExploreOutcomesNameTheirRecords: every outcome of `servers explore --call` that is not a
// plain success says which audit list command shows its records. A refused or failed call
// names its call id (from the answer), which finds it alone; so does a call that got no
// answer, by the id the CLI chose and sent (ExploreCall.call_id).
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
	msg := g.unknownExploreOutcome("fx", &typesv1.ExploreCall{Tool: "sleep", CallId: "call-6a7b"})
	require.Contains(t, msg, "the explore call's outcome is unknown: no answer within --timeout 20s")
	require.Contains(t, msg, "look up call call-6a7b before calling again: ringfence audit list --call call-6a7b (needs audit:read)",
		"the id the CLI sent finds the call's records alone")
}
