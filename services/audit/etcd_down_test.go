package audit

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/audit/auditpb"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// TestEtcdDownIsUnavailable: with etcd out of reach, the audit log on etcd answers an append
// (Append, on the leader) and a read (List, which first reads the chain's head in etcd) that
// carry no deadline UNAVAILABLE, naming etcd and what to check, rather than wait for as long
// as etcd is away; once etcd is back it appends and reads again.
func TestEtcdDownIsUnavailable(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	svc, err := Open(Config{
		DBPath: filepath.Join(t.TempDir(), "audit.db"), Etcd: cluster.Client(t, "audit"), EtcdRoot: cluster.Root(), Instance: "a",
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Close() })
	require.Eventually(t, svc.shared.Leading, 30*time.Second, 10*time.Millisecond)
	record := func(i int) *auditinternalv1.AppendRequest {
		tc := audit.ToolCallAttempt{RunID: "run-1", CallID: fmt.Sprint("call-", i), Attempt: 1, ToolName: "echo"}
		tc.Succeeded()
		return &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(audit.NewToolCallRecord("pool", "acme", tc))}}
	}
	ctx := as("") // no deadline
	_, err = svc.Internal().Append(ctx, record(1))
	require.NoError(t, err)

	restart := cluster.Down(0)
	defer restart()
	// The write first: without etcd the leader's lease lapses after a while, and a standby
	// answers an append UNAVAILABLE naming the leader instead.
	_, err = svc.Internal().Append(ctx, record(2))
	etcdtest.RequireUnavailable(t, err, "a write")
	_, err = svc.List(ctx, &auditv1.ListRequest{})
	etcdtest.RequireUnavailable(t, err, "a read")

	restart()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := svc.Internal().Append(ctx, record(2))
		assert.NoError(c, err)
	}, 60*time.Second, 100*time.Millisecond, "the log appends again once etcd is back")
	list, err := svc.List(ctx, &auditv1.ListRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetRecords(), 2)
}
