package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The pool's side of OAuth sign-in: per tenant, user and server, the user's token (sealed by
// the caller: this file never sees it in clear), the tool listing the server declared to that
// user, and the pending sign-ins, each keyed by the SHA-256 of its state.

func userServerKey(tenant, user, ref string) []byte { return []byte(tenant + "/" + user + "/" + ref) }

// SignInState is one sign-in begun and not yet called back: who it is for and what the
// callback needs to finish it. The PKCE verifier is sealed by the caller.
type SignInState struct {
	Tenant string `json:"tenant"`
	User   string `json:"user"`
	Ref    string `json:"ref"`
	// SignIn is the fingerprint of the registration's sign-in settings when it began.
	SignIn        string `json:"sign_in"`
	Issuer        string `json:"issuer"`
	TokenURL      string `json:"token_url"`
	Resource      string `json:"resource"`
	IssAdvertised bool   `json:"iss_advertised,omitempty"`
	// ClientID and AuthMethod are the client the sign-in began as and how it authenticates at
	// the token endpoint: the exchange is made as the same client.
	ClientID       string `json:"client_id"`
	AuthMethod     string `json:"auth_method"`
	VerifierSealed []byte `json:"verifier_sealed"`
	// Scopes are the scopes the sign-in asks for: its token keeps them, so that a scope
	// challenge to the token asks for them together with the challenge's.
	Scopes []string `json:"scopes,omitempty"`
	// ActorKeyID, ActorKeyName and ActorRole name the key that asked for the sign-in (which
	// asserted the user), for the admin event of its completion.
	ActorKeyID   string    `json:"actor_key_id,omitempty"`
	ActorKeyName string    `json:"actor_key_name,omitempty"`
	ActorRole    string    `json:"actor_role,omitempty"`
	ExpireTime   time.Time `json:"expire_time"`
}

// PutSignInState stores a new sign-in under the hash of its state, and drops the sign-ins
// that expired by now and any other pending one of the same tenant, user and server: one
// authorization URL is good at a time, so the bucket holds at most one per user and server.
func (s *Store) PutSignInState(ctx context.Context, hash string, st SignInState, now time.Time) error {
	val, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(oauthStatesBucket)
		var drop [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var old SignInState
			if json.Unmarshal(v, &old) != nil || !old.ExpireTime.After(now) ||
				old.Tenant == st.Tenant && old.User == st.User && old.Ref == st.Ref {
				drop = append(drop, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range drop {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return b.Put([]byte(hash), val)
	})
}

// TakeSignInState removes and returns the sign-in whose state hashes to hash: a state is
// good once. ErrNotFound when none is pending under it.
func (s *Store) TakeSignInState(ctx context.Context, hash string) (SignInState, error) {
	var st SignInState
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(oauthStatesBucket)
		v := b.Get([]byte(hash))
		if v == nil {
			return ErrNotFound
		}
		if err := json.Unmarshal(v, &st); err != nil {
			return err
		}
		return b.Delete([]byte(hash))
	})
	return st, err
}

// ErrTokenChanged refuses a write or a drop of a user's token that was made against a token
// read before: another pool host (or another request) stored a new one since, which stands.
var ErrTokenChanged = errors.New("the user's token changed since it was read")

// ErrLockHeld means a lock (LockOAuthToken, LockOAuthClient) stayed held by another holder
// until the wait's context ended; it wraps that context's error. A wait that ended because
// etcd could not be reached is etcdstore.ErrUnavailable instead, never this.
var ErrLockHeld = errors.New("the lock stayed held by another holder for as long as the wait allowed")

// SealedToken is a user's token as stored (sealed by the pool) and the version it was read
// at, which ReplaceOAuthToken and DropSignInAt compare: etcd's mod revision of its key; bbolt
// compares the sealed bytes themselves (every seal has a fresh nonce, so equal bytes are the
// same write).
type SealedToken struct {
	Sealed   []byte
	Revision int64
}

// PutOAuthToken stores a user's sealed token for a server, replacing the one before.
func (s *Store) PutOAuthToken(ctx context.Context, tenant, user, ref string, sealed []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(oauthTokensBucket).Put(userServerKey(tenant, user, ref), sealed)
	})
}

// ReplaceOAuthToken stores a user's new sealed token for a server if the stored one is still
// the token read as old; ErrTokenChanged when another was stored, or it was dropped, since.
func (s *Store) ReplaceOAuthToken(ctx context.Context, tenant, user, ref string, old SealedToken, sealed []byte) error {
	key := userServerKey(tenant, user, ref)
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(oauthTokensBucket)
		if v := b.Get(key); v == nil || !bytes.Equal(v, old.Sealed) {
			return ErrTokenChanged
		}
		return b.Put(key, sealed)
	})
}

// OAuthToken reads a user's sealed token for a server; ErrNotFound without one.
func (s *Store) OAuthToken(ctx context.Context, tenant, user, ref string) (SealedToken, error) {
	var out SealedToken
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(oauthTokensBucket).Get(userServerKey(tenant, user, ref))
		if v == nil {
			return ErrNotFound
		}
		out.Sealed = bytes.Clone(v)
		return nil
	})
	return out, err
}

// LockOAuthToken holds a user's token of a server against every other holder until unlock is
// called, or fails while it waits when ctx ends (ErrLockHeld past its deadline, ctx's error
// when it is canceled): a refresh holds it, since a rotating refresh token is good once. One
// process holds a bbolt file, so a lock in memory is the lock of every holder.
func (s *Store) LockOAuthToken(ctx context.Context, tenant, user, ref string) (unlock func(), err error) {
	return s.oauthLocks.lock(ctx, string(userServerKey(tenant, user, ref)))
}

// keyLocks is a lock per key, each a channel of one slot so that a wait honours its context;
// a key's lock is forgotten once nobody holds or waits for it.
type keyLocks struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	slot  chan struct{}
	users int // holders and waiters
}

func (l *keyLocks) lock(ctx context.Context, key string) (func(), error) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = make(map[string]*keyLock)
	}
	k, ok := l.locks[key]
	if !ok {
		k = &keyLock{slot: make(chan struct{}, 1)}
		l.locks[key] = k
	}
	k.users++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if k.users--; k.users == 0 {
			delete(l.locks, key)
		}
		l.mu.Unlock()
	}
	select {
	case k.slot <- struct{}{}:
		return sync.OnceFunc(func() {
			<-k.slot
			release()
		}), nil
	case <-ctx.Done():
		release()
		return nil, lockWaitEnded(ctx)
	}
}

// lockWaitEnded is the error of a lock's wait that ctx ended while another held the lock:
// ErrLockHeld past its deadline, ctx's error as it is when it was canceled.
func lockWaitEnded(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrLockHeld, ctx.Err())
	}
	return ctx.Err()
}

// Listing is the tool listing a server declared to one user when it was last connected.
type Listing struct {
	// SignIn is the fingerprint of the sign-in settings it was taken under.
	SignIn string `json:"sign_in"`
	// Tools maps each tool's name to the hash of its declaration (mcpdecl).
	Tools    map[string]string `json:"tools"`
	ListTime time.Time         `json:"list_time"`
}

// PutOAuthListing stores the listing a server declared to a user.
func (s *Store) PutOAuthListing(ctx context.Context, tenant, user, ref string, l Listing) error {
	val, err := json.Marshal(l)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(oauthListingsBucket).Put(userServerKey(tenant, user, ref), val)
	})
}

// PutOAuthListingAt stores the listing a server declared to a user if the user's stored token
// is still the one read as at; ErrTokenChanged, storing nothing, when another was stored since
// or it was dropped (a listing never outlives its token).
func (s *Store) PutOAuthListingAt(ctx context.Context, tenant, user, ref string, at SealedToken, l Listing) error {
	val, err := json.Marshal(l)
	if err != nil {
		return err
	}
	key := userServerKey(tenant, user, ref)
	return s.db.Update(func(tx *bolt.Tx) error {
		if v := tx.Bucket(oauthTokensBucket).Get(key); v == nil || !bytes.Equal(v, at.Sealed) {
			return ErrTokenChanged
		}
		return tx.Bucket(oauthListingsBucket).Put(key, val)
	})
}

// OAuthListing reads the listing a server declared to a user; ErrNotFound without one.
func (s *Store) OAuthListing(ctx context.Context, tenant, user, ref string) (Listing, error) {
	var l Listing
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(oauthListingsBucket).Get(userServerKey(tenant, user, ref))
		if v == nil {
			return ErrNotFound
		}
		return json.Unmarshal(v, &l)
	})
	return l, err
}

// DropSignInAt deletes a user's token and listing of a server (its token was refused or
// revoked, or the server's sign-in settings changed: the user signs in again) if the stored
// token is still the one read as old; ErrTokenChanged, dropping nothing, when another was
// stored since (or it is gone).
func (s *Store) DropSignInAt(ctx context.Context, tenant, user, ref string, old SealedToken) error {
	key := userServerKey(tenant, user, ref)
	return s.db.Update(func(tx *bolt.Tx) error {
		tokens := tx.Bucket(oauthTokensBucket)
		if v := tokens.Get(key); v == nil || !bytes.Equal(v, old.Sealed) {
			return ErrTokenChanged
		}
		if err := tokens.Delete(key); err != nil {
			return err
		}
		return tx.Bucket(oauthListingsBucket).Delete(key)
	})
}
