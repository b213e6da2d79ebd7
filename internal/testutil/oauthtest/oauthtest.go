// Package oauthtest starts, inside a test, a real OAuth 2.1 authorization server (zitadel's
// OpenID provider, github.com/zitadel/oidc/v3/pkg/op, with the in-memory storage of its example)
// and a remote MCP server that takes only its tokens (the go-sdk's streamable HTTP server behind
// its bearer-token middleware, which introspects each token at the authorization server), both
// on loopback. The MCP server declares different tools to each user, so a token sent for the
// wrong user shows in its listing. A test signs a user in as a browser would: it follows the
// authorization URL, posts the login form, and stops at the redirect to the client's callback.
package oauthtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/stretchr/testify/require"
	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/client/rs"
	"github.com/zitadel/oidc/v3/pkg/oidc"
)

// Users of the example storage: Alice is its user id1, Bob its id2; both have the password
// Password.
const (
	Alice    = "id1"
	Bob      = "id2"
	Password = "verysecure"
)

// AuthServer is a running authorization server with one confidential client registered.
type AuthServer struct {
	Issuer       string
	ClientID     string
	ClientSecret string
	srv          *httptest.Server

	mu sync.Mutex
	// resources records the resource parameter (RFC 8707) of each request, by endpoint path
	// (the authorization endpoint, the token endpoint).
	resources map[string][]string
	grants    map[string][]string
}

// StartAuthServer starts an authorization server whose client clientID (secret secret) may
// send users back to redirectURI.
func StartAuthServer(t testing.TB, clientID, secret, redirectURI string) *AuthServer {
	t.Helper()
	as := &AuthServer{ClientID: clientID, ClientSecret: secret, resources: map[string][]string{}, grants: map[string][]string{}}
	var handler http.Handler
	as.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		as.observe(r)
		handler.ServeHTTP(w, r)
	}))
	t.Cleanup(as.srv.Close)
	as.Issuer = as.srv.URL
	clients := map[string]*storage.Client{clientID: storage.WebClient(clientID, secret, redirectURI)}
	st := storage.NewStorageWithClients(storage.NewUserStore(as.Issuer), clients)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	prev := slog.Default()
	handler = exampleop.SetupServer(as.Issuer, st, quiet, false)
	slog.SetDefault(prev) // SetupServer replaces the process's default logger
	return as
}

// observe records a request's resource and grant_type parameters before the server reads it.
func (as *AuthServer) observe(r *http.Request) {
	q := r.URL.Query()
	if r.Method == http.MethodPost && strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		if form, err := url.ParseQuery(string(body)); err == nil {
			q = form
		}
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	if res, ok := q["resource"]; ok {
		as.resources[r.URL.Path] = append(as.resources[r.URL.Path], res...)
	}
	if g := q.Get("grant_type"); g != "" {
		as.grants[r.URL.Path] = append(as.grants[r.URL.Path], g)
	}
}

// Resources returns the resource parameters requests to path carried.
func (as *AuthServer) Resources(path string) []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.resources[path])
}

// Grants returns the grant types of the token requests to path.
func (as *AuthServer) Grants(path string) []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.grants[path])
}

// Username is the login name of user (Alice or Bob) at this server.
func (as *AuthServer) Username(user string) string {
	if user == Alice {
		u, _ := url.Parse(as.Issuer)
		return "test-user@" + u.Hostname()
	}
	return "test-user2"
}

// SignIn opens authURL as user's browser would, logs the user in, and returns the URL the
// authorization server sends the browser back to (the client's callback, with code and state),
// without following it.
func (as *AuthServer) SignIn(t testing.TB, authURL, user string) string {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browser := &http.Client{Jar: jar, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if !strings.HasPrefix(req.URL.String(), as.Issuer) {
			return http.ErrUseLastResponse // the client's callback: the test takes it from here
		}
		return nil
	}}
	resp, err := browser.Get(authURL)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the login page: %s", body)
	id := resp.Request.URL.Query().Get("authRequestID")
	require.NotEmpty(t, id, "the authorization server did not send the browser to its login page: %s", resp.Request.URL)
	resp, err = browser.PostForm(as.Issuer+"/login/username", url.Values{"id": {id}, "username": {as.Username(user)}, "password": {Password}})
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusFound, resp.StatusCode, "the login was not accepted: %s", body)
	loc := resp.Header.Get("Location")
	require.NotEmpty(t, loc)
	return loc
}

// Revoke revokes a token (access or refresh) at the authorization server (RFC 7009).
func (as *AuthServer) Revoke(t testing.TB, token string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, as.Issuer+"/revoke", strings.NewReader(url.Values{"token": {token}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(as.ClientID, as.ClientSecret)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "revocation: %s", body)
}

// Tool is one tool the MCP server declares: its input schema takes one string, text, as
// internal/testutil/pinned pins it, so a graph can bind it without discovery.
type Tool struct{ Name, Description string }

// MCPServer is a running MCP server that takes only the authorization server's tokens.
type MCPServer struct {
	URL string
	srv *httptest.Server

	mu sync.Mutex
	// tokens are the bearer tokens it was sent, by user, in order.
	tokens map[string][]string
	// scopes are the scopes a call of a tool needs, by tool (RequireScope), and listScopes
	// those tools/list needs (RequireListScope).
	scopes     map[string][]string
	listScopes []string
	// listHold, while set (HoldLists), keeps every tools/list unanswered until it is closed or
	// the request ends.
	listHold chan struct{}
	// called counts the calls each tool ran.
	called map[string]int
	// tools are the tools declared to each user besides whoami (SetTools changes them), and
	// servers the MCP servers of each user's open sessions, which SetTools tells.
	tools   map[string][]Tool
	servers map[string][]*mcp.Server
}

// StartMCPServer starts the MCP server at <url>/mcp: it serves its protected resource metadata
// (RFC 9728) naming as, takes a request only with a token as introspects as active, and
// declares to each user the tools of tools[user] plus whoami, which answers the user's id.
func StartMCPServer(t testing.TB, as *AuthServer, tools map[string][]Tool) *MCPServer {
	t.Helper()
	ms := &MCPServer{tokens: map[string][]string{}, scopes: map[string][]string{}, called: map[string]int{},
		tools: maps.Clone(tools), servers: map[string][]*mcp.Server{}}
	mux := http.NewServeMux()
	ms.srv = httptest.NewServer(mux)
	t.Cleanup(ms.srv.Close)
	ms.URL = ms.srv.URL + "/mcp"
	rsc, err := rs.NewResourceServerClientCredentials(t.Context(), as.Issuer, as.ClientID, as.ClientSecret)
	require.NoError(t, err)
	verify := func(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		resp, err := rs.Introspect[*oidc.IntrospectionResponse](ctx, rsc, token)
		if err != nil || !resp.Active {
			return nil, fmt.Errorf("%w: the token is not active", auth.ErrInvalidToken)
		}
		ms.mu.Lock()
		ms.tokens[resp.Subject] = append(ms.tokens[resp.Subject], token)
		ms.mu.Unlock()
		return &auth.TokenInfo{UserID: resp.Subject, Scopes: resp.Scope, Expiration: resp.Expiration.AsTime()}, nil
	}
	server := func(r *http.Request) *mcp.Server {
		user := auth.TokenInfoFromContext(r.Context()).UserID
		s := mcp.NewServer(&mcp.Implementation{Name: "tickets", Version: "1"}, nil)
		ms.mu.Lock()
		defer ms.mu.Unlock()
		list := append([]Tool{{Name: "whoami", Description: "Say who the caller is."}}, ms.tools[user]...)
		for _, tl := range list {
			ms.addTool(s, user, tl)
		}
		ms.servers[user] = append(ms.servers[user], s)
		return s
	}
	metaURL := ms.srv.URL + "/.well-known/oauth-protected-resource/mcp"
	mux.Handle("/.well-known/oauth-protected-resource/mcp", auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource: ms.URL, AuthorizationServers: []string{as.Issuer}, ScopesSupported: []string{"openid", "offline_access"},
	}))
	mux.Handle("/mcp", auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: metaURL})(
		ms.scoped(metaURL, mcp.NewStreamableHTTPHandler(server, nil))))
	return ms
}

// addTool declares tl on s, a server of user's session.
func (ms *MCPServer) addTool(s *mcp.Server, user string, tl Tool) {
	s.AddTool(&mcp.Tool{Name: tl.Name, Description: tl.Description, InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			ms.mu.Lock()
			ms.called[tl.Name]++
			ms.mu.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: tl.Name + " for " + user}}}, nil
		})
}

// SetTools changes the tools declared to user besides whoami (their permissions at the
// service changed): new sessions list them, and each of the user's open sessions is sent
// notifications/tools/list_changed.
func (ms *MCPServer) SetTools(user string, tools ...Tool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var gone []string
	for _, old := range ms.tools[user] {
		if !slices.ContainsFunc(tools, func(t Tool) bool { return t.Name == old.Name }) {
			gone = append(gone, old.Name)
		}
	}
	ms.tools[user] = slices.Clone(tools)
	for _, s := range ms.servers[user] {
		if len(gone) > 0 {
			s.RemoveTools(gone...)
		}
		for _, tl := range tools {
			ms.addTool(s, user, tl)
		}
	}
}

// RequireScope makes a call of tool need scopes: a token without them is refused with 403 and
// a Bearer insufficient_scope challenge naming them (RFC 6750 section 3.1), before the tool
// runs.
func (ms *MCPServer) RequireScope(tool string, scopes ...string) {
	ms.mu.Lock()
	ms.scopes[tool] = scopes
	ms.mu.Unlock()
}

// RequireListScope makes tools/list need scopes, as RequireScope makes a call.
func (ms *MCPServer) RequireListScope(scopes ...string) {
	ms.mu.Lock()
	ms.listScopes = scopes
	ms.mu.Unlock()
}

// HoldLists keeps every tools/list from now on unanswered until the returned release is
// called (or the request ends first): a server that hangs listing its tools.
func (ms *MCPServer) HoldLists() (release func()) {
	hold := make(chan struct{})
	ms.mu.Lock()
	ms.listHold = hold
	ms.mu.Unlock()
	return sync.OnceFunc(func() {
		ms.mu.Lock()
		ms.listHold = nil
		ms.mu.Unlock()
		close(hold)
	})
}

// Called is how many calls of tool ran.
func (ms *MCPServer) Called(tool string) int {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.called[tool]
}

// scoped refuses a tools/call whose tool needs a scope the request's token lacks, and a
// tools/list when listing does.
func (ms *MCPServer) scoped(metaURL string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		var msg struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &msg)
		var need []string
		var hold chan struct{}
		ms.mu.Lock()
		switch msg.Method {
		case "tools/call":
			need = ms.scopes[msg.Params.Name]
		case "tools/list":
			need, hold = ms.listScopes, ms.listHold
		}
		ms.mu.Unlock()
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		if !covers(auth.TokenInfoFromContext(r.Context()).Scopes, need) {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer error="insufficient_scope", scope=%q, resource_metadata=%q`, strings.Join(need, " "), metaURL))
			http.Error(w, "insufficient_scope", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// covers reports whether have holds every scope of need.
func covers(have, need []string) bool {
	for _, sc := range need {
		if !slices.Contains(have, sc) {
			return false
		}
	}
	return true
}

// Tokens returns the bearer tokens the server was sent for user, in order.
func (ms *MCPServer) Tokens(user string) []string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return slices.Clone(ms.tokens[user])
}
