package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"

	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// The client the pool is at an authorization server, chosen in the order of the MCP
// authorization spec: the client the registration names (pre-registered by the
// authorization server's operator); else the pool's client ID metadata document, when the
// authorization server accepts one (client_id_metadata_document_supported) and the
// document's URL is https, as draft-ietf-oauth-client-id-metadata-document requires; else a
// client the pool registers for itself (RFC 7591, registration_endpoint), once per issuer and
// callback URL, kept in pool.db and shared by every user and server whose sign-ins go there.
// A client secret goes only to the authorization server that issued it or that the operator
// named (a pre-registered client's secret requires oauth.authorization_server).

// Kinds of client.
const (
	clientPreRegistered    = "pre-registered"
	clientMetadataDocument = "metadata document"
	clientDynamic          = "dynamic registration"
)

// Token endpoint authentication methods (RFC 7591 section 2).
const (
	authBasic = "client_secret_basic"
	authPost  = "client_secret_post"
	authNone  = "none"
)

// OAuthClientMetadataPath is where the pool serves its client ID metadata document.
const OAuthClientMetadataPath = "/v1/oauth/client-metadata"

// errNoClient: the authorization server offers no client Ringfence can use, and the
// registration names none: its operator registers one.
var errNoClient = errors.New("pool: Ringfence has no client at the server's authorization server")

// errClientGone: the client a sign-in or a token was obtained with is no longer the pool's
// (the registration names another, or the authorization server refused the dynamic one).
var errClientGone = errors.New("the client the user signed in with is no longer Ringfence's client at the authorization server")

// signInClient is the client of one sign-in: its id, its secret (empty for a public client)
// and how it authenticates at the token endpoint.
type signInClient struct {
	kind   string
	id     string
	secret string
	method string
}

// authStyle is how golang.org/x/oauth2 sends the client's credentials.
func (c signInClient) authStyle() oauth2.AuthStyle {
	if c.method == authBasic {
		return oauth2.AuthStyleInHeader
	}
	return oauth2.AuthStyleInParams // client_secret_post, and none (client_id alone)
}

// clientMetadataURL is the URL of the pool's client ID metadata document, which is also the
// client id it stands for: oauth.client_metadata_url, else the callback's origin with
// OAuthClientMetadataPath.
func (s *Service) clientMetadataURL() string {
	if s.cfg.OAuthClientMetadataURL != "" {
		return s.cfg.OAuthClientMetadataURL
	}
	u, err := url.Parse(s.cfg.OAuthCallbackURL)
	if err != nil || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host + OAuthClientMetadataPath
}

// ClientMetadata is the pool's client ID metadata document
// (draft-ietf-oauth-client-id-metadata-document): a public client whose id is the
// document's own URL, sending users back to the callback.
func (s *Service) ClientMetadata() map[string]any {
	return map[string]any{
		"client_id":                  s.clientMetadataURL(),
		"client_name":                "Ringfence",
		"redirect_uris":              []string{s.cfg.OAuthCallbackURL},
		"grant_types":                []string{"authorization_code", "refresh_token"},
		"response_types":             []string{"code"},
		"token_endpoint_auth_method": authNone,
	}
}

// chooseClient picks the client of a new sign-in at the authorization server asm describes.
func (s *Service) chooseClient(ctx context.Context, res *mcpserver.Resolved, asm *oauthex.AuthServerMeta) (signInClient, error) {
	if id := res.OAuth.ClientID; id != "" {
		c := signInClient{kind: clientPreRegistered, id: id, secret: res.ClientSecret, method: authNone}
		if c.secret != "" {
			m, err := secretMethod(asm)
			if err != nil {
				return signInClient{}, err
			}
			c.method = m
		}
		return c, nil
	}
	doc := s.clientMetadataURL()
	if asm.ClientIDMetadataDocumentSupported && strings.HasPrefix(doc, "https://") {
		return signInClient{kind: clientMetadataDocument, id: doc, method: authNone}, nil
	}
	if asm.RegistrationEndpoint != "" {
		return s.dynamicClient(ctx, asm)
	}
	why := "offers neither a client ID metadata document (client_id_metadata_document_supported) nor dynamic client registration (registration_endpoint)"
	if asm.ClientIDMetadataDocumentSupported {
		why = fmt.Sprintf("accepts a client ID metadata document, whose URL must be https (this pool's is %s: set oauth.client_metadata_url), and offers no dynamic client registration", doc)
	}
	return signInClient{}, fmt.Errorf("%w: authorization server %s %s: register a client for Ringfence there, its redirect URI %s, and name it in the registration (--oauth-client-id, with --oauth-client-secret-ref for a confidential one)",
		errNoClient, asm.Issuer, why, s.cfg.OAuthCallbackURL)
}

// secretMethod is how a client with a secret authenticates at asm's token endpoint: HTTP Basic
// when it offers it (or names no method: RFC 8414's default), else in the body.
func secretMethod(asm *oauthex.AuthServerMeta) (string, error) {
	supported := asm.TokenEndpointAuthMethodsSupported
	switch {
	case len(supported) == 0 || slices.Contains(supported, authBasic):
		return authBasic, nil
	case slices.Contains(supported, authPost):
		return authPost, nil
	}
	return "", fmt.Errorf("%w: authorization server %s takes a client secret neither by client_secret_basic nor client_secret_post (token_endpoint_auth_methods_supported: %s)", errNoClient, asm.Issuer, clip(strings.Join(supported, " "), 256))
}

// clientContext binds a registered client's sealed secret to its issuer and redirect URI.
func clientContext(issuer, redirectURI string) []byte {
	return []byte("pool/oauth/client/" + issuer + "\n" + redirectURI)
}

// dynamicClient is the client the pool registered at asm's issuer for its callback, registered
// now when there is none (or its secret expired). One registration at a time per issuer, on
// every pool host: two sign-ins at once share one client.
func (s *Service) dynamicClient(ctx context.Context, asm *oauthex.AuthServerMeta) (signInClient, error) {
	lctx, cancel := context.WithTimeout(ctx, s.refreshLockWait())
	unlock, err := s.oauth.LockOAuthClient(lctx, asm.Issuer, s.cfg.OAuthCallbackURL)
	cancel()
	if err != nil && ctx.Err() != nil {
		return signInClient{}, ctx.Err()
	}
	if errors.Is(err, store.ErrLockHeld) {
		return signInClient{}, fmt.Errorf("the pool's client registration at %s is being made elsewhere and was not released within %s: try again", asm.Issuer, s.refreshLockWait())
	}
	if err != nil { // etcd out of reach (etcdstore.ErrUnavailable) says so itself
		return signInClient{}, err
	}
	defer unlock()
	c, err := s.oauth.OAuthClient(ctx, asm.Issuer, s.cfg.OAuthCallbackURL)
	if err == nil && (c.SecretExpireTime.IsZero() || s.now().Add(s.stateTTL()).Before(c.SecretExpireTime)) {
		return s.openClient(c)
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return signInClient{}, err
	}
	c, secret, err := s.registerClient(ctx, asm)
	if err != nil {
		return signInClient{}, fmt.Errorf("registering Ringfence at authorization server %s (RFC 7591) failed: %v", asm.Issuer, err)
	}
	if err := s.oauth.PutOAuthClient(ctx, c); err != nil {
		return signInClient{}, err
	}
	s.log.Debug("registered an OAuth client at an authorization server", "issuer", asm.Issuer, "client_id", c.ClientID, "auth_method", c.AuthMethod)
	return signInClient{kind: clientDynamic, id: c.ClientID, secret: secret, method: c.AuthMethod}, nil
}

// openClient is a stored registration with its secret in clear.
func (s *Service) openClient(c store.OAuthClient) (signInClient, error) {
	out := signInClient{kind: clientDynamic, id: c.ClientID, method: c.AuthMethod}
	if len(c.SecretSealed) > 0 {
		secret, err := s.cfg.Secrets.Open(c.SecretSealed, clientContext(c.Issuer, c.RedirectURI))
		if err != nil {
			return signInClient{}, err
		}
		out.secret = string(secret)
	}
	return out, nil
}

// registerClient registers the pool at asm's registration endpoint (RFC 7591): a web client
// named Ringfence whose one redirect URI is the callback, asking to be public (PKCE alone)
// when the authorization server takes that, else for a secret. The request is made here
// rather than with oauthex.RegisterClient, whose errors quote the answer's body, which holds
// the client secret.
func (s *Service) registerClient(ctx context.Context, asm *oauthex.AuthServerMeta) (store.OAuthClient, string, error) {
	want := authNone
	if supported := asm.TokenEndpointAuthMethodsSupported; len(supported) > 0 && !slices.Contains(supported, authNone) {
		m, err := secretMethod(asm)
		if err != nil {
			return store.OAuthClient{}, "", err
		}
		want = m
	}
	body, _ := json.Marshal(map[string]any{
		"client_name": "Ringfence", "redirect_uris": []string{s.cfg.OAuthCallbackURL},
		"grant_types": []string{"authorization_code", "refresh_token"}, "response_types": []string{"code"},
		"token_endpoint_auth_method": want, "application_type": "web",
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, asm.RegistrationEndpoint, strings.NewReader(string(body)))
	if err != nil {
		return store.OAuthClient{}, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := s.oauthClient().Do(req)
	if err != nil {
		return store.OAuthClient{}, "", errors.New(tokenErrorText(err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponse))
	if err != nil {
		return store.OAuthClient{}, "", err
	}
	var answer struct {
		ClientID              string      `json:"client_id"`
		ClientSecret          string      `json:"client_secret"`
		ClientSecretExpiresAt json.Number `json:"client_secret_expires_at"`
		AuthMethod            string      `json:"token_endpoint_auth_method"`
		Error                 string      `json:"error"`
		ErrorDescription      string      `json:"error_description"`
	}
	jerr := json.Unmarshal(raw, &answer)
	switch {
	case resp.StatusCode >= 400 && answer.Error != "":
		return store.OAuthClient{}, "", fmt.Errorf("the registration endpoint refused: %s %s", clip(answer.Error, 64), clip(answer.ErrorDescription, 256))
	case resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK:
		return store.OAuthClient{}, "", fmt.Errorf("the registration endpoint answered HTTP %d", resp.StatusCode)
	case jerr != nil || answer.ClientID == "":
		return store.OAuthClient{}, "", errors.New("the registration endpoint's answer is not a client registration (no client_id)")
	case len(answer.ClientID) > 2048:
		return store.OAuthClient{}, "", errors.New("the registration endpoint's client_id is longer than 2048 bytes")
	}
	// The answer says how the client authenticates; without it, RFC 7591's default holds for a
	// client given a secret (client_secret_basic), and what was asked for otherwise.
	method := answer.AuthMethod
	if method == "" {
		method = want
		if answer.ClientSecret != "" && method == authNone {
			method = authBasic
		}
	}
	switch {
	case method != authBasic && method != authPost && method != authNone:
		return store.OAuthClient{}, "", fmt.Errorf("the registration endpoint registered token_endpoint_auth_method %s, which Ringfence does not use (client_secret_basic, client_secret_post, none)", clip(method, 64))
	case method != authNone && answer.ClientSecret == "":
		return store.OAuthClient{}, "", fmt.Errorf("the registration endpoint registered token_endpoint_auth_method %s and issued no client secret", method)
	}
	now := s.now().UTC()
	c := store.OAuthClient{Issuer: asm.Issuer, RedirectURI: s.cfg.OAuthCallbackURL, ClientID: answer.ClientID, AuthMethod: method, RegisterTime: now}
	if method == authNone {
		answer.ClientSecret = "" // a public client sends none
	}
	if answer.ClientSecret != "" {
		c.SecretSealed = s.cfg.Secrets.Seal([]byte(answer.ClientSecret), clientContext(c.Issuer, c.RedirectURI))
	}
	if secs, err := answer.ClientSecretExpiresAt.Int64(); err == nil && secs > 0 {
		c.SecretExpireTime = time.Unix(secs, 0).UTC()
	}
	return c, answer.ClientSecret, nil
}

// clientByID is the client id of a sign-in or a token, as the pool holds it now: the
// registration's own, the metadata document, or the registered client of that issuer.
// errClientGone when the pool's client there is another by now.
func (s *Service) clientByID(ctx context.Context, res *mcpserver.Resolved, issuer string, match func(id string) bool) (signInClient, error) {
	if id := res.OAuth.ClientID; id != "" {
		if match(id) {
			return signInClient{kind: clientPreRegistered, id: id, secret: res.ClientSecret}, nil
		}
		return signInClient{}, errClientGone
	}
	if doc := s.clientMetadataURL(); doc != "" && match(doc) {
		return signInClient{kind: clientMetadataDocument, id: doc}, nil
	}
	c, err := s.oauth.OAuthClient(ctx, issuer, s.cfg.OAuthCallbackURL)
	if errors.Is(err, store.ErrNotFound) {
		return signInClient{}, errClientGone
	}
	if err != nil {
		return signInClient{}, err
	}
	if !match(c.ClientID) {
		return signInClient{}, errClientGone
	}
	return s.openClient(c)
}

// dropClient forgets a registered client the authorization server refused (invalid_client):
// the next sign-in registers anew.
func (s *Service) dropClient(ctx context.Context, issuer string, c signInClient) {
	if c.kind != clientDynamic {
		return
	}
	if err := s.oauth.DropOAuthClient(context.WithoutCancel(ctx), issuer, s.cfg.OAuthCallbackURL, c.id); err != nil {
		s.log.Error("a refused OAuth client registration could not be dropped", "issuer", issuer, "err", err)
		return
	}
	s.log.Warn("the authorization server refused the client Ringfence registered there; the next sign-in registers anew", "issuer", issuer, "client_id", c.id)
}

// wwwAuthenticate asks the server without a token, as an MCP client's first requests would,
// and reads its 401's WWW-Authenticate challenges: where its protected resource metadata is
// (resource_metadata, RFC 9728 section 5.1) and the scope it asks for. A streamable HTTP server
// is asked server/discover (the stateless lifecycle, which the pool's sessions ask first), then
// initialize: a server may take initialize without a token and challenge the request after it,
// whose scope is the one its tools need. An SSE server is asked its stream (a GET). Best
// effort: a server that answers otherwise says nothing.
func (s *Service) wwwAuthenticate(ctx context.Context, res *mcpserver.Resolved) (metadataURL string, scopes []string) {
	if res.Transport == mcpserver.TransportSSE {
		return s.probeChallenge(ctx, res, http.MethodGet, "")
	}
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"ringfence","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"ringfence","version":"1"}}}`,
	} {
		if metadataURL, scopes = s.probeChallenge(ctx, res, http.MethodPost, body); metadataURL != "" || scopes != nil {
			break
		}
	}
	return metadataURL, scopes
}

// probeChallenge makes one request of wwwAuthenticate and reads its 401's Bearer challenge.
func (s *Service) probeChallenge(ctx context.Context, res *mcpserver.Resolved, method, body string) (metadataURL string, scopes []string) {
	req, err := http.NewRequestWithContext(ctx, method, res.URL, strings.NewReader(body))
	if err != nil {
		return "", nil
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.oauthClient().Do(req)
	if err != nil {
		return "", nil
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		return "", nil
	}
	challenges, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
	if err != nil {
		return "", nil
	}
	for _, c := range challenges {
		if c.Scheme != "bearer" {
			continue
		}
		if u := c.Params["resource_metadata"]; u != "" && metadataURL == "" {
			metadataURL = u
		}
		if sc := mcpserver.ScopeTokens(c.Params["scope"]); len(sc) > 0 && scopes == nil {
			scopes = sc
		}
	}
	return metadataURL, scopes
}
