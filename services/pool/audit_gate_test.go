package pool

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/mtls"
)

// The pool acts only with room for its record: while the audit spool is full (the audit
// service is down and records pile up to SpoolMaxRecords), calls and explore calls are
// refused as audit_unavailable (UNAVAILABLE) before anything starts.

// downSink is the audit sink with an outage a test switches on: records stay in the spool.
type downSink struct {
	audit.Sink
	down atomic.Bool
}

func (d *downSink) Append(ctx context.Context, recs []audit.Record) error {
	if d.down.Load() {
		return errors.New("audit: connection refused")
	}
	return d.Sink.Append(ctx, recs)
}

// watchedRegistry is the real registry, counting resolutions (nothing starts without one) and
// running onPolicy, when set, as the ceiling is checked: after the audit gate, before the
// pending record.
type watchedRegistry struct {
	Registry
	resolves atomic.Int64
	onPolicy atomic.Pointer[func()]
}

func (w *watchedRegistry) ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error) {
	if f := w.onPolicy.Swap(nil); f != nil {
		(*f)()
	}
	return w.Registry.ServerPolicy(ctx, ref)
}

func (w *watchedRegistry) ResolveRegistration(ctx context.Context, ref string) (*mcpserver.Resolved, error) {
	w.resolves.Add(1)
	return w.Registry.ResolveRegistration(ctx, ref)
}

const gateSpoolMax = 8

// auditGateHarness is a harness whose pool spool holds gateSpoolMax records and forwards to
// a sink the test takes down, with the fixture server registered and a graph published.
func auditGateHarness(t *testing.T) (*harness, *downSink, *watchedRegistry) {
	t.Helper()
	var sink *downSink
	var reg *watchedRegistry
	h := newHarness(t, harnessOpts{
		spoolMaxRecords: gateSpoolMax,
		poolSink:        func(s audit.Sink) audit.Sink { sink = &downSink{Sink: s}; return sink },
		registry:        func(r Registry) Registry { reg = &watchedRegistry{Registry: r}; return reg },
	})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, h.pool.Spool().Flush(ctx))
	require.Zero(t, h.pool.Spool().Pending())
	reg.resolves.Store(0) // the import resolved it to take the listing
	return h, sink, reg
}

// fillSpool enqueues n records of a run named filler, which wait in the spool while the sink
// is down.
func fillSpool(t *testing.T, h *harness, n int) {
	t.Helper()
	for range n {
		tc := audit.ToolCallAttempt{RunID: "filler", CallID: "call-" + randomHex(), Attempt: 1, ToolName: "echo"}
		tc.Succeeded()
		require.NoError(t, h.pool.Spool().Enqueue(context.Background(), audit.NewToolCallRecord("pool", auth.DefaultTenant, tc)))
	}
}

// restore brings the sink back and waits until the spool has forwarded everything.
func (d *downSink) restore(t *testing.T, h *harness) {
	t.Helper()
	d.down.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, h.pool.Spool().Flush(ctx))
}

// requireAuditUnavailable asserts a gRPC refusal of a call for audit_unavailable.
func requireAuditUnavailable(t *testing.T, err error) {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "want a gRPC status, got %v", err)
	require.Equal(t, codes.Unavailable, st.Code(), st.Message())
	var detail *poolv1.CallRefusal
	for _, d := range st.Details() {
		if r, ok := d.(*poolv1.CallRefusal); ok {
			detail = r
		}
	}
	require.NotNil(t, detail, "the refusal carries its detail: %v", st.Details())
	require.Equal(t, reasonAuditUnavailable, detail.GetReason(), detail.GetMessage())
}

func echoRequest(run string) *poolv1.CallToolRequest {
	args, _ := structpb.NewStruct(map[string]any{"text": "x"})
	return &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: "fx__echo", Arguments: args}
}

// TestAFullAuditSpoolRefusesCallsBeforeAnythingStarts: gate 0. With the spool full, a run's
// first call is refused as audit_unavailable, and no session was started for it (no
// container, no session on the run, the registration not even resolved). Once the audit log
// takes the records, the same call starts a session and goes through.
func TestAFullAuditSpoolRefusesCallsBeforeAnythingStarts(t *testing.T) {
	h, sink, reg := auditGateHarness(t)
	run := h.start("g")
	rpc := NewServer(h.pool)

	sink.down.Store(true)
	fillSpool(t, h, gateSpoolMax)
	require.ErrorIs(t, h.pool.Spool().CanAccept(), audit.ErrSpoolFull)

	_, err := rpc.CallTool(h.ctx, echoRequest(run))
	requireAuditUnavailable(t, err)
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	ref := requireRefused(t, err, reasonAuditUnavailable)
	require.ErrorIs(t, ref, audit.ErrSpoolFull)

	require.Zero(t, h.spawned(), "no session was started")
	require.Zero(t, reg.resolves.Load(), "the registration was not even resolved")
	require.Zero(t, poolContainers(t, h.poolID), "no container was created")
	info, err := h.pool.GetRun(h.ctx, run, "")
	require.NoError(t, err)
	require.Empty(t, info.Sessions)

	sink.restore(t, h)
	require.Empty(t, h.pendings(), "nothing was dispatched while the spool was full")
	_, err = rpc.CallTool(h.ctx, echoRequest(run))
	require.NoError(t, err, "with room for its records the same call goes through")
	require.Equal(t, float64(1), h.spawned())
}

// TestAPendingRecordThatCannotBeWrittenRefusesTheCall: the spool had room at gate 0 but fills
// before the pending record is written (other calls took the last places meanwhile, here
// while the ceiling is checked). The session is up by then, but the call is refused as
// audit_unavailable and never reaches the server.
func TestAPendingRecordThatCannotBeWrittenRefusesTheCall(t *testing.T) {
	h, sink, reg := auditGateHarness(t)
	run := h.start("g")
	rpc := NewServer(h.pool)

	sink.down.Store(true)
	fillSpool(t, h, gateSpoolMax-1)
	require.NoError(t, h.pool.Spool().CanAccept(), "gate 0 sees room")
	takeLastPlace := func() { fillSpool(t, h, 1) }
	reg.onPolicy.Store(&takeLastPlace)

	_, err := rpc.CallTool(h.ctx, echoRequest(run))
	requireAuditUnavailable(t, err)
	require.Nil(t, reg.onPolicy.Load(), "the spool filled between gate 0 and the pending record")
	require.ErrorIs(t, h.pool.Spool().CanAccept(), audit.ErrSpoolFull)

	info, err := h.pool.GetRun(h.ctx, run, "")
	require.NoError(t, err)
	require.Len(t, info.Sessions, 1, "the session started before the pending record")
	require.Zero(t, info.Sessions[0].Calls, "the call never reached the server")

	sink.restore(t, h)
	require.Empty(t, h.pendings(), "no pending record: nothing was dispatched")
	_, err = rpc.CallTool(h.ctx, echoRequest(run))
	require.NoError(t, err)
	require.Len(t, h.pendings(), 1)
}

// TestAFullAuditSpoolRefusesExploreCalls: discovery with a call (Discover) is refused
// UNAVAILABLE before the server is started; a listing alone writes no record and is still
// answered. Once the audit log takes the records, the explore call goes through.
func TestAFullAuditSpoolRefusesExploreCalls(t *testing.T) {
	h, sink, reg := auditGateHarness(t)
	rpc := NewInternalServer(h.pool)
	args, err := structpb.NewStruct(map[string]any{"text": "x"})
	require.NoError(t, err)
	explore := &poolinternalv1.DiscoverRequest{ServerRef: "fx", Tenant: auth.DefaultTenant, ActorKeyId: "key_ops",
		Call: &typesv1.ExploreCall{Tool: "echo", Arguments: args}}

	asRegistry := auth.WithPrincipal(h.ctx, auth.Principal{Service: mtls.Registry}) // explore calls are the registry's

	sink.down.Store(true)
	fillSpool(t, h, gateSpoolMax)
	_, err = rpc.Discover(asRegistry, explore)
	st, ok := status.FromError(err)
	require.True(t, ok, "want a gRPC status, got %v", err)
	require.Equal(t, codes.Unavailable, st.Code(), st.Message())
	require.Contains(t, st.Message(), "spool full")
	require.Zero(t, reg.resolves.Load(), "the registration was not resolved: nothing started")

	listing, err := rpc.Discover(h.ctx, &poolinternalv1.DiscoverRequest{ServerRef: "fx"})
	require.NoError(t, err, "a listing writes no record")
	require.NotEmpty(t, listing.GetTools())

	sink.restore(t, h)
	require.Empty(t, h.pendings(), "nothing was dispatched while the spool was full")
	resp, err := rpc.Discover(asRegistry, explore)
	require.NoError(t, err)
	require.Equal(t, audit.OutcomeDispatched, resp.GetCall().GetOutcome(), fmt.Sprint(resp.GetCall()))
}
