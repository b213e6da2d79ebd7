package pool

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// Users' sign-ins shared by pool hosts on one etcd cluster, against the real authorization
// server and MCP server of oauth_test.go.

// oauthHosts is oauthHarness with pool hosts on one etcd cluster: open starts one with an id,
// the deployment's secrets key and the sign-in callback every host serves. Its caller closes
// it.
func oauthHosts(t testing.TB, opts ...harnessOpts) (*oauthWorld, func(id string) *Service) {
	w, open := oauthHostsKeyed(t, opts...)
	return w, func(id string) *Service { return open(id, w.poolCfg.Secrets) }
}

// oauthHostsKeyed is oauthHosts whose open takes the host's secrets key.
func oauthHostsKeyed(t testing.TB, opts ...harnessOpts) (*oauthWorld, func(id string, key *secretbox.Box) *Service) {
	w := oauthHarness(t, opts...)
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	return w, func(id string, key *secretbox.Box) *Service {
		return w.openHost(cluster, root, id, filepath.Join(t.TempDir(), "pool.db"), key)
	}
}

// openHost opens pool host id on cluster under root, with its pool.db at db and secrets key
// key; its caller closes it.
func (w *oauthWorld) openHost(cluster *etcdtest.Cluster, root, id, db string, key *secretbox.Box) *Service {
	return openPoolWith(w.t, w.harness, Config{DBPath: db, Etcd: cluster.Client(w.t, "pool"), EtcdRoot: root,
		HostID: id, HostAddr: "127.0.0.1:1", HostLeaseTTL: time.Second, Peers: unreachable{},
		Secrets: key, OAuthCallbackURL: testCallback, Now: w.clock.Now, Elapsed: w.clock.Elapsed})
}

// twoOAuthHosts is oauthHosts with hosts h1 and h2 open, closed when the test ends.
func twoOAuthHosts(t *testing.T) (w *oauthWorld, h1, h2 *Service) {
	w, open := oauthHosts(t)
	h1, h2 = open("h1"), open("h2")
	t.Cleanup(func() {
		require.NoError(t, h1.Close(context.Background()))
		require.NoError(t, h2.Close(context.Background()))
	})
	return w, h1, h2
}

// signInOn signs Alice in to tickets through host p, whether or not she has a token
// (connecting would use the one stored).
func (w *oauthWorld) signInOn(p *Service, res *mcpserver.Resolved) {
	w.t.Helper()
	var si *signInError
	require.ErrorAs(w.t, p.beginSignIn(w.ctx, auth.DefaultTenant, oauthtest.Alice, res, "", nil), &si)
	_, err := p.CompleteSignIn(w.ctx, callbackQuery(w.t, w.as.SignIn(w.t, si.url, oauthtest.Alice)))
	require.NoError(w.t, err)
}

// startOn starts a run of user on host p itself (as a forwarded StartRun is placed).
func (w *oauthWorld) startOn(p *Service, user string) string {
	w.t.Helper()
	info, err := p.StartRunFor(context.WithValue(w.ctx, forwardedKey{}, true), RunStart{Tenant: auth.DefaultTenant, GraphID: "g", User: user})
	require.NoError(w.t, err)
	return info.Run.ID
}

// toolsOn is the names agent a of run offers on host p.
func (w *oauthWorld) toolsOn(p *Service, run string) []string {
	w.t.Helper()
	l, err := p.ListAgentTools(w.ctx, run, auth.DefaultTenant, "a")
	require.NoError(w.t, err)
	var names []string
	for _, tool := range l.Tools {
		names = append(names, tool.Name)
	}
	return names
}

// whoamiOn calls tickets' whoami in run on host p and returns its answer.
func (w *oauthWorld) whoamiOn(p *Service, run string) (string, error) {
	res, err := p.CallTool(w.ctx, CallRequest{RunID: run, Tenant: auth.DefaultTenant, Agent: "a", Tool: "tickets__whoami", Arguments: []byte(`{}`)})
	if err != nil {
		return "", err
	}
	require.NotEmpty(w.t, res.Content)
	return res.Content[0]["text"].(string), nil
}

// TestSignInsAreSharedByPoolHosts: a sign-in begun on host h1 is finished by the callback
// reaching h2 (and only once, on either); runs on both hosts then call with the user's token
// and offer the tools the server declared to the user; a run re-homed from a host that
// stopped keeps them without a new sign-in; and a change of the server's sign-in settings
// drops the token and listing for every host.
func TestSignInsAreSharedByPoolHosts(t *testing.T) {
	w, open := oauthHosts(t)
	h1, h2 := open("h1"), open("h2")
	defer h2.Close(context.Background())
	tenant := auth.DefaultTenant

	c, err := h1.ConnectServer(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Equal(t, ConnectSignInRequired, c.State)
	q := callbackQuery(t, w.as.SignIn(t, c.AuthorizationURL, oauthtest.Alice))
	done, err := h2.CompleteSignIn(w.ctx, q)
	require.NoError(t, err, "the callback reached the other host")
	require.NoError(t, done.ConnectErr)
	require.Equal(t, []string{"alpha", "whoami"}, done.Tools)
	_, err = h1.CompleteSignIn(w.ctx, q)
	require.ErrorIs(t, err, errBadCallback, "a state is good once, on every host")

	runs := map[*Service]string{h1: w.startOn(h1, oauthtest.Alice), h2: w.startOn(h2, oauthtest.Alice)}
	for p, run := range runs {
		require.Equal(t, []string{"tickets__alpha", "tickets__whoami"}, w.toolsOn(p, run), p.host)
		got, err := w.whoamiOn(p, run)
		require.NoError(t, err, p.host)
		require.Equal(t, "whoami for "+oauthtest.Alice, got)
	}

	// h1 stops: its run fails on h2, which re-homes it; the user's token and listing follow.
	require.NoError(t, h1.Close(context.Background()))
	moved := runs[h1]
	require.Eventually(t, func() bool {
		info, err := h2.GetRun(w.ctx, moved, tenant)
		return err == nil && info.Run.State == StateFailed
	}, 10*time.Second, 50*time.Millisecond)
	_, err = h2.ResumeRun(w.ctx, moved, tenant)
	require.NoError(t, err)
	require.Equal(t, []string{"tickets__alpha", "tickets__whoami"}, w.toolsOn(h2, moved))
	got, err := w.whoamiOn(h2, moved)
	require.NoError(t, err, "no new sign-in on the run's new host")
	require.Equal(t, "whoami for "+oauthtest.Alice, got)

	// The settings change: the token and listing are dropped, and no host has them.
	_, err = w.reg.UpdateServer(w.ctx, &registryv1.UpdateServerRequest{Ref: "tickets", Transport: "streamable_http", Url: w.mcp.URL,
		Grants: []string{"process_spawn", "external_api_call"},
		Oauth: &registryv1.OAuthSignIn{ClientId: "ringfence", ClientSecretRef: "tickets-client", Scopes: []string{"openid", "offline_access", "profile"},
			AuthorizationServer: w.as.Issuer}})
	require.NoError(t, err)
	fresh := w.startOn(h2, oauthtest.Alice)
	require.Equal(t, []string{"mcp_oauth_connect_tickets"}, w.toolsOn(h2, fresh))
	_, err = w.whoamiOn(h2, fresh)
	requireRefused(t, err, reasonSignInRequired)
	c, err = h2.ConnectServer(w.ctx, tenant, oauthtest.Alice, "tickets") // reads the token, and drops it
	require.NoError(t, err)
	require.Equal(t, ConnectSignInRequired, c.State)
	h3 := open("h3")
	defer h3.Close(context.Background())
	_, err = h3.oauth.OAuthToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.ErrorIs(t, err, store.ErrNotFound, "dropped in etcd")
	_, err = h3.oauth.OAuthListing(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.ErrorIs(t, err, store.ErrNotFound)
}

// TestConcurrentRefreshesOnTwoHosts: requests on two hosts find the user's token due at once.
// The authorization server rotates refresh tokens (each is good once, and refreshing revokes
// the access token it replaced), so a second refresh of the same token would be refused and
// drop the user's sign-in: one host refreshes, and every request gets the token it stored.
func TestConcurrentRefreshesOnTwoHosts(t *testing.T) {
	w, h1, h2 := twoOAuthHosts(t)
	tenant := auth.DefaultTenant
	res, err := w.reg.ResolveRegistration(w.ctx, "tickets")
	require.NoError(t, err)
	w.signInOn(h1, res)
	before, err := h2.userToken(w.ctx, tenant, oauthtest.Alice, res)
	require.NoError(t, err)

	w.clock.advance(5 * time.Minute) // the example server's tokens live 5 minutes
	tokens := make([]string, 8)
	var wg sync.WaitGroup
	for i := range tokens {
		p := map[bool]*Service{true: h1, false: h2}[i%2 == 0]
		wg.Go(func() {
			tok, err := p.userToken(w.ctx, tenant, oauthtest.Alice, res)
			if err != nil {
				t.Error(err)
				return
			}
			tokens[i] = tok.AccessToken
		})
	}
	wg.Wait()
	require.NotEqual(t, before.AccessToken, tokens[0], "refreshed")
	for _, tok := range tokens {
		require.Equal(t, tokens[0], tok, "every request got the one refreshed token")
	}
	require.Equal(t, []string{"authorization_code", "refresh_token"}, w.as.Grants("/oauth/token"), "one refresh")
	run := w.startOn(h2, oauthtest.Alice)
	got, err := w.whoamiOn(h2, run)
	require.NoError(t, err)
	require.Equal(t, "whoami for "+oauthtest.Alice, got)
}

// TestARefreshThatLosesTakesTheWinnersToken: a refresh whose token was replaced since it was
// read (a new sign-in on another host stored one) does not overwrite it, and a refresh the
// authorization server refuses because another host rotated the token first does not drop the
// token that host stored: both read the stored token again and go on with it.
func TestARefreshThatLosesTakesTheWinnersToken(t *testing.T) {
	w, h1, h2 := twoOAuthHosts(t)
	tenant := auth.DefaultTenant
	res, err := w.reg.ResolveRegistration(w.ctx, "tickets")
	require.NoError(t, err)
	stored := func() oauthToken {
		_, tok, err := h1.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
		require.NoError(t, err)
		return tok
	}
	w.signInOn(h1, res)
	w.clock.advance(5 * time.Minute)

	// A new sign-in lands between h1's read and its write: the refresh succeeds at the
	// authorization server, and loses the compare-and-swap.
	at, old, err := h1.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	w.signInOn(h2, res)
	newer := stored()
	_, _, err = h1.renewToken(w.ctx, tenant, oauthtest.Alice, res, at, old)
	require.ErrorIs(t, err, store.ErrTokenChanged)
	require.Equal(t, newer, stored(), "the new sign-in's token stands")

	// h2 refreshes (rotating the refresh token) between h1's read and h1's refresh: h1's
	// refresh is refused, and its drop of the token it read drops nothing.
	w.clock.advance(5 * time.Minute) // the new sign-in's token is due in its turn
	at, old, err = h1.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	won, err := h2.userToken(w.ctx, tenant, oauthtest.Alice, res)
	require.NoError(t, err)
	_, refused, err := h1.renewToken(w.ctx, tenant, oauthtest.Alice, res, at, old)
	require.NoError(t, err)
	require.Contains(t, refused, "invalid_grant")
	require.ErrorIs(t, h1.dropSignInAt(w.ctx, at, tenant, oauthtest.Alice, "tickets", "refused"), store.ErrTokenChanged)
	got, err := h1.userToken(w.ctx, tenant, oauthtest.Alice, res)
	require.NoError(t, err)
	require.Equal(t, won.AccessToken, got.AccessToken)
}

// TestAHostWithAnotherSecretsKeyIsLogged: every pool host sharing etcd must open what the
// others sealed; a host started with a secrets key of its own (the default: one created in its
// data_dir) says so at start, naming the fix, and still starts; a user's token it cannot open
// names the fix too.
func TestAHostWithAnotherSecretsKeyIsLogged(t *testing.T) {
	logs := &rftestutil.SyncBuffer{}
	w, open := oauthHostsKeyed(t, harnessOpts{logTo: logs})
	const told = "this pool host's secrets key is not the one the other pool hosts sharing etcd seal"
	h1, h2 := open("h1", w.poolCfg.Secrets), open("h2", w.poolCfg.Secrets)
	defer h1.Close(context.Background())
	defer h2.Close(context.Background())
	require.NotContains(t, logs.String(), told)
	own, err := secretbox.LoadOrCreate(filepath.Join(t.TempDir(), "secrets.key"))
	require.NoError(t, err)
	h3 := open("h3", own)
	defer h3.Close(context.Background())
	require.Contains(t, logs.String(), told)
	require.Contains(t, logs.String(), "same secrets_key_file")

	res, err := w.reg.ResolveRegistration(w.ctx, "tickets")
	require.NoError(t, err)
	w.signInOn(h1, res)
	_, err = h3.userToken(w.ctx, auth.DefaultTenant, oauthtest.Alice, res)
	require.ErrorIs(t, err, secretbox.ErrOpen)
	require.ErrorContains(t, err, "pool hosts sharing etcd need the same secrets_key_file")
}

// TestARefusedTokenReplacedMeanwhileStands: a server's refusal of a user's token (HTTP 401 at a
// session's handshake: revoked) drops the token only while it is still the stored one. When
// another host's new sign-in (or refresh) stored another since, that one stands and the caller
// is told to call again; the refused one, still stored, is dropped.
func TestARefusedTokenReplacedMeanwhileStands(t *testing.T) {
	w, h1, h2 := twoOAuthHosts(t)
	tenant := auth.DefaultTenant
	res, err := w.reg.ResolveRegistration(w.ctx, "tickets")
	require.NoError(t, err)
	w.signInOn(h1, res)
	_, refused, err := h1.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	w.signInOn(h2, res) // a new sign-in lands between h1's session start and the server's 401
	_, newer, err := h1.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.NotEqual(t, refused.AccessToken, newer.AccessToken)

	err = h1.dropRefused(w.ctx, tenant, oauthtest.Alice, "tickets", "Bearer "+refused.AccessToken)
	require.ErrorIs(t, err, errTokenReplaced)
	_, kept, err := h2.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err, "the newer token stands")
	require.Equal(t, newer.AccessToken, kept.AccessToken)

	err = h2.dropRefused(w.ctx, tenant, oauthtest.Alice, "tickets", "Bearer "+newer.AccessToken)
	require.ErrorIs(t, err, errSignInRequired)
	_, _, err = h1.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.ErrorIs(t, err, store.ErrNotFound, "the refused token, still the stored one, is dropped")
	require.ErrorIs(t, h1.dropRefused(w.ctx, tenant, oauthtest.Alice, "tickets", "Bearer "+newer.AccessToken), errSignInRequired, "dropped already")
}
