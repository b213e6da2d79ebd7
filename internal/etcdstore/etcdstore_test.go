package etcdstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// mapMirror is the simplest mirror: key -> value.
type mapMirror struct {
	mu sync.Mutex
	m  map[string]string
}

func (mm *mapMirror) config(prefix string) etcdstore.MirrorConfig {
	return etcdstore.MirrorConfig{
		Prefix: prefix,
		Reset: func(kvs []*mvccpb.KeyValue) {
			mm.mu.Lock()
			defer mm.mu.Unlock()
			mm.m = make(map[string]string)
			for _, kv := range kvs {
				mm.m[string(kv.Key)] = string(kv.Value)
			}
		},
		Apply: func(evs []*clientv3.Event) {
			mm.mu.Lock()
			defer mm.mu.Unlock()
			for _, ev := range evs {
				if ev.Type == clientv3.EventTypeDelete {
					delete(mm.m, string(ev.Kv.Key))
				} else {
					mm.m[string(ev.Kv.Key)] = string(ev.Kv.Value)
				}
			}
		},
	}
}

func (mm *mapMirror) get(k string) (string, bool) {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	v, ok := mm.m[k]
	return v, ok
}

// TestMirrorReadsAreLinearizable: a write through one client is seen by a mirror fed through
// another as soon as Sync returns, with no wait in the test: Sync waits for the watch to reach
// the revision etcd had when it was called, also when the writes that moved the revision were
// outside the mirrored range (a progress notification then says the range is current).
func TestMirrorReadsAreLinearizable(t *testing.T) {
	c := etcdtest.Start(t, 3)
	writer, reader := c.Client(t, "registry"), c.Client(t, "publisher")
	space := etcdstore.NewSpace(c.Root(), "registry")
	mm := &mapMirror{}
	m, err := etcdstore.StartMirror(t.Context(), reader, mm.config(space.Prefix("servers")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })

	for i := range 50 {
		key := space.Key("servers", "s"+strconv.Itoa(i%5))
		_, err := writer.Put(t.Context(), key, strconv.Itoa(i))
		require.NoError(t, err)
		// Writes elsewhere move the revision past the range's last event.
		_, err = writer.Put(t.Context(), space.Key("other", strconv.Itoa(i)), "x")
		require.NoError(t, err)
		require.NoError(t, m.Sync(t.Context()))
		v, ok := mm.get(key)
		require.True(t, ok)
		require.Equal(t, strconv.Itoa(i), v)
	}
	_, err = writer.Delete(t.Context(), space.Key("servers", "s1"))
	require.NoError(t, err)
	require.NoError(t, m.Sync(t.Context()))
	_, ok := mm.get(space.Key("servers", "s1"))
	require.False(t, ok)
}

// TestMirrorSurvivesAKilledMember: with one member of three gone (the leader, without handing
// over), writes and linearizable reads go on through the others, and the mirror follows.
func TestMirrorSurvivesAKilledMember(t *testing.T) {
	c := etcdtest.Start(t, 3)
	cli := c.Client(t, "registry")
	space := etcdstore.NewSpace(c.Root(), "registry")
	mm := &mapMirror{}
	m, err := etcdstore.StartMirror(t.Context(), cli, mm.config(space.Prefix("keys")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	put := func(k, v string) {
		t.Helper()
		require.NoError(t, etcdstore.Retry(t.Context(), func(ctx context.Context) (bool, error) {
			_, err := cli.Put(ctx, space.Key("keys", k), v)
			return err == nil, err
		}))
	}
	put("a", "1")
	c.Kill(c.WaitLeader(t))
	c.WaitLeader(t)
	put("a", "2")
	put("b", "1")
	require.NoError(t, m.Sync(t.Context()))
	v, _ := mm.get(space.Key("keys", "a"))
	require.Equal(t, "2", v)
	_, ok := mm.get(space.Key("keys", "b"))
	require.True(t, ok)
}

// TestRetryCommitsEveryIncrementOnce: concurrent read-modify-write transactions through two
// clients, each comparing the mod revision it read, lose no update.
func TestRetryCommitsEveryIncrementOnce(t *testing.T) {
	c := etcdtest.Start(t, 3)
	clients := []*clientv3.Client{c.Client(t, "registry"), c.Client(t, "publisher")}
	key := etcdstore.NewSpace(c.Root(), "test").Key("counter")
	var wg sync.WaitGroup
	for w := range 8 {
		cli := clients[w%2]
		wg.Go(func() {
			for range 10 {
				require.NoError(t, etcdstore.Retry(t.Context(), func(ctx context.Context) (bool, error) {
					resp, err := cli.Get(ctx, key)
					if err != nil {
						return false, err
					}
					n, rev := 0, int64(0)
					if len(resp.Kvs) > 0 {
						n, _ = strconv.Atoi(string(resp.Kvs[0].Value))
						rev = resp.Kvs[0].ModRevision
					}
					txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
						Then(clientv3.OpPut(key, strconv.Itoa(n+1))).Commit()
					if err != nil {
						return false, err
					}
					return txn.Succeeded, nil
				}))
			}
		})
	}
	wg.Wait()
	resp, err := clients[0].Get(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, "80", string(resp.Kvs[0].Value))
}

// TestBlobsKeepLargeValuesWithTheirTransaction: a value larger than a chunk is stored in
// chunks that live only once the transaction pointing at them commits; chunks staged for a
// transaction that never commits go when their lease does.
func TestBlobsKeepLargeValuesWithTheirTransaction(t *testing.T) {
	c := etcdtest.Start(t, 3)
	cli := c.Client(t, "publisher")
	space := etcdstore.NewSpace(c.Root(), "publisher")
	blobs := etcdstore.NewBlobs(cli, space.Prefix("blobs"), 1000, 4096)
	ctx := t.Context()

	small := []byte("small value")
	st, err := blobs.Stage(ctx, "acme/g", small)
	require.NoError(t, err)
	require.Empty(t, st.Ops)
	got, err := blobs.Load(ctx, "acme/g", st.Value, 0)
	require.NoError(t, err)
	require.Equal(t, small, got)

	large := make([]byte, 4096*3+17)
	_, _ = rand.Read(large)
	st, err = blobs.Stage(ctx, "acme/g", large)
	require.NoError(t, err)
	require.Len(t, st.Ops, 4)
	_, err = cli.Txn(ctx).Then(append(st.Ops, clientv3.OpPut(space.Key("drafts", "acme/g"), string(st.Value)))...).Commit()
	require.NoError(t, err)
	resp, err := cli.Get(ctx, space.Key("drafts", "acme/g"))
	require.NoError(t, err)
	got, err = blobs.Load(ctx, "acme/g", resp.Kvs[0].Value, resp.Header.Revision)
	require.NoError(t, err)
	require.True(t, bytes.Equal(large, got))

	// Staged, never committed: revoking the lease (as its expiry would) removes the chunks;
	// the committed value's chunks, off the lease, stay.
	expired, err := blobs.Stage(ctx, "acme/g", large)
	require.NoError(t, err)
	chunks, err := cli.Get(ctx, space.Prefix("blobs"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Equal(t, int64(8), chunks.Count)
	require.NoError(t, blobs.Close())
	chunks, err = cli.Get(ctx, space.Prefix("blobs"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Equal(t, int64(4), chunks.Count)
	got, err = blobs.Load(ctx, "acme/g", resp.Kvs[0].Value, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(large, got))
	// A transaction whose staged chunks are gone fails as expired staging: its writer stages
	// again rather than reporting an error.
	_, err = cli.Txn(ctx).Then(append(expired.Ops, clientv3.OpPut(space.Key("drafts", "acme/h"), string(expired.Value)))...).Commit()
	require.True(t, etcdstore.IsStagingExpired(err), "committing expired staging: %v", err)

	_, err = cli.Txn(ctx).Then(blobs.DeleteOps("acme/g", resp.Kvs[0].Value)...).Commit()
	require.NoError(t, err)
	chunks, err = cli.Get(ctx, space.Prefix("blobs"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, chunks.Count)

	_, err = blobs.Stage(ctx, "acme/g", make([]byte, 4096*etcdstore.MaxChunks+1))
	require.ErrorIs(t, err, etcdstore.ErrTooLarge)
	require.NotErrorIs(t, err, etcdstore.ErrUnavailable, "etcd is not the problem")
	require.ErrorContains(t, err, fmt.Sprintf("%d bytes, and it keeps at most %d", 4096*etcdstore.MaxChunks+1, 4096*etcdstore.MaxChunks))
}

// TestBlobsTellADamagedValue: a stored value that cannot be read back whole (a chunk gone, a
// chunk changed, a format unknown) is ErrDamaged naming where it is, never ErrUnavailable:
// trying again cannot help.
func TestBlobsTellADamagedValue(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t, "publisher")
	space := etcdstore.NewSpace(c.Root(), "publisher")
	blobs := etcdstore.NewBlobs(cli, space.Prefix("blobs"), 1000, 4096)
	ctx := t.Context()
	store := func(data []byte) []byte {
		st, err := blobs.Stage(ctx, "acme/g", data)
		require.NoError(t, err)
		_, err = cli.Txn(ctx).Then(st.Ops...).Commit()
		require.NoError(t, err)
		return st.Value
	}
	requireDamaged := func(val []byte, says string) {
		t.Helper()
		_, err := blobs.Load(ctx, "acme/g", val, 0)
		require.ErrorIs(t, err, etcdstore.ErrDamaged)
		require.NotErrorIs(t, err, etcdstore.ErrUnavailable)
		require.ErrorContains(t, err, says)
	}

	gone := store(make([]byte, 4096*3+17))
	chunks, err := cli.Get(ctx, space.Prefix("blobs"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	require.Len(t, chunks.Kvs, 4)
	_, err = cli.Delete(ctx, string(chunks.Kvs[3].Key))
	require.NoError(t, err)
	requireDamaged(gone, "has 3 of its 4 chunks (under "+space.Prefix("blobs")+"acme/g/")

	changed := store(make([]byte, 4096*2+1))
	chunks, err = cli.Get(ctx, space.Prefix("blobs"), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))
	require.NoError(t, err)
	_, err = cli.Put(ctx, string(chunks.Kvs[0].Key), "changed")
	require.NoError(t, err)
	requireDamaged(changed, "does not match its digest")

	requireDamaged([]byte{7, 'x'}, "a value of acme/g has unknown tag 7")
	requireDamaged(nil, "a value of acme/g is empty")
}

// TestMigrateRefusesANewerSchema: a space written by a newer binary is refused, naming it.
func TestMigrateRefusesANewerSchema(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t, "registry")
	space := etcdstore.NewSpace(c.Root(), "registry")
	ran := 0
	step := func(context.Context, *clientv3.Client, etcdstore.Space) error { ran++; return nil }
	require.NoError(t, etcdstore.Migrate(t.Context(), cli, space, []etcdstore.Migration{step}))
	require.NoError(t, etcdstore.Migrate(t.Context(), cli, space, []etcdstore.Migration{step}))
	require.Equal(t, 1, ran, "a migration runs once")
	require.NoError(t, etcdstore.Migrate(t.Context(), cli, space, []etcdstore.Migration{step, step}))
	require.Equal(t, 2, ran, "only the new step runs")
	err := etcdstore.Migrate(t.Context(), cli, space, []etcdstore.Migration{step})
	require.ErrorContains(t, err, fmt.Sprintf("%s has schema version 2, newer than this binary knows (1)", space))
}

// TestDialRefusesAClientWithoutACertificate: the members take mutual TLS only, and Dial says
// what to check instead of hanging.
func TestDialRefusesAClientWithoutACertificate(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cfg := c.Config("registry")
	cfg.CertFile, cfg.KeyFile = "", ""
	cfg.DialTimeout = 2 * time.Second
	_, err := etcdstore.Dial(t.Context(), cfg)
	require.ErrorContains(t, err, "did not answer within 2s")
	require.ErrorContains(t, err, "store.etcd_cert_file")
}

// TestRewriteNeverOverwritesANewerWrite: a value another writer changed between the read and
// the rewrite is read again and rewritten from what that writer left; a leased key keeps its
// lease; a key deleted or expired meanwhile is reported gone and not written back.
func TestRewriteNeverOverwritesANewerWrite(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t, "pool")
	ctx := t.Context()
	space := etcdstore.NewSpace(c.Root(), "test")
	get := func(key string) *mvccpb.KeyValue {
		resp, err := cli.Get(ctx, key)
		require.NoError(t, err)
		if len(resp.Kvs) == 0 {
			return nil
		}
		return resp.Kvs[0]
	}
	upper := func(v []byte) ([]byte, bool, error) { return bytes.ToUpper(v), !bytes.Equal(v, bytes.ToUpper(v)), nil }

	// Another writer between the read and the rewrite: its value is the one rewritten.
	key := space.Key("plain")
	_, err := cli.Put(ctx, key, "old")
	require.NoError(t, err)
	kv := get(key)
	var seen []string
	exists, err := etcdstore.Rewrite(ctx, cli, kv, func(v []byte) ([]byte, bool, error) {
		seen = append(seen, string(v))
		if len(seen) == 1 {
			_, err := cli.Put(ctx, key, "newer")
			require.NoError(t, err)
		}
		return upper(v)
	})
	require.NoError(t, err)
	require.True(t, exists)
	require.Equal(t, []string{"old", "newer"}, seen)
	require.Equal(t, "NEWER", string(get(key).Value))

	// A value kept as it is is not written.
	rev := get(key).ModRevision
	exists, err = etcdstore.Rewrite(ctx, cli, get(key), upper)
	require.NoError(t, err)
	require.True(t, exists)
	require.Equal(t, rev, get(key).ModRevision)

	// A leased key keeps its lease.
	lease, err := cli.Grant(ctx, 60)
	require.NoError(t, err)
	leased := space.Key("leased")
	_, err = cli.Put(ctx, leased, "state", clientv3.WithLease(lease.ID))
	require.NoError(t, err)
	exists, err = etcdstore.Rewrite(ctx, cli, get(leased), upper)
	require.NoError(t, err)
	require.True(t, exists)
	require.Equal(t, "STATE", string(get(leased).Value))
	require.Equal(t, int64(lease.ID), get(leased).Lease)

	// Deleted meanwhile: gone, and not written back.
	_, err = cli.Put(ctx, key, "lower")
	require.NoError(t, err)
	kv = get(key)
	_, err = cli.Delete(ctx, key)
	require.NoError(t, err)
	exists, err = etcdstore.Rewrite(ctx, cli, kv, upper)
	require.NoError(t, err)
	require.False(t, exists)
	require.Nil(t, get(key))

	// Its lease expired meanwhile: gone, and not written back without one.
	_, err = cli.Put(ctx, leased, "lower", clientv3.WithLease(lease.ID))
	require.NoError(t, err)
	kv = get(leased)
	_, err = cli.Revoke(ctx, lease.ID)
	require.NoError(t, err)
	require.Nil(t, get(leased))
	kv.ModRevision = 0 // compares equal to the absent key's: only the lease refuses the put
	require.NoError(t, err)
	exists, err = etcdstore.Rewrite(ctx, cli, kv, upper)
	require.NoError(t, err)
	require.False(t, exists)
	require.Nil(t, get(leased))
}
