package etcdstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	rpctypes "go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
)

// ErrorCodes are the gRPC codes of this package's errors, for the error table of every service
// that keeps its state in etcd (grpcserver.MergeCodes), so that each answers them alike.
var ErrorCodes = map[error]codes.Code{
	ErrUnavailable: codes.Unavailable,
	ErrContention:  codes.Aborted,
	// Neither is helped by trying again, which UNAVAILABLE would invite.
	ErrTooLarge: codes.ResourceExhausted,
	ErrDamaged:  codes.DataLoss,
}

// RequestTimeout bounds one store operation against etcd (its reads, its transaction and its
// retries): a cluster without quorum makes a request fail with a reason rather than hang.
const RequestTimeout = 10 * time.Second

// Get is one read outside a transaction, bounded by RequestTimeout as Retry bounds a write: a
// cluster out of reach fails it with ErrUnavailable (what names the read) rather than holding
// it as long as its caller waits, which, without a deadline, is for ever.
func Get(ctx context.Context, cli *clientv3.Client, what, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	resp, err := cli.Get(ctx, key, opts...)
	if err != nil {
		return nil, Unavailable(what, err)
	}
	return resp, nil
}

// ErrContention means a write lost its compare to other writers of the same keys every time
// it tried.
var ErrContention = errors.New("etcdstore: other writers kept changing the same keys; try again")

// maxAttempts bounds Retry. Every losing attempt means another writer committed, so the
// system as a whole progresses; a write that loses this often is told so.
const maxAttempts = 32

// Retry runs an optimistic transaction until it commits: attempt reads what it needs, builds
// a transaction whose compares say "nothing I read has changed" (mod revisions, or creation
// revision 0 for a key that must not exist) and commits it, returning true when it did and
// false when a compare failed, to be run again on fresh reads. Writes never take a lock held
// across replicas: the transaction that commits first wins, the others see its result.
//
// attempt's requests go only to a member that has a leader (clientv3.WithRequireLeader): one
// without refuses them before anything is proposed, and the attempt runs again, so a write
// issued while the cluster elects a new leader waits for it. Any other failure is returned:
// a request cut off in flight may have committed, and only its caller can tell.
func Retry(ctx context.Context, attempt func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	ctx = clientv3.WithRequireLeader(ctx)
	conflicts := 0
	for i := 0; ; i++ {
		ok, err := attempt(ctx)
		switch {
		case ok:
			return nil
		case err == nil:
			if conflicts++; conflicts == maxAttempts {
				return ErrContention
			}
		case errors.Is(err, rpctypes.ErrNoLeader):
			// An election is under way; the deadline above bounds the wait.
		default:
			return err
		}
		// Jittered and growing, so writers that collided do not collide again in step.
		d := min(time.Millisecond<<min(i, 6), 50*time.Millisecond)
		t := time.NewTimer(rand.N(d) + time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return Unavailable("write", ctx.Err())
		case <-t.C:
		}
	}
}

// TxRecorder is what a transaction writes besides its change (audit.EtcdRecorder: the audit
// records of the change, in the producer's outbox).
type TxRecorder interface {
	Ops() []clientv3.Op
	Committed()
}

// Commit commits ops, with rec's operations, if every compare holds; it reports whether it
// did, and tells rec once it did.
func Commit(ctx context.Context, cli *clientv3.Client, cmps []clientv3.Cmp, ops []clientv3.Op, rec TxRecorder) (*clientv3.TxnResponse, error) {
	if rec != nil {
		ops = slices.Concat(ops, rec.Ops())
	}
	resp, err := cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return nil, Unavailable("commit", err)
	}
	if resp.Succeeded && rec != nil {
		rec.Committed()
	}
	return resp, nil
}

// Rewrite replaces one key's value by a transaction that commits only if the key is unchanged
// since kv was read: rewrite gets the value and returns the new one, or false to keep it as it
// is. When another writer changed the key first, the key is read again and rewrite called on
// what that writer left, so its write is never overwritten. A key with a lease keeps it.
// Rewrite reports whether the key was still there at the end: false when it was deleted, or
// its lease expired, meanwhile.
func Rewrite(ctx context.Context, cli *clientv3.Client, kv *mvccpb.KeyValue, rewrite func(val []byte) ([]byte, bool, error)) (exists bool, err error) {
	key := string(kv.Key)
	for {
		out, changed, err := rewrite(kv.Value)
		if err != nil || !changed {
			return true, err
		}
		var opts []clientv3.OpOption
		if kv.Lease != 0 {
			opts = append(opts, clientv3.WithLease(clientv3.LeaseID(kv.Lease)))
		}
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, string(out), opts...)).Else(clientv3.OpGet(key)).Commit()
		if kv.Lease != 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return false, nil
		}
		if err != nil {
			return true, Unavailable("rewrite "+key, err)
		}
		if resp.Succeeded {
			return true, nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return false, nil
		}
		kv = kvs[0]
	}
}
