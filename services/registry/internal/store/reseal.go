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

	"github.com/ringfence/ringfence/internal/boltdb"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/secretbox"
)

// Re-sealing after a rotation of the secrets key (docs/operations.md, "Rotating the secrets
// key"): while the key file holds more than one key, every start re-seals under the first key
// each secret, env and URL that only a later key opens, so the older lines can be removed once
// the log says none is left. A re-seal changes no value in clear: the revision and the update
// time stay, and, as the schema migrations that seal at start, it takes no audit record.

// resealServer re-seals a stored registration's env and URL; changed when either moved.
func resealServer(n *secretbox.ResealCount, box *secretbox.Box, st *storedServer) (changed bool) {
	var envChanged, urlChanged bool
	st.EnvSealed, envChanged = n.One(box.Reseal, st.EnvSealed, envContext(st.Ref))
	st.URLSealed, urlChanged = n.One(box.Reseal, st.URLSealed, urlContext(st.Ref))
	return envChanged || urlChanged
}

// resealSecret re-seals a stored secret; changed when it moved.
func resealSecret(n *secretbox.ResealCount, box *secretbox.Box, name string, st *storedSecret) (changed bool) {
	st.Sealed, changed = n.One(box.Reseal, st.Sealed, secretContext(name))
	return changed
}

// A value that does not decode is left as it is, for the reads that meet it to report (as they
// do without a re-seal): it is no reason to refuse a start.

// reseal re-seals the file's values in one transaction, which also asks for a scrub: the
// values sealed under the older key must leave the file's free pages too.
func (s *Bolt) reseal() (secretbox.ResealCount, error) {
	var n secretbox.ResealCount
	if s.box.Keys() < 2 {
		return n, nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		type update struct {
			b        *bolt.Bucket
			key, val []byte
		}
		var updates []update
		secrets := tx.Bucket(secretsBucket)
		err := secrets.ForEach(func(k, v []byte) error {
			var st storedSecret
			if json.Unmarshal(v, &st) != nil || !resealSecret(&n, s.box, string(k), &st) {
				return nil
			}
			val, err := json.Marshal(st)
			updates = append(updates, update{secrets, bytes.Clone(k), val})
			return err
		})
		if err != nil {
			return err
		}
		servers := tx.Bucket(serversBucket)
		err = servers.ForEach(func(k, v []byte) error {
			var st storedServer
			if json.Unmarshal(v, &st) != nil || !resealServer(&n, s.box, &st) {
				return nil
			}
			val, err := json.Marshal(&st)
			updates = append(updates, update{servers, bytes.Clone(k), val})
			return err
		})
		if err != nil {
			return err
		}
		for _, u := range updates { // not inside ForEach: bbolt forbids changing a bucket it iterates
			if err := u.b.Put(u.key, u.val); err != nil {
				return err
			}
		}
		if len(updates) == 0 {
			return nil
		}
		return boltdb.RequestScrub(tx)
	})
	if err != nil {
		return secretbox.ResealCount{}, fmt.Errorf("registry: re-seal the stored secrets under the first key of the secrets key file: %w", err)
	}
	return n, nil
}

// reseal re-seals the registrations and secrets in etcd, each by a transaction that commits
// only if the key is unchanged since read: a value another replica wrote meanwhile is read
// again (and is left as it is when the first key opens it), never overwritten.
func (s *Etcd) reseal(ctx context.Context) (secretbox.ResealCount, error) {
	var n secretbox.ResealCount
	if s.box.Keys() < 2 {
		return n, nil
	}
	for _, kind := range []string{etcdSecrets, etcdServers} {
		prefix := s.space.Prefix(kind)
		resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return n, etcdstore.Unavailable("read "+prefix, err)
		}
		for _, kv := range resp.Kvs {
			if err := s.resealKey(ctx, kind, kv, &n); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// resealKey re-seals one key's value (etcdstore.Rewrite: a value another writer changed first
// is read again, never overwritten).
func (s *Etcd) resealKey(ctx context.Context, kind string, kv *mvccpb.KeyValue, n *secretbox.ResealCount) error {
	name := strings.TrimPrefix(string(kv.Key), s.space.Prefix(kind))
	var try secretbox.ResealCount // of the value last read
	exists, err := etcdstore.Rewrite(ctx, s.cli, kv, func(v []byte) ([]byte, bool, error) {
		try = secretbox.ResealCount{}
		var changed bool
		var val []byte
		var err error
		switch kind {
		case etcdSecrets:
			var st storedSecret
			if changed = json.Unmarshal(v, &st) == nil && resealSecret(&try, s.box, name, &st); changed {
				val, err = json.Marshal(st)
			}
		case etcdServers:
			var st storedServer
			if changed = json.Unmarshal(v, &st) == nil && resealServer(&try, s.box, &st); changed {
				val, err = json.Marshal(&st)
			}
		}
		if err != nil {
			return nil, false, fmt.Errorf("registry: re-seal %s: %w", kv.Key, err)
		}
		return val, changed, nil
	})
	if err == nil && exists { // not deleted meanwhile
		n.Add(try)
	}
	return err
}
