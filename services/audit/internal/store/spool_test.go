package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
)

// service stands in for the audit service as the spool sees it: it can be stopped
// (the store closed) and restarted on the same file, and can lose acknowledgements.
type service struct {
	mu       sync.Mutex
	store    *Store
	loseAcks atomic.Int32
}

func (v *service) Append(ctx context.Context, recs []audit.Record) error {
	v.mu.Lock()
	s := v.store
	v.mu.Unlock()
	if s == nil {
		return errors.New("audit service unavailable")
	}
	if _, err := s.Append(ctx, recs); err != nil {
		return err
	}
	if v.loseAcks.Load() > 0 {
		v.loseAcks.Add(-1)
		return errors.New("connection reset before the reply")
	}
	return nil
}

func (v *service) set(s *Store) {
	v.mu.Lock()
	v.store = s
	v.mu.Unlock()
}

// TestSpoolAcrossAuditOutage stops the audit log while a registry-like producer keeps
// committing changes with their events and pool-like producers keep enqueuing; after
// the log returns, every event is in it exactly once, in order, and the chain verifies.
func TestSpoolAcrossAuditOutage(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "audit.db")
	svc := &service{}
	svc.set(openStore(t, logPath))

	producerDB, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = producerDB.Close() })
	spool, err := audit.NewSpool(audit.SpoolConfig{
		DB: producerDB, Bucket: "audit_outbox", Sink: svc, Producer: "registry",
		BatchSize: 64, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	runDone := make(chan error, 1)
	go func() { runDone <- spool.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-runDone)
	})

	var (
		adminIDs []string   // the registry's events, in commit order
		poolIDs  [][]string // each pool goroutine's events, in its order
	)
	poolIDs = make([][]string, 4)
	change := func(i int) {
		r := audit.NewAdminRecord("registry", "", audit.AdminEvent{
			ActorKeyID: "key-1", ActorRole: "admin", Action: audit.ActionUpdate, ResourceType: "mcp_server",
			ResourceID: fmt.Sprint("server-", i), Change: json.RawMessage(`{"headers":{"Authorization":"` + audit.SecretMask + `"}}`),
		})
		require.NoError(t, producerDB.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("servers"))
			if err != nil {
				return err
			}
			if err := b.Put([]byte(r.Admin.ResourceID), []byte("{}")); err != nil {
				return err
			}
			return spool.EnqueueTx(tx, r)
		}))
		adminIDs = append(adminIDs, r.ID)
	}
	poolBurst := func(from, n int) {
		var wg sync.WaitGroup
		for g := range poolIDs {
			wg.Go(func() {
				for i := from; i < from+n; i++ {
					r := toolRec(call{tenant: "t", run: fmt.Sprint("run-", g), server: "s", tool: "x"}, fmt.Sprint(g, "-", i))
					if !assertNoError(t, spool.Enqueue(context.Background(), r)) {
						return
					}
					poolIDs[g] = append(poolIDs[g], r.ID)
				}
			})
		}
		wg.Wait()
	}

	for i := range 20 {
		change(i)
	}
	poolBurst(0, 25)
	require.NoError(t, spool.Flush(t.Context()))

	// The audit service stops; changes continue and queue in the producer's file.
	stopped := svc.store
	svc.set(nil)
	require.NoError(t, stopped.Close())
	for i := 20; i < 60; i++ {
		change(i)
	}
	poolBurst(25, 50)
	require.Equal(t, 40+4*50, spool.Pending(), "everything produced during the outage waits in the outbox")

	// It comes back on the same file, and the first replies are lost on the way.
	svc.loseAcks.Store(3)
	svc.set(openStore(t, logPath))
	require.NoError(t, spool.Flush(t.Context()))

	s := svc.store
	var all []audit.Record
	token := ""
	for {
		page, err := s.List(t.Context(), Filter{}, MaxPageSize, token)
		require.NoError(t, err)
		all = append(all, recordsOf(page)...)
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	require.Len(t, all, len(adminIDs)+4*75, "every event exactly once")
	seen := make(map[string]bool)
	var gotAdmin []string
	gotPool := make([][]string, 4)
	for _, r := range all {
		require.False(t, seen[r.ID], "duplicate %s", r.ID)
		seen[r.ID] = true
		if r.Kind == audit.KindAdmin {
			gotAdmin = append(gotAdmin, r.ID)
			continue
		}
		var g int
		_, err := fmt.Sscanf(r.ToolCall.RunID, "run-%d", &g)
		require.NoError(t, err)
		gotPool[g] = append(gotPool[g], r.ID)
	}
	require.Equal(t, adminIDs, gotAdmin, "the registry's events in commit order")
	require.Equal(t, poolIDs, gotPool, "each pool producer's events in its order")
	head, _ := s.Head()
	requireVerified(t, s, head)
}
