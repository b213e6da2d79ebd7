package audit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// TestEtcdOutboxDownIsUnavailable: with etcd out of reach, a record added to a producer's
// transaction (which counts the outbox in etcd first) under a context without a deadline ends
// with etcdstore.ErrUnavailable, naming etcd and what to check, rather than wait for as long
// as etcd is away, so the producer's request answers UNAVAILABLE; once etcd is back, records
// commit with their change and are forwarded again.
func TestEtcdOutboxDownIsUnavailable(t *testing.T) {
	testEtcd = etcdtest.Start(t, 1)
	cluster := testEtcd
	t.Cleanup(func() { testEtcd = nil })
	env := newSpoolEnvOf(t, "etcd", nil)
	cli := env.spool.out.(*etcdOutbox).cli
	key := etcdstore.NewSpace(cluster.Root(), "registry").Key("servers", "docs")

	restart := cluster.Down(0)
	defer restart()
	r, err := env.spool.EtcdRecorder(t.Context()) // no deadline
	require.NoError(t, err)
	err = r.Record(toolRecord(1, "p"))
	require.ErrorIs(t, err, etcdstore.ErrUnavailable)
	require.Contains(t, err.Error(), "etcd")
	require.Contains(t, err.Error(), "store.etcd_endpoints", "names what to check")

	restart()
	rec := toolRecord(2, "p")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		ok, err := commitWith(t, cli, env.spool, key, rec)
		assert.NoError(c, err)
		assert.True(c, ok)
	}, 30*time.Second, 100*time.Millisecond, "records commit again once etcd is back")
	env.run(t)
	require.NoError(t, env.spool.Flush(t.Context()))
	require.Equal(t, []string{rec.ID}, ids(env.sink.records()))
}
