package pool

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/secretbox"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

var (
	rotKeyA = strings.Repeat("a1", 32)
	rotKeyB = strings.Repeat("b2", 32)
)

// keyFile is a secrets key file holding lines, loaded as the server loads it.
func keyFile(t *testing.T, lines ...string) *secretbox.Box {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	box, err := secretbox.LoadOrCreate(path)
	require.NoError(t, err)
	return box
}

// TestRotatedKeyResealsSignIns: Alice's token, a client the pool registered for itself and
// Bob's pending sign-in, all sealed under key A; the pool starts with the key file "B, A"
// and then with "B" alone. Alice's token is still sent, the client's secret opens, and Bob's
// sign-in finishes: everything was re-sealed under B at the first of those starts, which logs
// how many and that A's line can go, without a value. On bbolt and on etcd (where the secrets
// check that every host's key must open is re-sealed too).
func TestRotatedKeyResealsSignIns(t *testing.T) {
	const clientSecret = "client-secret-of-the-pools-own-client"
	issuer := "https://auth.example.com"
	for _, backend := range []string{"bbolt", "etcd"} {
		t.Run(backend, func(t *testing.T) {
			logs := &rftestutil.SyncBuffer{}
			w := oauthHarness(t, harnessOpts{logTo: logs})
			db := filepath.Join(t.TempDir(), "pool.db")
			open := func(key *secretbox.Box) *Service { return w.openBolt(db, key) }
			if backend == "etcd" {
				cluster := etcdtest.Start(t, 1)
				root := cluster.Root()
				open = func(key *secretbox.Box) *Service { return w.openHost(cluster, root, "h1", db, key) }
			}
			tenant, res := auth.DefaultTenant, w.tickets()

			p := open(keyFile(t, rotKeyA))
			w.signInOn(p, res)
			before, err := p.userToken(w.ctx, tenant, oauthtest.Alice, res)
			require.NoError(t, err)
			require.NoError(t, p.oauth.PutOAuthClient(w.ctx, store.OAuthClient{Issuer: issuer, RedirectURI: testCallback, ClientID: "dyn-1",
				AuthMethod: authBasic, SecretSealed: p.cfg.Secrets.Seal([]byte(clientSecret), clientContext(issuer, testCallback)), RegisterTime: w.clock.Now()}))
			var si *signInError
			require.ErrorAs(t, p.beginSignIn(w.ctx, tenant, oauthtest.Bob, res, "", nil), &si, "Bob's sign-in is pending")
			require.NoError(t, p.Close(context.Background()))

			mark := len(logs.String())
			p = open(keyFile(t, rotKeyB, rotKeyA))
			got, err := p.userToken(w.ctx, tenant, oauthtest.Alice, res)
			require.NoError(t, err)
			require.Equal(t, before.AccessToken, got.AccessToken)
			require.NoError(t, p.Close(context.Background()))
			require.Contains(t, logs.String()[mark:], "resealed=3", "Alice's token, the client's secret, Bob's verifier")
			require.Contains(t, logs.String()[mark:], "every sealed value opens with the first key of")
			for _, hidden := range []string{before.AccessToken, before.RefreshToken, clientSecret, rotKeyA, rotKeyB} {
				require.NotContains(t, logs.String(), hidden)
			}

			mark = len(logs.String())
			p = open(keyFile(t, rotKeyB))
			defer p.Close(context.Background())
			require.NotContains(t, logs.String()[mark:], "is not the one the other pool hosts sharing etcd seal", "the secrets check opens with B alone")
			got, err = p.userToken(w.ctx, tenant, oauthtest.Alice, res)
			require.NoError(t, err, "Alice's token opens with B alone")
			require.Equal(t, before.AccessToken, got.AccessToken)
			c, err := p.oauth.OAuthClient(w.ctx, issuer, testCallback)
			require.NoError(t, err)
			opened, err := p.openClient(c)
			require.NoError(t, err)
			require.Equal(t, clientSecret, opened.secret)
			_, err = p.CompleteSignIn(w.ctx, callbackQuery(t, w.as.SignIn(t, si.url, oauthtest.Bob)))
			require.NoError(t, err, "Bob's verifier opens with B alone")
		})
	}
}

// TestRotatedKeyResealsSignInsLeftInPoolDB: a host on etcd whose pool.db kept Alice's sign-in
// (sealed under A) because its key was not the one the other hosts share (S) rotates its key to
// "B, A": that start re-seals the sign-in left in pool.db under B too, so the log line that A's
// line can go is true. With A's line gone and S given to the host ("S, B"), the next start
// moves the sign-in, and the host on S alone sends Alice's token. Left under A, it would have
// opened with no key of that file: not moved, and lost.
func TestRotatedKeyResealsSignInsLeftInPoolDB(t *testing.T) {
	rotKeyS := strings.Repeat("c3", 32)
	logs := &rftestutil.SyncBuffer{}
	w := oauthHarness(t, harnessOpts{logTo: logs})
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	tenant, res := auth.DefaultTenant, w.tickets()
	first := w.openHost(cluster, root, "first", filepath.Join(t.TempDir(), "pool.db"), keyFile(t, rotKeyS))
	defer first.Close(context.Background())

	db := filepath.Join(t.TempDir(), "pool.db")
	p := w.openBolt(db, keyFile(t, rotKeyA))
	w.signInOn(p, res)
	_, token, err := p.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.NoError(t, p.Close(context.Background()))
	h := w.openHost(cluster, root, "moving", db, keyFile(t, rotKeyA))
	require.NoError(t, h.Close(context.Background()))
	require.Contains(t, logs.String(), "the users' sign-ins kept in pool.db were not copied to etcd: this host's secrets key is not the one the pool hosts sharing etcd seal with")

	mark := len(logs.String())
	h = w.openHost(cluster, root, "moving", db, keyFile(t, rotKeyB, rotKeyA))
	require.NoError(t, h.Close(context.Background()))
	said := logs.String()[mark:]
	require.Contains(t, said, "not copied to etcd", "still not the other hosts' key: left in pool.db")
	require.Contains(t, said, "resealed=1", "Alice's token in pool.db")
	require.Contains(t, said, "every sealed value opens with the first key of")

	// A's line removed; the host given the other hosts' key first.
	mark = len(logs.String())
	h = w.openHost(cluster, root, "moving", db, keyFile(t, rotKeyS, rotKeyB))
	defer h.Close(context.Background())
	require.Contains(t, logs.String()[mark:], movedLog+`, and cleared them from pool.db" tokens_copied=1`)
	_, got, err := first.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err, "the host on S alone opens Alice's token")
	require.Equal(t, token.AccessToken, got.AccessToken)
	for _, hidden := range []string{token.AccessToken, token.RefreshToken, rotKeyA, rotKeyB, rotKeyS} {
		require.NotContains(t, logs.String(), hidden)
	}
}
