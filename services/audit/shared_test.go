package audit

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/audit/auditpb"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// TestInstancesShareTheLogThroughEtcd: two audit instances on one etcd cluster. One leads and
// appends; the other answers Append with UNAVAILABLE naming the leader, and reads everything
// the leader acknowledged. A leader whose election key is gone (its lease lapsed while it was
// paused) appends nothing, steps down, and the standby takes over: a producer's resend is
// answered with the original seqs, new records continue the chain, and both copies verify
// to the same head.
func TestInstancesShareTheLogThroughEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	cli := cluster.Client(t, "audit")
	root := cluster.Root()
	open := func(name string) *Service {
		svc, err := Open(Config{
			DBPath: filepath.Join(t.TempDir(), "audit.db"), Etcd: cli, EtcdRoot: root, Instance: name,
			Logger: slog.New(slog.DiscardHandler),
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = svc.Close() })
		return svc
	}
	a, b := open("a"), open("b")
	var leader, standby *Service
	require.Eventually(t, func() bool {
		switch {
		case a.shared.Leading():
			leader, standby = a, b
		case b.shared.Leading():
			leader, standby = b, a
		}
		return leader != nil
	}, 30*time.Second, 10*time.Millisecond)

	batch := func(from, n int) *auditinternalv1.AppendRequest {
		req := &auditinternalv1.AppendRequest{}
		for i := from; i < from+n; i++ {
			tc := audit.ToolCallAttempt{RunID: "run-1", CallID: fmt.Sprint("call-", i), Attempt: 1, ToolName: "echo"}
			tc.Succeeded()
			rec := audit.NewToolCallRecord("pool", "acme", tc)
			req.Records = append(req.Records, auditpb.RecordToProto(rec))
		}
		return req
	}
	ctx := t.Context()
	first := batch(0, 10)
	resp, err := leader.Internal().Append(ctx, first)
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, resp.GetSeqs())

	_, err = standby.Internal().Append(ctx, batch(10, 1))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	var info *errdetails.ErrorInfo
	for _, d := range status.Convert(err).Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	require.NotNil(t, info, "the refusal says why in an ErrorInfo")
	require.Equal(t, audit.NotLeaderReason, info.GetReason())
	require.Equal(t, leader.shared.Name(), info.GetMetadata()["leader"])

	// A read on the standby answers with everything acknowledged before it.
	require.NoError(t, standby.catchUp(ctx))
	head, _ := standby.store.Head()
	require.Equal(t, uint64(10), head)

	// The leader's key goes, as when its lease lapses while it is paused: its next append is
	// fenced off, and it writes nothing.
	key := leader.shared.Key()
	_, err = cli.Delete(ctx, key)
	require.NoError(t, err)
	_, err = leader.Internal().Append(ctx, batch(10, 5))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	got, err := cli.Get(ctx, root+"/audit/chain/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Equal(t, int64(10), got.Count, "a deposed leader appended nothing")

	require.Eventually(t, standby.shared.Leading, 30*time.Second, 10*time.Millisecond, "the standby takes over")
	require.False(t, leader.shared.Leading(), "the deposed leader stepped down")
	resp, err = standby.Internal().Append(ctx, first)
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, resp.GetSeqs(), "a resend to the new leader is idempotent")
	resp, err = standby.Internal().Append(ctx, batch(10, 5))
	require.NoError(t, err)
	require.Equal(t, []uint64{11, 12, 13, 14, 15}, resp.GetSeqs())

	var heads []string
	for _, s := range []*Service{leader, standby} {
		res, err := s.Verify(as(""), &auditv1.VerifyRequest{})
		require.NoError(t, err)
		require.True(t, res.GetOk(), "%+v", res)
		require.Equal(t, uint64(15), res.GetHeadSeq())
		heads = append(heads, res.GetHeadHash())
	}
	require.Equal(t, heads[0], heads[1], "both copies end at the same record")
}
