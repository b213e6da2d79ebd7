package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/ident"
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
	// Skipped are the entries no pool writes (a damaged or altered pool.db): a token kept
	// under a key that is no <tenant>/<user>/<server> of valid names, a listing or a client
	// that does not decode. They are not copied, and go with the rest when pool.db's sign-ins
	// are cleared: no pool could use them.
	Skipped []SkippedSignIn
}

// SkippedSignIn is an entry of pool.db's sign-ins LocalSignIns left out: Key is the key it is
// kept under, quoted and clipped (it may hold any byte), Reason why. Never a value.
type SkippedSignIn struct{ Bucket, Key, Reason string }

func (l *LocalSignIns) skip(bucket []byte, key []byte, reason string) {
	k := string(key)
	if len(k) > 80 {
		k = k[:80] + "…"
	}
	l.Skipped = append(l.Skipped, SkippedSignIn{Bucket: string(bucket), Key: fmt.Sprintf("%q", k), Reason: reason})
}

// tokenKeyProblem says why a token's key is no <tenant>/<user>/<server> of the names a pool
// keeps one under (ident.Ref, ident.User, ident.Ref), or "".
func tokenKeyProblem(parts []string) string {
	switch {
	case len(parts) != 3:
		return "its key is not <tenant>/<user>/<server>"
	case !ident.Ref.Valid(parts[0]):
		return "its tenant is no tenant name (" + ident.Ref.Pattern() + ")"
	case !ident.User.Valid(parts[1]):
		return "its user is no user name (" + ident.User.Pattern() + ")"
	case !ident.Ref.Valid(parts[2]):
		return "its server is no server ref (" + ident.Ref.Pattern() + ")"
	}
	return ""
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
			if why := tokenKeyProblem(parts); why != "" {
				out.skip(oauthTokensBucket, k, why)
				return nil
			}
			t := LocalToken{Tenant: parts[0], User: parts[1], Ref: parts[2], Sealed: bytes.Clone(v)}
			if l := listings.Get(k); l != nil {
				t.Listing = new(Listing)
				if json.Unmarshal(l, t.Listing) != nil {
					// A listing is what the server declared at the last sign-in: the token moves
					// without it, and the next listing of the server writes it again.
					t.Listing = nil
					out.skip(oauthListingsBucket, k, "it does not decode as a listing; the token moves without it")
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
			if json.Unmarshal(v, &c) != nil {
				out.skip(oauthClientsBucket, k, "it does not decode as an OAuth client; the pool registers one again when a user signs in")
				return nil
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
