package tests

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/testutil"
)

// BenchmarkPoolHosts measures tool calls a second in one deployment, each phase with
// benchRuns runs calling at once from their own goroutines (split binaries, mutual TLS, a real
// Docker engine, the fixture's echo):
//
//   - bbolt: one ringfence-pool on bbolt, every call to it;
//
//   - etcd-owner: two pool hosts on a three-member etcd cluster, the runs spread over them by
//     placement, every call sent to its run's owner;
//
//   - etcd-any: the same runs, every call sent to either host round-robin, so half are
//     forwarded to the owner over the internal plane.
//
//     go test -run '^$' -bench 'PoolHosts$' -benchtime 3000x ./tests/
func BenchmarkPoolHosts(b *testing.B) {
	d := startPoolHosts(b, "bolt")
	dial := func(addrs ...string) poolv1.PoolServiceClient {
		tlsCfg, err := mtls.CAOnlyConfig(filepath.Join(d.certs, "ca.pem"), "", mtls.Pool)
		require.NoError(b, err)
		target, opts := addrs[0], []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg))}
		if len(addrs) > 1 {
			target = "ringfence-bench:///pools"
			opts = append(opts, grpc.WithResolvers(staticResolver(addrs)), grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
		}
		conn, err := grpc.NewClient(target, opts...)
		require.NoError(b, err)
		b.Cleanup(func() { conn.Close() })
		return poolv1.NewPoolServiceClient(conn)
	}
	ctx := testutil.WithKey(context.Background(), adminKey)
	args, err := structpb.NewStruct(map[string]any{"text": "ping"})
	require.NoError(b, err)
	call := func(c poolv1.PoolServiceClient, run string) bool {
		res, err := c.CallTool(ctx, &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: "fx__echo", Arguments: args})
		if err != nil || res.GetResult() != "succeeded" {
			b.Errorf("call on %s: %v (%s)", run, err, res.GetResult())
			return false
		}
		return true
	}
	// start starts benchRuns runs through c and makes each one's first call (the spawn); it
	// returns each run's id and the client of its owner.
	start := func(c poolv1.PoolServiceClient, owner map[string]poolv1.PoolServiceClient) (ids []string, owners []poolv1.PoolServiceClient) {
		for range benchRuns {
			r, err := c.StartRun(ctx, &poolv1.StartRunRequest{GraphId: "hosts"})
			require.NoError(b, err)
			ids = append(ids, r.GetRun().GetRunId())
			o, ok := owner[r.GetRun().GetHost()]
			require.True(b, ok, "owner %q", r.GetRun().GetHost())
			owners = append(owners, o)
			require.True(b, call(o, ids[len(ids)-1]))
		}
		return ids, owners
	}
	measure := func(b *testing.B, ids []string, clients []poolv1.PoolServiceClient) {
		var next atomic.Int64
		var wg sync.WaitGroup
		b.ResetTimer()
		for i, id := range ids {
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) && call(clients[i], id) {
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	}

	bolt := dial(d.addr["bolt"])
	p1, p2, both := dial(d.addr["p1"]), dial(d.addr["p2"]), dial(d.addr["p1"], d.addr["p2"])
	boltIDs, boltOwners := start(bolt, map[string]poolv1.PoolServiceClient{"": bolt})
	ids, owners := start(both, map[string]poolv1.PoolServiceClient{"p1": p1, "p2": p2})
	anyHost := make([]poolv1.PoolServiceClient, len(ids))
	for i := range anyHost {
		anyHost[i] = both
	}
	b.Run("bbolt", func(b *testing.B) { measure(b, boltIDs, boltOwners) })
	b.Run("etcd-owner", func(b *testing.B) { measure(b, ids, owners) })
	b.Run("etcd-any", func(b *testing.B) { measure(b, ids, anyHost) })
}

// staticResolver resolves to addrs, as the CLI's list does.
func staticResolver(addrs []string) *manual.Resolver {
	r := manual.NewBuilderWithScheme("ringfence-bench")
	var state resolver.State
	for _, a := range addrs {
		host, _, _ := net.SplitHostPort(a)
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a, ServerName: host})
	}
	r.InitialState(state)
	return r
}
