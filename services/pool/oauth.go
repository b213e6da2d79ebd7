package pool

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// OAuth sign-in for servers that act for a person (docs/oauth.md). The pool is the OAuth
// client: it discovers the server's authorization server (RFC 9728, then RFC 8414 metadata),
// sends the user to it with PKCE (S256) and the resource parameter (RFC 8707), takes the code at
// /v1/oauth/callback once (the state is single use, bound to tenant, user and server, and
// expires), checks the iss parameter (RFC 9207), and keeps the user's token sealed in pool.db
// (or in etcd, shared by every pool host) under (tenant, user, server), refreshed before it
// expires. Tokens live with the pool and nowhere else: the pool is the one service that sends
// them, so no internal RPC ever carries one.

// Defaults of the sign-in settings (oauth.* in the configuration).
const (
	DefaultOAuthStateTTL      = 10 * time.Minute
	DefaultOAuthRefreshBefore = time.Minute
	// oauthHTTPTimeout bounds one request to an authorization server or for metadata.
	oauthHTTPTimeout = 15 * time.Second
	// maxTokenResponse bounds a token endpoint's answer.
	maxTokenResponse = 1 << 20
)

// errSignInRequired: the user has no token the server takes (never signed in, refused or
// revoked, or obtained under sign-in settings since changed). signInError carries the URL.
var errSignInRequired = errors.New("pool: sign-in required")

// errNoCallback: the deployment did not say where authorization servers send users back.
var errNoCallback = errors.New("pool: no OAuth callback URL is configured: set RINGFENCE_OAUTH__CALLBACK_URL (or frontdoor.public_url) to the pool's HTTP listener as the user's browser reaches it")

// errNoSignIn: the server does not sign users in.
var errNoSignIn = errors.New("pool: the server signs nobody in (its registration has no oauth): its tools need no connect")

// errNoUser: a sign-in needs the user it is for.
var errNoUser = errors.New("pool: the run acts for no user, so no user's token can be sent: start the run with a user (StartRun user, ringfence runs start --user)")

// errBadCallback: a callback that cannot finish any sign-in.
var errBadCallback = errors.New("pool: sign-in callback refused")

// signInError is a sign-in the user has to make: where to go, and until when that URL is good.
type signInError struct {
	ref    string
	url    string
	expire time.Time
	why    string
}

func (e *signInError) Error() string {
	msg := fmt.Sprintf("server %q signs each user in and has no token for the user this run acts for", e.ref)
	if e.why != "" {
		msg = fmt.Sprintf("server %q signs each user in: %s", e.ref, e.why)
	}
	if e.url != "" {
		msg += "; the user signs in at " + e.url + " (good once, until " + e.expire.UTC().Format(time.RFC3339) + "), then the call is made again"
	}
	return msg
}

func (e *signInError) Unwrap() error { return errSignInRequired }

// oauthToken is a user's token at rest (sealed whole) and what refreshing it needs.
type oauthToken struct {
	AccessToken  string    `json:"access_token"`
	RefreshToken string    `json:"refresh_token,omitempty"`
	TokenType    string    `json:"token_type,omitempty"`
	Expiry       time.Time `json:"expiry,omitzero"`
	// IssueTime is when the pool obtained it (none in tokens stored before the pool kept it):
	// its refresh is due, by the monotonic clock, no later than Expiry-IssueTime after the pool
	// first saw it (renewLife), whatever the wall clock did since.
	IssueTime time.Time `json:"issue_time,omitzero"`
	Issuer    string    `json:"issuer"`
	TokenURL  string    `json:"token_url"`
	Resource  string    `json:"resource"`
	// SignIn is the fingerprint of the registration's sign-in settings it was obtained under.
	SignIn string `json:"sign_in"`
	// ClientID and AuthMethod are the client it was obtained by and how that client
	// authenticates at the token endpoint, which its refreshes use (empty in tokens stored
	// before clients other than the registration's: the registration's client).
	ClientID   string `json:"client_id,omitempty"`
	AuthMethod string `json:"auth_method,omitempty"`
	// Scopes are the scopes its sign-in asked for (none in tokens stored before the pool kept
	// them): a scope challenge to it is answered by a sign-in for these and the challenge's.
	Scopes []string `json:"scopes,omitempty"`
}

func tokenContext(tenant, user, ref string) []byte {
	return []byte("pool/oauth/token/" + tenant + "/" + user + "/" + ref)
}

func verifierContext(hash string) []byte { return []byte("pool/oauth/state/" + hash) }

// ValidateUser checks a run's user: ident.User.
func ValidateUser(field, user string) error { return ident.User.Check(field, user) }

// oauthClient is the HTTP client for metadata, token and refresh requests: bounded, and
// following no redirect (a token request carries the client's secret and the user's code).
func (s *Service) oauthClient() *http.Client {
	if s.cfg.OAuthHTTPClient != nil {
		return s.cfg.OAuthHTTPClient
	}
	return &http.Client{Timeout: oauthHTTPTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (s *Service) now() time.Time {
	if s.cfg.Now != nil {
		return s.cfg.Now()
	}
	return time.Now()
}

// resourceOf is the server's resource identifier (RFC 8707, RFC 9728): its URL without query or
// fragment. A query may carry a credential, which an authorization server has no business
// seeing.
func resourceOf(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	u.RawQuery, u.Fragment, u.User = "", "", nil
	return u.String(), nil
}

// authServer discovers the server's authorization server and the scopes a sign-in asks for.
// Unless the registration names both an authorization server and scopes, the server is asked
// once without a token, and its 401's WWW-Authenticate read (where its protected resource
// metadata is, and the scope it wants). The authorization server is the registration's, or the
// first of the server's protected resource metadata (RFC 9728: at the URL the challenge
// names, then the path-suffixed well-known URL, then the root one); then its metadata (RFC
// 8414, or OpenID discovery). An authorization server that does not offer PKCE with S256 is
// refused, as the MCP authorization spec asks. The scopes are the registration's; else the
// challenge's; else the metadata's scopes_supported; else none (the parameter is omitted).
func (s *Service) authServer(ctx context.Context, res *mcpserver.Resolved) (*oauthex.AuthServerMeta, string, []string, error) {
	resource, err := resourceOf(res.URL)
	if err != nil {
		return nil, "", nil, fmt.Errorf("the server's URL cannot be read: %v", err)
	}
	hc := s.oauthClient()
	issuer, scopes := res.OAuth.AuthorizationServer, res.OAuth.Scopes
	if issuer == "" || len(scopes) == 0 {
		metadataURL, challenged := s.wwwAuthenticate(ctx, res)
		if len(scopes) == 0 {
			scopes = challenged
		}
		// Each metadata URL stands for a resource (RFC 9728 section 3.3): the root one for
		// the server's origin, the others for its URL.
		u, _ := url.Parse(resource)
		origin := u.Scheme + "://" + u.Host
		type try struct{ metadata, resource string }
		var tries []try
		if metadataURL != "" {
			tries = append(tries, try{metadataURL, resource})
		}
		if p := strings.Trim(u.Path, "/"); p != "" {
			tries = append(tries, try{origin + "/.well-known/oauth-protected-resource/" + p, resource})
		}
		tries = append(tries, try{origin + "/.well-known/oauth-protected-resource", origin})
		var errs []string
		var prm *oauthex.ProtectedResourceMetadata
		for _, m := range tries {
			p, err := oauthex.GetProtectedResourceMetadata(ctx, m.metadata, m.resource, hc)
			if err != nil {
				errs = append(errs, m.metadata+": "+fetchProblem(err))
				continue
			}
			if len(p.AuthorizationServers) == 0 {
				errs = append(errs, m.metadata+" names no authorization server")
				continue
			}
			prm = p
			break
		}
		if prm != nil {
			// The resource the server publishes is the one its tokens are for (RFC 8707).
			resource = prm.Resource
		}
		switch {
		case issuer != "":
			// The operator's authorization server stands; the metadata gave scopes at most.
		case prm == nil:
			return nil, "", nil, fmt.Errorf("the server's authorization server could not be discovered (RFC 9728 protected resource metadata: %s); name it in the registration's oauth.authorization_server", strings.Join(errs, "; "))
		default:
			issuer = prm.AuthorizationServers[0]
		}
		if len(scopes) == 0 && prm != nil {
			scopes = mcpserver.ScopeList(prm.ScopesSupported)
		}
	}
	asm, err := sdkauth.GetAuthServerMetadata(ctx, issuer, hc)
	if err != nil {
		return nil, "", nil, fmt.Errorf("the metadata of authorization server %s could not be read: %s", issuer, fetchProblem(err))
	}
	if asm == nil {
		return nil, "", nil, fmt.Errorf("authorization server %s serves no metadata (RFC 8414 or OpenID discovery)", issuer)
	}
	if !slices.Contains(asm.CodeChallengeMethodsSupported, "S256") {
		return nil, "", nil, fmt.Errorf("authorization server %s does not offer PKCE with S256 (code_challenge_methods_supported), which sign-in requires", issuer)
	}
	return asm, resource, scopes, nil
}

// fetchProblem says why a metadata document could not be fetched in an operator's words: the
// network's reason when there is one (the SDK's wrapping and Go's dial details say the same at
// length), else the error's own text. The SDK wraps some errors as text, so the reasons are
// read from the text too.
func fetchProblem(err error) string {
	text := err.Error()
	where := ""
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		where = hostOf(urlErr.URL)
	} else if m := quotedURL.FindStringSubmatch(text); m != nil {
		where = hostOf(m[1])
	}
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr):
		return fmt.Sprintf("the host %s does not resolve", dnsErr.Name)
	case strings.Contains(text, "no such host") && where != "":
		return "the host of " + where + " does not resolve"
	case (errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(text, "connection refused")) && where != "":
		return "nothing accepts connections at " + where
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return "no answer in time"
	case urlErr != nil:
		return urlErr.Err.Error()
	}
	return text
}

// quotedURL finds the URL net/http quotes in a request's error (Get "https://…": …).
var quotedURL = regexp.MustCompile(`"(https?://[^"\s]+)"`)

// hostOf is the scheme and host of a URL, or the URL as it is when it does not parse.
func hostOf(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		return u.Scheme + "://" + u.Host
	}
	return raw
}

// oauth2Config is the client as the authorization server knows it.
func (s *Service) oauth2Config(c signInClient, scopes []string, authURL, tokenURL string) *oauth2.Config {
	return &oauth2.Config{
		ClientID: c.id, ClientSecret: c.secret, Scopes: scopes,
		RedirectURL: s.cfg.OAuthCallbackURL,
		Endpoint:    oauth2.Endpoint{AuthURL: authURL, TokenURL: tokenURL, AuthStyle: c.authStyle()},
	}
}

// beginSignIn makes the authorization URL a user opens to sign in to the server, and keeps what
// the callback needs under the SHA-256 of its state (the PKCE verifier sealed). The answer is a
// *signInError carrying the URL. up, when the server refused the user's token for want of
// scope, widens the scopes the sign-in asks for (oauth_stepup.go), or refuses (errScopeNotGranted)
// when a new sign-in would not help.
func (s *Service) beginSignIn(ctx context.Context, tenant, user string, res *mcpserver.Resolved, why string, up *stepUp) error {
	if s.cfg.OAuthCallbackURL == "" {
		return errNoCallback
	}
	asm, resource, scopes, err := s.authServer(ctx, res)
	if err != nil {
		return fmt.Errorf("%w: server %q: %v", errServerUnreachable, res.Ref, err)
	}
	if up != nil {
		if scopes, err = up.scopes(res.Ref, scopes); err != nil {
			return err
		}
	}
	client, err := s.chooseClient(ctx, res, asm)
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, errNoClient) || errors.Is(err, etcdstore.ErrUnavailable) {
		return err // the pool's own client, or etcd, is the problem: not the server
	}
	if err != nil {
		return fmt.Errorf("%w: server %q: %v", errServerUnreachable, res.Ref, err)
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	state := base64.RawURLEncoding.EncodeToString(b[:])
	hash := stateHash(state)
	verifier := oauth2.GenerateVerifier()
	expire := s.now().Add(s.stateTTL())
	p, _ := auth.FromContext(ctx)
	actorID, actorName, actorRole := p.AuditActor()
	st := store.SignInState{Tenant: tenant, User: user, Ref: res.Ref, SignIn: res.SignInFingerprint(), Issuer: asm.Issuer,
		ActorKeyID: actorID, ActorKeyName: actorName, ActorRole: actorRole,
		TokenURL: asm.TokenEndpoint, Resource: resource, IssAdvertised: asm.AuthorizationResponseIssParameterSupported,
		ClientID: client.id, AuthMethod: client.method, Scopes: scopes,
		VerifierSealed: s.cfg.Secrets.Seal([]byte(verifier), verifierContext(hash)), ExpireTime: expire}
	if err := s.oauth.PutSignInState(ctx, hash, st, s.now()); err != nil {
		return err
	}
	s.signInLife(hash, st)
	authURL := s.oauth2Config(client, scopes, asm.AuthorizationEndpoint, asm.TokenEndpoint).AuthCodeURL(state,
		oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("resource", resource))
	return &signInError{ref: res.Ref, url: authURL, expire: expire, why: why}
}

// renewLife is the life of user token t until its refresh is due: oauth.refresh_before ahead
// of its expiry by the wall clock, and no later by the monotonic clock than its lifetime allows
// from when this process first saw it (clock.go). A clock set back would otherwise keep an
// expired token in use, and the server's 401 would drop the user's sign-in.
func (s *Service) renewLife(t oauthToken) lifetime {
	return s.oauthLives.get(s, stateHash(t.AccessToken), t.IssueTime, t.Expiry.Add(-s.refreshBefore()), noLimit)
}

// signInLife is the life of the sign-in whose state hashes to hash: oauth.state_ttl from when
// this process began it, by both clocks (clock.go), so a clock set back does not keep its link
// good for longer. A sign-in another pool host began (its callback reached this one) is judged
// from its stored expiry, and never longer than oauth.state_ttl from now.
func (s *Service) signInLife(hash string, st store.SignInState) lifetime {
	return s.signInLives.get(s, hash, st.ExpireTime.Add(-s.stateTTL()), st.ExpireTime, s.stateTTL())
}

func stateHash(state string) string {
	sum := sha256.Sum256([]byte(state))
	return hex.EncodeToString(sum[:])
}

func (s *Service) stateTTL() time.Duration {
	if s.cfg.OAuthStateTTL > 0 {
		return s.cfg.OAuthStateTTL
	}
	return DefaultOAuthStateTTL
}

func (s *Service) refreshBefore() time.Duration {
	if s.cfg.OAuthRefreshBefore > 0 {
		return s.cfg.OAuthRefreshBefore
	}
	return DefaultOAuthRefreshBefore
}

// SignedIn is what a finished sign-in says (never the token).
type SignedIn struct {
	Tenant, User, Ref string
	// Tools are the names the server declared to the user, when it could be connected at once.
	Tools []string
	// ConnectErr says why it could not (the token is kept: connecting again finishes).
	ConnectErr error
}

// CompleteSignIn is the callback: it takes the sign-in the state names (once), refuses an
// authorization server's error, a missing or foreign iss (RFC 9207: a mix-up), and a
// registration whose sign-in settings changed meanwhile, exchanges the code with the PKCE
// verifier and the resource, stores the token sealed, and connects the server for the user.
// Its errors never quote the code or the state.
func (s *Service) CompleteSignIn(ctx context.Context, q url.Values) (*SignedIn, error) {
	state := q.Get("state")
	if state == "" || len(state) > 512 {
		return nil, fmt.Errorf("%w: it carries no state", errBadCallback)
	}
	hash := stateHash(state)
	st, err := s.oauth.TakeSignInState(ctx, hash)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: its state is unknown, was used already, or was replaced by a newer sign-in: sign in again from the start", errBadCallback)
	}
	if err != nil {
		return nil, err
	}
	life := s.signInLife(hash, st)
	s.signInLives.forget(hash)
	if s.over(life) {
		return nil, fmt.Errorf("%w: the sign-in expired (oauth.state_ttl): sign in again from the start", errBadCallback)
	}
	if e := q.Get("error"); e != "" {
		return nil, fmt.Errorf("%w: the authorization server answered %s: %s", errBadCallback, clip(e, 64), clip(q.Get("error_description"), 256))
	}
	switch iss := q.Get("iss"); {
	case iss == "" && st.IssAdvertised:
		return nil, fmt.Errorf("%w: the authorization server says it sends iss (RFC 9207), and this answer has none", errBadCallback)
	case iss != "" && iss != st.Issuer:
		return nil, fmt.Errorf("%w: the answer comes from issuer %s, not %s, where the sign-in began (RFC 9207: an authorization server mix-up); nothing was exchanged", errBadCallback, clip(iss, 256), st.Issuer)
	}
	code := q.Get("code")
	if code == "" {
		return nil, fmt.Errorf("%w: it carries no code", errBadCallback)
	}
	res, err := s.cfg.Registry.ResolveRegistration(ctx, st.Ref)
	if err != nil {
		return nil, err
	}
	if res.OAuth == nil || res.SignInFingerprint() != st.SignIn {
		return nil, fmt.Errorf("%w: server %q's sign-in settings changed since the sign-in began: sign in again", errBadCallback, st.Ref)
	}
	client, err := s.clientByID(ctx, res, st.Issuer, func(id string) bool { return id == st.ClientID })
	if errors.Is(err, errClientGone) {
		return nil, fmt.Errorf("%w: %v since the sign-in began: sign in again", errBadCallback, err)
	}
	if err != nil {
		return nil, err
	}
	client.method = st.AuthMethod
	verifier, err := s.cfg.Secrets.Open(st.VerifierSealed, verifierContext(hash))
	if err != nil {
		return nil, err
	}
	conf := s.oauth2Config(client, nil, "", st.TokenURL)
	tok, err := conf.Exchange(context.WithValue(ctx, oauth2.HTTPClient, s.oauthClient()), code,
		oauth2.VerifierOption(string(verifier)), oauth2.SetAuthURLParam("resource", st.Resource))
	if err != nil {
		if re := (*oauth2.RetrieveError)(nil); errors.As(err, &re) && re.ErrorCode == "invalid_client" {
			s.dropClient(ctx, st.Issuer, client)
		}
		return nil, fmt.Errorf("%w: the authorization server refused the code: %s", errBadCallback, tokenErrorText(err))
	}
	t := oauthToken{AccessToken: tok.AccessToken, RefreshToken: tok.RefreshToken, TokenType: tok.TokenType, Expiry: tok.Expiry, IssueTime: s.now().UTC(),
		Issuer: st.Issuer, TokenURL: st.TokenURL, Resource: st.Resource, SignIn: st.SignIn, ClientID: client.id, AuthMethod: client.method, Scopes: st.Scopes}
	// A new sign-in's token replaces whatever is stored: a refresh of the old one in flight
	// meanwhile loses its compare-and-swap and takes this one (userToken).
	sealed, err := s.sealToken(st.Tenant, st.User, st.Ref, t)
	if err != nil {
		return nil, err
	}
	if err := s.oauth.PutOAuthToken(ctx, st.Tenant, st.User, st.Ref, sealed); err != nil {
		return nil, err
	}
	// On record as the key that asked for the sign-in (it asserted the user).
	s.recordSignInEvent(ctx, audit.AdminEvent{ActorKeyID: st.ActorKeyID, ActorKeyName: st.ActorKeyName, ActorRole: cmp.Or(st.ActorRole, "system"),
		Action: actionOAuthSignIn}, st.Tenant, st.User, st.Ref, "")
	out := &SignedIn{Tenant: st.Tenant, User: st.User, Ref: st.Ref}
	out.Tools, out.ConnectErr = s.connect(ctx, st.Tenant, st.User, res)
	return out, nil
}

// Admin actions of users' sign-ins, as the pool records them: a sign-in finished (its actor is
// the key that asked for it, which asserted the user), and a token dropped (why says so).
const (
	actionOAuthSignIn   = "oauth_sign_in"
	actionOAuthDrop     = "oauth_drop"
	resourceOAuthServer = "oauth_connection"
)

// dropSignInAt deletes user's token of server ref, read at at, with the user's stored listing,
// and records why: store.ErrTokenChanged, dropping and recording nothing, when another host
// (or a new sign-in) stored a token since.
func (s *Service) dropSignInAt(ctx context.Context, at store.SealedToken, tenant, user, ref, why string) error {
	if err := s.oauth.DropSignInAt(context.WithoutCancel(ctx), tenant, user, ref, at); err != nil {
		return err
	}
	p, _ := auth.FromContext(ctx)
	id, name, role := p.AuditActor()
	s.recordSignInEvent(ctx, audit.AdminEvent{ActorKeyID: id, ActorKeyName: name, ActorRole: role, Action: actionOAuthDrop}, tenant, user, ref, why)
	return nil
}

// recordSignInEvent puts a sign-in or a drop in the audit log as an admin event naming the
// server and the user, never a token. A record that cannot be spooled is logged: the sign-in
// (or the drop) stands all the same, as a key's would.
func (s *Service) recordSignInEvent(ctx context.Context, ev audit.AdminEvent, tenant, user, ref, why string) {
	change := map[string]any{"server": ref, "user": user}
	if why != "" {
		change["reason"] = why
	}
	ev.ResourceType, ev.ResourceID = resourceOAuthServer, ref
	ev.Change, _ = json.Marshal(change)
	if err := s.spool.Enqueue(context.WithoutCancel(ctx), audit.NewAdminRecord("pool", tenant, ev)); err != nil {
		s.log.Error("a sign-in's admin event could not be recorded in the audit spool", "action", ev.Action, "server", ref, "err", err)
	}
}

// tokenErrorText is what an authorization server's refusal says, without its body's other
// fields: the error code and description only.
func tokenErrorText(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		if re.ErrorCode != "" {
			return clip(re.ErrorCode, 64) + " " + clip(re.ErrorDescription, 256)
		}
		if re.Response != nil {
			return "HTTP " + re.Response.Status
		}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return clip(ue.Err.Error(), 256)
	}
	return clip(err.Error(), 256)
}

func clip(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	return truncateTo(s, n)
}

func (s *Service) sealToken(tenant, user, ref string, t oauthToken) ([]byte, error) {
	plain, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	return s.cfg.Secrets.Seal(plain, tokenContext(tenant, user, ref)), nil
}

// readToken reads user's token of server ref, opened, and the revision it was read at.
func (s *Service) readToken(ctx context.Context, tenant, user, ref string) (store.SealedToken, oauthToken, error) {
	at, err := s.oauth.OAuthToken(ctx, tenant, user, ref)
	if err != nil {
		return at, oauthToken{}, err
	}
	plain, err := s.cfg.Secrets.Open(at.Sealed, tokenContext(tenant, user, ref))
	if err != nil {
		return at, oauthToken{}, fmt.Errorf("pool: server %q: the user's token does not open with this host's secrets key (pool hosts sharing etcd need the same secrets_key_file): %w", ref, err)
	}
	var t oauthToken
	err = json.Unmarshal(plain, &t)
	return at, t, err
}

// Bounds of a refresh: how long a request waits for another one's refresh of the same token
// (which makes at most two requests to the token endpoint, each within oauthHTTPTimeout), and
// how often userToken reads a token that other hosts keep replacing before it gives up.
const (
	refreshLockWait = 2*oauthHTTPTimeout + 5*time.Second
	maxTokenReads   = 4
)

// refreshLockWait is how long a refresh, or a client registration, waits for the lock another
// request holds.
func (s *Service) refreshLockWait() time.Duration {
	if s.lockWait > 0 {
		return s.lockWait
	}
	return refreshLockWait
}

// userToken is the user's token for the server, refreshed first when it expires within
// oauth.refresh_before. errSignInRequired (wrapped, with why) when there is none the server
// takes: none stored, one obtained under other sign-in settings, or one the authorization
// server refuses to refresh; the last two are dropped, with the user's stored listing.
//
// A refresh holds the user's token of the server on every pool host (OAuthStore.LockOAuthToken)
// and reads it again under the lock: a rotating refresh token is good once, so a second
// refresh of the same token would be refused and drop the token the first one stored; the
// request that waited finds that token instead. The refreshed token is written by a
// compare-and-swap on the revision it was read at all the same (a lock whose lease lapsed, a
// new sign-in stored meanwhile), and so are the drops decided here: a write or drop that
// loses reads the token that won and goes on with it.
func (s *Service) userToken(ctx context.Context, tenant, user string, res *mcpserver.Resolved) (oauthToken, error) {
	if user == "" {
		return oauthToken{}, errNoUser
	}
	var unlock func()
	defer func() {
		if unlock != nil {
			unlock()
		}
	}()
	for range maxTokenReads {
		at, t, err := s.readToken(ctx, tenant, user, res.Ref)
		if errors.Is(err, store.ErrNotFound) {
			return oauthToken{}, fmt.Errorf("%w: the user has not signed in", errSignInRequired)
		}
		if err != nil {
			return oauthToken{}, err
		}
		var why string
		switch {
		case t.SignIn != res.SignInFingerprint():
			why = "the server's sign-in settings changed since the user signed in"
		case t.Expiry.IsZero() || !s.over(s.renewLife(t)):
			return t, nil
		case t.RefreshToken == "":
			why = "the user's token expired and came with no refresh token"
		case unlock == nil:
			lctx, cancel := context.WithTimeout(ctx, s.refreshLockWait())
			unlock, err = s.oauth.LockOAuthToken(lctx, tenant, user, res.Ref)
			cancel()
			if err != nil && ctx.Err() != nil {
				return oauthToken{}, ctx.Err()
			}
			if errors.Is(err, store.ErrLockHeld) {
				return oauthToken{}, fmt.Errorf("%w: server %q: the user's token is being refreshed elsewhere and was not released within %s: try again", errServerUnreachable, res.Ref, s.refreshLockWait())
			}
			if err != nil { // etcd out of reach (etcdstore.ErrUnavailable) says so itself
				return oauthToken{}, err
			}
			continue // read again under the lock: another host may have refreshed it meanwhile
		default:
			next, refused, err := s.renewToken(ctx, tenant, user, res, at, t)
			switch {
			case errors.Is(err, store.ErrTokenChanged):
				continue
			case err != nil:
				return oauthToken{}, err
			case refused == "":
				return next, nil
			}
			why = refused
		}
		err = s.dropSignInAt(ctx, at, tenant, user, res.Ref, why)
		if errors.Is(err, store.ErrTokenChanged) {
			continue
		}
		if err != nil {
			return oauthToken{}, err
		}
		return oauthToken{}, fmt.Errorf("%w: %s, so it was dropped", errSignInRequired, why)
	}
	return oauthToken{}, fmt.Errorf("%w: server %q: the user's token kept changing while it was read (other pool hosts kept replacing it): try again", errServerUnreachable, res.Ref)
}

// renewToken refreshes t, read at at, and stores the new token if the stored one is still
// t: store.ErrTokenChanged when another was stored since, which stands (the caller reads it
// again). refused says why the token is of no more use when the refresh was refused.
func (s *Service) renewToken(ctx context.Context, tenant, user string, res *mcpserver.Resolved, at store.SealedToken, t oauthToken) (next oauthToken, refused string, err error) {
	next, err = s.refresh(ctx, res, t)
	var r *refreshRefused
	if errors.As(err, &r) {
		if r.code == "" { // the token's client is gone: the text says so
			return oauthToken{}, r.text, nil
		}
		return oauthToken{}, "the authorization server refused to refresh the user's token (" + r.text + ")", nil
	}
	if err != nil {
		return oauthToken{}, "", fmt.Errorf("%w: server %q: the user's token could not be refreshed: %v", errServerUnreachable, res.Ref, err)
	}
	sealed, err := s.sealToken(tenant, user, res.Ref, next)
	if err != nil {
		return oauthToken{}, "", err
	}
	if err := s.oauth.ReplaceOAuthToken(ctx, tenant, user, res.Ref, at, sealed); err != nil {
		return oauthToken{}, "", err
	}
	return next, "", nil
}

// refreshRefused: the authorization server answered a refresh with an OAuth error (the grant
// is revoked, expired, or not this client's), or (code empty) the token's client is no longer
// the pool's: the token is of no more use.
type refreshRefused struct{ code, text string }

func (e *refreshRefused) Error() string { return "refresh refused: " + e.text }

// refresh trades the refresh token for a new token, sending the resource (RFC 8707) as the
// authorization request did: golang.org/x/oauth2 refreshes without it, so the request is made
// here, as RFC 6749 section 6 has it. The client is the one the token was obtained by, and it
// authenticates as it did then (section 2.3.1): client_secret_basic in a Basic header,
// client_secret_post in the body, none naming itself in the body. A token whose client is no
// longer the pool's, or whose registered client the authorization server refuses
// (invalid_client, which drops that registration), is refused like a revoked one.
func (s *Service) refresh(ctx context.Context, res *mcpserver.Resolved, t oauthToken) (oauthToken, error) {
	if t.ClientID == "" { // a token from before the pool had clients of its own
		t.ClientID, t.AuthMethod = res.OAuth.ClientID, authNone
		if res.ClientSecret != "" {
			t.AuthMethod = authBasic
		}
	}
	client, err := s.clientByID(ctx, res, t.Issuer, func(id string) bool { return id == t.ClientID })
	if errors.Is(err, errClientGone) {
		return oauthToken{}, &refreshRefused{text: "the client the user's token was obtained by is no longer Ringfence's client at the authorization server"}
	}
	if err != nil {
		return oauthToken{}, err
	}
	client.method = t.AuthMethod
	next, err := s.refreshAs(ctx, client, t)
	var refused *refreshRefused
	if errors.As(err, &refused) && refused.code == "invalid_client" {
		s.dropClient(ctx, t.Issuer, client)
	}
	return next, err
}

// refreshAs is one refresh request by client.
func (s *Service) refreshAs(ctx context.Context, client signInClient, t oauthToken) (oauthToken, error) {
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {t.RefreshToken}, "resource": {t.Resource}}
	basic := client.method == authBasic
	if !basic {
		form.Set("client_id", client.id)
		if client.method == authPost {
			form.Set("client_secret", client.secret)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.TokenURL, strings.NewReader(form.Encode()))
	if err != nil {
		return oauthToken{}, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	if basic {
		req.SetBasicAuth(url.QueryEscape(client.id), url.QueryEscape(client.secret))
	}
	resp, err := s.oauthClient().Do(req)
	if err != nil {
		return oauthToken{}, errors.New(tokenErrorText(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponse))
	if err != nil {
		return oauthToken{}, err
	}
	var answer struct {
		AccessToken      string      `json:"access_token"`
		TokenType        string      `json:"token_type"`
		RefreshToken     string      `json:"refresh_token"`
		ExpiresIn        json.Number `json:"expires_in"`
		Error            string      `json:"error"`
		ErrorDescription string      `json:"error_description"`
	}
	jerr := json.Unmarshal(body, &answer)
	switch {
	case resp.StatusCode >= 400 && resp.StatusCode < 500 && answer.Error != "":
		return oauthToken{}, &refreshRefused{code: answer.Error, text: clip(answer.Error, 64) + " " + clip(answer.ErrorDescription, 256)}
	case resp.StatusCode != http.StatusOK:
		return oauthToken{}, fmt.Errorf("the token endpoint answered HTTP %d", resp.StatusCode)
	case jerr != nil || answer.AccessToken == "":
		return oauthToken{}, errors.New("the token endpoint's answer is not a token response")
	}
	next := t
	next.AccessToken, next.TokenType, next.Expiry, next.IssueTime = answer.AccessToken, answer.TokenType, time.Time{}, s.now().UTC()
	if answer.RefreshToken != "" {
		next.RefreshToken = answer.RefreshToken // rotated
	}
	if secs, err := answer.ExpiresIn.Int64(); err == nil && secs > 0 {
		next.Expiry = s.now().Add(time.Duration(secs) * time.Second)
	}
	return next, nil
}

// withBearer is res with the user's token as its Authorization header: a copy, so the
// registration as resolved stays the operator's. The spawner masks it in any server text like
// every header value.
func withBearer(res *mcpserver.Resolved, token string) *mcpserver.Resolved {
	c := *res
	c.HeaderValues = make(map[string]string, len(res.HeaderValues)+1)
	for k, v := range res.HeaderValues {
		c.HeaderValues[k] = v
	}
	c.HeaderValues["Authorization"] = "Bearer " + token
	return &c
}
