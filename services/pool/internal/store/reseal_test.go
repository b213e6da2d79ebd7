package store

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/secretbox"
)

// rotationBoxes are the boxes of the key files "A", "B, A" and "B".
func rotationBoxes(t *testing.T) (a, ba, b *secretbox.Box) {
	t.Helper()
	ka, kb := bytes.Repeat([]byte{0xa1}, 32), bytes.Repeat([]byte{0xb2}, 32)
	var err error
	a, err = secretbox.NewKeys(ka)
	require.NoError(t, err)
	ba, err = secretbox.NewKeys(kb, ka)
	require.NoError(t, err)
	b, err = secretbox.NewKeys(kb)
	require.NoError(t, err)
	return a, ba, b
}

func tokenCtx(tenant, user, ref string) []byte {
	return []byte("token/" + tenant + "/" + user + "/" + ref)
}
func verifierCtx(hash string) []byte { return []byte("verifier/" + hash) }
func clientCtx(issuer, redirectURI string) []byte {
	return []byte("client/" + issuer + "\n" + redirectURI)
}

// TestResealSignIns: a user's token, a pending sign-in's verifier and a client's secret sealed
// under key A are re-sealed under B with the key file "B, A", on bbolt and on etcd (where the
// pending sign-in keeps its lease); a value that does not decode is left as it is and stops
// nothing; a second re-seal finds nothing left.
func TestResealSignIns(t *testing.T) {
	ctx := t.Context()
	a, ba, onlyB := rotationBoxes(t)
	r := Resealer{Reseal: ba.Reseal, Token: tokenCtx, Verifier: verifierCtx, Client: clientCtx}
	const issuer, cb = "https://auth.example.com", "https://pool.example.com/v1/oauth/callback"
	cluster := etcdtest.Start(t, 1)
	e, err := OpenEtcd(ctx, cluster.Client(t, "pool"), cluster.Root())
	require.NoError(t, err)
	b, err := Open(filepath.Join(t.TempDir(), "pool.db"))
	require.NoError(t, err)
	defer b.Close()

	type resealing interface {
		oauthStore
		ResealSignIns(ctx context.Context, r Resealer) (secretbox.ResealCount, error)
	}
	for name, tc := range map[string]struct {
		s       resealing
		garbage func()
	}{
		"bbolt": {b, func() {
			require.NoError(t, b.db.Update(func(tx *bolt.Tx) error {
				return tx.Bucket(oauthClientsBucket).Put([]byte("garbage"), []byte("{not json"))
			}))
		}},
		"etcd": {e, func() {
			_, err := e.cli.Put(ctx, e.space.Key(etcdOAuth, etcdOAuthClients, "garbage"), "{not json")
			require.NoError(t, err)
		}},
	} {
		t.Run(name, func(t *testing.T) {
			s := tc.s
			require.NoError(t, s.PutOAuthToken(ctx, "default", "alice", "tickets", a.Seal([]byte("alice-token"), tokenCtx("default", "alice", "tickets"))))
			require.NoError(t, s.PutSignInState(ctx, "h1", SignInState{Tenant: "default", User: "bob", Ref: "tickets",
				VerifierSealed: a.Seal([]byte("bob-verifier"), verifierCtx("h1")), ExpireTime: time.Now().Add(time.Hour)}, time.Now()))
			require.NoError(t, s.PutOAuthClient(ctx, OAuthClient{Issuer: issuer, RedirectURI: cb, ClientID: "c1", AuthMethod: "client_secret_basic",
				SecretSealed: a.Seal([]byte("client-secret"), clientCtx(issuer, cb))}))
			tc.garbage()

			n, err := s.ResealSignIns(ctx, r)
			require.NoError(t, err, "a value that does not decode stops nothing")
			require.Equal(t, secretbox.ResealCount{Resealed: 3}, n)
			n, err = s.ResealSignIns(ctx, r)
			require.NoError(t, err)
			require.Equal(t, secretbox.ResealCount{}, n, "nothing is left under A")

			tok, err := s.OAuthToken(ctx, "default", "alice", "tickets")
			require.NoError(t, err)
			plain, err := onlyB.Open(tok.Sealed, tokenCtx("default", "alice", "tickets"))
			require.NoError(t, err)
			require.Equal(t, "alice-token", string(plain))
			c, err := s.OAuthClient(ctx, issuer, cb)
			require.NoError(t, err)
			plain, err = onlyB.Open(c.SecretSealed, clientCtx(issuer, cb))
			require.NoError(t, err)
			require.Equal(t, "client-secret", string(plain))
			if s == e {
				resp, err := e.cli.Get(ctx, e.space.Key(etcdOAuth, etcdOAuthStates, "h1"))
				require.NoError(t, err)
				require.NotZero(t, resp.Kvs[0].Lease, "the pending sign-in keeps its lease")
			}
			st, err := s.TakeSignInState(ctx, "h1")
			require.NoError(t, err)
			plain, err = onlyB.Open(st.VerifierSealed, verifierCtx("h1"))
			require.NoError(t, err)
			require.Equal(t, "bob-verifier", string(plain))
		})
	}
}

// TestEtcdResealKeepsANewerToken: a re-seal commits only if the token is unchanged since it
// was read; a token another host stored meanwhile is read again and kept.
func TestEtcdResealKeepsANewerToken(t *testing.T) {
	ctx := t.Context()
	a, ba, onlyB := rotationBoxes(t)
	cluster := etcdtest.Start(t, 1)
	e, err := OpenEtcd(ctx, cluster.Client(t, "pool"), cluster.Root())
	require.NoError(t, err)
	require.NoError(t, e.PutOAuthToken(ctx, "default", "alice", "tickets", a.Seal([]byte("older"), tokenCtx("default", "alice", "tickets"))))
	key := e.oauthKey(etcdOAuthTokens, "default", "alice", "tickets")
	stale, err := e.cli.Get(ctx, key)
	require.NoError(t, err)
	require.NoError(t, e.PutOAuthToken(ctx, "default", "alice", "tickets", a.Seal([]byte("newer"), tokenCtx("default", "alice", "tickets"))))

	var n secretbox.ResealCount
	r := Resealer{Reseal: ba.Reseal, Token: tokenCtx, Verifier: verifierCtx, Client: clientCtx}
	require.NoError(t, e.resealKey(ctx, r, etcdOAuthTokens, "default/alice/tickets", stale.Kvs[0], &n))
	require.Equal(t, 1, n.Resealed)
	tok, err := e.OAuthToken(ctx, "default", "alice", "tickets")
	require.NoError(t, err)
	plain, err := onlyB.Open(tok.Sealed, tokenCtx("default", "alice", "tickets"))
	require.NoError(t, err)
	require.Equal(t, "newer", string(plain), "the newer token stands, re-sealed")
}
