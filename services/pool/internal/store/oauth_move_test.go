package store

import (
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/ident"
)

// TestSignInsCopyFromBoltToEtcd: a pool.db's tokens (with their listings) and clients are
// read as stored, copied into etcd only where etcd holds none of their key, and cleared from
// pool.db.
func TestSignInsCopyFromBoltToEtcd(t *testing.T) {
	ctx := t.Context()
	cluster := etcdtest.Start(t, 1)
	e, err := OpenEtcd(ctx, cluster.Client(t, "pool"), cluster.Root())
	require.NoError(t, err)
	b, err := Open(filepath.Join(t.TempDir(), "pool.db"))
	require.NoError(t, err)
	defer b.Close()

	listing := Listing{SignIn: "fp", Tools: map[string]string{"alpha": "h1"}, ListTime: time.Unix(10, 0).UTC()}
	require.NoError(t, b.PutOAuthToken(ctx, "default", "alice", "tickets", []byte("sealed-a")))
	require.NoError(t, b.PutOAuthListing(ctx, "default", "alice", "tickets", listing))
	require.NoError(t, b.PutOAuthToken(ctx, "default", "bob", "tickets", []byte("sealed-b")))
	require.NoError(t, b.PutOAuthListing(ctx, "default", "carol", "tickets", listing)) // no token: left out
	client := OAuthClient{Issuer: "https://auth.example.com", RedirectURI: "https://pool.example.com/v1/oauth/callback", ClientID: "c1", AuthMethod: "none"}
	require.NoError(t, b.PutOAuthClient(ctx, client))
	require.NoError(t, b.PutSignInState(ctx, "hash", SignInState{Tenant: "default", User: "dave", Ref: "tickets", ExpireTime: time.Now().Add(time.Hour)}, time.Now()))

	local, err := b.LocalSignIns(ctx)
	require.NoError(t, err)
	require.Equal(t, LocalSignIns{
		Tokens: []LocalToken{
			{Tenant: "default", User: "alice", Ref: "tickets", Sealed: []byte("sealed-a"), Listing: &listing},
			{Tenant: "default", User: "bob", Ref: "tickets", Sealed: []byte("sealed-b")},
		},
		Clients: []OAuthClient{client},
		Pending: 1,
	}, local)

	// Bob signed in on a host on etcd already, and a listing of no token is there for Alice.
	require.NoError(t, e.PutOAuthToken(ctx, "default", "bob", "tickets", []byte("sealed-b-newer")))
	require.NoError(t, e.PutOAuthListing(ctx, "default", "alice", "tickets", Listing{SignIn: "stale"}))
	created, err := e.CopySignIn(ctx, local.Tokens[0])
	require.NoError(t, err)
	require.True(t, created)
	created, err = e.CopySignIn(ctx, local.Tokens[1])
	require.NoError(t, err)
	require.False(t, created, "bob's newer token stands")
	created, err = e.CopyOAuthClient(ctx, client)
	require.NoError(t, err)
	require.True(t, created)
	created, err = e.CopyOAuthClient(ctx, OAuthClient{Issuer: client.Issuer, RedirectURI: client.RedirectURI, ClientID: "c2"})
	require.NoError(t, err)
	require.False(t, created, "the client in etcd stands")

	tok, err := e.OAuthToken(ctx, "default", "alice", "tickets")
	require.NoError(t, err)
	require.Equal(t, []byte("sealed-a"), tok.Sealed, "sealed as stored")
	l, err := e.OAuthListing(ctx, "default", "alice", "tickets")
	require.NoError(t, err)
	require.Equal(t, listing, l, "the listing goes with its token")
	tok, err = e.OAuthToken(ctx, "default", "bob", "tickets")
	require.NoError(t, err)
	require.Equal(t, []byte("sealed-b-newer"), tok.Sealed)
	c, err := e.OAuthClient(ctx, client.Issuer, client.RedirectURI)
	require.NoError(t, err)
	require.Equal(t, client, c)

	require.NoError(t, b.ClearSignIns(ctx))
	local, err = b.LocalSignIns(ctx)
	require.NoError(t, err)
	require.Equal(t, LocalSignIns{}, local)
	_, err = b.OAuthListing(ctx, "default", "carol", "tickets")
	require.ErrorIs(t, err, ErrNotFound, "cleared too")
}

// TestTwoHostsCopyTheSameSignIn: two hosts copying a sign-in of the same user and server at
// once: one creates it, the other finds it there.
func TestTwoHostsCopyTheSameSignIn(t *testing.T) {
	ctx := t.Context()
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	var created [2]bool
	var errs [2]error
	var wg sync.WaitGroup
	for i := range created {
		e, err := OpenEtcd(ctx, cluster.Client(t, "pool"), root)
		require.NoError(t, err)
		wg.Go(func() {
			created[i], errs[i] = e.CopySignIn(ctx, LocalToken{Tenant: "default", User: "alice", Ref: "tickets", Sealed: []byte{byte('a' + i)}})
		})
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.NotEqual(t, created[0], created[1], "exactly one created it")
	e, err := OpenEtcd(ctx, cluster.Client(t, "pool"), root)
	require.NoError(t, err)
	tok, err := e.OAuthToken(ctx, "default", "alice", "tickets")
	require.NoError(t, err)
	winner := 0
	if created[1] {
		winner = 1
	}
	require.Equal(t, []byte{byte('a' + winner)}, tok.Sealed, "the one that created it stands")
}

// TestLocalSignInsSkipWhatNoPoolWrites: a pool.db damaged or altered to hold sign-ins no pool
// writes (a token under a key of four parts, or with a user or server that is no valid name, a
// NUL in it; a listing or a client that does not decode) is read without them, each named with
// its reason, rather than fail every start on etcd; the valid token moves (without its broken
// listing), and nothing is written outside the prefix.
func TestLocalSignInsSkipWhatNoPoolWrites(t *testing.T) {
	ctx := t.Context()
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	e, err := OpenEtcd(ctx, cluster.Client(t, "pool"), root)
	require.NoError(t, err)
	b, err := Open(filepath.Join(t.TempDir(), "pool.db"))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.PutOAuthToken(ctx, "default", "alice", "tickets", []byte("sealed-a")))
	require.NoError(t, b.db.Update(func(tx *bolt.Tx) error {
		for k, v := range map[string][]byte{
			"default/alice/tickets/extra": []byte("sealed-x"),
			"default/al ice/tickets":      []byte("sealed-y"),
			"default/bob/tick\x00ets":     []byte("sealed-z"),
		} {
			if err := tx.Bucket(oauthTokensBucket).Put([]byte(k), v); err != nil {
				return err
			}
		}
		if err := tx.Bucket(oauthListingsBucket).Put([]byte("default/alice/tickets"), []byte("{not json")); err != nil {
			return err
		}
		return tx.Bucket(oauthClientsBucket).Put([]byte("broken"), []byte("[1,2"))
	}))

	local, err := b.LocalSignIns(ctx)
	require.NoError(t, err, "a damaged entry does not stop the move")
	require.Equal(t, []LocalToken{{Tenant: "default", User: "alice", Ref: "tickets", Sealed: []byte("sealed-a")}}, local.Tokens)
	require.Empty(t, local.Clients)
	require.ElementsMatch(t, []SkippedSignIn{
		{Bucket: string(oauthTokensBucket), Key: `"default/alice/tickets/extra"`, Reason: "its key is not <tenant>/<user>/<server>"},
		{Bucket: string(oauthTokensBucket), Key: `"default/al ice/tickets"`, Reason: "its user is no user name (" + ident.User.Pattern() + ")"},
		{Bucket: string(oauthTokensBucket), Key: `"default/bob/tick\x00ets"`, Reason: "its server is no server ref (" + ident.Ref.Pattern() + ")"},
		{Bucket: string(oauthListingsBucket), Key: `"default/alice/tickets"`, Reason: "it does not decode as a listing; the token moves without it"},
		{Bucket: string(oauthClientsBucket), Key: `"broken"`, Reason: "it does not decode as an OAuth client; the pool registers one again when a user signs in"},
	}, local.Skipped)

	created, err := e.CopySignIn(ctx, local.Tokens[0])
	require.NoError(t, err)
	require.True(t, created)
	all, err := cluster.Client(t, "pool").Get(ctx, "\x00", clientv3.WithFromKey())
	require.NoError(t, err)
	for _, kv := range all.Kvs {
		k := string(kv.Key)
		require.True(t, strings.HasPrefix(k, root+"/"), "%q is outside the prefix %s", k, root)
		require.NotContains(t, k, "extra")
		require.NotContains(t, k, "\x00")
	}
	require.NoError(t, b.ClearSignIns(ctx))
	local, err = b.LocalSignIns(ctx)
	require.NoError(t, err)
	require.Equal(t, LocalSignIns{}, local, "cleared with the rest")
}
