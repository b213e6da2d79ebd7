package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A host that moves from bbolt to etcd brings the users' sign-ins its pool.db kept: Store
// reads them (LocalSignIns) and empties its buckets once they are in etcd (ClearSignIns); Etcd
// takes each only where it holds none of its key (CopySignIn, CopyOAuthClient), so a sign-in
// made on another host since, or copied by another host, stands.

// LocalSignIns is what a pool.db holds of users' sign-ins, still sealed as stored.
type LocalSignIns struct {
	Tokens  []LocalToken
	Clients []OAuthClient
	// Pending counts the sign-ins begun and not called back (short-lived: not copied).
	Pending int
}

// LocalToken is a user's sealed token of a server, with the listing the server declared to
// the user (nil when none is stored).
type LocalToken struct {
	Tenant, User, Ref string
	Sealed            []byte
	Listing           *Listing
}

// LocalSignIns reads every user's token (with its listing), every client the pool registered
// for itself, and how many sign-ins are pending. A listing without a token is left out: it is
// dropped with its token, so it belongs to none.
func (s *Store) LocalSignIns(ctx context.Context) (LocalSignIns, error) {
	var out LocalSignIns
	err := s.db.View(func(tx *bolt.Tx) error {
		listings := tx.Bucket(oauthListingsBucket)
		err := tx.Bucket(oauthTokensBucket).ForEach(func(k, v []byte) error {
			parts := strings.Split(string(k), "/")
			if len(parts) != 3 {
				return fmt.Errorf("store: %s: key %q is not tenant/user/server", oauthTokensBucket, k)
			}
			t := LocalToken{Tenant: parts[0], User: parts[1], Ref: parts[2], Sealed: bytes.Clone(v)}
			if l := listings.Get(k); l != nil {
				t.Listing = new(Listing)
				if err := json.Unmarshal(l, t.Listing); err != nil {
					return fmt.Errorf("store: %s %q: %w", oauthListingsBucket, k, err)
				}
			}
			out.Tokens = append(out.Tokens, t)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(oauthClientsBucket).ForEach(func(k, v []byte) error {
			var c OAuthClient
			if err := json.Unmarshal(v, &c); err != nil {
				return fmt.Errorf("store: %s: %w", oauthClientsBucket, err)
			}
			out.Clients = append(out.Clients, c)
			return nil
		})
		out.Pending = tx.Bucket(oauthStatesBucket).Stats().KeyN
		return err
	})
	return out, err
}

// ClearSignIns empties the buckets of users' sign-ins (tokens, listings, pending sign-ins,
// the pool's clients), in one transaction: once they are in etcd, a later start copies nothing
// again, and a move back to bbolt finds none (no token etcd dropped or replaced since comes
// back).
func (s *Store) ClearSignIns(ctx context.Context) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{oauthTokensBucket, oauthListingsBucket, oauthStatesBucket, oauthClientsBucket} {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		return nil
	})
}

// CopySignIn stores a user's token and listing from a host's pool.db, sealed as they are,
// only where etcd holds no token of the same tenant, user and server (a create-if-absent
// transaction): created is false when one is there (the user signed in on another host, or
// another host copied it), which stands. The listing goes with the token: without one, any
// listing etcd kept of no token is deleted.
func (s *Etcd) CopySignIn(ctx context.Context, t LocalToken) (created bool, err error) {
	key := s.oauthKey(etcdOAuthTokens, t.Tenant, t.User, t.Ref)
	listingKey := s.oauthKey(etcdOAuthListings, t.Tenant, t.User, t.Ref)
	ops := []clientv3.Op{clientv3.OpPut(key, string(t.Sealed)), clientv3.OpDelete(listingKey)}
	if t.Listing != nil {
		val, err := json.Marshal(t.Listing)
		if err != nil {
			return false, err
		}
		ops[1] = clientv3.OpPut(listingKey, string(val))
	}
	return s.createIfAbsent(ctx, key, ops)
}

// CopyOAuthClient stores a client the pool registered for itself, from a host's pool.db, only
// where etcd holds none for the same issuer and redirect URI: created is false when another
// host's client is there, which stands.
func (s *Etcd) CopyOAuthClient(ctx context.Context, c OAuthClient) (created bool, err error) {
	val, err := json.Marshal(c)
	if err != nil {
		return false, err
	}
	key := s.oauthClientKey(etcdOAuthClients, c.Issuer, c.RedirectURI)
	return s.createIfAbsent(ctx, key, []clientv3.Op{clientv3.OpPut(key, string(val))})
}
