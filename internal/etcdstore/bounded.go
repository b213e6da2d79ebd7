package etcdstore

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// bound is the context of one request to etcd: at most RequestTimeout, or the caller's
// deadline when that comes first. The etcd client retries a request that found no member
// as long as its context allows, so a request whose context has no deadline would wait for
// as long as etcd is away.
func bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, RequestTimeout)
}

// Bound makes every request cli sends (a read, a write, a transaction, a lease's grant,
// revoke or single keep-alive) end within RequestTimeout, whatever its caller's context, so
// no code path, the etcd client's own helpers (concurrency.Session, Mutex, Election) included,
// can wait on etcd without a limit. Streams are left as they are: a watch and a lease's
// keep-alive live as long as their context, and whoever opens one decides when it ends. Dial
// bounds the clients it returns.
func Bound(cli *clientv3.Client) {
	if _, ok := cli.KV.(boundedKV); !ok {
		cli.KV = boundedKV{cli.KV}
	}
	if _, ok := cli.Lease.(boundedLease); !ok {
		cli.Lease = boundedLease{cli.Lease}
	}
}

type boundedKV struct{ clientv3.KV }

func (k boundedKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return k.KV.Put(ctx, key, val, opts...)
}

func (k boundedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return k.KV.Get(ctx, key, opts...)
}

func (k boundedKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return k.KV.Delete(ctx, key, opts...)
}

func (k boundedKV) Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return k.KV.Compact(ctx, rev, opts...)
}

func (k boundedKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return k.KV.Do(ctx, op)
}

func (k boundedKV) Txn(ctx context.Context) clientv3.Txn { return &boundedTxn{kv: k.KV, ctx: ctx} }

// boundedTxn gathers a transaction and sends it at Commit, whose context is bounded.
type boundedTxn struct {
	kv             clientv3.KV
	ctx            context.Context
	cmps           []clientv3.Cmp
	then, els      []clientv3.Op
	cif, cthen, ce bool
}

// If, Then and Else may each be called once, as on the etcd client's own Txn.
func (t *boundedTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	if t.cif || t.cthen || t.ce {
		panic("etcdstore: If after If, Then or Else in one transaction")
	}
	t.cif, t.cmps = true, cs
	return t
}

func (t *boundedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	if t.cthen || t.ce {
		panic("etcdstore: Then after Then or Else in one transaction")
	}
	t.cthen, t.then = true, ops
	return t
}

func (t *boundedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	if t.ce {
		panic("etcdstore: Else after Else in one transaction")
	}
	t.ce, t.els = true, ops
	return t
}

func (t *boundedTxn) Commit() (*clientv3.TxnResponse, error) {
	ctx, cancel := bound(t.ctx)
	defer cancel()
	return t.kv.Txn(ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
}

type boundedLease struct{ clientv3.Lease }

func (l boundedLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return l.Lease.Grant(ctx, ttl)
}

func (l boundedLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return l.Lease.Revoke(ctx, id)
}

func (l boundedLease) TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return l.Lease.TimeToLive(ctx, id, opts...)
}

func (l boundedLease) Leases(ctx context.Context) (*clientv3.LeaseLeasesResponse, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return l.Lease.Leases(ctx)
}

func (l boundedLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	return l.Lease.KeepAliveOnce(ctx, id)
}
