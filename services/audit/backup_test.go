package audit

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// TestOnlyTheLeaderRecordsItsOwnBackup: ringfence-audit records its backups itself. With two
// instances sharing the chain in etcd the leader appends the record to the shared chain, and a
// standby refuses (UNAVAILABLE: it is a standby) instead of writing to its copy alone, which
// would fork it from the chain.
func TestOnlyTheLeaderRecordsItsOwnBackup(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cli, root := cluster.Client(t, "audit"), cluster.Root()
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

	rec := func() audit.Record {
		return audit.NewAdminRecord("audit", "", audit.AdminEvent{ActorKeyID: "key_a", ActorRole: "admin", Action: "backup", ResourceType: "data_dir", ResourceID: "ringfence-audit"})
	}
	err := standby.Record(t.Context(), rec())
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "this instance is a standby: the leader appends")
	require.Zero(t, standby.HeadSeq(), "the standby's copy is left as it was")

	require.NoError(t, leader.Record(t.Context(), rec()))
	require.EqualValues(t, 1, leader.HeadSeq())
}
