package pool

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
	"github.com/ringfence/ringfence/internal/testutil/pinned"
	"github.com/ringfence/ringfence/services/publisher"
)

// Sign-in against a real authorization server (zitadel's OpenID provider) and a remote MCP
// server that takes only its tokens, both on loopback: nothing here fakes either side.

const testCallback = "http://127.0.0.1:8000/v1/oauth/callback"

// clock is the pool's two clocks in these tests: tokens' expiry is judged by them. Time
// passes on both (advance); the wall clock alone can be stepped, as NTP or an operator steps it
// (step).
type clock struct {
	mu   sync.Mutex
	now  time.Time
	mono time.Duration
}

// newClock is a clock that starts at the wall clock's now, without a monotonic reading (a
// stored time's kind), and at 0 on the monotonic one.
func newClock() *clock { return &clock{now: time.Now().Round(0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Elapsed() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now, c.mono = c.now.Add(d), c.mono+d
	c.mu.Unlock()
}

func (c *clock) step(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *clock) opts() harnessOpts { return harnessOpts{now: c.Now, elapsed: c.Elapsed} }

type oauthWorld struct {
	*harness
	as    *oauthtest.AuthServer
	mcp   *oauthtest.MCPServer
	clock *clock
}

// oauthHarness registers server tickets (the MCP server, signing each user in at the
// authorization server, whose client secret is the registry secret tickets-client) and
// publishes graph g, whose agent a binds tickets' whoami, alpha (declared to Alice only) and
// beta (to Bob only).
func oauthHarness(t testing.TB, opts ...harnessOpts) *oauthWorld {
	t.Helper()
	w := &oauthWorld{clock: newClock()}
	w.as = oauthtest.StartAuthServer(t, "ringfence", "client-secret-"+randomHex(), testCallback)
	w.mcp = oauthtest.StartMCPServer(t, w.as, map[string][]oauthtest.Tool{
		oauthtest.Alice: {{Name: "alpha", Description: "Alpha."}},
		oauthtest.Bob:   {{Name: "beta", Description: "Beta."}},
	})
	o := harnessOpts{}
	if len(opts) > 0 {
		o = opts[0]
	}
	o.noImage, o.oauthCallback, o.now, o.elapsed = true, testCallback, w.clock.Now, w.clock.Elapsed
	w.harness = newHarness(t, o)
	_, err := w.reg.PutSecret(w.ctx, &registryv1.PutSecretRequest{Name: "tickets-client", Value: w.as.ClientSecret})
	require.NoError(t, err)
	w.server("tickets", func(r *registryv1.CreateServerRequest) {
		r.Command, r.Transport, r.Url = "", "streamable_http", w.mcp.URL
		r.Oauth = &registryv1.OAuthSignIn{ClientId: "ringfence", ClientSecretRef: "tickets-client", Scopes: []string{"openid", "offline_access"},
			AuthorizationServer: w.as.Issuer}
	})
	w.publishSurface("g", nil,
		pinned.Tool{Server: "tickets", Tool: "whoami", Description: "Say who the caller is."},
		pinned.Tool{Server: "tickets", Tool: "alpha", Description: "Alpha."},
		pinned.Tool{Server: "tickets", Tool: "beta", Description: "Beta."},
	)
	return w
}

// aliceCalled is a harness (with opts) where Alice signed in and a run of hers called tool:
// the run, and the tokens the server was sent by then.
func aliceCalled(t *testing.T, tool string, opts ...harnessOpts) (w *oauthWorld, run string, tokens []string) {
	t.Helper()
	w = oauthHarness(t, opts...)
	w.signIn(auth.DefaultTenant, oauthtest.Alice)
	run = w.startAs(auth.DefaultTenant, oauthtest.Alice)
	_, err := w.callAs(auth.DefaultTenant, run, tool)
	require.NoError(t, err)
	return w, run, w.mcp.Tokens(oauthtest.Alice)
}

func (w *oauthWorld) startAs(tenant, user string) string {
	w.t.Helper()
	info, err := w.pool.StartRunFor(w.ctx, RunStart{Tenant: tenant, GraphID: "g", User: user})
	require.NoError(w.t, err)
	return info.Run.ID
}

// listing is the names agent a of run offers, and why each hidden tool is hidden.
func (w *oauthWorld) listing(tenant, run string) (visible []string, hidden map[string]agentsurface.Outcome) {
	w.t.Helper()
	l, err := w.pool.ListAgentTools(w.ctx, run, tenant, "a")
	require.NoError(w.t, err)
	hidden = map[string]agentsurface.Outcome{}
	for _, t := range l.Tools {
		visible = append(visible, t.Name)
	}
	for _, h := range l.Hidden {
		hidden[h.Tool.Name] = h.Decision.Outcome
	}
	return visible, hidden
}

// signIn connects tickets for user of tenant: ConnectServer answers the authorization URL,
// the user signs in, and the callback finishes; it returns the callback's answer.
func (w *oauthWorld) signIn(tenant, user string) *SignedIn {
	w.t.Helper()
	c, err := w.pool.ConnectServer(w.ctx, tenant, user, "tickets")
	require.NoError(w.t, err)
	require.Equal(w.t, ConnectSignInRequired, c.State)
	done, err := w.pool.CompleteSignIn(w.ctx, callbackQuery(w.t, w.as.SignIn(w.t, c.AuthorizationURL, user)))
	require.NoError(w.t, err)
	require.NoError(w.t, done.ConnectErr)
	return done
}

func callbackQuery(t testing.TB, loc string) url.Values {
	t.Helper()
	require.True(t, strings.HasPrefix(loc, testCallback+"?"), "the authorization server sent the browser to %s", loc)
	u, err := url.Parse(loc)
	require.NoError(t, err)
	return u.Query()
}

func (w *oauthWorld) callAs(tenant, run, tool string) (*CallResult, error) {
	return w.pool.CallTool(w.ctx, CallRequest{RunID: run, Tenant: tenant, Agent: "a", Tool: tool, Arguments: json.RawMessage(`{}`)})
}

// signInEvents are the admin events of users' sign-ins and drops, as "action user server
// actor [reason]", with every record checked to hold none of tokens.
func (w *oauthWorld) signInEvents(tokens ...string) []string {
	w.t.Helper()
	w.attempts() // flushes the spool
	var out []string
	for _, r := range w.audit.Records() {
		raw, err := json.Marshal(r)
		require.NoError(w.t, err)
		for _, tok := range tokens {
			require.NotContains(w.t, string(raw), tok)
		}
		if r.Kind != audit.KindAdmin || r.Admin.ResourceType != resourceOAuthServer {
			continue
		}
		var c map[string]string
		require.NoError(w.t, json.Unmarshal(r.Admin.Change, &c))
		out = append(out, strings.TrimSpace(strings.Join([]string{r.Admin.Action, c["user"], c["server"], r.Admin.ActorKeyID, c["reason"]}, " ")))
	}
	return out
}

func resultText(t *testing.T, res *CallResult) string {
	t.Helper()
	require.NotEmpty(t, res.Content)
	return res.Content[0]["text"].(string)
}

// TestSignInConnectsEachUserToTheirOwnTools: before sign-in a run of Alice offers the connect
// tool alone, and a call to a tool of the server is refused as sign_in_required with the URL;
// the connect tool answers the authorization URL; after Alice signs in (PKCE, the resource
// parameter on the authorization and token requests) the run offers exactly the tools the
// server declared to Alice and its calls carry Alice's token. Bob, connected by ConnectServer,
// sees his own tools and no token of Alice's ever reaches the server for him. A callback is
// good once.
func TestSignInConnectsEachUserToTheirOwnTools(t *testing.T) {
	w := oauthHarness(t)
	tenant := auth.DefaultTenant
	run := w.startAs(tenant, oauthtest.Alice)

	visible, hidden := w.listing(tenant, run)
	require.Equal(t, []string{"mcp_oauth_connect_tickets"}, visible)
	require.Equal(t, agentsurface.SignInRequired, hidden["tickets__whoami"])

	_, err := w.callAs(tenant, run, "tickets__whoami")
	requireRefused(t, err, reasonSignInRequired)
	require.Contains(t, err.Error(), w.as.Issuer+"/auth?", "the refusal names the URL to sign in at")

	res, err := w.callAs(tenant, run, "mcp_oauth_connect_tickets")
	require.NoError(t, err)
	require.Equal(t, ConnectSignInRequired, res.StructuredContent["state"])
	authURL := res.StructuredContent["authorization_url"].(string)
	u, err := url.Parse(authURL)
	require.NoError(t, err)
	q := u.Query()
	require.Equal(t, "S256", q.Get("code_challenge_method"))
	require.NotEmpty(t, q.Get("code_challenge"))
	require.Equal(t, w.mcp.URL, q.Get("resource"))
	require.Equal(t, testCallback, q.Get("redirect_uri"))

	loc := w.as.SignIn(t, authURL, oauthtest.Alice)
	done, err := w.pool.CompleteSignIn(w.ctx, callbackQuery(t, loc))
	require.NoError(t, err)
	require.NoError(t, done.ConnectErr)
	require.Equal(t, []string{"alpha", "whoami"}, done.Tools)
	require.Equal(t, []string{w.mcp.URL}, w.as.Resources("/auth"))
	require.Equal(t, []string{w.mcp.URL}, w.as.Resources("/oauth/token"))

	_, err = w.pool.CompleteSignIn(w.ctx, callbackQuery(t, loc))
	require.ErrorIs(t, err, errBadCallback, "a state is good once")

	visible, hidden = w.listing(tenant, run)
	require.Equal(t, []string{"tickets__alpha", "tickets__whoami"}, visible)
	require.Equal(t, agentsurface.NotDeclared, hidden["tickets__beta"])
	res, err = w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)
	require.Equal(t, "whoami for "+oauthtest.Alice, resultText(t, res))
	_, err = w.callAs(tenant, run, "tickets__beta")
	requireRefused(t, err, reasonNotDeclared)

	bobRun := w.startAs(tenant, oauthtest.Bob)
	visible, _ = w.listing(tenant, bobRun)
	require.Equal(t, []string{"mcp_oauth_connect_tickets"}, visible, "Alice's connection is hers alone")
	require.Equal(t, []string{"beta", "whoami"}, w.signIn(tenant, oauthtest.Bob).Tools)
	visible, _ = w.listing(tenant, bobRun)
	require.Equal(t, []string{"tickets__beta", "tickets__whoami"}, visible)
	res, err = w.callAs(tenant, bobRun, "tickets__whoami")
	require.NoError(t, err)
	require.Equal(t, "whoami for "+oauthtest.Bob, resultText(t, res))
	for _, tok := range w.mcp.Tokens(oauthtest.Bob) {
		require.NotContains(t, w.mcp.Tokens(oauthtest.Alice), tok)
	}

	// A run acting for nobody gets no one's token, and its connect tool says why.
	nobody := w.startAs(tenant, "")
	_, err = w.callAs(tenant, nobody, "tickets__whoami")
	requireRefused(t, err, reasonSignInRequired)
	_, err = w.callAs(tenant, nobody, "mcp_oauth_connect_tickets")
	requireRefused(t, err, reasonSignInRequired)
	require.ErrorContains(t, err, "acts for no user")
}

// TestSignInIsBoundToItsTenant: a user's token and listing are the tenant's: the same user in
// another tenant is not connected, and its runs never reach the server with the first
// tenant's token.
func TestSignInIsBoundToItsTenant(t *testing.T) {
	w := oauthHarness(t)
	w.signIn(auth.DefaultTenant, oauthtest.Alice)
	// The graph is the default tenant's; the other tenant publishes its own copy.
	other := "acme"
	ctx := w.ctx
	w.ctx = auth.WithTenancy(ctx, auth.Tenancy{Tenant: other})
	w.publishSurface("g", nil,
		pinned.Tool{Server: "tickets", Tool: "whoami", Description: "Say who the caller is."},
		pinned.Tool{Server: "tickets", Tool: "alpha", Description: "Alpha."})
	run := w.startAs(other, oauthtest.Alice)
	visible, _ := w.listing(other, run)
	require.Equal(t, []string{"mcp_oauth_connect_tickets"}, visible)
	before := len(w.mcp.Tokens(oauthtest.Alice))
	_, err := w.callAs(other, run, "tickets__whoami")
	requireRefused(t, err, reasonSignInRequired)
	require.Len(t, w.mcp.Tokens(oauthtest.Alice), before, "no token reached the server")
	w.ctx = ctx
}

// TestCallbackRefusals: an authorization server's answer from another issuer than the one
// the sign-in began at (RFC 9207 mix-up: a second real server answering with its own iss), an
// expired state, an unknown one and an error answer finish nothing, and never quote the code.
func TestCallbackRefusals(t *testing.T) {
	w := oauthHarness(t)
	other := oauthtest.StartAuthServer(t, "ringfence", w.as.ClientSecret, testCallback)
	begin := func(user string) string {
		c, err := w.pool.ConnectServer(w.ctx, auth.DefaultTenant, user, "tickets")
		require.NoError(t, err)
		require.Equal(t, ConnectSignInRequired, c.State)
		return c.AuthorizationURL
	}

	// The mix-up: the user is sent to the other server with this sign-in's state, and it
	// answers with its own issuer.
	authURL := begin(oauthtest.Alice)
	mixed := other.Issuer + authURL[len(w.as.Issuer):]
	q := callbackQuery(t, other.SignIn(t, mixed, oauthtest.Alice))
	q.Set("iss", other.Issuer)
	_, err := w.pool.CompleteSignIn(w.ctx, q)
	require.ErrorIs(t, err, errBadCallback)
	require.Contains(t, err.Error(), "mix-up")
	require.NotContains(t, err.Error(), q.Get("code"))
	require.Empty(t, w.as.Grants("/oauth/token"), "nothing was exchanged")

	// The right issuer's iss is taken.
	q = callbackQuery(t, w.as.SignIn(t, begin(oauthtest.Alice), oauthtest.Alice))
	q.Set("iss", w.as.Issuer)
	_, err = w.pool.CompleteSignIn(w.ctx, q)
	require.NoError(t, err)

	// Expired (Bob from here: Alice is signed in).
	q = callbackQuery(t, w.as.SignIn(t, begin(oauthtest.Bob), oauthtest.Bob))
	w.clock.advance(DefaultOAuthStateTTL + time.Second)
	_, err = w.pool.CompleteSignIn(w.ctx, q)
	require.ErrorIs(t, err, errBadCallback)
	require.Contains(t, err.Error(), "expired")

	// Unknown, and an authorization server's error.
	_, err = w.pool.CompleteSignIn(w.ctx, url.Values{"state": {"forged"}, "code": {"x"}})
	require.ErrorIs(t, err, errBadCallback)
	authURL = begin(oauthtest.Bob)
	u, _ := url.Parse(authURL)
	_, err = w.pool.CompleteSignIn(w.ctx, url.Values{"state": {u.Query().Get("state")}, "error": {"access_denied"}})
	require.ErrorIs(t, err, errBadCallback)
	require.Contains(t, err.Error(), "access_denied")

	// Over HTTP: no API key, a plain page, and a refusal is 400.
	rec := httptest.NewRecorder()
	w.pool.OAuthCallbackHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/oauth/callback?state=forged&code=x", nil))
	require.Equal(t, http.StatusBadRequest, rec.Code)
	loc := w.as.SignIn(t, begin(oauthtest.Bob), oauthtest.Bob)
	rec = httptest.NewRecorder()
	w.pool.OAuthCallbackHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, loc, nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "Signed in to tickets")
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
}

// TestTokensAreRefreshedAndDroppedWhenRefused: a token about to expire is refreshed (with the
// resource parameter) and the run's next session carries the new one; once the authorization
// server refuses the refresh (the grant was revoked), the token is dropped and the server needs
// sign-in again. A revoked access token the server refuses is dropped too.
func TestTokensAreRefreshedAndDroppedWhenRefused(t *testing.T) {
	w, run, first := aliceCalled(t, "tickets__whoami")
	tenant := auth.DefaultTenant
	res, err := w.reg.ResolveRegistration(w.ctx, "tickets")
	require.NoError(t, err)

	// The example server's tokens live 5 minutes: past that (by the pool's clock) the next
	// call refreshes, and a fresh session carries the new token.
	w.clock.advance(5 * time.Minute)
	res2, err := w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)
	require.Equal(t, "whoami for "+oauthtest.Alice, resultText(t, res2))
	require.Contains(t, w.as.Grants("/oauth/token"), "refresh_token")
	require.Len(t, w.as.Resources("/oauth/token"), 2, "the refresh carried the resource too")
	now := w.mcp.Tokens(oauthtest.Alice)
	require.NotEqual(t, first[len(first)-1], now[len(now)-1], "the new token was sent")

	// The grant is revoked: the next refresh is refused, and the token dropped.
	tok, err := w.pool.userToken(w.ctx, tenant, oauthtest.Alice, res)
	require.NoError(t, err)
	w.as.Revoke(t, tok.RefreshToken)
	w.clock.advance(5 * time.Minute)
	_, err = w.callAs(tenant, run, "tickets__whoami")
	requireRefused(t, err, reasonSignInRequired)
	require.Contains(t, err.Error(), w.as.Issuer+"/auth?")
	_, err = w.pool.userToken(w.ctx, tenant, oauthtest.Alice, res)
	require.ErrorIs(t, err, errSignInRequired)
	visible, _ := w.listing(tenant, run)
	require.Equal(t, []string{"mcp_oauth_connect_tickets"}, visible)
	events := w.signInEvents(tok.AccessToken, tok.RefreshToken)
	require.Equal(t, "oauth_sign_in id1 tickets key_test", events[0], "the key that asked for the sign-in is on record")
	require.Contains(t, events[1], "oauth_drop id1 tickets key_test the authorization server refused to refresh the user's token (invalid_grant")

	// Signed in again, the access token is revoked: the server refuses it at the next
	// session's handshake, and the token is dropped.
	w.signIn(tenant, oauthtest.Alice)
	tok, err = w.pool.userToken(w.ctx, tenant, oauthtest.Alice, res)
	require.NoError(t, err)
	w.as.Revoke(t, tok.AccessToken)
	fresh := w.startAs(tenant, oauthtest.Alice)
	_, err = w.callAs(tenant, fresh, "tickets__whoami")
	requireRefused(t, err, reasonSignInRequired)
	_, err = w.pool.userToken(w.ctx, tenant, oauthtest.Alice, res)
	require.ErrorIs(t, err, errSignInRequired)
	events = w.signInEvents(tok.AccessToken, tok.RefreshToken)
	require.Equal(t, "oauth_drop id1 tickets key_test the server refused the user's token (revoked?)", events[len(events)-1])
}

// TestSignInSettingsChangeDropsTokens: changing the server's sign-in settings (its scopes here)
// invalidates every user's listing and drops their tokens: the server shows as its connect
// tool again, and connecting asks for a new sign-in.
func TestSignInSettingsChangeDropsTokens(t *testing.T) {
	w := oauthHarness(t)
	tenant := auth.DefaultTenant
	w.signIn(tenant, oauthtest.Alice)
	run := w.startAs(tenant, oauthtest.Alice)
	visible, _ := w.listing(tenant, run)
	require.Contains(t, visible, "tickets__whoami")

	_, err := w.reg.UpdateServer(w.ctx, &registryv1.UpdateServerRequest{Ref: "tickets", Transport: "streamable_http", Url: w.mcp.URL,
		Grants: []string{"process_spawn", "external_api_call"},
		Oauth: &registryv1.OAuthSignIn{ClientId: "ringfence", ClientSecretRef: "tickets-client", Scopes: []string{"openid", "offline_access", "profile"},
			AuthorizationServer: w.as.Issuer}})
	require.NoError(t, err)
	visible, _ = w.listing(tenant, run)
	require.Equal(t, []string{"mcp_oauth_connect_tickets"}, visible)
	_, err = w.callAs(tenant, run, "tickets__whoami")
	requireRefused(t, err, reasonSignInRequired)
	c, err := w.pool.ConnectServer(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Equal(t, ConnectSignInRequired, c.State)
	_, err = w.pool.oauth.OAuthToken(context.Background(), tenant, oauthtest.Alice, "tickets")
	require.Error(t, err, "the old token was dropped")
}

// TestImportAsAUser: an operator's discovery has no user's token, so it lists nothing of a
// server that signs each user in and says how its tools are listed; an import names a
// connected user and pins the declarations the server made to that user (Alice's alpha, never
// Bob's beta), and an import as a user who has not connected it is refused as sign_in_required.
func TestImportAsAUser(t *testing.T) {
	w := oauthHarness(t)
	_, err := w.pool.DiscoverTools(w.ctx, "tickets")
	require.ErrorContains(t, err, "ringfence servers connect tickets --user U")
	require.Empty(t, w.mcp.Tokens(oauthtest.Alice))

	_, err = w.pub.CreateGraph(w.ctx, &publisherv1.CreateGraphRequest{GraphId: "imported", Agents: []string{"a"}})
	require.NoError(t, err)
	imp := publisher.ImportRequest{Tenant: auth.DefaultTenant, GraphID: "imported", ServerRef: "tickets", Agent: "a", User: oauthtest.Alice}
	_, err = w.pub.Import(w.ctx, imp)
	f, ok := discovery.AsFailure(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, discovery.ClassSignInRequired, f.Class)
	require.Contains(t, f.Message, "ringfence servers connect tickets --user "+oauthtest.Alice)

	w.signIn(auth.DefaultTenant, oauthtest.Alice)
	res, err := w.pub.Import(w.ctx, imp)
	require.NoError(t, err)
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.ToolName)
	}
	require.ElementsMatch(t, []string{"alpha", "whoami"}, names)

	// The pins the import took are the ones the graph of the other tests hand-pinned.
	d, err := w.pub.GetDraft(w.ctx, &publisherv1.GetDraftRequest{GraphId: "imported"})
	require.NoError(t, err)
	pins := map[string]string{}
	for _, n := range d.GetDraft().GetNodes() {
		if m := n.GetMcpTool(); m != nil {
			pins[m.GetToolName()] = m.GetSchemaHash()
		}
	}
	g, err := w.pub.GetDraft(w.ctx, &publisherv1.GetDraftRequest{GraphId: "g"})
	require.NoError(t, err)
	for _, n := range g.GetDraft().GetNodes() {
		if m := n.GetMcpTool(); m != nil && pins[m.GetToolName()] != "" {
			require.Equal(t, m.GetSchemaHash(), pins[m.GetToolName()], m.GetToolName())
		}
	}
}

// TestAuthorizationServerDiscovery: a public client's authorization server is discovered from
// the MCP server's protected resource metadata (RFC 9728) and then the authorization server's
// own metadata (RFC 8414 or OpenID discovery), both served by the real servers; a named one
// is taken as named.
func TestAuthorizationServerDiscovery(t *testing.T) {
	w := oauthHarness(t)
	res, err := w.reg.ResolveRegistration(w.ctx, "tickets")
	require.NoError(t, err)
	public := *res
	public.OAuth = &mcpserver.OAuth{ClientID: "public"}
	asm, resource, scopes, err := w.pool.authServer(w.ctx, &public)
	require.NoError(t, err)
	require.Equal(t, w.as.Issuer, asm.Issuer)
	require.Equal(t, w.mcp.URL, resource)
	require.Contains(t, asm.CodeChallengeMethodsSupported, "S256")
	require.Equal(t, []string{"openid", "offline_access"}, scopes, "without scopes of its own, the sign-in asks for the metadata's scopes_supported")

	public.URL = strings.Replace(w.mcp.URL, "/mcp", "/elsewhere", 1)
	_, _, _, err = w.pool.authServer(w.ctx, &public)
	require.ErrorContains(t, err, "could not be discovered", "no metadata names that resource")

	// Unreachable: the network's reason, not the SDK's and Go's wrapping of it.
	closed := testutil.FreeAddr(t)
	public.URL = "http://" + closed + "/mcp"
	_, _, _, err = w.pool.authServer(w.ctx, &public)
	require.ErrorContains(t, err, "http://"+closed+"/.well-known/oauth-protected-resource/mcp: nothing accepts connections at http://"+closed)
	require.NotContains(t, err.Error(), "GetProtectedResourceMetadata")
	require.NotContains(t, err.Error(), "dial tcp")
	public.OAuth = &mcpserver.OAuth{ClientID: "public", AuthorizationServer: "http://" + closed}
	public.OAuth.Scopes = []string{"openid"}
	_, _, _, err = w.pool.authServer(w.ctx, &public)
	require.EqualError(t, err, "the metadata of authorization server http://"+closed+" could not be read: nothing accepts connections at http://"+closed)
}

// TestAnExpiredTokenWithoutARefreshTokenNeedsSignIn: without offline_access the authorization
// server issues no refresh token, so a token past its expiry (by the pool's clock) is dropped
// and the server needs sign-in again; before, it is sent as it is.
func TestAnExpiredTokenWithoutARefreshTokenNeedsSignIn(t *testing.T) {
	w := oauthHarness(t)
	tenant := auth.DefaultTenant
	_, err := w.reg.UpdateServer(w.ctx, &registryv1.UpdateServerRequest{Ref: "tickets", Transport: "streamable_http", Url: w.mcp.URL,
		Grants: []string{"process_spawn", "external_api_call"},
		Oauth:  &registryv1.OAuthSignIn{ClientId: "ringfence", ClientSecretRef: "tickets-client", Scopes: []string{"openid"}, AuthorizationServer: w.as.Issuer}})
	require.NoError(t, err)
	w.signIn(tenant, oauthtest.Alice)
	res, err := w.reg.ResolveRegistration(w.ctx, "tickets")
	require.NoError(t, err)
	tok, err := w.pool.userToken(w.ctx, tenant, oauthtest.Alice, res)
	require.NoError(t, err)
	require.Empty(t, tok.RefreshToken)
	require.False(t, tok.Expiry.IsZero())

	run := w.startAs(tenant, oauthtest.Alice)
	_, err = w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)
	w.clock.advance(5 * time.Minute) // the example server's tokens live 5 minutes
	fresh := w.startAs(tenant, oauthtest.Alice)
	_, err = w.callAs(tenant, fresh, "tickets__whoami")
	requireRefused(t, err, reasonSignInRequired)
	require.ErrorContains(t, err, "came with no refresh token")
	require.Empty(t, w.as.Grants("/oauth/token")[1:], "no refresh was tried")
}
