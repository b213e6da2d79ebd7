package registry

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/auth"
)

// TestRESTHeadAnswersAsGet: HEAD on a GET route (curl -I, a monitoring probe) gets what the GET
// gets, status and headers, without the body: 200 with a key that may list, the same 401 without
// a key and 403 with a key that lacks the permission. HEAD on a path whose only route is a POST
// stays 405, its Allow naming POST; a 405 on a GET route's path names HEAD beside GET.
func TestRESTHeadAnswersAsGet(t *testing.T) {
	f := newFixture(t)
	_, err := f.client.CreateServer(f.admin(t), docsSearch())
	require.NoError(t, err)

	for _, tc := range []struct {
		name, path, key string
		code            int
	}{
		{"a key that may list", "/v1/mcp/servers", adminKey, http.StatusOK},
		{"one server", "/v1/mcp/servers/docs-search", adminKey, http.StatusOK},
		{"no key", "/v1/mcp/servers", "", http.StatusUnauthorized},
		{"a key without mcp:admin", "/v1/mcp/servers", f.roleKeys[auth.RoleRunner], http.StatusForbidden},
		{"an unknown server", "/v1/mcp/servers/nosuch", adminKey, http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getCode, getBody, getHeader := f.restHeaders(t, http.MethodGet, tc.path, tc.key, "")
			require.Equal(t, tc.code, getCode, getBody)
			require.NotEmpty(t, getBody)
			code, body, header := f.restHeaders(t, http.MethodHead, tc.path, tc.key, "")
			require.Equal(t, getCode, code)
			require.Empty(t, body, "HEAD has no body")
			require.Equal(t, getHeader.Get("Content-Type"), header.Get("Content-Type"))
			require.NotEmpty(t, header.Get("X-Request-Id"))
		})
	}
	// The HEAD changed nothing, and did not create a server.
	code, body := f.rest(t, http.MethodGet, "/v1/mcp/servers", adminKey, "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "docs-search")

	code, body, header := f.restHeaders(t, http.MethodHead, "/v1/keys/key_1:revoke", adminKey, "")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	require.Empty(t, body)
	require.Equal(t, "POST", header.Get("Allow"), "a POST route is not run for a HEAD")

	code, body, header = f.restHeaders(t, http.MethodDelete, "/v1/mcp/servers", adminKey, "")
	require.Equal(t, http.StatusMethodNotAllowed, code, body)
	require.Equal(t, "GET, HEAD, POST", header.Get("Allow"))
	require.Contains(t, body, "it takes GET, HEAD, POST")
}
