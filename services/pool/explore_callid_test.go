package pool

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/mtls"
)

// TestAnExploreCallIsRecordedUnderTheCallersID: an explore call whose request names a call_id
// is recorded under that id, every record of it (the pending record and the outcome, or the
// refusal), so the audit log's call filter finds it without the answer, as a caller whose
// answer never came needs; the answer carries the same id. A malformed call_id is refused
// INVALID_ARGUMENT naming call.call_id before anything starts or is recorded.
func TestAnExploreCallIsRecordedUnderTheCallersID(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true, realAudit: true})
	h.server("fx", nil)
	rpc := NewInternalServer(h.pool)
	asRegistry := auth.WithPrincipal(h.ctx, auth.Principal{Service: mtls.Registry}) // explore calls are the registry's
	args, err := structpb.NewStruct(map[string]any{"text": "x"})
	require.NoError(t, err)
	explore := func(tool, callID string) (*poolinternalv1.DiscoverResponse, error) {
		return rpc.Discover(asRegistry, &poolinternalv1.DiscoverRequest{ServerRef: "fx", Tenant: auth.DefaultTenant, ActorKeyId: "key_ops",
			Call: &typesv1.ExploreCall{Tool: tool, Arguments: args, CallId: callID}})
	}
	records := func(callID string) []*auditv1.ToolCallAttempt {
		t.Helper()
		require.NoError(t, h.pool.Spool().Flush(h.ctx))
		resp, err := h.auditLog.List(h.ctx, &auditv1.ListRequest{Filter: &auditv1.Filter{CallId: callID}})
		require.NoError(t, err)
		var out []*auditv1.ToolCallAttempt
		for _, r := range resp.GetRecords() {
			require.NotNil(t, r.GetToolCall(), "only the call's records: %v", r)
			out = append(out, r.GetToolCall())
		}
		return out
	}

	const dispatched = "call-explore-0a1b:2c3d"
	resp, err := explore("echo", dispatched)
	require.NoError(t, err)
	require.Equal(t, audit.OutcomeDispatched, resp.GetCall().GetOutcome(), "%v", resp.GetCall())
	require.Equal(t, dispatched, resp.GetCall().GetCallId(), "the answer names the caller's id")
	got := records(dispatched)
	require.Len(t, got, 2, "the pending record and the outcome, both under the caller's id")
	require.Equal(t, audit.ResultPending, got[0].GetResult())
	require.Equal(t, audit.ResultSucceeded, got[1].GetResult())
	for _, r := range got {
		require.True(t, strings.HasPrefix(r.GetRunId(), "explore-"), r.GetRunId())
		require.Equal(t, "echo", r.GetToolName())
	}
	// The outcome, as the audit log lists it, carries the digest of the result the explorer got.
	sum, size := structsDigest(t, resp.GetCall().GetContent(), resp.GetCall().GetIsError(), resp.GetCall().GetStructuredContent())
	require.Equal(t, sum, got[1].GetResultDigest())
	require.Equal(t, size, got[1].GetResultSize())
	require.Empty(t, got[0].GetResultDigest())
	require.Equal(t, sum, resp.GetCall().GetResultDigest(), "the explorer's answer names it too")
	require.Equal(t, size, resp.GetCall().GetResultSize())

	const refused = "call-explore-4e5f"
	resp, err = explore("nosuch", refused)
	require.NoError(t, err, "the listing is answered")
	require.Equal(t, audit.OutcomeRefusedBeforeDispatch, resp.GetCall().GetOutcome())
	require.Equal(t, refused, resp.GetCall().GetCallId())
	got = records(refused)
	require.Len(t, got, 1)
	require.Equal(t, audit.ReasonUnknownTool, got[0].GetReason())

	all := func() int {
		t.Helper()
		require.NoError(t, h.pool.Spool().Flush(h.ctx))
		resp, err := h.auditLog.List(h.ctx, &auditv1.ListRequest{Filter: &auditv1.Filter{}, PageSize: 1000})
		require.NoError(t, err)
		return len(resp.GetRecords())
	}
	before := all()
	for _, bad := range []string{"call one", "..", "call/1", strings.Repeat("c", 513)} {
		_, err := explore("echo", bad)
		st := status.Convert(err)
		require.Equal(t, codes.InvalidArgument, st.Code(), "%q: %v", bad, err)
		require.Contains(t, st.Message(), "call.call_id", bad)
		require.Contains(t, st.Message(), "A-Z a-z 0-9 _ . : -", "names what a call id may hold")
	}
	require.Equal(t, before, all(), "a refused request records nothing")
}
