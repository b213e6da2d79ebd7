package paging

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestATokenIsTakenOnlyByTheListThatIssuedIt: a token decodes to its position in the list it
// was made for; a made-up, damaged or another list's token is ErrBadToken, never a position
// past the end (an empty, final page).
func TestATokenIsTakenOnlyByTheListThatIssuedIt(t *testing.T) {
	tok := EncodeToken("docs-search", "servers")
	got, err := DecodeToken(tok, "servers")
	require.NoError(t, err)
	require.Equal(t, "docs-search", got)
	got, err = DecodeToken("", "servers")
	require.NoError(t, err)
	require.Empty(t, got, "no token is the first page")

	damaged := []byte(tok)
	damaged[len(damaged)/2] ^= 1
	legacy := base64.RawURLEncoding.EncodeToString([]byte("docs-search")) // before versioned tokens
	for name, bad := range map[string]string{
		"made up":           "zzz",
		"not base64":        "!!!",
		"damaged":           string(damaged),
		"truncated":         tok[:len(tok)-2],
		"legacy":            legacy,
		"unversioned":       base64.RawURLEncoding.EncodeToString([]byte("\x02docs-search12345678")),
		"position too long": EncodeToken(strings.Repeat("a", MaxTokenPosition+1), "servers"),
	} {
		_, err := DecodeToken(bad, "servers")
		require.ErrorIs(t, err, ErrBadToken, name)
	}
	for _, scope := range [][]string{{"graphs"}, {}, {"servers", ""}, {"serv", "ers"}} {
		_, err := DecodeToken(tok, scope...)
		require.ErrorIs(t, err, ErrBadToken, "another list's token: %q", scope)
	}
	_, err = DecodeToken(EncodeToken("g1", "acme", "x"), "acm", "ex")
	require.ErrorIs(t, err, ErrBadToken, "scope parts are delimited")
}
