package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/ringfence/ringfence/internal/etcdstore"
)

// Users' OAuth sign-ins in etcd, beside the runs, so that every pool host finishes any host's
// sign-in and sends the user's token wherever the user's runs are:
//
//	oauth/states/<sha256>                 a pending sign-in (SignInState JSON) under the hash of
//	                                      its state, bound to a lease that ends after it expires
//	oauth/pending/<tenant>/<user>/<ref>   the hash of that user's pending sign-in of the server,
//	                                      bound to the same lease
//	oauth/tokens/<tenant>/<user>/<ref>    the user's token, sealed by the pool as in bbolt
//	oauth/listings/<tenant>/<user>/<ref>  the Listing the server declared to the user
//	oauth/locks/<tenant>/<user>/<ref>/    the lock a refresh holds (concurrency.Mutex)
//	oauth/secrets_check                   the first host's seal of a fixed text, which every
//	                                      host's secrets key must open (SecretsCheck)
//
// Tenants, users and refs hold no "/" (ident), so these keys cannot run into each other.
const (
	etcdOAuth         = "oauth"
	etcdOAuthStates   = "states"
	etcdOAuthPending  = "pending"
	etcdOAuthTokens   = "tokens"
	etcdOAuthListings = "listings"
	etcdOAuthLocks    = "locks"
	etcdOAuthCheck    = "secrets_check"
	// oauthLockTTL is how long a refresh's lock outlives a pool host that died holding it.
	oauthLockTTL = 10
)

func (s *Etcd) oauthKey(kind, tenant, user, ref string) string {
	return s.space.Key(etcdOAuth, kind, tenant, user, ref)
}

// PutSignInState stores a new sign-in under the hash of its state and replaces the pending
// one of the same tenant, user and server, if any: one authorization URL is good at a time.
// Both keys live on a lease that ends a second after the sign-in expires (by now), so expired
// sign-ins leave etcd by themselves; TakeSignInState's caller checks the expiry all the same.
func (s *Etcd) PutSignInState(ctx context.Context, hash string, st SignInState, now time.Time) error {
	val, err := json.Marshal(st)
	if err != nil {
		return err
	}
	ttl := max(int64(math.Ceil(st.ExpireTime.Sub(now).Seconds()))+1, 1)
	lease, err := s.cli.Grant(ctx, ttl)
	if err != nil {
		return etcdstore.Unavailable("grant a sign-in's lease", err)
	}
	stateKey := s.space.Key(etcdOAuth, etcdOAuthStates, hash)
	pendingKey := s.oauthKey(etcdOAuthPending, st.Tenant, st.User, st.Ref)
	var replaced clientv3.LeaseID
	err = etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		resp, err := s.cli.Get(ctx, pendingKey)
		if err != nil {
			return false, etcdstore.Unavailable("read "+pendingKey, err)
		}
		cmp := clientv3.Compare(clientv3.CreateRevision(pendingKey), "=", 0)
		ops := []clientv3.Op{
			clientv3.OpPut(stateKey, string(val), clientv3.WithLease(lease.ID)),
			clientv3.OpPut(pendingKey, hash, clientv3.WithLease(lease.ID)),
		}
		replaced = 0
		if len(resp.Kvs) > 0 {
			kv := resp.Kvs[0]
			cmp = clientv3.Compare(clientv3.ModRevision(pendingKey), "=", kv.ModRevision)
			if old := string(kv.Value); old != hash {
				ops = append(ops, clientv3.OpDelete(s.space.Key(etcdOAuth, etcdOAuthStates, old)))
			}
			replaced = clientv3.LeaseID(kv.Lease)
		}
		c, err := etcdstore.Commit(ctx, s.cli, []clientv3.Cmp{cmp}, ops, nil)
		if err != nil {
			return false, err
		}
		return c.Succeeded, nil
	})
	if err != nil {
		return err
	}
	if replaced != 0 {
		// Nothing is bound to the replaced sign-in's lease any more; it would lapse anyway.
		_, _ = s.cli.Revoke(context.WithoutCancel(ctx), replaced)
	}
	return nil
}

// TakeSignInState removes and returns the sign-in whose state hashes to hash: a state is
// good once, whichever host the callback reaches (one delete wins, and only it reads the
// value). ErrNotFound when none is pending under it.
func (s *Etcd) TakeSignInState(ctx context.Context, hash string) (SignInState, error) {
	key := s.space.Key(etcdOAuth, etcdOAuthStates, hash)
	var taken *clientv3.DeleteResponse
	err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		resp, err := s.cli.Delete(ctx, key, clientv3.WithPrevKV())
		if err != nil {
			return false, etcdstore.Unavailable("take "+key, err)
		}
		taken = resp
		return true, nil
	})
	if err != nil {
		return SignInState{}, err
	}
	if len(taken.PrevKvs) == 0 {
		return SignInState{}, ErrNotFound
	}
	var st SignInState
	if err := json.Unmarshal(taken.PrevKvs[0].Value, &st); err != nil {
		return SignInState{}, fmt.Errorf("store: %s: %w", key, err)
	}
	// The lease holds the pending/ index too, if it still names this sign-in.
	if lease := clientv3.LeaseID(taken.PrevKvs[0].Lease); lease != 0 {
		_, _ = s.cli.Revoke(context.WithoutCancel(ctx), lease)
	}
	return st, nil
}

// PutOAuthToken stores a user's sealed token for a server, replacing the one before.
func (s *Etcd) PutOAuthToken(ctx context.Context, tenant, user, ref string, sealed []byte) error {
	key := s.oauthKey(etcdOAuthTokens, tenant, user, ref)
	return etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		_, err := s.cli.Put(ctx, key, string(sealed))
		return err == nil, etcdstore.Unavailable("write "+key, err)
	})
}

// ReplaceOAuthToken stores a user's new sealed token for a server if the stored one is still
// at old's revision; ErrTokenChanged when another was stored, or it was dropped, since.
func (s *Etcd) ReplaceOAuthToken(ctx context.Context, tenant, user, ref string, old SealedToken, sealed []byte) error {
	key := s.oauthKey(etcdOAuthTokens, tenant, user, ref)
	return s.ifTokenAt(ctx, key, old, clientv3.OpPut(key, string(sealed)))
}

// OAuthToken reads a user's sealed token for a server and its revision; ErrNotFound without
// one.
func (s *Etcd) OAuthToken(ctx context.Context, tenant, user, ref string) (SealedToken, error) {
	key := s.oauthKey(etcdOAuthTokens, tenant, user, ref)
	resp, err := etcdstore.Get(ctx, s.cli, "read "+key, key)
	if err != nil {
		return SealedToken{}, err
	}
	if len(resp.Kvs) == 0 {
		return SealedToken{}, ErrNotFound
	}
	return SealedToken{Sealed: resp.Kvs[0].Value, Revision: resp.Kvs[0].ModRevision}, nil
}

// LockOAuthToken holds a user's token of a server against every other holder, on any pool
// host, until unlock is called, or fails while it waits when ctx ends: ErrLockHeld when
// another holder kept it past ctx's deadline, etcdstore.ErrUnavailable when etcd could not be
// reached. The lock lives on a lease of its own, kept alive while this process lives: a host
// that dies holding it lets the others in oauthLockTTL seconds later.
func (s *Etcd) LockOAuthToken(ctx context.Context, tenant, user, ref string) (unlock func(), err error) {
	return s.lockOnLease(ctx, s.oauthKey(etcdOAuthLocks, tenant, user, ref), "a user's token")
}

// lockOnLease holds the concurrency.Mutex under key on a lease of its own, kept alive while
// this process lives and revoked by unlock (which deletes the lock's key): a host that dies
// holding it lets the others in oauthLockTTL seconds later.
//
// A wait whose deadline passed is not taken as proof that another holder kept the lock: the
// Mutex waits on a watch, and a watch on a cluster that went away waits quietly until the
// deadline too. So the lock is tried once more (one transaction, bounded by etcdstore.Bound):
// another holder there is ErrLockHeld, a lock found free is taken, and no answer from etcd is
// etcdstore.ErrUnavailable, as is any failure before the deadline (the lease's grant, a
// request of the Mutex).
func (s *Etcd) lockOnLease(ctx context.Context, key, what string) (unlock func(), err error) {
	session, err := concurrency.NewSession(s.cli, concurrency.WithTTL(oauthLockTTL), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, etcdstore.Unavailable("grant a lock's lease", err)
	}
	release := func() { _ = session.Close() }
	m := concurrency.NewMutex(session, key)
	err = m.Lock(ctx)
	if err == nil {
		return release, nil
	}
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		err = ctx.Err()
	case ctx.Err() == nil:
		err = etcdstore.Unavailable("lock "+what, err)
	default: // the wait's deadline passed
		err = m.TryLock(context.WithoutCancel(ctx))
		if err == nil {
			return release, nil
		}
		if errors.Is(err, concurrency.ErrLocked) {
			err = fmt.Errorf("%w: %s: %w", ErrLockHeld, what, ctx.Err())
		} else {
			err = etcdstore.Unavailable("lock "+what+" (its wait ended, and who holds it could not be read)", err)
		}
	}
	// Revoking the lease drops this waiter's key at once; with etcd away the revoke waits for
	// its bound, and the lease lapses by itself: the caller is not held for it.
	go release()
	return nil, err
}

// PutOAuthListing stores the listing a server declared to a user.
func (s *Etcd) PutOAuthListing(ctx context.Context, tenant, user, ref string, l Listing) error {
	val, err := json.Marshal(l)
	if err != nil {
		return err
	}
	key := s.oauthKey(etcdOAuthListings, tenant, user, ref)
	return etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		_, err := s.cli.Put(ctx, key, string(val))
		return err == nil, etcdstore.Unavailable("write "+key, err)
	})
}

// PutOAuthListingAt stores the listing a server declared to a user if the user's stored token
// is still at at's revision; ErrTokenChanged, storing nothing, when another was stored since
// or it was dropped (a listing never outlives its token).
func (s *Etcd) PutOAuthListingAt(ctx context.Context, tenant, user, ref string, at SealedToken, l Listing) error {
	val, err := json.Marshal(l)
	if err != nil {
		return err
	}
	return s.ifTokenAt(ctx, s.oauthKey(etcdOAuthTokens, tenant, user, ref), at,
		clientv3.OpPut(s.oauthKey(etcdOAuthListings, tenant, user, ref), string(val)))
}

// OAuthListing reads the listing a server declared to a user; ErrNotFound without one.
func (s *Etcd) OAuthListing(ctx context.Context, tenant, user, ref string) (Listing, error) {
	var l Listing
	err := s.getJSON(ctx, s.oauthKey(etcdOAuthListings, tenant, user, ref), &l)
	return l, err
}

// DropSignInAt is DropSignIn if the stored token is still at old's revision; ErrTokenChanged,
// dropping nothing, when another was stored since (or it is gone).
func (s *Etcd) DropSignInAt(ctx context.Context, tenant, user, ref string, old SealedToken) error {
	return s.ifTokenAt(ctx, s.oauthKey(etcdOAuthTokens, tenant, user, ref), old, s.dropOps(tenant, user, ref)...)
}

func (s *Etcd) dropOps(tenant, user, ref string) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpDelete(s.oauthKey(etcdOAuthTokens, tenant, user, ref)),
		clientv3.OpDelete(s.oauthKey(etcdOAuthListings, tenant, user, ref)),
	}
}

// ifTokenAt commits ops if the token at key is still at old's revision (a key that is gone
// has revision 0, which no read token has); ErrTokenChanged otherwise.
func (s *Etcd) ifTokenAt(ctx context.Context, key string, old SealedToken, ops ...clientv3.Op) error {
	if old.Revision == 0 {
		return errors.New("store: a token's compare needs the revision it was read at")
	}
	var changed bool
	err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		c, err := etcdstore.Commit(ctx, s.cli, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", old.Revision)}, ops, nil)
		if err != nil {
			return false, err
		}
		changed = !c.Succeeded
		return true, nil
	})
	if err == nil && changed {
		err = ErrTokenChanged
	}
	return err
}

// SecretsCheck returns the seal every pool host's secrets key must open to use the sign-ins
// the others sealed: the value under oauth/secrets_check, which the first host to ask stores
// (sealed, its own seal).
func (s *Etcd) SecretsCheck(ctx context.Context, sealed []byte) ([]byte, error) {
	key := s.space.Key(etcdOAuth, etcdOAuthCheck)
	var out []byte
	err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		c, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(sealed))).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return false, etcdstore.Unavailable("read or write "+key, err)
		}
		out = sealed
		if !c.Succeeded {
			out = c.Responses[0].GetResponseRange().Kvs[0].Value
		}
		return true, nil
	})
	return out, err
}

// SecretsCheckKey is where SecretsCheck keeps its seal, for an operator who replaced every
// host's key on purpose (and deletes it).
func (s *Etcd) SecretsCheckKey() string { return s.space.Key(etcdOAuth, etcdOAuthCheck) }
