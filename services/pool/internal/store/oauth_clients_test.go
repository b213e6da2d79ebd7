package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testClientsAreKeptPerIssuerAndRedirect: a registered client is found by its issuer and
// redirect URI from either handle, and is dropped only while it is still the one named: a
// client registered since under another id stays.
func testClientsAreKeptPerIssuerAndRedirect(t *testing.T, s, other oauthStore) {
	ctx := t.Context()
	const issuer, cb = "https://auth.example.com", "https://tools.example.com/v1/oauth/callback"
	_, err := s.OAuthClient(ctx, issuer, cb)
	require.ErrorIs(t, err, ErrNotFound)

	c := OAuthClient{Issuer: issuer, RedirectURI: cb, ClientID: "c1", SecretSealed: []byte("sealed"), AuthMethod: "client_secret_basic", RegisterTime: time.Unix(10, 0).UTC()}
	require.NoError(t, s.PutOAuthClient(ctx, c))
	_, err = other.OAuthClient(ctx, issuer, "https://other.example.com/v1/oauth/callback")
	require.ErrorIs(t, err, ErrNotFound, "another callback is another client")
	got, err := other.OAuthClient(ctx, issuer, cb)
	require.NoError(t, err)
	require.Equal(t, c, got)

	require.NoError(t, other.DropOAuthClient(ctx, issuer, cb, "c0"))
	_, err = s.OAuthClient(ctx, issuer, cb)
	require.NoError(t, err, "a drop of a client since replaced leaves the current one")
	require.NoError(t, other.DropOAuthClient(ctx, issuer, cb, "c1"))
	_, err = s.OAuthClient(ctx, issuer, cb)
	require.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, s.DropOAuthClient(ctx, issuer, cb, "c1"), "dropping what is gone is no error")
}

// testClientLockExcludesEveryHolder: one registration at a time per issuer and redirect URI,
// whichever handle asks; another issuer's is not held.
func testClientLockExcludesEveryHolder(t *testing.T, s, other oauthStore) {
	ctx := t.Context()
	const issuer, cb = "https://auth.example.com", "https://tools.example.com/v1/oauth/callback"
	unlock, err := s.LockOAuthClient(ctx, issuer, cb)
	require.NoError(t, err)
	u2, err := other.LockOAuthClient(ctx, "https://auth2.example.com", cb)
	require.NoError(t, err)
	u2()
	waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = other.LockOAuthClient(waitCtx, issuer, cb)
	cancel()
	requireLockHeld(t, err)
	unlock()
	u3, err := other.LockOAuthClient(ctx, issuer, cb)
	require.NoError(t, err)
	u3()
}

// TestOAuthClientsSurviveAReopen: a registered client is in pool.db, not in memory.
func TestOAuthClientsSurviveAReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pool.db")
	s, err := Open(path)
	require.NoError(t, err)
	c := OAuthClient{Issuer: "https://auth.example.com", RedirectURI: "https://tools.example.com/v1/oauth/callback", ClientID: "c1", AuthMethod: "none", RegisterTime: time.Unix(10, 0).UTC()}
	require.NoError(t, s.PutOAuthClient(t.Context(), c))
	require.NoError(t, s.Close())
	s, err = Open(path)
	require.NoError(t, err)
	defer s.Close()
	got, err := s.OAuthClient(t.Context(), c.Issuer, c.RedirectURI)
	require.NoError(t, err)
	require.Equal(t, c, got)
}
