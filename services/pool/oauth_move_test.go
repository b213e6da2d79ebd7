package pool

import (
	"context"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// A pool host that moves from bbolt to etcd brings the sign-ins its pool.db kept, against the
// real authorization server and MCP server of oauth_test.go.

const movedLog = "moved the users' sign-ins kept in pool.db to etcd"

// openBolt opens a pool on bbolt with its pool.db at db and secrets key key, as a host
// before it moves; its caller closes it.
func (w *oauthWorld) openBolt(db string, key *secretbox.Box) *Service {
	return openPoolWith(w.t, w.harness, Config{DBPath: db, Secrets: key, OAuthCallbackURL: testCallback, Now: w.clock.Now, Elapsed: w.clock.Elapsed})
}

func (w *oauthWorld) tickets() *mcpserver.Resolved {
	w.t.Helper()
	res, err := w.reg.ResolveRegistration(w.ctx, "tickets")
	require.NoError(w.t, err)
	return res
}

// etcdValues is every value stored under root.
func etcdValues(t *testing.T, cluster *etcdtest.Cluster, root string) []string {
	t.Helper()
	resp, err := cluster.Client(t, "pool").Get(t.Context(), root, clientv3.WithPrefix())
	require.NoError(t, err)
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Value))
	}
	return out
}

// moving is a pool on bbolt where Alice signed in to tickets, about to move to etcd: its
// pool.db, the cluster and key space it moves to, and the log of every service.
type moving struct {
	*oauthWorld
	logs     *rftestutil.SyncBuffer
	cluster  *etcdtest.Cluster
	root, db string
	bolt     *Service // open; its caller closes it
}

func aliceOnBolt(t *testing.T) *moving {
	m := &moving{logs: &rftestutil.SyncBuffer{}, cluster: etcdtest.Start(t, 1), db: filepath.Join(t.TempDir(), "pool.db")}
	m.oauthWorld = oauthHarness(t, harnessOpts{logTo: m.logs})
	m.root = m.cluster.Root()
	m.bolt = m.openBolt(m.db, m.poolCfg.Secrets)
	m.signInOn(m.bolt, m.tickets())
	return m
}

// TestSignInsMoveToEtcdWithTheirHost: a user's sign-in, a client the pool registered for
// itself and a pending sign-in in a bbolt pool's pool.db; the host restarts on etcd. The
// user's token and listing, and the client, are in etcd, sealed as they were: a run calls
// with the token, a refresh works, the client's secret opens. The pending sign-in is not
// copied. pool.db is cleared, so a second start copies nothing (a token dropped in etcd
// since stays dropped), and a move back to bbolt finds no sign-in. No log line and no value
// in etcd holds a token or a secret in clear.
func TestSignInsMoveToEtcdWithTheirHost(t *testing.T) {
	w := aliceOnBolt(t)
	logs, cluster, root, db, p0 := w.logs, w.cluster, w.root, w.db, w.bolt
	key := w.poolCfg.Secrets
	tenant := auth.DefaultTenant
	res := w.tickets()
	before, err := p0.userToken(w.ctx, tenant, oauthtest.Alice, res)
	require.NoError(t, err)
	require.NotEmpty(t, before.RefreshToken)
	const clientSecret = "client-secret-of-the-pools-own-client"
	issuer := "https://auth.example.com"
	require.NoError(t, p0.oauth.PutOAuthClient(w.ctx, store.OAuthClient{Issuer: issuer, RedirectURI: testCallback, ClientID: "dyn-1",
		AuthMethod: authBasic, SecretSealed: key.Seal([]byte(clientSecret), clientContext(issuer, testCallback)), RegisterTime: w.clock.Now()}))
	var si *signInError
	require.ErrorAs(t, p0.beginSignIn(w.ctx, tenant, oauthtest.Bob, res, "", nil), &si, "Bob's sign-in is pending")
	require.NoError(t, p0.Close(context.Background()))

	h1 := w.openHost(cluster, root, "h1", db, key)
	require.Contains(t, logs.String(), movedLog+`, and cleared them from pool.db" tokens_copied=1 tokens_already_in_etcd=0 clients_copied=1 clients_already_in_etcd=0 pending_skipped=1`)
	run := w.startOn(h1, oauthtest.Alice)
	require.Equal(t, []string{"tickets__alpha", "tickets__whoami"}, w.toolsOn(h1, run), "the listing came along")
	got, err := w.whoamiOn(h1, run)
	require.NoError(t, err, "the token is served without a new sign-in")
	require.Equal(t, "whoami for "+oauthtest.Alice, got)
	w.clock.advance(5 * time.Minute) // the example server's tokens live 5 minutes
	after, err := h1.userToken(w.ctx, tenant, oauthtest.Alice, res)
	require.NoError(t, err)
	require.NotEqual(t, before.AccessToken, after.AccessToken, "refreshed on etcd")
	c, err := h1.oauth.OAuthClient(w.ctx, issuer, testCallback)
	require.NoError(t, err)
	opened, err := h1.openClient(c)
	require.NoError(t, err)
	require.Equal(t, "dyn-1", opened.id)
	require.Equal(t, clientSecret, opened.secret)
	_, err = h1.oauth.TakeSignInState(w.ctx, w.pendingHash(si.url))
	require.ErrorIs(t, err, store.ErrNotFound, "a pending sign-in is not copied")

	for _, secret := range []string{before.AccessToken, before.RefreshToken, after.AccessToken, after.RefreshToken, clientSecret} {
		require.NotContains(t, logs.String(), secret)
		for _, v := range etcdValues(t, cluster, root) {
			require.NotContains(t, v, secret)
		}
	}

	// Dropped in etcd, then the host starts again: nothing comes back from pool.db.
	at, err := h1.oauth.OAuthToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.NoError(t, h1.oauth.DropSignInAt(w.ctx, tenant, oauthtest.Alice, "tickets", at))
	require.NoError(t, h1.Close(context.Background()))
	h1 = w.openHost(cluster, root, "h1-again", db, key)
	_, err = h1.oauth.OAuthToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.ErrorIs(t, err, store.ErrNotFound, "copied once")
	require.Equal(t, 1, strings.Count(logs.String(), movedLog))
	require.NoError(t, h1.Close(context.Background()))

	// Back to bbolt: pool.db holds no sign-in.
	p := w.openBolt(db, key)
	defer p.Close(context.Background())
	_, err = p.oauth.OAuthToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.ErrorIs(t, err, store.ErrNotFound)
	_, err = p.oauth.OAuthClient(w.ctx, issuer, testCallback)
	require.ErrorIs(t, err, store.ErrNotFound)
}

// pendingHash is the hash a pending sign-in is stored under, from its authorization URL.
func (w *oauthWorld) pendingHash(authURL string) string {
	w.t.Helper()
	u, err := url.Parse(authURL)
	require.NoError(w.t, err)
	require.NotEmpty(w.t, u.Query().Get("state"))
	return stateHash(u.Query().Get("state"))
}

// TestSignInMoveKeepsANewerSignInInEtcd: the user signed in again on a host already on etcd
// before the bbolt host moved: the newer token stands, and pool.db is cleared all the same.
func TestSignInMoveKeepsANewerSignInInEtcd(t *testing.T) {
	w := aliceOnBolt(t)
	logs, cluster, root, db, p0 := w.logs, w.cluster, w.root, w.db, w.bolt
	key := w.poolCfg.Secrets
	tenant := auth.DefaultTenant
	res := w.tickets()
	_, older, err := p0.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.NoError(t, p0.Close(context.Background()))
	h2 := w.openHost(cluster, root, "h2", filepath.Join(t.TempDir(), "pool.db"), key)
	defer h2.Close(context.Background())
	w.signInOn(h2, res)
	_, newer, err := h2.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.NotEqual(t, older.AccessToken, newer.AccessToken)

	h1 := w.openHost(cluster, root, "h1", db, key)
	defer h1.Close(context.Background())
	_, kept, err := h1.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Equal(t, newer.AccessToken, kept.AccessToken, "the newer sign-in stands")
	require.Contains(t, logs.String(), "tokens_copied=0 tokens_already_in_etcd=1")
	local, err := h1.store.LocalSignIns(w.ctx)
	require.NoError(t, err)
	require.Empty(t, local.Tokens, "pool.db is cleared")
}

// TestSignInMoveNeedsTheKeyThatOpensThem: a host whose secrets key is not the one the hosts
// on etcd share, or does not open its pool.db's sign-ins, copies nothing, says why and how to
// fix it, and keeps them in pool.db for a start that can copy them.
func TestSignInMoveNeedsTheKeyThatOpensThem(t *testing.T) {
	logs := &rftestutil.SyncBuffer{}
	w := oauthHarness(t, harnessOpts{logTo: logs})
	cluster := etcdtest.Start(t, 1)
	shared := w.poolCfg.Secrets
	own, err := secretbox.LoadOrCreate(filepath.Join(t.TempDir(), "secrets.key"))
	require.NoError(t, err)
	tenant := auth.DefaultTenant
	res := w.tickets()

	for _, tc := range []struct {
		name string
		// key is the moving host's key; its pool.db's sign-ins are sealed with own.
		key  *secretbox.Box
		said string
	}{
		{"another key than the other hosts'", own, "this host's secrets key is not the one the pool hosts sharing etcd seal with"},
		{"a key that does not open them", shared, "some do not open with this host's secrets key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := cluster.Root()
			first := w.openHost(cluster, root, "first", filepath.Join(t.TempDir(), "pool.db"), shared)
			defer first.Close(context.Background())
			db := filepath.Join(t.TempDir(), "pool.db")
			p0 := w.openBolt(db, own)
			w.signInOn(p0, res)
			_, token, err := p0.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
			require.NoError(t, err)
			require.NoError(t, p0.Close(context.Background()))

			mark := len(logs.String())
			h := w.openHost(cluster, root, "moving", db, tc.key)
			said := logs.String()[mark:]
			require.Contains(t, said, "the users' sign-ins kept in pool.db were not copied to etcd: "+tc.said)
			require.NotContains(t, said, movedLog)
			require.NotContains(t, logs.String(), token.AccessToken)
			_, err = first.oauth.OAuthToken(w.ctx, tenant, oauthtest.Alice, "tickets")
			require.ErrorIs(t, err, store.ErrNotFound, "nothing copied")
			require.NoError(t, h.Close(context.Background()))

			p := w.openBolt(db, own)
			defer p.Close(context.Background())
			_, kept, err := p.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
			require.NoError(t, err, "kept in pool.db")
			require.Equal(t, token.AccessToken, kept.AccessToken)
		})
	}
}

// TestRunsOnBboltAreNamedWhenTheHostMovesToEtcd: run records are not moved to etcd, so a host
// that moves with running runs in its pool.db says how many and what to do, at every start
// until they are ended.
func TestRunsOnBboltAreNamedWhenTheHostMovesToEtcd(t *testing.T) {
	w := aliceOnBolt(t)
	w.startOn(w.bolt, oauthtest.Alice)
	require.NoError(t, w.bolt.Close(context.Background()))
	h1 := w.openHost(w.cluster, w.root, "h1", w.db, w.poolCfg.Secrets)
	require.NoError(t, h1.Close(context.Background()))
	require.Contains(t, w.logs.String(), `pool.db holds running or paused runs from store.backend=bbolt, which are not moved to etcd`)
	require.Regexp(t, `not moved to etcd.*" runs=1\n`, w.logs.String())
}
