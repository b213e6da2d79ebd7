package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// oauthStore is what the pool asks of users' sign-ins (pool.OAuthStore).
type oauthStore interface {
	PutSignInState(ctx context.Context, hash string, st SignInState, now time.Time) error
	TakeSignInState(ctx context.Context, hash string) (SignInState, error)
	PutOAuthToken(ctx context.Context, tenant, user, ref string, sealed []byte) error
	OAuthToken(ctx context.Context, tenant, user, ref string) (SealedToken, error)
	ReplaceOAuthToken(ctx context.Context, tenant, user, ref string, old SealedToken, sealed []byte) error
	LockOAuthToken(ctx context.Context, tenant, user, ref string) (func(), error)
	PutOAuthListing(ctx context.Context, tenant, user, ref string, l Listing) error
	OAuthListing(ctx context.Context, tenant, user, ref string) (Listing, error)
	PutOAuthListingAt(ctx context.Context, tenant, user, ref string, at SealedToken, l Listing) error
	DropSignInAt(ctx context.Context, tenant, user, ref string, at SealedToken) error
	PutOAuthClient(ctx context.Context, c OAuthClient) error
	OAuthClient(ctx context.Context, issuer, redirectURI string) (OAuthClient, error)
	DropOAuthClient(ctx context.Context, issuer, redirectURI, clientID string) error
	LockOAuthClient(ctx context.Context, issuer, redirectURI string) (func(), error)
}

var (
	_ oauthStore = (*Store)(nil)
	_ oauthStore = (*Etcd)(nil)
)

// oauthBehaviours is the one table every store of sign-ins passes. Each behaviour gets two
// handles on the same records (two pool hosts on etcd; one file for bbolt, which one process
// holds).
var oauthBehaviours = map[string]func(t *testing.T, s, other oauthStore){
	"SignInStatesAreTakenOnce":           testSignInStatesAreTakenOnce,
	"ANewSignInReplacesThePendingOne":    testANewSignInReplacesThePendingOne,
	"ExpiredSignInsLeave":                testExpiredSignInsLeave,
	"TokensAreReplacedByCompareAndSwap":  testTokensAreReplacedByCompareAndSwap,
	"ListingsGoWithTheirToken":           testListingsGoWithTheirToken,
	"ListingsAreKeptOnlyWithTheirToken":  testListingsAreKeptOnlyWithTheirToken,
	"LockExcludesEveryHolder":            testLockExcludesEveryHolder,
	"ClientsAreKeptPerIssuerAndRedirect": testClientsAreKeptPerIssuerAndRedirect,
	"ClientLockExcludesEveryHolder":      testClientLockExcludesEveryHolder,
}

// TestOAuthStoreBehaviours runs the table against bbolt and against a three-member etcd
// cluster.
func TestOAuthStoreBehaviours(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	for name, test := range oauthBehaviours {
		for _, b := range runBackends(t, cluster) {
			t.Run(name+"/"+b.name, func(t *testing.T) {
				test(t, b.open(t).(oauthStore), b.open(t).(oauthStore))
			})
		}
	}
}

func signIn(user, ref string, expire time.Time) SignInState {
	return SignInState{Tenant: "acme", User: user, Ref: ref, SignIn: "fp", Issuer: "https://as.example", TokenURL: "https://as.example/token",
		Resource: "https://mcp.example/mcp", VerifierSealed: []byte("sealed verifier"), Scopes: []string{"tickets.read", "tickets.write"}, ActorKeyID: "key_1", ExpireTime: expire.UTC()}
}

func testSignInStatesAreTakenOnce(t *testing.T, s, other oauthStore) {
	ctx := t.Context()
	now := time.Now()
	st := signIn("alice", "tickets", now.Add(10*time.Minute))
	require.NoError(t, s.PutSignInState(ctx, "h1", st, now))
	got, err := other.TakeSignInState(ctx, "h1")
	require.NoError(t, err)
	require.Equal(t, st, got)
	_, err = s.TakeSignInState(ctx, "h1")
	require.ErrorIs(t, err, ErrNotFound, "good once")
	_, err = other.TakeSignInState(ctx, "unknown")
	require.ErrorIs(t, err, ErrNotFound)

	// Callbacks racing on every host: one takes it.
	require.NoError(t, s.PutSignInState(ctx, "h2", st, now))
	var wg sync.WaitGroup
	var taken atomic.Int32
	for i := range 8 {
		wg.Go(func() {
			h := map[bool]oauthStore{true: s, false: other}[i%2 == 0]
			_, err := h.TakeSignInState(ctx, "h2")
			if err == nil {
				taken.Add(1)
			} else if !errors.Is(err, ErrNotFound) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, taken.Load())
}

func testANewSignInReplacesThePendingOne(t *testing.T, s, other oauthStore) {
	ctx := t.Context()
	now := time.Now()
	later := now.Add(10 * time.Minute)
	require.NoError(t, s.PutSignInState(ctx, "alice-1", signIn("alice", "tickets", later), now))
	require.NoError(t, s.PutSignInState(ctx, "bob-1", signIn("bob", "tickets", later), now))
	require.NoError(t, s.PutSignInState(ctx, "alice-docs", signIn("alice", "docs", later), now))
	require.NoError(t, other.PutSignInState(ctx, "alice-2", signIn("alice", "tickets", later), now))

	_, err := s.TakeSignInState(ctx, "alice-1")
	require.ErrorIs(t, err, ErrNotFound, "replaced by alice's newer sign-in of tickets")
	for _, h := range []string{"alice-2", "bob-1", "alice-docs"} {
		_, err := other.TakeSignInState(ctx, h)
		require.NoError(t, err, h)
	}
	// Taken, it replaces nothing any more: the next one stands alone.
	require.NoError(t, s.PutSignInState(ctx, "alice-3", signIn("alice", "tickets", later), now))
	_, err = other.TakeSignInState(ctx, "alice-3")
	require.NoError(t, err)
}

// testExpiredSignInsLeave: a sign-in past its expiry leaves the store without being taken: on
// bbolt when the next sign-in is put, on etcd when its lease lapses (a second or two).
func testExpiredSignInsLeave(t *testing.T, s, other oauthStore) {
	ctx := t.Context()
	now := time.Now()
	require.NoError(t, s.PutSignInState(ctx, "stale", signIn("alice", "tickets", now.Add(-time.Minute)), now))
	require.NoError(t, s.PutSignInState(ctx, "fresh", signIn("bob", "tickets", now.Add(10*time.Minute)), now))
	require.Eventually(t, func() bool { return !pending(t, other, "stale") }, 15*time.Second, 100*time.Millisecond)
	_, err := other.TakeSignInState(ctx, "fresh")
	require.NoError(t, err, "one that has not expired stays")
}

// pending says whether a sign-in is stored under hash, without taking it.
func pending(t *testing.T, s oauthStore, hash string) bool {
	switch s := s.(type) {
	case *Store:
		var found bool
		require.NoError(t, s.db.View(func(tx *bolt.Tx) error {
			found = tx.Bucket(oauthStatesBucket).Get([]byte(hash)) != nil
			return nil
		}))
		return found
	case *Etcd:
		resp, err := s.cli.Get(t.Context(), s.space.Key(etcdOAuth, etcdOAuthStates, hash))
		require.NoError(t, err)
		return len(resp.Kvs) > 0
	}
	t.Fatalf("no way to read %T", s)
	return false
}

func testTokensAreReplacedByCompareAndSwap(t *testing.T, s, other oauthStore) {
	ctx := t.Context()
	_, err := s.OAuthToken(ctx, "acme", "alice", "tickets")
	require.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, s.PutOAuthToken(ctx, "acme", "alice", "tickets", []byte("sealed-1")))
	require.NoError(t, s.PutOAuthToken(ctx, "other", "alice", "tickets", []byte("other tenant's")))
	at1, err := other.OAuthToken(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	require.Equal(t, []byte("sealed-1"), at1.Sealed)

	// Two hosts refresh from the same read: the first write wins, the second is told.
	require.NoError(t, other.ReplaceOAuthToken(ctx, "acme", "alice", "tickets", at1, []byte("sealed-2")))
	require.ErrorIs(t, s.ReplaceOAuthToken(ctx, "acme", "alice", "tickets", at1, []byte("sealed-lost")), ErrTokenChanged)
	at2, err := s.OAuthToken(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	require.Equal(t, []byte("sealed-2"), at2.Sealed)

	// A new sign-in's token replaces whatever is stored; a refresh of the old one then loses.
	require.NoError(t, s.PutOAuthToken(ctx, "acme", "alice", "tickets", []byte("sealed-3")))
	require.ErrorIs(t, other.ReplaceOAuthToken(ctx, "acme", "alice", "tickets", at2, []byte("sealed-lost")), ErrTokenChanged)
	got, err := other.OAuthToken(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	require.Equal(t, []byte("sealed-3"), got.Sealed)

	// A token dropped meanwhile is not brought back by a refresh.
	require.NoError(t, s.DropSignInAt(ctx, "acme", "alice", "tickets", got))
	require.ErrorIs(t, other.ReplaceOAuthToken(ctx, "acme", "alice", "tickets", got, []byte("sealed-lost")), ErrTokenChanged)
	_, err = s.OAuthToken(ctx, "acme", "alice", "tickets")
	require.ErrorIs(t, err, ErrNotFound)
	kept, err := other.OAuthToken(ctx, "other", "alice", "tickets")
	require.NoError(t, err)
	require.Equal(t, []byte("other tenant's"), kept.Sealed, "tokens are per tenant")
}

func testListingsGoWithTheirToken(t *testing.T, s, other oauthStore) {
	ctx := t.Context()
	l := Listing{SignIn: "fp", Tools: map[string]string{"whoami": "sha256:1"}, ListTime: time.Now().UTC().Truncate(time.Second)}
	require.NoError(t, s.PutOAuthToken(ctx, "acme", "alice", "tickets", []byte("sealed-1")))
	require.NoError(t, s.PutOAuthListing(ctx, "acme", "alice", "tickets", l))
	got, err := other.OAuthListing(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	require.Equal(t, l, got)
	_, err = other.OAuthListing(ctx, "acme", "bob", "tickets")
	require.ErrorIs(t, err, ErrNotFound, "listings are per user")

	// A drop against a token read before another was stored drops nothing.
	stale, err := other.OAuthToken(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	require.NoError(t, s.PutOAuthToken(ctx, "acme", "alice", "tickets", []byte("sealed-2")))
	require.ErrorIs(t, other.DropSignInAt(ctx, "acme", "alice", "tickets", stale), ErrTokenChanged)
	_, err = s.OAuthListing(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)

	current, err := other.OAuthToken(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	require.NoError(t, other.DropSignInAt(ctx, "acme", "alice", "tickets", current))
	_, err = s.OAuthToken(ctx, "acme", "alice", "tickets")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.OAuthListing(ctx, "acme", "alice", "tickets")
	require.ErrorIs(t, err, ErrNotFound, "the listing goes with the token")
	require.ErrorIs(t, s.DropSignInAt(ctx, "acme", "alice", "tickets", current), ErrTokenChanged, "gone already")
}

// testListingsAreKeptOnlyWithTheirToken: a run's session keeps a user's listing current
// (PutOAuthListingAt) only while the token it read is the stored one: a listing taken with a
// token replaced since is not stored, and one taken after the user's sign-in was dropped does
// not bring the listing back.
func testListingsAreKeptOnlyWithTheirToken(t *testing.T, s, other oauthStore) {
	ctx := t.Context()
	connected := Listing{SignIn: "fp", Tools: map[string]string{"whoami": "sha256:1"}, ListTime: time.Now().UTC().Truncate(time.Second)}
	require.NoError(t, s.PutOAuthToken(ctx, "acme", "alice", "tickets", []byte("sealed-1")))
	require.NoError(t, s.PutOAuthListing(ctx, "acme", "alice", "tickets", connected))
	at1, err := other.OAuthToken(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)

	relisted := Listing{SignIn: "fp", Tools: map[string]string{"whoami": "sha256:1", "beta": "sha256:2"}, ListTime: connected.ListTime.Add(time.Minute)}
	require.NoError(t, other.PutOAuthListingAt(ctx, "acme", "alice", "tickets", at1, relisted))
	got, err := s.OAuthListing(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	require.Equal(t, relisted, got)

	// The user signed in again meanwhile: the old token's listing is not stored.
	require.NoError(t, s.PutOAuthToken(ctx, "acme", "alice", "tickets", []byte("sealed-2")))
	require.ErrorIs(t, other.PutOAuthListingAt(ctx, "acme", "alice", "tickets", at1, connected), ErrTokenChanged)
	got, err = s.OAuthListing(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	require.Equal(t, relisted, got)

	// Dropped meanwhile: no listing comes back.
	at2, err := other.OAuthToken(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	require.NoError(t, s.DropSignInAt(ctx, "acme", "alice", "tickets", at2))
	require.ErrorIs(t, other.PutOAuthListingAt(ctx, "acme", "alice", "tickets", at2, relisted), ErrTokenChanged)
	_, err = s.OAuthListing(ctx, "acme", "alice", "tickets")
	require.ErrorIs(t, err, ErrNotFound)
}

// requireLockHeld checks the answer of a wait for a lock that another holder kept past the
// wait's deadline: ErrLockHeld with that deadline, never etcd out of reach.
func requireLockHeld(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, ErrLockHeld, "held by the first holder until it unlocks")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, etcdstore.ErrUnavailable, "etcd answered")
}

func testLockExcludesEveryHolder(t *testing.T, s, other oauthStore) {
	ctx := t.Context()
	unlock, err := s.LockOAuthToken(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	// Another user's, or another server's, is not held.
	u2, err := other.LockOAuthToken(ctx, "acme", "bob", "tickets")
	require.NoError(t, err)
	u2()
	waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = other.LockOAuthToken(waitCtx, "acme", "alice", "tickets")
	cancel()
	requireLockHeld(t, err)
	unlock()

	// Holders on both handles at once: never two inside.
	var inside atomic.Int32
	var overlapped atomic.Bool
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			h := map[bool]oauthStore{true: s, false: other}[i%2 == 0]
			unlock, err := h.LockOAuthToken(ctx, "acme", "alice", "tickets")
			if err != nil {
				t.Error(err)
				return
			}
			if inside.Add(1) != 1 {
				overlapped.Store(true)
			}
			time.Sleep(5 * time.Millisecond) // a refresh's time inside, for another to overlap
			inside.Add(-1)
			unlock()
		})
	}
	wg.Wait()
	require.False(t, overlapped.Load(), "two holders at once")
}
