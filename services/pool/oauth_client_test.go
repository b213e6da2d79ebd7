package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// The pool's own clients (a client ID metadata document, dynamic registration) and how they
// authenticate at the token endpoint, against a small authorization server made for these
// tests (the real one of oauth_test.go, zitadel's, registers no clients dynamically); the
// conformance suite's client scenarios (tests/oauth_conformance_e2e_test.go) check the same
// against the suite's.

// dcrServer is an authorization server that registers clients (RFC 7591), approves every
// authorization at once, and takes at its token endpoint only a registered client
// authenticating as its registration says.
type dcrServer struct {
	t   *testing.T
	srv *httptest.Server
	// method is the token_endpoint_auth_method it registers clients with; register and
	// cimd say whether it offers dynamic registration and client ID metadata documents.
	method   string
	register bool
	cimd     bool

	mu      sync.Mutex
	clients map[string]string // client id -> secret
	// registrations counts the registrations made; clientIDs are the client ids of the
	// authorization requests, in order; grants the grant types of the token requests.
	registrations int
	clientIDs     []string
	grants        []string
	tokens        map[string]string // access token -> user
	expiresIn     int
}

func startDCRServer(t *testing.T, method string) *dcrServer {
	as := &dcrServer{t: t, method: method, register: true, clients: map[string]string{}, tokens: map[string]string{}, expiresIn: 3600}
	mux := http.NewServeMux()
	as.srv = httptest.NewServer(mux)
	t.Cleanup(as.srv.Close)
	mux.HandleFunc("/.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
		as.mu.Lock()
		defer as.mu.Unlock()
		meta := map[string]any{"issuer": as.srv.URL, "authorization_endpoint": as.srv.URL + "/authorize", "token_endpoint": as.srv.URL + "/token",
			"response_types_supported": []string{"code"}, "code_challenge_methods_supported": []string{"S256"},
			"token_endpoint_auth_methods_supported": []string{as.method}, "authorization_response_iss_parameter_supported": true,
			"client_id_metadata_document_supported": as.cimd}
		if as.register {
			meta["registration_endpoint"] = as.srv.URL + "/register"
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(meta)
	})
	mux.HandleFunc("/register", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			RedirectURIs []string `json:"redirect_uris"`
			ClientName   string   `json:"client_name"`
		}
		require.NoError(t, json.NewDecoder(r.Body).Decode(&req))
		require.Equal(t, []string{testCallback}, req.RedirectURIs)
		require.Equal(t, "Ringfence", req.ClientName)
		as.mu.Lock()
		defer as.mu.Unlock()
		as.registrations++
		id, secret := fmt.Sprintf("client-%d", as.registrations), "dcr-secret-"+randomHex()
		answer := map[string]any{"client_id": id, "token_endpoint_auth_method": as.method, "redirect_uris": req.RedirectURIs}
		if as.method != authNone {
			as.clients[id] = secret
			answer["client_secret"] = secret
		} else {
			as.clients[id] = ""
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(answer)
	})
	mux.HandleFunc("/authorize", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		require.Equal(t, "S256", q.Get("code_challenge_method"))
		as.mu.Lock()
		as.clientIDs = append(as.clientIDs, q.Get("client_id"))
		code := "code-" + randomHex()
		as.mu.Unlock()
		back, _ := url.Parse(q.Get("redirect_uri"))
		back.RawQuery = url.Values{"code": {code}, "state": {q.Get("state")}, "iss": {as.srv.URL}}.Encode()
		http.Redirect(w, r, back.String(), http.StatusFound)
	})
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, r.ParseForm())
		as.mu.Lock()
		defer as.mu.Unlock()
		as.grants = append(as.grants, r.PostForm.Get("grant_type"))
		id, secret, basic := r.BasicAuth()
		if basic {
			id, _ = url.QueryUnescape(id)
			secret, _ = url.QueryUnescape(secret)
		} else {
			id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
		}
		want, known := as.clients[id]
		if as.cimd && strings.HasPrefix(id, "https://") { // a metadata document's URL (not fetched here)
			want, known = "", true
		}
		usedMethod := map[bool]string{true: authBasic, false: authPost}[basic]
		if !basic && secret == "" {
			usedMethod = authNone
		}
		w.Header().Set("Content-Type", "application/json")
		if !known || want != secret || usedMethod != as.method {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "invalid_client", "error_description": "client " + id + " by " + usedMethod})
			return
		}
		tok := "at-" + randomHex()
		as.tokens[tok] = "someone"
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": as.expiresIn, "refresh_token": "rt-" + randomHex()})
	})
	return as
}

// forget makes the authorization server refuse every client it registered (invalid_client).
func (as *dcrServer) forget() {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.clients = map[string]string{}
}

func (as *dcrServer) counts() (registrations int, clientIDs, grants []string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	return as.registrations, append([]string(nil), as.clientIDs...), append([]string(nil), as.grants...)
}

// startProtectedMCP starts an MCP server at <url>/mcp that takes only as's tokens and names as
// in its protected resource metadata.
func startProtectedMCP(t *testing.T, as *dcrServer) string {
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	verify := func(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		as.mu.Lock()
		defer as.mu.Unlock()
		if _, ok := as.tokens[token]; !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: "someone", Expiration: time.Now().Add(time.Hour)}, nil
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "protected", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "ping", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil
	})
	mux.Handle("/.well-known/oauth-protected-resource/mcp", auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource: srv.URL + "/mcp", AuthorizationServers: []string{as.srv.URL}}))
	mux.Handle("/mcp", auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: srv.URL + "/.well-known/oauth-protected-resource/mcp"})(
		mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)))
	return srv.URL + "/mcp"
}

// ownClientHarness is a pool with sign-in on, and servers s1 and s2 (two MCP servers) whose
// sign-ins go to as with no client named: the pool brings its own.
func ownClientHarness(t *testing.T, as *dcrServer, c *clock) *harness {
	h := newHarness(t, harnessOpts{noImage: true, oauthCallback: testCallback, now: c.Now})
	for _, ref := range []string{"s1", "s2"} {
		u := startProtectedMCP(t, as)
		h.server(ref, func(r *registryv1.CreateServerRequest) {
			r.Command, r.Transport, r.Url = "", "streamable_http", u
			r.Oauth = &registryv1.OAuthSignIn{}
		})
	}
	return h
}

// connectOwn connects ref for user: the authorization URL, the redirect it answers at once
// (the test's browser), and the callback. It answers the callback's error.
func connectOwn(t *testing.T, h *harness, user, ref string) error {
	t.Helper()
	c, err := h.pool.ConnectServer(h.ctx, "default", user, ref)
	require.NoError(t, err)
	require.Equal(t, ConnectSignInRequired, c.State)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(c.AuthorizationURL)
	require.NoError(t, err)
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	done, err := h.pool.CompleteSignIn(h.ctx, callbackQuery(t, loc))
	if err != nil {
		return err
	}
	require.NoError(t, done.ConnectErr)
	require.Equal(t, []string{"ping"}, done.Tools)
	return nil
}

// TestDynamicRegistrationIsMadeOnceAndShared: without a client named, the pool registers
// itself at the authorization server once (RFC 7591) and every user's sign-in to every server
// whose authorization server it is uses that client, authenticating at the token endpoint as
// the registration says (client_secret_post here, in the exchange and the refresh alike). Its
// secret is sealed in pool.db. A registration the authorization server refuses
// (invalid_client) is dropped, and the next sign-in registers anew.
func TestDynamicRegistrationIsMadeOnceAndShared(t *testing.T) {
	as := startDCRServer(t, authPost)
	c := &clock{now: time.Now()}
	h := ownClientHarness(t, as, c)
	require.NoError(t, connectOwn(t, h, "alice", "s1"))
	require.NoError(t, connectOwn(t, h, "bob", "s1"))
	require.NoError(t, connectOwn(t, h, "alice", "s2"))
	registrations, clientIDs, _ := as.counts()
	require.Equal(t, 1, registrations, "one registration for the issuer and callback")
	require.Equal(t, []string{"client-1", "client-1", "client-1"}, clientIDs)

	stored, err := h.pool.store.OAuthClient(h.ctx, as.srv.URL, testCallback)
	require.NoError(t, err)
	require.Equal(t, "client-1", stored.ClientID)
	require.Equal(t, authPost, stored.AuthMethod)
	require.NotEmpty(t, stored.SecretSealed)
	require.NotContains(t, string(stored.SecretSealed), as.clients["client-1"], "the secret is sealed")

	// A refresh authenticates as the registration says too.
	c.advance(2 * time.Hour)
	conn, err := h.pool.ConnectServer(h.ctx, "default", "alice", "s1")
	require.NoError(t, err)
	require.Equal(t, ConnectConnected, conn.State)
	_, _, grants := as.counts()
	require.Equal(t, "refresh_token", grants[len(grants)-1])

	// The authorization server forgets its clients: the exchange is refused, the registration
	// dropped, and the next sign-in registers again.
	as.forget()
	err = connectOwn(t, h, "carol", "s1")
	require.ErrorIs(t, err, errBadCallback)
	require.ErrorContains(t, err, "invalid_client")
	_, err = h.pool.store.OAuthClient(h.ctx, as.srv.URL, testCallback)
	require.ErrorIs(t, err, store.ErrNotFound, "a refused registration is dropped")
	require.NoError(t, connectOwn(t, h, "carol", "s1"))
	registrations, clientIDs, _ = as.counts()
	require.Equal(t, 2, registrations)
	require.Equal(t, "client-2", clientIDs[len(clientIDs)-1])

	// Bob's token came from the forgotten client: its refresh is refused, and Bob signs in
	// again (with the new client).
	c.advance(2 * time.Hour)
	conn, err = h.pool.ConnectServer(h.ctx, "default", "bob", "s1")
	require.NoError(t, err)
	require.Equal(t, ConnectSignInRequired, conn.State)
	require.Contains(t, conn.AuthorizationURL, "client_id=client-2")
}

// TestTokenEndpointAuthentication: the exchange and the refresh authenticate as the client's
// registration says: client_secret_basic in a Basic header, client_secret_post in the body,
// none with the client id alone. The authorization server refuses any other way.
func TestTokenEndpointAuthentication(t *testing.T) {
	for _, method := range []string{authBasic, authPost, authNone} {
		t.Run(method, func(t *testing.T) {
			as := startDCRServer(t, method)
			c := &clock{now: time.Now()}
			h := ownClientHarness(t, as, c)
			require.NoError(t, connectOwn(t, h, "alice", "s1"))
			c.advance(2 * time.Hour)
			conn, err := h.pool.ConnectServer(h.ctx, "default", "alice", "s1")
			require.NoError(t, err)
			require.Equal(t, ConnectConnected, conn.State)
			_, _, grants := as.counts()
			require.Equal(t, []string{"authorization_code", "refresh_token"}, grants)
		})
	}
}

// TestClientMetadataDocument: an authorization server that accepts client ID metadata
// documents gets the document's URL as client id (no registration), when that URL is https;
// the pool serves the document on its HTTP listener.
func TestClientMetadataDocument(t *testing.T) {
	as := startDCRServer(t, authNone)
	as.cimd = true
	h := ownClientHarness(t, as, &clock{now: time.Now()})

	// The default URL follows the callback, http here: authorization servers take https
	// only, so the pool registers itself instead.
	require.NoError(t, connectOwn(t, h, "alice", "s1"))
	registrations, clientIDs, _ := as.counts()
	require.Equal(t, 1, registrations)
	require.Equal(t, "client-1", clientIDs[0])

	const doc = "https://tools.example.com/v1/oauth/client-metadata"
	h.pool.cfg.OAuthClientMetadataURL = doc
	require.NoError(t, connectOwn(t, h, "bob", "s1"))
	registrations, clientIDs, _ = as.counts()
	require.Equal(t, 1, registrations, "no registration with a metadata document")
	require.Equal(t, doc, clientIDs[1])

	rec := httptest.NewRecorder()
	h.pool.ClientMetadataHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, OAuthClientMetadataPath, nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.JSONEq(t, `{"client_id":"`+doc+`","client_name":"Ringfence","redirect_uris":["`+testCallback+`"],
		"grant_types":["authorization_code","refresh_token"],"response_types":["code"],"token_endpoint_auth_method":"none"}`, rec.Body.String())
}

// TestNoClientIsRefused: an authorization server that offers neither a client ID metadata
// document nor dynamic registration, for a registration that names no client: the sign-in
// is refused, saying to register a client and name it.
func TestNoClientIsRefused(t *testing.T) {
	as := startDCRServer(t, authNone)
	as.register = false
	h := ownClientHarness(t, as, &clock{now: time.Now()})
	_, err := h.pool.ConnectServer(h.ctx, "default", "alice", "s1")
	require.ErrorIs(t, err, errNoClient)
	require.ErrorContains(t, err, "offers neither a client ID metadata document")
	require.ErrorContains(t, err, "--oauth-client-id")
	st := status.Convert(h.pool.errors.Status(h.ctx, err))
	require.Equal(t, codes.FailedPrecondition, st.Code())
	require.True(t, strings.Contains(st.Message(), "--oauth-client-id"), st.Message())
}
