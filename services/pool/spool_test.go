package pool

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// TestPoolMovesAnOlderOutboxIntoItsSpool: records an older pool left in pool.db's outbox are
// forwarded after an upgrade, and leave pool.db.
func TestPoolMovesAnOlderOutboxIntoItsSpool(t *testing.T) {
	var left []string
	h := newHarness(t, harnessOpts{noImage: true, beforeOpen: func(dir string) {
		db, err := bolt.Open(filepath.Join(dir, "pool.db"), 0o600, &bolt.Options{Timeout: time.Second})
		require.NoError(t, err)
		old, err := audit.NewSpool(audit.SpoolConfig{DB: db, Bucket: string(store.LegacyOutboxBucket), Sink: rftestutil.NewAuditRecorder(), Producer: "pool"})
		require.NoError(t, err)
		for i := range 3 {
			tc := audit.ToolCallAttempt{RunID: "run-old", CallID: fmt.Sprint("call-", i), Attempt: 1, ToolName: "echo"}
			tc.Succeeded()
			r := audit.NewToolCallRecord("pool", "default", tc)
			require.NoError(t, old.Enqueue(t.Context(), r))
			left = append(left, r.ID)
		}
		require.NoError(t, db.Close())
	}})
	require.NoError(t, h.pool.Spool().Flush(h.ctx))
	var got []string
	for _, r := range h.audit.Records() {
		if r.Kind == audit.KindToolCall && r.ToolCall.RunID == "run-old" {
			got = append(got, r.ID)
		}
	}
	require.Equal(t, left, got)
}
