package store

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The pool's side of OAuth sign-in: per tenant, user and server, the user's token (sealed by
// the caller: this file never sees it in clear), the tool listing the server declared to that
// user, and the pending sign-ins, each keyed by the SHA-256 of its state.

func userServerKey(tenant, user, ref string) []byte { return []byte(tenant + "/" + user + "/" + ref) }

// SignInState is one sign-in begun and not yet called back: who it is for and what the
// callback needs to finish it. The PKCE verifier is sealed by the caller.
type SignInState struct {
	Tenant string `json:"tenant"`
	User   string `json:"user"`
	Ref    string `json:"ref"`
	// SignIn is the fingerprint of the registration's sign-in settings when it began.
	SignIn         string `json:"sign_in"`
	Issuer         string `json:"issuer"`
	TokenURL       string `json:"token_url"`
	Resource       string `json:"resource"`
	IssAdvertised  bool   `json:"iss_advertised,omitempty"`
	VerifierSealed []byte `json:"verifier_sealed"`
	// ActorKeyID, ActorKeyName and ActorRole name the key that asked for the sign-in (which
	// asserted the user), for the admin event of its completion.
	ActorKeyID   string    `json:"actor_key_id,omitempty"`
	ActorKeyName string    `json:"actor_key_name,omitempty"`
	ActorRole    string    `json:"actor_role,omitempty"`
	ExpireTime   time.Time `json:"expire_time"`
}

// PutSignInState stores a new sign-in under the hash of its state, and drops the sign-ins
// that expired by now and any other pending one of the same tenant, user and server: one
// authorization URL is good at a time, so the bucket holds at most one per user and server.
func (s *Store) PutSignInState(ctx context.Context, hash string, st SignInState, now time.Time) error {
	val, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(oauthStatesBucket)
		var drop [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var old SignInState
			if json.Unmarshal(v, &old) != nil || !old.ExpireTime.After(now) ||
				old.Tenant == st.Tenant && old.User == st.User && old.Ref == st.Ref {
				drop = append(drop, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range drop {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return b.Put([]byte(hash), val)
	})
}

// TakeSignInState removes and returns the sign-in whose state hashes to hash: a state is
// good once. ErrNotFound when none is pending under it.
func (s *Store) TakeSignInState(ctx context.Context, hash string) (SignInState, error) {
	var st SignInState
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(oauthStatesBucket)
		v := b.Get([]byte(hash))
		if v == nil {
			return ErrNotFound
		}
		if err := json.Unmarshal(v, &st); err != nil {
			return err
		}
		return b.Delete([]byte(hash))
	})
	return st, err
}

// PutOAuthToken stores a user's sealed token for a server, replacing the one before.
func (s *Store) PutOAuthToken(ctx context.Context, tenant, user, ref string, sealed []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(oauthTokensBucket).Put(userServerKey(tenant, user, ref), sealed)
	})
}

// OAuthToken reads a user's sealed token for a server; ErrNotFound without one.
func (s *Store) OAuthToken(ctx context.Context, tenant, user, ref string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(oauthTokensBucket).Get(userServerKey(tenant, user, ref))
		if v == nil {
			return ErrNotFound
		}
		out = bytes.Clone(v)
		return nil
	})
	return out, err
}

// Listing is the tool listing a server declared to one user when it was last connected.
type Listing struct {
	// SignIn is the fingerprint of the sign-in settings it was taken under.
	SignIn string `json:"sign_in"`
	// Tools maps each tool's name to the hash of its declaration (mcpdecl).
	Tools    map[string]string `json:"tools"`
	ListTime time.Time         `json:"list_time"`
}

// PutOAuthListing stores the listing a server declared to a user.
func (s *Store) PutOAuthListing(ctx context.Context, tenant, user, ref string, l Listing) error {
	val, err := json.Marshal(l)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(oauthListingsBucket).Put(userServerKey(tenant, user, ref), val)
	})
}

// OAuthListing reads the listing a server declared to a user; ErrNotFound without one.
func (s *Store) OAuthListing(ctx context.Context, tenant, user, ref string) (Listing, error) {
	var l Listing
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(oauthListingsBucket).Get(userServerKey(tenant, user, ref))
		if v == nil {
			return ErrNotFound
		}
		return json.Unmarshal(v, &l)
	})
	return l, err
}

// DropSignIn deletes a user's token and listing of a server, when its token was refused or
// revoked, or the server's sign-in settings changed: the user signs in again.
func (s *Store) DropSignIn(ctx context.Context, tenant, user, ref string) error {
	key := userServerKey(tenant, user, ref)
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(oauthTokensBucket).Delete(key); err != nil {
			return err
		}
		return tx.Bucket(oauthListingsBucket).Delete(key)
	})
}
