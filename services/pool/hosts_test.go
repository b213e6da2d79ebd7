package pool

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/pinned"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// TestRunRecordsLiveInEtcd: on etcd a pool host keeps its run records there, not in its file:
// the same host id started on an empty file restores its runs with their selection and loaded
// tools, and another host id restores none of them.
func TestRunRecordsLiveInEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	h := newHarness(t, harnessOpts{noImage: true})
	h.server("docs", nil)
	h.publishSurface("g", func(a *publisherv1.AgentNode) { a.DeferTools = true },
		pinned.Tool{Server: "docs", Tool: "read_file", Description: "Read."}, pinned.Tool{Server: "docs", Tool: "write_file", Description: "Write."})
	open := func(host string) *Service {
		return openHost(t, h, cluster, root, host, 0)
	}
	p := open("h1")
	info, err := p.StartRun(h.ctx, auth.DefaultTenant, "g", 0, "", "docs")
	require.NoError(t, err)
	require.Equal(t, "h1", info.Run.Host)
	runID := info.Run.ID
	r, err := p.lookup(h.ctx, runID, "")
	require.NoError(t, err)
	require.NoError(t, p.loadTools(h.ctx, r, "a", []string{"docs__write_file"}))
	require.NoError(t, p.Close(context.Background()))

	p = open("h1")
	defer p.Close(context.Background())
	l, err := p.ListAgentTools(h.ctx, runID, "", "a")
	require.NoError(t, err)
	resp := listingToProto(l)
	require.Equal(t, []string{"docs__write_file", "tool_search"}, toolNames(resp), "restored from etcd, on a new file")
	other := open("h2")
	require.Empty(t, other.runs.byKey, "h2 owns none of h1's runs")
	require.NoError(t, other.Close(context.Background()))
	require.Equal(t, []string{"docs"}, resp.GetSelectedServers())
}

// unreachable is the HostPeers of a host whose peers never answer: these tests call each host
// directly and check what it decides, not the transport (tests/hosts_e2e_test.go does that).
type unreachable struct{}

func (unreachable) ForwardRun(context.Context, string, *poolinternalv1.ForwardRunRequest) (*poolinternalv1.ForwardRunResponse, error) {
	return nil, errors.New("unreachable in this test")
}

func (unreachable) ForwardCallTool(context.Context, string, *poolinternalv1.ForwardCallToolRequest, func(*poolinternalv1.CallProgress)) (*poolv1.CallToolResponse, error) {
	return nil, errors.New("unreachable in this test")
}

func (unreachable) WatchAgentTools(context.Context, string, *poolinternalv1.WatchAgentToolsRequest, func(*poolinternalv1.WatchAgentToolsResponse)) error {
	return errors.New("unreachable in this test")
}

// openHost opens a pool host on the cluster's root.
func openHost(t *testing.T, h *harness, cluster *etcdtest.Cluster, root, id string, maxRuns int) *Service {
	return openPoolWith(t, h, Config{DBPath: filepath.Join(t.TempDir(), "pool.db"), Etcd: cluster.Client(t, "pool"), EtcdRoot: root,
		HostID: id, HostAddr: "127.0.0.1:1", HostLeaseTTL: time.Second, Peers: unreachable{}, MaxRuns: maxRuns})
}

// hostsOnEtcd is a harness with graph g (agent a, docs__read_file) published, and open, which
// opens a pool host with an id and a run limit (0: the default) on one etcd cluster.
func hostsOnEtcd(t *testing.T) (*harness, func(id string, maxRuns int) *Service) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	h := newHarness(t, harnessOpts{noImage: true})
	h.server("docs", nil)
	h.publishSurface("g", nil, pinned.Tool{Server: "docs", Tool: "read_file", Description: "Read."})
	return h, func(id string, maxRuns int) *Service { return openHost(t, h, cluster, root, id, maxRuns) }
}

// TestPlacementTakesTheLeastLoadedHost: a run goes to the live host with the lowest share of
// its capacity in use, the receiving host on a tie; a request for another host's run is that
// host's; every host full is errTooManyRuns.
func TestPlacementTakesTheLeastLoadedHost(t *testing.T) {
	h, open := hostsOnEtcd(t)
	h1 := open("h1", 2)
	defer h1.Close(context.Background())
	h2 := open("h2", 4)
	defer h2.Close(context.Background())

	info, err := h1.StartRun(h.ctx, "", "g", 0, "r1")
	require.NoError(t, err, "a tie: the receiving host")
	require.Equal(t, "h1", info.Run.Host)
	// h1 is at 1/2, h2 at 0/4.
	_, err = h1.StartRun(h.ctx, "", "g", 0, "r2")
	var e *elsewhereError
	require.ErrorAs(t, err, &e)
	require.Equal(t, "h2", e.host)
	for _, id := range []string{"r2", "r3"} {
		info, err = h2.StartRun(h.ctx, "", "g", 0, id)
		require.NoError(t, err)
		require.Equal(t, "h2", info.Run.Host)
	}
	// h1 at 1/2, h2 at 2/4: a tie again, and h2's share grows with the next run.
	info, err = h2.StartRun(h.ctx, "", "g", 0, "r4")
	require.NoError(t, err)
	require.Equal(t, "h2", info.Run.Host)
	_, err = h2.StartRun(h.ctx, "", "g", 0, "r5")
	require.ErrorAs(t, err, &e)
	require.Equal(t, "h1", e.host, "3/4 is more loaded than 1/2")

	// Requests about a run are its owner's.
	_, err = h1.GetRun(h.ctx, "r3", "")
	require.ErrorAs(t, err, &e)
	require.Equal(t, "h2", e.host)
	call := CallRequest{RunID: "r3", Agent: "a", Tool: "docs__read_file", CallID: "c1"}
	_, err = h1.CallTool(inGRPCHandler(h.ctx), call)
	require.ErrorIs(t, err, errRunElsewhere, "the gRPC handler forwards the request it received")
	_, err = h1.CallTool(h.ctx, call) // in-process (the front door): forwarded here, to a peer that does not answer
	require.ErrorContains(t, rftestutil.RequireStatus(t, err, codes.Unavailable).Err(), "pool host h2 does not answer")

	// A forwarded request is served where it arrives, without placement, and never forwarded.
	fwd := context.WithValue(h.ctx, forwardedKey{}, true)
	info, err = h2.StartRun(fwd, "", "g", 0, "r6")
	require.NoError(t, err)
	require.Equal(t, "h2", info.Run.Host)
	err = h1.forward(fwd, &elsewhereError{host: "h2"}, poolv1.PoolService_GetRun_FullMethodName, &poolv1.GetRunRequest{RunId: "r3"}, &poolv1.GetRunResponse{})
	rftestutil.RequireStatus(t, err, codes.Unavailable)

	// Every host full.
	_, err = h1.StartRun(h.ctx, "", "g", 0, "r7")
	require.NoError(t, err)
	_, err = h1.StartRun(h.ctx, "", "g", 0, "r8")
	require.ErrorIs(t, err, errTooManyRuns)

	// A run another host failed meanwhile (as for a lost lease) is not its old owner's to
	// write: UNAVAILABLE, so the caller asks again and reaches the run where it is.
	_, err = h1.runStore.UpdateRun(h.ctx, auth.DefaultTenant, "r3", func(r *store.Run) error {
		r.State, r.HostLost, r.Host = StateFailed, r.Host, ""
		return nil
	})
	require.NoError(t, err)
	_, err = h2.PauseRun(h.ctx, "r3", "")
	require.ErrorIs(t, err, store.ErrNotOwner)
	rftestutil.RequireStatus(t, h2.errors.Status(h.ctx, err), codes.Unavailable)
}

// TestALostHostsRunsFailAndResumeElsewhere: when a host's lease ends, another host fails its
// runs with the reason, ResumeRun re-homes one there with fresh sessions, and the lost host's
// record of it is refused.
func TestALostHostsRunsFailAndResumeElsewhere(t *testing.T) {
	h, open := hostsOnEtcd(t)
	h1 := open("h1", 0)
	defer h1.Close(context.Background())
	h2 := open("h2", 0)
	fwd := context.WithValue(h.ctx, forwardedKey{}, true) // placed on h2
	_, err := h2.StartRun(fwd, "", "g", 0, "lost")
	require.NoError(t, err)
	_, err = h2.PauseRun(h.ctx, "lost", "")
	require.NoError(t, err)
	r2, err := h2.lookup(h.ctx, "lost", "")
	require.NoError(t, err)
	require.NoError(t, h2.Close(context.Background())) // its lease is revoked

	var got *RunInfo
	require.Eventually(t, func() bool {
		got, err = h1.GetRun(h.ctx, "lost", "")
		return err == nil && got.Run.State == StateFailed
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, "h2", got.Run.HostLost)
	require.Contains(t, got.Run.EndReason, "pool host h2 is gone (it was stopped, or stopped answering): its lease in etcd ended (revoked as it stopped")

	// h1 kept an approval of the run from an earlier life there: it is not the re-homed run's.
	require.NoError(t, h1.store.PutApproval(h.ctx, store.Approval{ID: "old", Tenant: auth.DefaultTenant, RunID: "lost", State: "pending"}))
	info, err := h1.ResumeRun(h.ctx, "lost", "")
	require.NoError(t, err)
	kept, err := h1.store.RunApprovals(h.ctx, auth.DefaultTenant, "lost")
	require.NoError(t, err)
	require.Empty(t, kept)
	require.Empty(t, info.PendingApproval)
	require.Equal(t, StateRunning, info.Run.State)
	require.Equal(t, "h1", info.Run.Host)
	require.Empty(t, info.Run.HostLost)
	require.Empty(t, info.Sessions)
	_, err = h1.ResumeRun(h.ctx, "lost", "")
	require.ErrorIs(t, err, errRunNotPaused, "resumed once")

	// h2's stale copy of the run cannot be written back.
	rec := r2.rec
	rec.State = StateRunning
	require.ErrorIs(t, h2.runStore.PutRun(h.ctx, rec), store.ErrNotOwner)
}

// TestForwardedRequestsKeepTheirCallersLimits: the owner serves a forwarded request as its
// caller's, and checks the caller's permission and tenant binding again: a pool certificate
// alone never widens what a caller may do.
func TestForwardedRequestsKeepTheirCallersLimits(t *testing.T) {
	h, open := hostsOnEtcd(t)
	h1 := open("h1", 0)
	defer h1.Close(context.Background())
	_, err := h1.StartRun(h.ctx, "", "g", 0, "r1")
	require.NoError(t, err)
	srv := NewInternalServer(h1)
	body, err := proto.Marshal(&poolv1.GetRunRequest{RunId: "r1"})
	require.NoError(t, err)
	ask := func(c *poolinternalv1.Caller, tenant, method string) (*poolinternalv1.ForwardRunResponse, error) {
		return srv.ForwardRun(t.Context(), &poolinternalv1.ForwardRunRequest{Method: method, Request: body, Caller: c, Tenant: tenant})
	}
	runner := &poolinternalv1.Caller{KeyId: "key_1", Role: "runner", Permissions: []string{string(auth.RunExecute)}}
	resp, err := ask(runner, auth.DefaultTenant, poolv1.PoolService_GetRun_FullMethodName)
	require.NoError(t, err)
	var got poolv1.GetRunResponse
	require.NoError(t, proto.Unmarshal(resp.GetResponse(), &got))
	require.Equal(t, "h1", got.GetRun().GetHost())

	_, err = ask(&poolinternalv1.Caller{KeyId: "key_2", Role: "reader", Permissions: []string{string(auth.AuditRead)}}, auth.DefaultTenant, poolv1.PoolService_GetRun_FullMethodName)
	rftestutil.RequireStatus(t, err, codes.PermissionDenied)
	_, err = ask(&poolinternalv1.Caller{KeyId: "key_3", Permissions: []string{string(auth.RunExecute)}, KeyTenant: "acme"}, auth.DefaultTenant, poolv1.PoolService_GetRun_FullMethodName)
	rftestutil.RequireStatus(t, err, codes.PermissionDenied)
	_, err = ask(runner, "acme", poolv1.PoolService_GetRun_FullMethodName)
	rftestutil.RequireStatus(t, err, codes.NotFound) // the tenant travels: acme has no run r1
	_, err = ask(runner, auth.DefaultTenant, poolv1.PoolService_PutDocument_FullMethodName)
	rftestutil.RequireStatus(t, err, codes.InvalidArgument)
	_, err = ask(nil, auth.DefaultTenant, poolv1.PoolService_GetRun_FullMethodName)
	rftestutil.RequireStatus(t, err, codes.InvalidArgument)

	// An agent token decides its own run's approvals (its front door put them to the client's
	// user), and no other run's.
	_, err = h1.StartRun(h.ctx, "", "g", 0, "r2")
	require.NoError(t, err)
	require.NoError(t, h1.tokens.PutAgentToken(h.ctx, store.AgentToken{ID: "tok_1", Tenant: auth.DefaultTenant, RunID: "r1", Agent: "a", Hash: "h",
		ExpireTime: time.Now().Add(time.Hour)}))
	token := &poolinternalv1.Caller{AgentToken: "tok_1", Permissions: []string{string(auth.RunExecute)}, KeyTenant: auth.DefaultTenant}
	for _, run := range []string{"r1", "r2"} {
		body, err = proto.Marshal(&poolv1.DenyCallRequest{RunId: run, ApprovalId: "ap-1"})
		require.NoError(t, err)
		_, err = ask(token, auth.DefaultTenant, poolv1.PoolService_DenyCall_FullMethodName)
		want := map[string]codes.Code{"r1": codes.NotFound, "r2": codes.PermissionDenied}[run] // r1 has no approval ap-1
		rftestutil.RequireStatus(t, err, want, run)
	}
}

// TestEtcdDownIsUnavailable: with etcd out of reach, a pool host on etcd answers a run's start
// UNAVAILABLE naming etcd, as the registry and the publisher do, not INTERNAL; and a request
// without a deadline is not held for as long as etcd is gone (etcdstore.RequestTimeout).
func TestEtcdDownIsUnavailable(t *testing.T) {
	for name, deadline := range map[string]bool{"a request with a deadline": true, "a request without one": false} {
		t.Run(name, func(t *testing.T) {
			cluster := etcdtest.Start(t, 1)
			h := newHarness(t, harnessOpts{noImage: true})
			h.server("docs", nil)
			h.publishSurface("g", nil, pinned.Tool{Server: "docs", Tool: "read_file", Description: "Read."})
			p := openHost(t, h, cluster, cluster.Root(), "h1", 0)
			defer p.Close(context.Background())

			cluster.Kill(0)
			defer cluster.Restart(0) // before Close, which hands the host's runs back through etcd
			ctx := h.ctx
			if deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(h.ctx, 3*time.Second)
				defer cancel()
			}
			_, err := NewServer(p).StartRun(ctx, &poolv1.StartRunRequest{GraphId: "g"})
			require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), "etcd")
		})
	}
}
