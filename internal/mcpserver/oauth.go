package mcpserver

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/ident"
)

// OAuth is a remote registration's sign-in: the server acts for a person, so each user signs in
// to its authorization server (OAuth 2.1, authorization code with PKCE) and the pool sends that
// user's access token, never another's, as the Authorization header of every request. Nothing
// here is secret: the client secret is named (ClientSecretRef, a registry secret), never held.
type OAuth struct {
	// AuthorizationServer is the authorization server's issuer URL. Empty discovers it from
	// the server's protected resource metadata (RFC 9728), as MCP clients do; a confidential
	// client (ClientSecretRef) requires it, so its secret never goes where a server points.
	AuthorizationServer string `json:"authorization_server,omitempty"`
	// ClientID is a client the authorization server's operator registered for Ringfence, with
	// ClientSecretRef naming the registry secret that holds its secret (empty: a public
	// client, PKCE alone). Empty: the pool uses its client ID metadata document when the
	// authorization server accepts one, else registers itself there (RFC 7591); then
	// ClientSecretRef must be empty too.
	ClientID        string `json:"client_id,omitempty"`
	ClientSecretRef string `json:"client_secret_ref,omitempty"`
	// Scopes are asked for at sign-in; empty asks for the scopes the server's metadata names.
	Scopes []string `json:"scopes,omitempty"`
}

// Bounds of the sign-in settings.
const (
	MaxScopes    = 32
	MaxScopeName = 256
)

// validate checks the sign-in settings of a registration over transport: remote only, a
// client given, a secret named (never a value), scopes as RFC 6749 scope tokens, and no
// Authorization header of the registration's own (the pool sets it to the user's token).
func (o *OAuth) validate(transport string, headers map[string]string) error {
	if transport != TransportStreamableHTTP && transport != TransportSSE {
		return fielderr.New("oauth", "applies to the streamable_http and sse transports only (a stdio server has no sign-in): remove oauth, or set transport")
	}
	for h := range headers {
		if http.CanonicalHeaderKey(h) == "Authorization" {
			return fielderr.New("headers."+h, "is the user's access token on a server that signs users in (oauth): remove the header")
		}
	}
	if o.AuthorizationServer != "" {
		if len(o.AuthorizationServer) > MaxURL {
			return fielderr.New("oauth.authorization_server", "is longer than %d bytes", MaxURL)
		}
		u, err := CheckRemoteURL(o.AuthorizationServer)
		if err != nil {
			return fielderr.New("oauth.authorization_server", "%s", err.Error())
		}
		if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return fielderr.New("oauth.authorization_server", "is an issuer identifier: an https URL with no query, fragment or userinfo (RFC 8414)")
		}
	}
	if o.ClientID != "" && (len(o.ClientID) > 256 || !printable(o.ClientID)) {
		return fielderr.New("oauth.client_id", "must be 1 to 256 printable ASCII characters")
	}
	// Without a client id the pool is a client of its own making (a client ID metadata
	// document, or dynamic registration), which has no secret of the operator's.
	if o.ClientSecretRef != "" && o.ClientID == "" {
		return fielderr.New("oauth.client_secret_ref", "names the secret of a pre-registered client, and oauth.client_id names none: set client_id to the client the authorization server's operator registered, or remove client_secret_ref to let the pool use its client ID metadata document or register itself (RFC 7591)")
	}
	if o.ClientSecretRef != "" && !ident.SecretName.Valid(o.ClientSecretRef) {
		return fielderr.New("oauth.client_secret_ref", "must be the name of a registry secret (%s), never the secret itself: put the value in a secret (ringfence secrets set NAME, or PutSecret) and send its name; the value sent is not shown", ident.SecretName.Pattern())
	}
	// A client's secret goes to the authorization server the operator registered the client
	// at, never to one the MCP server names in its metadata: a server could name its own and
	// receive the secret with the code.
	if o.ClientSecretRef != "" && o.AuthorizationServer == "" {
		return fielderr.New("oauth.authorization_server", "is required with client_secret_ref: the client's secret is sent only to the authorization server named here (the issuer the client is registered at), never to one a server's metadata names; discovery (RFC 9728) serves public clients only")
	}
	if len(o.Scopes) > MaxScopes {
		return fielderr.New("oauth.scopes", "has %d entries; at most %d", len(o.Scopes), MaxScopes)
	}
	for i, s := range o.Scopes {
		if s == "" || len(s) > MaxScopeName || !scopeToken(s) {
			return fielderr.New(fmt.Sprintf("oauth.scopes[%d]", i), "%s is not a scope: 1 to %d printable ASCII characters without space, '\"' or '\\' (RFC 6749 3.3)", fielderr.Quote(s), MaxScopeName)
		}
	}
	return nil
}

func printable(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool { return r <= 0x20 || r >= 0x7f })
}

func scopeToken(s string) bool { return printable(s) && !strings.ContainsAny(s, "\"\\") }

// ScopeList is scopes a server or an authorization server named (a challenge, metadata) when
// they hold to the bounds a registration's are held to (at most MaxScopes RFC 6749 scope
// tokens of at most MaxScopeName bytes), or none: what a server names reaches an authorization
// URL only within them.
func ScopeList(scopes []string) []string {
	if len(scopes) > MaxScopes {
		return nil
	}
	for _, s := range scopes {
		if len(s) > MaxScopeName || !scopeToken(s) {
			return nil
		}
	}
	return scopes
}

// ScopeTokens is a scope parameter's space-separated tokens (RFC 6749 section 3.3) by
// ScopeList's bounds.
func ScopeTokens(scope string) []string { return ScopeList(strings.Fields(scope)) }

// SignInFingerprint names the settings a user's sign-in was made under: the transport and
// endpoint, and the sign-in fields (authorization server, client id, scopes). Tokens and tool
// listings stored for a user keep it, and one whose fingerprint is not the registration's
// current one is dropped: a change of any of these makes every user sign in again. Empty for a
// registration without sign-in. The URL enters hashed with the rest, so the fingerprint shows
// nothing of a credential in its query.
func (r *Registration) SignInFingerprint() string {
	if r.OAuth == nil {
		return ""
	}
	scopes := slices.Clone(r.OAuth.Scopes)
	slices.Sort(scopes)
	b, _ := json.Marshal([]any{"ringfence sign-in v1", r.Transport, r.URL, r.OAuth.AuthorizationServer, r.OAuth.ClientID, scopes})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}
