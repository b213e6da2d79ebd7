package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"
)

// OAuthClient is a client the pool registered for itself at an authorization server (dynamic
// client registration, RFC 7591): one per issuer and redirect URI, shared by every user and
// server whose sign-ins go there. Its secret, when the authorization server issued one, is
// sealed by the caller: this file never sees it in clear.
type OAuthClient struct {
	Issuer      string `json:"issuer"`
	RedirectURI string `json:"redirect_uri"`
	ClientID    string `json:"client_id"`
	// SecretSealed is the client secret (empty: a public client).
	SecretSealed []byte `json:"secret_sealed,omitempty"`
	// AuthMethod is how the client authenticates at the token endpoint: client_secret_basic,
	// client_secret_post or none.
	AuthMethod string `json:"auth_method"`
	// SecretExpireTime is when the secret expires (zero: never); RegisterTime when the
	// authorization server registered the client.
	SecretExpireTime time.Time `json:"secret_expire_time,omitzero"`
	RegisterTime     time.Time `json:"register_time"`
}

// oauthClientKey is a registration's key: the issuer and the redirect URI, which are URLs and
// hold no newline.
func oauthClientKey(issuer, redirectURI string) []byte { return []byte(issuer + "\n" + redirectURI) }

// oauthClientName is a registration's key as one path segment (etcd keys, lock names).
func oauthClientName(issuer, redirectURI string) string {
	sum := sha256.Sum256(oauthClientKey(issuer, redirectURI))
	return hex.EncodeToString(sum[:])
}

// LockOAuthClient holds the registration at issuer for redirectURI until unlock is called: the
// pool registers one client at a time there, so two sign-ins at once share it. One process
// holds a bbolt file, so a lock in memory is the lock of every holder.
func (s *Store) LockOAuthClient(ctx context.Context, issuer, redirectURI string) (unlock func(), err error) {
	return s.oauthLocks.lock(ctx, "client\n"+string(oauthClientKey(issuer, redirectURI)))
}

// PutOAuthClient stores the client registered at c.Issuer for c.RedirectURI, replacing the
// one before.
func (s *Store) PutOAuthClient(ctx context.Context, c OAuthClient) error {
	val, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(oauthClientsBucket).Put(oauthClientKey(c.Issuer, c.RedirectURI), val)
	})
}

// OAuthClient reads the client registered at issuer for redirectURI; ErrNotFound without one.
func (s *Store) OAuthClient(ctx context.Context, issuer, redirectURI string) (OAuthClient, error) {
	var c OAuthClient
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(oauthClientsBucket).Get(oauthClientKey(issuer, redirectURI))
		if v == nil {
			return ErrNotFound
		}
		return json.Unmarshal(v, &c)
	})
	return c, err
}

// DropOAuthClient deletes the client registered at issuer for redirectURI when it is still
// clientID (the authorization server refused it): the next sign-in registers anew. A client
// registered since under another id stays.
func (s *Store) DropOAuthClient(ctx context.Context, issuer, redirectURI, clientID string) error {
	key := oauthClientKey(issuer, redirectURI)
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(oauthClientsBucket)
		v := b.Get(key)
		if v == nil {
			return nil
		}
		var c OAuthClient
		if err := json.Unmarshal(v, &c); err == nil && c.ClientID != clientID {
			return nil
		}
		return b.Delete(key)
	})
}
