package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/secretbox"
)

// Re-sealing after a rotation of the secrets key (docs/operations.md, "Rotating the secrets
// key"): at start, while the key file holds more than one key, the pool re-seals under the
// first key every user's token, pending sign-in's verifier and client secret that only a later
// key opens. The store never sees a value in clear: the caller's Resealer opens and seals.

// Resealer re-seals one sealed value bound to its context (secretbox.Box.Reseal): out and true
// when it was re-sealed, false to keep it as it is; an error when no key opens it (kept, and
// counted). Token, Verifier and Client are the contexts the pool seals each kind with.
type Resealer struct {
	Reseal   func(sealed, context []byte) (out []byte, resealed bool, err error)
	Token    func(tenant, user, ref string) []byte
	Verifier func(hash string) []byte
	Client   func(issuer, redirectURI string) []byte
}

// resealValue re-seals the value of one key of kind (tokens, states or clients) named name
// (tenant/user/ref, a state's hash, or anything for a client: its JSON names it), returning
// the new value and whether it changed. A key or value that does not decode is left as it is,
// for the reads that meet it to report, as they do without a re-seal.
func resealValue(n *secretbox.ResealCount, r Resealer, kind, name string, v []byte) ([]byte, bool, error) {
	switch kind {
	case etcdOAuthTokens:
		parts := strings.Split(name, "/")
		if len(parts) != 3 {
			return v, false, nil
		}
		out, changed := n.One(r.Reseal, v, r.Token(parts[0], parts[1], parts[2]))
		return out, changed, nil
	case etcdOAuthStates:
		var st SignInState
		if json.Unmarshal(v, &st) != nil {
			return v, false, nil
		}
		var changed bool
		if st.VerifierSealed, changed = n.One(r.Reseal, st.VerifierSealed, r.Verifier(name)); !changed {
			return v, false, nil
		}
		out, err := json.Marshal(st)
		return out, err == nil, err
	case etcdOAuthClients:
		var c OAuthClient
		if json.Unmarshal(v, &c) != nil {
			return v, false, nil
		}
		var changed bool
		if c.SecretSealed, changed = n.One(r.Reseal, c.SecretSealed, r.Client(c.Issuer, c.RedirectURI)); !changed {
			return v, false, nil
		}
		out, err := json.Marshal(c)
		return out, err == nil, err
	}
	return v, false, nil
}

// ResealSignIns re-seals pool.db's users' tokens, pending sign-ins and clients in one
// transaction.
func (s *Store) ResealSignIns(ctx context.Context, r Resealer) (secretbox.ResealCount, error) {
	var n secretbox.ResealCount
	err := s.db.Update(func(tx *bolt.Tx) error {
		for kind, name := range map[string][]byte{etcdOAuthTokens: oauthTokensBucket, etcdOAuthStates: oauthStatesBucket, etcdOAuthClients: oauthClientsBucket} {
			b := tx.Bucket(name)
			var keys, vals [][]byte
			err := b.ForEach(func(k, v []byte) error {
				out, changed, err := resealValue(&n, r, kind, string(k), v)
				if err != nil {
					return fmt.Errorf("store: %s %q: %w", name, k, err)
				}
				if changed {
					keys, vals = append(keys, bytes.Clone(k)), append(vals, out)
				}
				return nil
			})
			if err != nil {
				return err
			}
			for i := range keys { // not inside ForEach: bbolt forbids changing a bucket it iterates
				if err := b.Put(keys[i], vals[i]); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return secretbox.ResealCount{}, err
	}
	return n, nil
}

// ResealSignIns re-seals the users' tokens, pending sign-ins and clients in etcd, each by a
// transaction that commits only if its key is unchanged since read (a pending sign-in keeps
// its lease): a value another pool host wrote meanwhile is read again, never overwritten.
func (s *Etcd) ResealSignIns(ctx context.Context, r Resealer) (secretbox.ResealCount, error) {
	var n secretbox.ResealCount
	for _, kind := range []string{etcdOAuthTokens, etcdOAuthStates, etcdOAuthClients} {
		prefix := s.space.Prefix(etcdOAuth, kind)
		resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return n, etcdstore.Unavailable("read "+prefix, err)
		}
		for _, kv := range resp.Kvs {
			if err := s.resealKey(ctx, r, kind, strings.TrimPrefix(string(kv.Key), prefix), kv, &n); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// resealKey re-seals one key's value (etcdstore.Rewrite: a value another pool host changed
// first is read again, never overwritten; a pending sign-in keeps its lease).
func (s *Etcd) resealKey(ctx context.Context, r Resealer, kind, name string, kv *mvccpb.KeyValue, n *secretbox.ResealCount) error {
	var try secretbox.ResealCount // of the value last read
	exists, err := etcdstore.Rewrite(ctx, s.cli, kv, func(v []byte) ([]byte, bool, error) {
		try = secretbox.ResealCount{}
		out, changed, err := resealValue(&try, r, kind, name, v)
		if err != nil {
			return nil, false, fmt.Errorf("store: re-seal %s: %w", kv.Key, err)
		}
		return out, changed, nil
	})
	if err == nil && exists { // not taken, dropped or expired meanwhile
		n.Add(try)
	}
	return err
}

// ReplaceSecretsCheck stores sealed as the seal of SecretsCheck if it still holds old: the
// check re-sealed under the first key of a rotated key file. A check another host replaced
// meanwhile stands.
func (s *Etcd) ReplaceSecretsCheck(ctx context.Context, old, sealed []byte) error {
	key := s.SecretsCheckKey()
	_, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(key), "=", string(old))).
		Then(clientv3.OpPut(key, string(sealed))).Commit()
	if err != nil {
		return etcdstore.Unavailable("re-seal "+key, err)
	}
	return nil
}
