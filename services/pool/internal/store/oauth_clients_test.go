package store

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOAuthClientsAreKeptPerIssuerAndRedirectURI: a registered client is found by its issuer
// and redirect URI, survives a reopen, and is dropped only while it is still the one named: a
// client registered since under another id stays.
func TestOAuthClientsAreKeptPerIssuerAndRedirectURI(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pool.db")
	s, err := Open(path)
	require.NoError(t, err)
	ctx := t.Context()
	const issuer, cb = "https://auth.example.com", "https://tools.example.com/v1/oauth/callback"
	_, err = s.OAuthClient(ctx, issuer, cb)
	require.ErrorIs(t, err, ErrNotFound)

	c := OAuthClient{Issuer: issuer, RedirectURI: cb, ClientID: "c1", SecretSealed: []byte("sealed"), AuthMethod: "client_secret_basic", RegisterTime: time.Unix(10, 0).UTC()}
	require.NoError(t, s.PutOAuthClient(ctx, c))
	_, err = s.OAuthClient(ctx, issuer, "https://other.example.com/v1/oauth/callback")
	require.ErrorIs(t, err, ErrNotFound, "another callback is another client")
	require.NoError(t, s.Close())

	s, err = Open(path)
	require.NoError(t, err)
	defer s.Close()
	got, err := s.OAuthClient(ctx, issuer, cb)
	require.NoError(t, err)
	require.Equal(t, c, got)

	require.NoError(t, s.DropOAuthClient(ctx, issuer, cb, "c0"))
	_, err = s.OAuthClient(ctx, issuer, cb)
	require.NoError(t, err, "a drop of a client since replaced leaves the current one")
	require.NoError(t, s.DropOAuthClient(ctx, issuer, cb, "c1"))
	_, err = s.OAuthClient(ctx, issuer, cb)
	require.ErrorIs(t, err, ErrNotFound)
}
