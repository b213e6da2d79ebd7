package registry

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/testutil"
)

// TestAMalformedExploreCallIDIsRefusedFirst: an explore whose call names a call_id that is not
// a call id is refused INVALID_ARGUMENT naming call.call_id, before an ad-hoc server's admin
// record is written or the pool is asked; a well-formed one reaches the pool.
func TestAMalformedExploreCallIDIsRefusedFirst(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	disc := recordingDiscoverer{adhoc: make(chan *registryinternalv1.ResolveServerResponse, 1)}
	f.svc.SetDiscoverer(disc)
	adhoc := &registryv1.CreateServerRequest{Command: "mcpfixture", Grants: []string{"process_spawn"}}
	for _, bad := range []string{"call one", "..", "call/1"} {
		_, err := f.client.ExploreServer(ctx, &registryv1.ExploreServerRequest{Ref: "adhoc", Server: adhoc,
			Call: &typesv1.ExploreCall{Tool: "echo", CallId: bad}})
		st := testutil.RequireStatus(t, err, codes.InvalidArgument)
		require.Contains(t, st.Message(), "call.call_id", bad)
	}
	require.Empty(t, disc.adhoc, "the pool was not asked")
	require.Empty(t, f.audit.Records(), "nothing started, so nothing is recorded")

	_, err := f.client.ExploreServer(ctx, &registryv1.ExploreServerRequest{Ref: "adhoc", Server: adhoc,
		Call: &typesv1.ExploreCall{Tool: "echo", CallId: "call-0a1b:2"}})
	require.NoError(t, err)
	require.Len(t, disc.adhoc, 1, "a call id passes")
}
