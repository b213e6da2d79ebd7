package etcdstore_test

import (
	"sync"
	"time"

	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// TestEveryRequestOfADialedClientIsBounded: a client from Dial sends a transaction as it was
// built (If, Then, Else), and with etcd out of reach every kind of request it sends under a
// context without a deadline (a read, a write, a transaction, a lease's grant, the etcd
// client's own concurrency.Session, and a listing) ends with an error instead of waiting for
// as long as etcd is away; once etcd is back it answers again.
func TestEveryRequestOfADialedClientIsBounded(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t, "registry")
	ctx := t.Context() // no deadline
	key := cluster.Root() + "/k"
	_, err := cli.Put(ctx, key, "v1")
	require.NoError(t, err)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(key), "=", "other")).
		Then(clientv3.OpPut(key, "v2")).Else(clientv3.OpGet(key)).Commit()
	require.NoError(t, err)
	require.False(t, resp.Succeeded)
	require.Equal(t, "v1", string(resp.Responses[0].GetResponseRange().GetKvs()[0].Value), "the Else branch ran")

	restart := cluster.Down(0)
	defer restart()
	requests := map[string]func() error{
		"get": func() error { _, err := cli.Get(ctx, key); return err },
		"put": func() error { _, err := cli.Put(ctx, key, "v3"); return err },
		"txn": func() error {
			_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), ">", 0)).Then(clientv3.OpDelete(key)).Commit()
			return err
		},
		"grant":   func() error { _, err := cli.Grant(ctx, 10); return err },
		"session": func() error { _, err := concurrency.NewSession(cli, concurrency.WithContext(ctx)); return err },
		"list":    func() error { _, _, err := etcdstore.List(ctx, cli, cluster.Root()+"/"); return err },
	}
	// At once: each waits for its bound.
	var mu sync.Mutex
	errs := map[string]error{}
	var wg sync.WaitGroup
	for name, request := range requests {
		wg.Go(func() {
			err := request()
			mu.Lock()
			defer mu.Unlock()
			errs[name] = err
		})
	}
	wg.Wait()
	for name := range requests {
		require.Error(t, errs[name], name)
	}
	require.ErrorIs(t, errs["list"], etcdstore.ErrUnavailable)
	require.Contains(t, errs["list"].Error(), "store.etcd_endpoints", "names what to check")

	restart()
	cluster.WaitLeader(t)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got, err := cli.Get(ctx, key)
		if assert.NoError(c, err) {
			assert.Equal(c, "v1", string(got.Kvs[0].Value))
		}
	}, 30*time.Second, 100*time.Millisecond)
}
