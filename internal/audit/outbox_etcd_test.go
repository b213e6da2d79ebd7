package audit

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// testEtcd is the cluster TestEtcdSpool starts for its subtests: one cluster, a prefix each.
var testEtcd *etcdtest.Cluster

func etcdSpoolConfig(t *testing.T, cfg *SpoolConfig) {
	t.Helper()
	require.NotNil(t, testEtcd, "spools in etcd are tested inside TestEtcdSpool")
	cfg.Etcd = &EtcdOutbox{Client: testEtcd.Client(t, "registry"), Prefix: etcdstore.NewSpace(testEtcd.Root(), "registry").Prefix("audit_outbox")}
	cfg.QuarantinePath = filepath.Join(t.TempDir(), "quarantine.jsonl")
}

// TestEtcdSpool runs the spool's behaviours against an outbox in a real three-member etcd
// cluster, and what only an outbox shared by replicas must do.
func TestEtcdSpool(t *testing.T) {
	testEtcd = etcdtest.Start(t, 3)
	t.Cleanup(func() { testEtcd = nil })
	for name, f := range map[string]func(*testing.T, string){
		"ForwardsInOrder":            testSpoolForwardsInOrder,
		"Outage":                     testSpoolOutage,
		"FailClosed":                 testSpoolFailClosed,
		"ContinueAndAlarm":           testSpoolContinueAndAlarm,
		"RequeuesQuarantinedRecords": testSpoolRequeuesQuarantinedRecords,
	} {
		t.Run(name, func(t *testing.T) { f(t, "etcd") })
	}
	t.Run("RecordCommitsWithTheChange", testEtcdRecordCommitsWithTheChange)
	t.Run("ReplicasShareTheOutbox", testEtcdReplicasShareTheOutbox)
	t.Run("OneTransactionsRecordsStayTogether", testEtcdOneTransactionsRecordsStayTogether)
}

// commitWith commits put (a change) with the recorder's records if key does not exist yet.
func commitWith(t *testing.T, cli *clientv3.Client, s *Spool, key string, recs ...Record) (bool, error) {
	t.Helper()
	r, err := s.EtcdRecorder(t.Context())
	require.NoError(t, err)
	for _, rec := range recs {
		if err := r.Record(rec); err != nil {
			return false, err
		}
	}
	txn, err := cli.Txn(t.Context()).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(append(r.Ops(), clientv3.OpPut(key, "change"))...).Commit()
	require.NoError(t, err)
	if txn.Succeeded {
		r.Committed()
	}
	return txn.Succeeded, nil
}

// testEtcdRecordCommitsWithTheChange: a record added to a transaction that does not commit is
// not in the outbox, one that commits is; a full outbox refuses the record before the change.
func testEtcdRecordCommitsWithTheChange(t *testing.T) {
	env := newSpoolEnvOf(t, "etcd", func(c *SpoolConfig) { c.MaxPending = 2 })
	cli := env.spool.out.(*etcdOutbox).cli
	key := etcdstore.NewSpace(testEtcd.Root(), "registry").Key("servers", "docs")
	first, second := toolRecord(1, "p"), toolRecord(2, "p")
	ok, err := commitWith(t, cli, env.spool, key, first)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = commitWith(t, cli, env.spool, key, second)
	require.NoError(t, err)
	require.False(t, ok, "the key exists: the change did not commit")
	n, err := env.spool.out.count()
	require.NoError(t, err)
	require.Equal(t, 1, n, "nor did its record")

	env.sink.down.Store(true)
	third := toolRecord(3, "p")
	require.NoError(t, env.spool.Enqueue(t.Context(), third))
	_, err = commitWith(t, cli, env.spool, key+"2", toolRecord(4, "p"))
	require.ErrorIs(t, err, ErrSpoolFull)
	resp, err := cli.Get(t.Context(), key+"2")
	require.NoError(t, err)
	require.Zero(t, resp.Count, "no change without its record")

	env.sink.down.Store(false)
	env.run(t)
	require.NoError(t, env.spool.Flush(t.Context()))
	require.Equal(t, []string{first.ID, third.ID}, ids(env.sink.records()))
}

// testEtcdReplicasShareTheOutbox: two replicas write records in their transactions; only one
// forwards (the other's forwarder is down, as if it crashed after its commits), and every
// record reaches the log once, in commit order.
func testEtcdReplicasShareTheOutbox(t *testing.T) {
	defer func(d time.Duration) { etcdOrphanCheck = d }(etcdOrphanCheck)
	etcdOrphanCheck = 50 * time.Millisecond
	prefix := etcdstore.NewSpace(testEtcd.Root(), "registry").Prefix("audit_outbox")
	sink := newFakeSink()
	open := func() (*Spool, *clientv3.Client) {
		cli := testEtcd.Client(t, "registry")
		s, err := NewSpool(SpoolConfig{Sink: sink, Producer: "registry", Etcd: &EtcdOutbox{Client: cli, Prefix: prefix},
			QuarantinePath: filepath.Join(t.TempDir(), "q.jsonl"), Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s, cli
	}
	a, cliA := open()
	b, cliB := open()
	var mu sync.Mutex
	var committed []string
	var wg sync.WaitGroup
	for i := range 20 {
		s, cli := a, cliA
		if i%2 == 1 {
			s, cli = b, cliB
		}
		wg.Go(func() {
			rec := toolRecord(i, "r")
			// Commit order is the order records are forwarded in: hold the lock across the
			// commit so the test knows it.
			mu.Lock()
			defer mu.Unlock()
			ok, err := commitWith(t, cli, s, fmt.Sprintf("%schange-%d", prefix, i), rec)
			require.NoError(t, err)
			require.True(t, ok)
			committed = append(committed, rec.ID)
		})
	}
	wg.Wait()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.NoError(t, a.Flush(t.Context()))
	require.Equal(t, committed, ids(sink.records()), "b's records too, in commit order")

	rec := toolRecord(99, "r")
	ok, err := commitWith(t, cliB, b, prefix+"change-99", rec)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, a.Flush(t.Context()), "a forwards b's record once its check for orphans finds it")
	require.Equal(t, append(committed, rec.ID), ids(sink.records()))
}

// testEtcdOneTransactionsRecordsStayTogether: records of one transaction share a revision;
// they are forwarded in the order written and never split across batches, even when the batch
// size is smaller than their number.
func testEtcdOneTransactionsRecordsStayTogether(t *testing.T) {
	env := newSpoolEnvOf(t, "etcd", func(c *SpoolConfig) { c.BatchSize = 3 })
	cli := env.spool.out.(*etcdOutbox).cli
	key := etcdstore.NewSpace(testEtcd.Root(), "registry").Key("servers", "x")
	var want []string
	var recs []Record
	for i := range 7 {
		r := toolRecord(i, "t")
		recs = append(recs, r)
		want = append(want, r.ID)
	}
	ok, err := commitWith(t, cli, env.spool, key, recs...)
	require.NoError(t, err)
	require.True(t, ok)
	last := toolRecord(8, "t")
	require.NoError(t, env.spool.Enqueue(t.Context(), last))
	want = append(want, last.ID)
	env.run(t)
	require.NoError(t, env.spool.Flush(t.Context()))
	require.Equal(t, want, ids(env.sink.records()))
	env.sink.mu.Lock()
	defer env.sink.mu.Unlock()
	require.Equal(t, len(want), env.sink.delivered, "nothing was sent twice")
}
