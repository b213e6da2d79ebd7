package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/pool/internal/store"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// Connecting a server that signs each user in: the user's token lists the server's tools, and
// the listing is stored per (tenant, user, server); a run's session of the server keeps it
// current afterwards (keepListing). A run's agent surface offers such a
// server's tools to a run of that user only once the listing exists, under the registration's
// current sign-in settings; before, the server's connect tool stands for them
// (agentsurface.KindConnect), and a call to one of its tools is refused as sign_in_required
// with the URL to sign in at.

// errServerUnreachable: the server or its authorization server could not be reached.
var errServerUnreachable = errors.New("pool: the server or its authorization server could not be reached")

// Connection states.
const (
	ConnectConnected      = "connected"
	ConnectSignInRequired = "sign_in_required"
)

// Connection is where a user's connection to a server stands.
type Connection struct {
	State string
	// AuthorizationURL is where the user signs in (ConnectSignInRequired), good once until
	// ExpireTime.
	AuthorizationURL string
	ExpireTime       time.Time
	// Tools are the names of the tools the server declared to the user (ConnectConnected).
	Tools []string
}

// ConnectServer connects server ref for user of tenant: with the user's token, the server's
// tools are listed and the listing stored; without one, the answer is the authorization URL.
// The caller (a key with run:execute in the tenant) asserts the user (docs/oauth.md).
func (s *Service) ConnectServer(ctx context.Context, tenant, user, ref string) (*Connection, error) {
	return s.connectServer(ctx, tenant, user, ref, true)
}

// ConnectServerIfSignedIn is ConnectServer without beginning a sign-in: without the user's
// token the answer is ConnectSignInRequired with no URL, and the user's pending sign-in (whose
// URL an earlier ConnectServer answered) stays good, where a new one would replace it. It is
// for polling until the user has signed in.
func (s *Service) ConnectServerIfSignedIn(ctx context.Context, tenant, user, ref string) (*Connection, error) {
	return s.connectServer(ctx, tenant, user, ref, false)
}

func (s *Service) connectServer(ctx context.Context, tenant, user, ref string, beginSignIn bool) (*Connection, error) {
	tenant = orDefaultTenant(tenant)
	if err := ValidateUser("user", user); err != nil {
		return nil, err
	}
	if err := mcpserver.ValidateRef(ref); err != nil {
		return nil, err
	}
	if err := s.signInConfigured(); err != nil {
		return nil, err
	}
	res, err := s.cfg.Registry.ResolveRegistration(ctx, ref)
	if err != nil {
		return nil, err
	}
	if res.OAuth == nil {
		return nil, errNoSignIn
	}
	if !beginSignIn {
		tools, err := s.connectSignedIn(ctx, tenant, user, res)
		if errors.Is(err, errSignInRequired) {
			return &Connection{State: ConnectSignInRequired}, nil
		}
		if err != nil {
			return nil, err
		}
		return &Connection{State: ConnectConnected, Tools: tools}, nil
	}
	tools, err := s.connect(ctx, tenant, user, res)
	var si *signInError
	if errors.As(err, &si) {
		return &Connection{State: ConnectSignInRequired, AuthorizationURL: si.url, ExpireTime: si.expire}, nil
	}
	if err != nil {
		return nil, err
	}
	return &Connection{State: ConnectConnected, Tools: tools}, nil
}

// signInConfigured says whether this pool can sign users in at all.
func (s *Service) signInConfigured() error {
	if s.cfg.Secrets == nil || s.cfg.OAuthCallbackURL == "" {
		return errNoCallback
	}
	return nil
}

// connect lists res's tools with user's token and stores the listing, answering the tools'
// names; without a token the server takes, it begins a sign-in and answers its *signInError.
func (s *Service) connect(ctx context.Context, tenant, user string, res *mcpserver.Resolved) ([]string, error) {
	tools, err := s.connectSignedIn(ctx, tenant, user, res)
	if errors.Is(err, errSignInRequired) {
		return nil, s.beginSignIn(ctx, tenant, user, res, signInWhy(err), stepUpOf(err))
	}
	return tools, err
}

// connectSignedIn is connect without the sign-in: errSignInRequired (wrapped) without a token
// the server takes.
func (s *Service) connectSignedIn(ctx context.Context, tenant, user string, res *mcpserver.Resolved) ([]string, error) {
	listing, err := s.listAs(ctx, tenant, user, res)
	if err != nil {
		return nil, err
	}
	stored := store.Listing{SignIn: res.SignInFingerprint(), Tools: storedTools(listing), ListTime: s.now().UTC()}
	if err := s.oauth.PutOAuthListing(ctx, tenant, user, res.Ref, stored); err != nil {
		return nil, err
	}
	s.connected(tenant, user, res.Ref)
	return slices.Sorted(maps.Keys(stored.Tools)), nil
}

// storedTools is what a user's stored listing keeps of a screened listing: each tool's name
// (as the screen shows it) and the hash of its declaration.
func storedTools(listing *discovery.Listing) map[string]string {
	tools := make(map[string]string, len(listing.Tools))
	for _, t := range listing.Tools {
		tools[t.Name] = t.SchemaHash
	}
	return tools
}

// keepListing keeps the stored listing of the user a run's session acts for current (seed
// 003: the first call's listing, and the one the session takes in the background soon after
// the server's tools/list_changed (listSoon), keep it so):
// once sess listed its server's tools again, what the server declares to the user now,
// screened as connecting screens it, replaces the user's stored listing, which the run's next
// call and every later run of the user's offer and gate by (connections); the user's runs'
// listeners are told. It writes only
//   - when a tool came, went or changed its declaration, so a listing like the stored one
//     costs one read and no write, and one like the last it held up costs nothing;
//   - over a listing taken under the sign-in settings the session was started with: it never
//     connects a server the user has not connected, nor one whose settings changed since (the
//     user connects that again);
//   - while the user's stored token is the one the session carries, compared in the write
//     (PutOAuthListingAt): a listing never comes back after the user's sign-in was dropped,
//     and never replaces what a newer sign-in listed. Runs of the user on several pool hosts
//     write full listings: the last one stands.
//
// A failure is logged, never the call's: the session's next listing tries again (a listing
// that cannot be screened, once it changes).
func (s *Service) keepListing(ctx context.Context, sess *session, tools []*mcp.Tool) {
	in := sess.signIn
	if in == nil || sess.inline != nil || sess.kept != nil && maps.Equal(sess.kept, sess.live) {
		return
	}
	if ctx.Err() != nil {
		return // the session stops (a background listing: listSoon): nothing is written after
	}
	if err := s.putListing(ctx, sess, tools); err != nil {
		s.log.Warn("a user's stored listing of a server could not be brought up to date with the listing a run's session took: their runs offer the stored one until a session lists again",
			"server", sess.ref, "tenant", in.tenant, "err", err)
		if !errors.Is(err, errListingUnscreenable) {
			return // the store: the session's next listing tries again
		}
	}
	sess.kept = sess.live
}

// errListingUnscreenable: a tool of the listing cannot be read, as connecting refuses it; the
// drift check refuses that tool. The same listing is not tried again.
var errListingUnscreenable = errors.New("a tool of the listing the server declared cannot be read")

// putListing is keepListing's write: nil also when nothing was to be written.
func (s *Service) putListing(ctx context.Context, sess *session, tools []*mcp.Tool) error {
	in := sess.signIn
	cur, err := s.oauth.OAuthListing(ctx, in.tenant, in.user, in.res.Ref)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil // not connected, or dropped since
	case err != nil:
		return err
	case cur.SignIn != in.res.SignInFingerprint() || maps.Equal(cur.Tools, map[string]string(sess.live)):
		return nil
	}
	listing, err := Screen(sess.reg, tools, sess.sess)
	if err != nil {
		return fmt.Errorf("%w: %v", errListingUnscreenable, err)
	}
	next := store.Listing{SignIn: cur.SignIn, Tools: storedTools(listing), ListTime: s.now().UTC()}
	if maps.Equal(cur.Tools, next.Tools) {
		return nil
	}
	at, tok, err := s.readToken(ctx, in.tenant, in.user, in.res.Ref)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	case sess.reg.HeaderValues["Authorization"] != "Bearer "+tok.AccessToken:
		return nil // replaced: the run's next call starts a session with the newest token
	}
	err = s.oauth.PutOAuthListingAt(ctx, in.tenant, in.user, in.res.Ref, at, next)
	if errors.Is(err, store.ErrTokenChanged) {
		return nil
	}
	if err != nil {
		return err
	}
	s.connected(in.tenant, in.user, in.res.Ref)
	return nil
}

// listAs lists res's tools with user's token, pinned and screened as discovery does: what the
// server declares to that user. errSignInRequired (wrapped, with why) without a token the
// server takes; one it refuses (revoked) is dropped; one it refuses for want of scope is a
// *scopeRefused, which a sign-in for the wider scope answers.
func (s *Service) listAs(ctx context.Context, tenant, user string, res *mcpserver.Resolved) (*discovery.Listing, error) {
	tok, err := s.userToken(ctx, tenant, user, res)
	if err != nil {
		return nil, err
	}
	authed := withBearer(res, tok.AccessToken)
	sp, err := s.spawner.Spawn(ctx, specFor(authed, spawner.PurposeDiscovery, ""))
	if err != nil {
		if scoped := refusedForScope(err, tok); scoped != nil {
			return nil, scoped
		}
		if refusedToken(err) {
			return nil, s.dropRefused(ctx, tenant, user, res.Ref, authed.HeaderValues["Authorization"])
		}
		return nil, fmt.Errorf("%w: server %q: %v", errServerUnreachable, res.Ref, spawnFailure(err))
	}
	defer func() { _ = sp.Close(context.WithoutCancel(ctx)) }()
	tools, err := sp.SetupListTools(ctx)
	if err != nil {
		if scoped := refusedForScope(err, tok); scoped != nil {
			return nil, scoped
		}
		return nil, fmt.Errorf("%w: server %q: %v", errServerUnreachable, res.Ref, spawnFailure(err))
	}
	listing, err := Screen(authed, tools, sp)
	if err != nil {
		return nil, fmt.Errorf("%w: server %q: %v", errServerUnreachable, res.Ref, err)
	}
	return listing, nil
}

// DiscoverToolsAs lists a registered server's tools as user of tenant sees them: for a server
// that signs each user in, with that user's token (an import for that user's runs); any other
// server as DiscoverTools does.
func (s *Service) DiscoverToolsAs(ctx context.Context, tenant, user, ref string) (*discovery.Listing, error) {
	listing, _, err := s.ExploreTools(ctx, discovery.ExploreRequest{Ref: ref, Tenant: tenant, User: user})
	return listing, err
}

// connected tells the listeners of every run of user in tenant (the MCP front door) that
// server ref's tools joined their agents' listings.
func (s *Service) connected(tenant, user, ref string) {
	s.runs.mu.Lock()
	var ids []runIdentity
	for key, r := range s.runs.byKey {
		if key.tenant == tenant && r.id.User == user {
			ids = append(ids, r.id)
		}
	}
	s.runs.mu.Unlock()
	for _, id := range ids {
		s.toolsChanged(id, "", ref)
	}
}

// signInWhy is the reason userToken gave, without its sentinel's words.
func signInWhy(err error) string {
	return strings.TrimPrefix(err.Error(), errSignInRequired.Error()+": ")
}

// refusedToken says the server refused the credentials the session presented (HTTP 401).
func refusedToken(err error) bool {
	var se *spawner.Error
	return errors.As(err, &se) && se.HTTPStatus == 401
}

// connections reads the stored listings of user for the servers among policies that sign users
// in: the agent surface's State.Connections. A listing taken under other sign-in settings than
// the policy's current ones is none (the server shows as its connect tool again); a run without
// a user has none.
func (s *Service) connections(ctx context.Context, tenant, user string, policies map[string]mcpserver.Policy) (map[string]agentsurface.Connection, error) {
	var out map[string]agentsurface.Connection
	if user == "" {
		return out, nil
	}
	for ref, p := range policies {
		if p.SignIn == "" {
			continue
		}
		l, err := s.oauth.OAuthListing(ctx, tenant, user, ref)
		if errors.Is(err, store.ErrNotFound) || err == nil && l.SignIn != p.SignIn {
			continue
		}
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = make(map[string]agentsurface.Connection)
		}
		c := agentsurface.Connection{Tools: make(map[string]bool, len(l.Tools))}
		for name := range l.Tools {
			c.Tools[name] = true
		}
		out[ref] = c
	}
	return out, nil
}

// signInRefusal turns a session that could not start for want of the user's token (or of its
// scope) into the refusal a call gets: sign_in_required, with the URL the user signs in at
// when one can be made, or why signing in again would not help.
func (s *Service) signInRefusal(ctx context.Context, tenant, user string, res *mcpserver.Resolved, cause error) error {
	return refusal(reasonSignInRequired, s.signInNeeded(ctx, tenant, user, res, cause))
}

// signInNeeded is what a sign_in_required answer says: the *signInError with the URL, or why
// none was begun.
func (s *Service) signInNeeded(ctx context.Context, tenant, user string, res *mcpserver.Resolved, cause error) error {
	if errors.Is(cause, errNoUser) {
		return cause
	}
	err := s.beginSignIn(ctx, tenant, user, res, signInWhy(cause), stepUpOf(cause))
	var si *signInError
	if errors.As(err, &si) || errors.Is(err, errScopeNotGranted) {
		return err
	}
	return fmt.Errorf("server %q signs each user in and the user this run acts for must sign in, but no sign-in could be begun: %w", res.Ref, err)
}

// runBearer is reg with the run's user's token as its Authorization header, for sess: it
// notes in sess whose token it carries and when that token is due for a refresh. A run without
// a user, or a user without a token the server takes, is refused as sign_in_required (with the
// URL the user signs in at).
func (s *Service) runBearer(ctx context.Context, r *run, sess *session, reg *mcpserver.Resolved) (*mcpserver.Resolved, error) {
	if err := s.signInConfigured(); err != nil {
		return nil, refusal(reasonSignInRequired, err)
	}
	tok, err := s.userToken(ctx, r.id.Tenant, r.id.User, reg)
	switch {
	case errors.Is(err, errSignInRequired) || errors.Is(err, errNoUser):
		return nil, s.signInRefusal(ctx, r.id.Tenant, r.id.User, reg, err)
	case errors.Is(err, errServerUnreachable):
		return nil, refusal(reasonSpawnFailed, err)
	case err != nil:
		return nil, err
	}
	if !tok.Expiry.IsZero() {
		l := s.renewLife(tok)
		sess.renew = &l
	}
	sess.signIn = &sessionSignIn{tenant: r.id.Tenant, user: r.id.User, res: reg, scopes: tok.Scopes}
	return withBearer(reg, tok.AccessToken), nil
}

// dropRefusedToken: the server refused the run's user's token at the handshake (it was
// revoked): it is dropped with the user's listing, and the call is refused as
// sign_in_required; or, when the user's stored token is another by now, the call is refused
// as spawn_failed and the next one carries it.
func (s *Service) dropRefusedToken(ctx context.Context, r *run, reg *mcpserver.Resolved) error {
	err := s.dropRefused(ctx, r.id.Tenant, r.id.User, reg.Ref, reg.HeaderValues["Authorization"])
	switch {
	case errors.Is(err, errTokenReplaced):
		return refusal(reasonSpawnFailed, err)
	case errors.Is(err, errSignInRequired):
		return s.signInRefusal(ctx, r.id.Tenant, r.id.User, reg, err)
	}
	return err
}

// errTokenReplaced: the token a server refused is no longer the user's stored one: a refresh
// on another pool host, or a new sign-in, replaced it meanwhile. It stands, and the next
// attempt carries it.
var errTokenReplaced = fmt.Errorf("%w: the server refused the user's token, which was replaced meanwhile (a refresh on another pool host, or a new sign-in): call again", errServerUnreachable)

// dropRefused drops the user's token of server ref that the server refused (HTTP 401:
// revoked), bearer being the Authorization header that carried it, if it is still the stored
// one; a token stored since is not the refused one (errTokenReplaced). The answer wraps
// errSignInRequired once the token is gone.
func (s *Service) dropRefused(ctx context.Context, tenant, user, ref, bearer string) error {
	const why = "the server refused the user's token (revoked?)"
	at, t, err := s.readToken(ctx, tenant, user, ref)
	switch {
	case errors.Is(err, store.ErrNotFound): // dropped already
	case err != nil:
		return err
	case bearer != "Bearer "+t.AccessToken:
		return errTokenReplaced
	default:
		err := s.dropSignInAt(ctx, at, tenant, user, ref, why)
		if errors.Is(err, store.ErrTokenChanged) {
			return errTokenReplaced
		}
		if err != nil {
			return err
		}
	}
	return fmt.Errorf("%w: %s, so it was dropped", errSignInRequired, why)
}

// callConnections reads the run's user's connections of the servers whose policies the call
// read, for the gates (in.connections).
func (s *Service) callConnections(ctx context.Context, r *run, in *gateInput) (map[string]agentsurface.Connection, error) {
	policies := make(map[string]mcpserver.Policy)
	if in.policy.SignIn != "" {
		policies[in.policy.Ref] = in.policy
	}
	if p := in.connectPolicy; p != nil && p.SignIn != "" {
		policies[p.Ref] = *p
	}
	for ref, p := range in.searchPolicies {
		if p.SignIn != "" {
			policies[ref] = p
		}
	}
	if len(policies) == 0 {
		return nil, nil
	}
	return s.connections(ctx, r.id.Tenant, r.id.User, policies)
}

// withSignInURL adds to a sign_in_required refusal the URL the run's user signs in at, when
// one can be made; otherwise the refusal stands as it is, naming the connect tool.
func (s *Service) withSignInURL(ctx context.Context, r *run, ref string, refused *RefusedError) error {
	if s.signInConfigured() != nil {
		return refused
	}
	res, err := s.cfg.Registry.ResolveRegistration(ctx, ref)
	if err != nil || res.OAuth == nil {
		return refused
	}
	var si *signInError
	if errors.As(s.beginSignIn(ctx, r.id.Tenant, r.id.User, res, "the user this run acts for has not connected it", nil), &si) {
		refused.Err = si
	}
	return refused
}

// answerConnect answers a call to a server's connect tool: on record first like any dispatch
// (connecting stores a listing and may start a sign-in), then the server is connected for the
// run's user, whose agents' listings then show its tools (the run's listeners are told), or
// the answer is the URL the user signs in at.
func (s *Service) answerConnect(ctx context.Context, r *run, d decision) outcome {
	out := outcome{attempt: d.attempt, tenant: r.id.Tenant, args: d.args.canonical}
	if r.id.User == "" {
		out.err = refusal(reasonSignInRequired, errNoUser)
		return out
	}
	var err error
	if err = s.recordPending(ctx, &out.attempt, out.args, out.tenant); err != nil {
		out.err = err
		return out
	}
	text, structured := "", map[string]any{"server": d.connect}
	c, err := s.ConnectServer(ctx, r.id.Tenant, r.id.User, d.connect)
	switch {
	case err != nil:
		out.err = &FailedError{Class: failureTransport, Err: fmt.Errorf("server %q could not be connected: %v", d.connect, err)}
		return out
	case c.State == ConnectConnected:
		structured["state"], structured["tools"] = c.State, c.Tools
		text = fmt.Sprintf("Connected %s for the user. Its tools now join the listing: %s.", d.connect, strings.Join(c.Tools, ", "))
	default:
		structured["state"], structured["authorization_url"], structured["expire_time"] = c.State, c.AuthorizationURL, c.ExpireTime.UTC().Format(time.RFC3339)
		text = fmt.Sprintf("The user has to sign in to %s first: ask them to open %s (good once, until %s), then call %s again.",
			d.connect, c.AuthorizationURL, c.ExpireTime.UTC().Format(time.RFC3339), agentsurface.ConnectToolName(d.connect))
	}
	out.res = &CallResult{CallID: d.attempt.CallID, Attempt: d.attempt.Attempt, ToolName: agentsurface.ConnectToolName(d.connect), Result: audit.ResultSucceeded,
		Content: []map[string]any{{"type": "text", "text": text}}, StructuredContent: structured}
	return out
}
