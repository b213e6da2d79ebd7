package mcpserver

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOAuthSettingsAreValidated: sign-in is for remote servers, needs a client, names its
// secret (never holds it), takes scope tokens, and leaves the Authorization header to the
// user's token.
func TestOAuthSettingsAreValidated(t *testing.T) {
	remote := func(o *OAuth, headers map[string]string) *Registration {
		return &Registration{Ref: "tickets", Transport: TransportStreamableHTTP, URL: "https://mcp.example.com/mcp", Headers: headers, OAuth: o}
	}
	good := &OAuth{ClientID: "ringfence", ClientSecretRef: "tickets-client", Scopes: []string{"tickets.read"}, AuthorizationServer: "https://auth.example.com"}
	require.NoError(t, remote(&OAuth{ClientID: "public"}, nil).Validate(nil), "a public client may discover its authorization server")
	require.NoError(t, remote(&OAuth{}, nil).Validate(nil), "without a client id the pool brings its own client (metadata document, or dynamic registration)")
	require.NoError(t, remote(good, nil).Validate(nil))
	for _, tc := range []struct {
		name, want string
		reg        *Registration
	}{
		{"stdio", "applies to the streamable_http and sse transports only", &Registration{Ref: "fs", Command: "fs-mcp", OAuth: good}},
		{"a secret without its client", "oauth.client_secret_ref: names the secret of a pre-registered client", remote(&OAuth{ClientSecretRef: "tickets-client", AuthorizationServer: "https://auth.example.com"}, nil)},
		{"secret value", "oauth.client_secret_ref", remote(&OAuth{ClientID: "c", ClientSecretRef: "s3cr3t value/with spaces"}, nil)},
		{"secret without its issuer", "oauth.authorization_server: is required with client_secret_ref", remote(&OAuth{ClientID: "c", ClientSecretRef: "tickets-client"}, nil)},
		{"scope", "oauth.scopes[0]", remote(&OAuth{ClientID: "c", Scopes: []string{"two words"}}, nil)},
		{"issuer", "oauth.authorization_server", remote(&OAuth{ClientID: "c", AuthorizationServer: "http://auth.example.com"}, nil)},
		{"issuer query", "oauth.authorization_server", remote(&OAuth{ClientID: "c", AuthorizationServer: "https://auth.example.com/?a=b"}, nil)},
		{"authorization header", "headers.authorization", remote(good, map[string]string{"authorization": "tickets-token"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.reg.Validate(nil)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "s3cr3t")
		})
	}
}

// TestSignInFingerprintFollowsTheSettingsThatBindTokens: the transport, URL, authorization
// server, client id and scopes change it; the client secret's name, the description and the
// order of the scopes do not.
func TestSignInFingerprintFollowsTheSettingsThatBindTokens(t *testing.T) {
	base := func() *Registration {
		return &Registration{Ref: "tickets", Transport: TransportStreamableHTTP, URL: "https://mcp.example.com/mcp?k=1",
			OAuth: &OAuth{ClientID: "c", ClientSecretRef: "s", Scopes: []string{"a", "b"}}}
	}
	fp := base().SignInFingerprint()
	require.NotEmpty(t, fp)
	require.NotContains(t, fp, "k=1")
	for name, edit := range map[string]func(*Registration){
		"transport": func(r *Registration) { r.Transport = TransportSSE },
		"url":       func(r *Registration) { r.URL = "https://mcp.example.com/v2" },
		"issuer":    func(r *Registration) { r.OAuth.AuthorizationServer = "https://auth.example.com" },
		"client":    func(r *Registration) { r.OAuth.ClientID = "d" },
		"scopes":    func(r *Registration) { r.OAuth.Scopes = []string{"a"} },
	} {
		r := base()
		edit(r)
		require.NotEqual(t, fp, r.SignInFingerprint(), name)
	}
	for name, edit := range map[string]func(*Registration){
		"secret name": func(r *Registration) { r.OAuth.ClientSecretRef = "t" },
		"description": func(r *Registration) { r.Description = "Tickets." },
		"scope order": func(r *Registration) { r.OAuth.Scopes = []string{"b", "a"} },
	} {
		r := base()
		edit(r)
		require.Equal(t, fp, r.SignInFingerprint(), name)
	}
	require.Empty(t, (&Registration{Ref: "fs", Command: "x"}).SignInFingerprint())
}

// TestScopeTokens: a scope a server names is read only as RFC 6749 scope tokens, within bounds.
func TestScopeTokens(t *testing.T) {
	require.Equal(t, []string{"a", "b:c"}, ScopeTokens(" a  b:c "))
	require.Empty(t, ScopeTokens(""))
	require.Nil(t, ScopeTokens(`a "b"`), "a quote is no scope token")
	require.Nil(t, ScopeTokens("a\\b"))
	require.Nil(t, ScopeTokens("a b\u00e9"), "nor is anything but printable ASCII")
	require.Nil(t, ScopeTokens(strings.Repeat("x", MaxScopeName+1)))
	require.Nil(t, ScopeTokens(strings.TrimSpace(strings.Repeat("s ", MaxScopes+1))))
	require.Len(t, ScopeTokens(strings.TrimSpace(strings.Repeat("s ", MaxScopes))), MaxScopes)
}
