package pool

import (
	"context"
	"net"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"

	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/peers"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

var _ HostPeers = (*peers.PoolHosts)(nil)

// servedHosts opens pool hosts h1 and h2 on one etcd cluster, each serving its internal API on
// a loopback listener over mutual TLS with the pool's certificate and reaching the other with
// peers.PoolHosts, as ringfence-pool does; the harness's graph g has agent a binding fx's echo,
// sleep and progress (the fixture as a host process). It returns the harness, the hosts and
// the pool certificate's files.
func servedHosts(t *testing.T) (*harness, map[string]*Service, mtls.Files) {
	t.Helper()
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", func(r *registryv1.CreateServerRequest) { r.Description = "The fixture." }, "--runtime-tools", "--read-only-tools")
	h.publish("g", []string{"a"}, []imp{{server: "fx", agent: "a", tools: []string{"echo", "sleep", "progress"}}}, nil)
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	certs := t.TempDir()
	_, err := mtls.InitDevCA(certs, mtls.DevCAOptions{})
	require.NoError(t, err)
	files := mtls.Files{CertFile: filepath.Join(certs, mtls.Pool+".pem"), KeyFile: filepath.Join(certs, mtls.Pool+"-key.pem"), CAFile: filepath.Join(certs, "ca.pem")}
	tlsCfg, err := mtls.ServerConfig(files)
	require.NoError(t, err)
	hosts := map[string]*Service{}
	for _, id := range []string{"h1", "h2"} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		hostPeers := peers.NewPoolHosts(files, nil)
		t.Cleanup(func() { _ = hostPeers.Close() })
		p, err := Open(t.Context(), Config{DBPath: filepath.Join(t.TempDir(), "pool.db"), Etcd: cluster.Client(t, "pool"), EtcdRoot: root,
			HostID: id, HostAddr: lis.Addr().String(), HostLeaseTTL: 5 * time.Second, Peers: hostPeers,
			Registry: h.reg, Versions: h.versions, AuditSink: h.audit, Spawner: h.spawner(), Logger: h.pool.log,
			FrontDoorURL: "http://127.0.0.1:8000/mcp"})
		require.NoError(t, err)
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)))
		poolinternalv1.RegisterPoolInternalServiceServer(srv, NewInternalServer(p))
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(func() {
			srv.Stop()
			require.NoError(t, p.Close(context.Background()))
		})
		hosts[id] = p
	}
	return h, hosts, files
}

// TestAForwardedFrontDoorCallRelaysProgress: an MCP client at the front door of h2, for a run
// h1 owns, gets every progress report of the server under its own progress token, then the
// result, as a client of h1's front door does; the call is served and recorded once, on h1. A
// client that cancels the call through h2 cancels it at the server on h1. The owner checks the
// forwarded caller again, and a call forwarded to a host that does not own the run is not sent
// on.
func TestAForwardedFrontDoorCallRelaysProgress(t *testing.T) {
	h, hosts, files := servedHosts(t)
	owner, other := hosts["h1"], hosts["h2"]
	info, err := owner.StartRun(context.WithValue(h.ctx, forwardedKey{}, true), "", "g", 0, "fwd") // placed on h1
	require.NoError(t, err)
	require.Equal(t, "h1", info.Run.Host)
	_, secret, err := owner.CreateAgentToken(h.ctx, auth.DefaultTenant, "fwd", "a", 0)
	require.NoError(t, err)
	fd, err := other.FrontDoor(FrontDoorConfig{})
	require.NoError(t, err)
	srv := httptest.NewServer(fd)
	t.Cleanup(srv.Close)
	d := &door{h: h, fd: fd, srv: srv, url: srv.URL + "/mcp", run: "fwd"}

	for _, version := range []string{"2025-11-25", statelessProtocolVersion} {
		t.Run(version, func(t *testing.T) {
			d.requireProgressAndCancellation(t, secret, version, owner, owner, other)
		})
	}

	// ForwardCallTool as another pool host sends it, over mutual TLS.
	client := peers.NewPoolHosts(files, nil)
	t.Cleanup(func() { _ = client.Close() })
	call := &poolv1.CallToolRequest{RunId: "fwd", Agent: "a", Tool: "fx__echo", Arguments: &structpb.Struct{Fields: map[string]*structpb.Value{"text": structpb.NewStringValue("forwarded")}}}
	runner := &poolinternalv1.Caller{KeyId: "key_1", Role: "runner", Permissions: []string{string(auth.RunExecute)}}
	ask := func(host string, c *poolinternalv1.Caller) (*poolv1.CallToolResponse, error) {
		return client.ForwardCallTool(t.Context(), hosts[host].hosts.self.Addr,
			&poolinternalv1.ForwardCallToolRequest{Request: call, Caller: c, Tenant: auth.DefaultTenant},
			func(*poolinternalv1.CallProgress) { t.Error("no progress was asked for") })
	}
	resp, err := ask("h1", runner)
	require.NoError(t, err)
	require.Contains(t, resp.GetContent()[0].AsMap()["text"], "forwarded")
	// The owner records the call once, with the digest of the result the forwarding host got.
	require.NoError(t, owner.Spool().Flush(t.Context()))
	sum, size := grpcResultDigest(t, resp)
	var digests []string
	for _, r := range h.audit.Records() {
		if tc := r.ToolCall; tc != nil && tc.CallID == resp.GetCallId() && tc.Result == audit.ResultSucceeded {
			require.Equal(t, size, tc.ResultSize)
			digests = append(digests, tc.ResultDigest)
		}
	}
	require.Equal(t, []string{sum}, digests)
	require.Equal(t, sum, resp.GetResultDigest(), "the forwarded answer names the owner's digest")
	require.Equal(t, size, resp.GetResultSize())
	_, err = ask("h1", &poolinternalv1.Caller{KeyId: "key_2", Role: "reader", Permissions: []string{string(auth.AuditRead)}})
	rftestutil.RequireStatus(t, err, codes.PermissionDenied)
	_, err = ask("h1", &poolinternalv1.Caller{KeyId: "key_3", Permissions: []string{string(auth.RunExecute)}, KeyTenant: "acme"})
	rftestutil.RequireStatus(t, err, codes.PermissionDenied)
	_, err = ask("h1", nil)
	rftestutil.RequireStatus(t, err, codes.InvalidArgument)
	st := rftestutil.RequireStatus(t, func() error { _, err := ask("h2", runner); return err }(), codes.Unavailable)
	require.Contains(t, st.Message(), "send it again", "a forwarded call is never forwarded again")
}

// floodingOwner is the HostPeers of a host whose peer streams n progress reports as fast as it
// can, then the response: a hostile server's flood as the forwarding host sees it.
type floodingOwner struct {
	unreachable
	n    int
	sent chan struct{} // closed once every report was handed over
}

func (f floodingOwner) ForwardCallTool(_ context.Context, _ string, _ *poolinternalv1.ForwardCallToolRequest, progress func(*poolinternalv1.CallProgress)) (*poolv1.CallToolResponse, error) {
	for i := 1; i <= f.n; i++ {
		progress(&poolinternalv1.CallProgress{Progress: float64(i)})
	}
	close(f.sent)
	return &poolv1.CallToolResponse{CallId: "c1"}, nil
}

// TestAForwardingHostBoundsTheProgressItRelays: a client that takes its progress slowly holds
// up neither the owner's stream nor the response, and the reports it is not ready for are
// dropped, not queued: the forwarding host keeps no more of a flood than the local relay's
// queue.
func TestAForwardingHostBoundsTheProgressItRelays(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	h := newHarness(t, harnessOpts{noImage: true})
	owner := floodingOwner{n: 10_000, sent: make(chan struct{})}
	open := func(id string) *Service {
		p := openPoolWith(t, h, Config{DBPath: filepath.Join(t.TempDir(), "pool.db"), Etcd: cluster.Client(t, "pool"), EtcdRoot: root,
			HostID: id, HostAddr: "127.0.0.1:1", HostLeaseTTL: 5 * time.Second, Peers: owner})
		t.Cleanup(func() { require.NoError(t, p.Close(context.Background())) })
		return p
	}
	h1 := open("h1")
	open("h2")

	release := make(chan struct{})
	var got []float64 // the relay's goroutine writes it; read once forwardCall returned
	ctx := auth.WithTenancy(auth.WithPrincipal(h.ctx, auth.Principal{KeyID: "key_1", Permissions: []auth.Permission{auth.RunExecute}}),
		auth.Tenancy{Tenant: auth.DefaultTenant})
	ctx = spawner.WithProgress(ctx, func(p spawner.Progress) {
		<-release
		got = append(got, p.Progress)
	})
	done := make(chan error, 1)
	go func() {
		_, err := h1.forwardCall(ctx, &elsewhereError{host: "h2"}, &poolv1.CallToolRequest{RunId: "r1"})
		done <- err
	}()
	select {
	case <-owner.sent:
	case <-time.After(30 * time.Second):
		t.Fatal("the forwarding host held up the owner's stream while its client was busy")
	}
	close(release)
	require.NoError(t, <-done)
	require.NotEmpty(t, got)
	require.LessOrEqual(t, len(got), 16+1, "the relay's queue (spawner's progressQueue), and the report the client held")
	require.True(t, slices.IsSorted(got), "%v", got)
}
