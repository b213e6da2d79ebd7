package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/paging"
	"github.com/ringfence/ringfence/internal/secretbox"
)

// The registry's keys in etcd, under <root>/registry/ (etcdstore.Space):
//
//	meta/schema_version       the layout's version (etcdstore.Migrate)
//	meta/secrets_key_check    a value sealed with the secrets key of the first replica: a
//	                          replica whose key cannot open it refuses to start
//	servers/<ref>             a registration, as in bbolt (storedServer JSON, env and URL sealed)
//	secrets/<name>            a named secret (storedSecret JSON, value sealed)
//	keys/<id>                 an API key's record (hash only)
//	key_hashes/<sha256>       the id of the key with that hash: a hash is never registered twice
//	audit_outbox/records/...  audit records waiting for the audit log (audit.EtcdOutbox)
//	audit_outbox/dropped/...  records dropped under continue_and_alarm, to report
const (
	etcdServers   = "servers"
	etcdSecrets   = "secrets"
	etcdKeys      = "keys"
	etcdKeyHashes = "key_hashes"
	etcdOutbox    = "audit_outbox"
)

// etcdMigrations are the etcd layout's schema versions; migrations[i] brings it to i+1.
var etcdMigrations = []etcdstore.Migration{
	func(context.Context, *clientv3.Client, etcdstore.Space) error { return nil }, // v1: the keys above
}

// Etcd keeps the registry's state in etcd, shared by every replica of the registry. A mirror
// fed by a watch holds registrations, secrets and keys in memory; every read first confirms
// the mirror is current (etcdstore.Mirror.Sync), so a change any replica acknowledged is seen
// by the next read on every replica. Writes are transactions that compare what they read.
type Etcd struct {
	cli    *clientv3.Client
	space  etcdstore.Space
	box    *secretbox.Box
	spool  *audit.Spool
	mirror *etcdstore.Mirror
	log    *slog.Logger
	// resealed is what the start re-sealed in etcd, for a log line held back (HoldResealLog).
	resealed secretbox.ResealCount

	mu      sync.RWMutex
	servers map[string]*storedServer
	secrets map[string]storedSecret
	bad     map[string]error // keys whose value does not decode, for the reads that meet them
	gen     uint64           // bumped with every registration change
	warm    atomic.Pointer[warmTargets]
	keys    keyTable
	touches sync.WaitGroup
}

// EtcdConfig says where the registry's state lives in etcd.
type EtcdConfig struct {
	Client *clientv3.Client
	// Root is the prefix of every Ringfence key (store.etcd_prefix); the registry's are under
	// <Root>/registry/.
	Root   string
	Box    *secretbox.Box
	Logger *slog.Logger
	// HoldResealLog keeps the start's re-seal log line back for LogResealed, after a move
	// from bbolt (MoveBolt): until the file's values are in etcd, the old key still opens
	// what the file holds, and no line may say it can go.
	HoldResealLog bool
}

// OpenEtcd opens the registry's part of etcd. spool is the audit spool to open beside it: its
// outbox is in etcd too (audit_outbox/), so a change and its record commit together, and its
// QuarantinePath must be set (a file on this replica's disk).
func OpenEtcd(ctx context.Context, cfg EtcdConfig, spool SpoolConfig) (*Etcd, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Etcd{cli: cfg.Client, space: etcdstore.NewSpace(cfg.Root, "registry"), box: cfg.Box, log: cfg.Logger}
	if err := etcdstore.Migrate(ctx, s.cli, s.space, etcdMigrations); err != nil {
		return nil, err
	}
	if err := s.checkSecretsKey(ctx); err != nil {
		return nil, err
	}
	resealed, err := s.reseal(ctx)
	if err != nil {
		return nil, err
	}
	s.resealed = resealed
	if !cfg.HoldResealLog {
		s.box.LogResealed(s.log, "registry", resealed.Resealed, resealed.Unopened)
	}
	spool.Etcd = &audit.EtcdOutbox{Client: s.cli, Prefix: s.space.Prefix(etcdOutbox)}
	if s.spool, err = audit.NewSpool(spool); err != nil {
		return nil, err
	}
	s.mirror, err = etcdstore.StartMirror(ctx, s.cli, etcdstore.MirrorConfig{Prefix: s.space.Prefix(), Reset: s.reset, Apply: s.apply, Logger: s.log})
	if err != nil {
		_ = s.spool.Close() // the mirror's error is the one to report
		return nil, err
	}
	return s, nil
}

// secretsKeyCheck is what meta/secrets_key_check holds, sealed.
const secretsKeyCheck = "ringfence registry secrets key"

// checkSecretsKey refuses a secrets key file none of whose keys is the one the data was sealed
// with: every replica seals and opens with its own copy of the key file, and one that differs
// would write secrets no other replica can open. A check that only a later key of the file
// opens (a rotation under way) is re-sealed under the first.
func (s *Etcd) checkSecretsKey(ctx context.Context) error {
	key := s.space.Key("meta", "secrets_key_check")
	sealed := s.box.Seal([]byte(secretsKeyCheck), []byte(key))
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(sealed))).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return etcdstore.Unavailable("check the secrets key", err)
	}
	if resp.Succeeded {
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 1 {
		if plain, err := s.box.Open(kvs[0].Value, []byte(key)); err == nil && string(plain) == secretsKeyCheck {
			// Sealed under an older key of the file: the first seals it from now on (unless
			// another replica changed it meanwhile, which stands).
			if resealed, changed, _ := s.box.Reseal(kvs[0].Value, []byte(key)); changed {
				if _, err := s.cli.Txn(ctx).If(unchanged(kvs[0])).Then(clientv3.OpPut(key, string(resealed))).Commit(); err != nil {
					return etcdstore.Unavailable("re-seal the secrets key check", err)
				}
			}
			return nil
		}
	}
	keyFile := "RINGFENCE_SECRETS_KEY_FILE"
	if p := s.box.Path(); p != "" {
		keyFile = p + ", RINGFENCE_SECRETS_KEY_FILE"
	}
	return fmt.Errorf("registry: this replica's secrets key (%s) is not the one the registrations in etcd (%s) were sealed with: every registry replica needs the same key file; copy it from a running replica. "+
		"After `secrets-key rotate`, the old key's line may have gone before a start re-sealed under the new one: put that line back after the first, start, and remove it only once the log says every sealed value opens with the first key", keyFile, s.space)
}

// LogResealed logs the start's re-seal held back by HoldResealLog, with what a move from
// bbolt re-sealed of the file (moved's BoltState): once the file's values are in etcd.
func (s *Etcd) LogResealed(moved *BoltState) {
	n := s.resealed.Resealed
	if moved != nil {
		n += moved.resealed
	}
	s.box.LogResealed(s.log, "registry", n, s.resealed.Unopened)
}

// Empty says whether etcd holds no registration, secret or API key under this registry's
// prefix: a start pointed at another cluster or prefix than its data was moved into.
func (s *Etcd) Empty(ctx context.Context) (bool, error) {
	for _, kind := range []string{etcdServers, etcdSecrets, etcdKeys} {
		resp, err := s.cli.Get(ctx, s.space.Prefix(kind), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, etcdstore.Unavailable("count what the registry holds", err)
		}
		if resp.Count > 0 {
			return false, nil
		}
	}
	return true, nil
}

// Prefix is the etcd prefix of every key of this registry (<root>/registry/).
func (s *Etcd) Prefix() string { return s.space.Prefix() }

// Spool is the audit spool whose outbox is in etcd.
func (s *Etcd) Spool() *audit.Spool { return s.spool }

// Close stops following etcd; the client stays open (its owner closes it).
func (s *Etcd) Close() error {
	s.touches.Wait()
	return errors.Join(s.mirror.Close(), s.spool.Close())
}

// reset and apply keep the mirror: registrations decoded (seals kept), secrets sealed, keys.
// A reset builds the new content aside and swaps it in, so no read sees half of it.
func (s *Etcd) reset(kvs []*mvccpb.KeyValue) {
	servers, secrets, bad := make(map[string]*storedServer), make(map[string]storedSecret), make(map[string]error)
	var keys []Key
	for _, kv := range kvs {
		kind, name, v, err := s.decode(kv)
		switch {
		case err != nil:
			bad[string(kv.Key)] = err
		case kind == etcdServers:
			servers[name] = v.(*storedServer)
		case kind == etcdSecrets:
			secrets[name] = v.(storedSecret)
		case kind == etcdKeys:
			keys = append(keys, v.(Key))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.servers, s.secrets, s.bad = servers, secrets, bad
	s.keys.reset(keys)
	s.gen++
}

func (s *Etcd) apply(evs []*clientv3.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		delete(s.bad, key)
		kind, name, v, err := s.decode(ev.Kv)
		if kind == etcdServers {
			s.gen++
		}
		if ev.Type == clientv3.EventTypeDelete || err != nil {
			if err != nil {
				s.bad[key] = err
			}
			switch kind {
			case etcdServers:
				delete(s.servers, name)
			case etcdSecrets:
				delete(s.secrets, name)
			case etcdKeys:
				s.keys.remove(name)
			}
			continue
		}
		switch kind {
		case etcdServers:
			s.servers[name] = v.(*storedServer)
		case etcdSecrets:
			s.secrets[name] = v.(storedSecret)
		case etcdKeys:
			s.keys.put(v.(Key))
		}
	}
}

// decode splits a key into its collection and name ("servers", ref) and decodes its value; a
// deleted key (no value) decodes to nothing.
func (s *Etcd) decode(kv *mvccpb.KeyValue) (kind, name string, v any, err error) {
	kind, name, _ = strings.Cut(strings.TrimPrefix(string(kv.Key), string(s.space)), "/")
	if len(kv.Value) == 0 {
		return kind, name, nil, nil
	}
	switch kind {
	case etcdServers:
		st := &storedServer{}
		err = json.Unmarshal(kv.Value, st)
		v = st
	case etcdSecrets:
		var st storedSecret
		err = json.Unmarshal(kv.Value, &st)
		v = st
	case etcdKeys:
		var k Key
		err = json.Unmarshal(kv.Value, &k)
		v = k
	}
	if err != nil {
		err = fmt.Errorf("store: decode %s: %w", kv.Key, err)
		s.log.Error("registry: a value in etcd does not decode; reads of it fail until it is written again", "key", string(kv.Key), "err", err)
	}
	return kind, name, v, err
}

// commit runs hook with a recorder of this transaction and commits ops and its records if
// cmps hold.
func (s *Etcd) commit(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op, hook Hook) (bool, error) {
	rec, err := s.spool.EtcdRecorder(ctx)
	if err != nil {
		return false, err
	}
	if err := runHook(rec, hook); err != nil {
		return false, err
	}
	resp, err := etcdstore.Commit(ctx, s.cli, cmps, ops, rec)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

func absent(key string) clientv3.Cmp { return clientv3.Compare(clientv3.CreateRevision(key), "=", 0) }

func present(key string) clientv3.Cmp { return clientv3.Compare(clientv3.CreateRevision(key), ">", 0) }

func unchanged(kv *mvccpb.KeyValue) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)
}

// readJSON reads key from etcd into v, for a read-modify-write: the pair it returns is what a
// write compares with unchanged. A missing key is ErrNotFound.
func (s *Etcd) readJSON(ctx context.Context, key string, v any) (*mvccpb.KeyValue, error) {
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return nil, etcdstore.Unavailable("read "+key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, ErrNotFound
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, v); err != nil {
		return nil, fmt.Errorf("store: decode %s: %w", key, err)
	}
	return resp.Kvs[0], nil
}

// CreateServer stores a new registration at revision 1.
func (s *Etcd) CreateServer(ctx context.Context, r *mcpserver.Registration, hook Hook) error {
	now := time.Now().UTC()
	r.Revision, r.CreateTime, r.UpdateTime = 1, now, now
	val, err := encodeServer(s.box, r)
	if err != nil {
		return err
	}
	key := s.space.Key(etcdServers, r.Ref)
	return etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		ok, err := s.commit(ctx, []clientv3.Cmp{absent(key)}, []clientv3.Op{clientv3.OpPut(key, string(val))}, hook)
		if err == nil && !ok {
			return false, ErrExists
		}
		return ok, err
	})
}

// stored returns the decoded registration once the mirror is current; callers must not
// modify it.
func (s *Etcd) stored(ctx context.Context, ref string) (*storedServer, error) {
	if err := s.mirror.Sync(ctx); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.bad[s.space.Key(etcdServers, ref)]; err != nil {
		return nil, err
	}
	st, ok := s.servers[ref]
	if !ok {
		return nil, ErrNotFound
	}
	return st, nil
}

// GetServer returns a registration with its env in clear.
func (s *Etcd) GetServer(ctx context.Context, ref string) (*mcpserver.Registration, error) {
	st, err := s.stored(ctx, ref)
	if err != nil {
		return nil, err
	}
	return openServer(s.box, st)
}

// GetServerMasked returns a registration with env values empty and the URL masked, opening no
// seal.
func (s *Etcd) GetServerMasked(ctx context.Context, ref string) (*mcpserver.Registration, error) {
	st, err := s.stored(ctx, ref)
	if err != nil {
		return nil, err
	}
	return st.masked(), nil
}

// ServerView returns build's view of ref's registration, built once per stored revision.
func (s *Etcd) ServerView(ctx context.Context, ref string, build func(*mcpserver.Registration) any) (any, error) {
	st, err := s.stored(ctx, ref)
	if err != nil {
		return nil, err
	}
	return st.viewOf(build), nil
}

// ServerPolicy returns what a registration allows without opening its seals.
func (s *Etcd) ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error) {
	st, err := s.stored(ctx, ref)
	if err != nil {
		return mcpserver.Policy{}, err
	}
	return st.policy(), nil
}

// WarmTargets returns every registration whose prewarm is above 0, in ref order, computed once
// per change of the registrations.
func (s *Etcd) WarmTargets(ctx context.Context) ([]mcpserver.WarmTarget, error) {
	if err := s.mirror.Sync(ctx); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if w := s.warm.Load(); w != nil && w.gen == s.gen {
		return w.targets, nil
	}
	var out []mcpserver.WarmTarget
	for _, ref := range slices.Sorted(maps.Keys(s.servers)) {
		// Grants that miss the floor deny every call: no warm container would be taken (a
		// registration stored before the registry refused that, CheckPrewarm).
		if st := s.servers[ref]; st.Prewarm > 0 && len(mcpserver.FloorMissing(st.Grants)) == 0 {
			out = append(out, mcpserver.WarmTarget{Ref: st.Ref, Prewarm: st.Prewarm, Revision: st.Revision})
		}
	}
	s.warm.Store(&warmTargets{gen: s.gen, targets: out})
	return out, nil
}

// ListServers returns up to limit registrations after the page token, masked, and the next
// token.
func (s *Etcd) ListServers(ctx context.Context, pageToken string, limit int) ([]*mcpserver.Registration, string, error) {
	after, err := paging.DecodeToken(pageToken, serversTokenScope)
	if err != nil {
		return nil, "", err
	}
	if err := s.mirror.Sync(ctx); err != nil {
		return nil, "", err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*mcpserver.Registration
	for _, ref := range slices.Sorted(maps.Keys(s.servers)) {
		if ref <= after {
			continue
		}
		if len(out) == limit {
			return out, paging.EncodeToken(out[len(out)-1].Ref, serversTokenScope), nil
		}
		out = append(out, s.servers[ref].masked())
	}
	return out, "", nil
}

// ClosestRef returns the registered ref nearest to ref, for a "did you mean"; it does not wait
// for the mirror to be confirmed current.
func (s *Etcd) ClosestRef(ref string) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return closestRef(ref, maps.Keys(s.servers))
}

// UpdateServer replaces a registration: mutate receives the stored one and returns the new one
// (it may refuse); the revision advances by one. When another replica changed it first, mutate
// and hook run again on what that replica wrote.
func (s *Etcd) UpdateServer(ctx context.Context, ref string, mutate func(cur *mcpserver.Registration) (*mcpserver.Registration, error), hook UpdateHook) (*mcpserver.Registration, error) {
	key := s.space.Key(etcdServers, ref)
	var result *mcpserver.Registration
	err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		var st storedServer
		kv, err := s.readJSON(ctx, key, &st)
		if err != nil {
			return false, err
		}
		cur, err := openServer(s.box, &st)
		if err != nil {
			return false, err
		}
		next, err := mutate(cur)
		if err != nil {
			return false, err
		}
		next.Ref, next.Revision, next.CreateTime, next.UpdateTime = cur.Ref, cur.Revision+1, cur.CreateTime, time.Now().UTC()
		val, err := encodeServer(s.box, next)
		if err != nil {
			return false, err
		}
		ok, err := s.commit(ctx, []clientv3.Cmp{unchanged(kv)}, []clientv3.Op{clientv3.OpPut(key, string(val))}, func(rec audit.Recorder) error {
			if hook == nil {
				return nil
			}
			return hook(rec, cur, next)
		})
		if ok {
			result = next
		}
		return ok, err
	})
	return result, err
}

// DeleteServer removes a registration.
func (s *Etcd) DeleteServer(ctx context.Context, ref string, hook Hook) error {
	return s.deleteKey(ctx, s.space.Key(etcdServers, ref), hook)
}

func (s *Etcd) deleteKey(ctx context.Context, key string, hook Hook) error {
	return etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		ok, err := s.commit(ctx, []clientv3.Cmp{present(key)}, []clientv3.Op{clientv3.OpDelete(key)}, hook)
		if err == nil && !ok {
			return false, ErrNotFound
		}
		return ok, err
	})
}

// PutSecret creates or replaces a secret; the value is sealed before it leaves this process.
func (s *Etcd) PutSecret(ctx context.Context, name, value string, hook Hook) (Secret, error) {
	val, st, err := sealSecret(s.box, name, value)
	if err != nil {
		return Secret{}, err
	}
	key := s.space.Key(etcdSecrets, name)
	err = etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		return s.commit(ctx, nil, []clientv3.Op{clientv3.OpPut(key, string(val))}, hook)
	})
	return Secret{Name: name, UpdateTime: st.UpdateTime}, err
}

// SecretValue returns a secret's clear value.
func (s *Etcd) SecretValue(ctx context.Context, name string) (string, error) {
	if err := s.mirror.Sync(ctx); err != nil {
		return "", err
	}
	s.mu.RLock()
	st, ok := s.secrets[name]
	bad := s.bad[s.space.Key(etcdSecrets, name)]
	s.mu.RUnlock()
	if bad != nil {
		return "", bad
	}
	if !ok {
		return "", ErrNotFound
	}
	return openSecret(s.box, name, st)
}

// ListSecrets lists every secret name in order.
func (s *Etcd) ListSecrets(ctx context.Context) ([]Secret, error) {
	if err := s.mirror.Sync(ctx); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []Secret
	for _, name := range slices.Sorted(maps.Keys(s.secrets)) {
		out = append(out, Secret{Name: name, UpdateTime: s.secrets[name].UpdateTime})
	}
	return out, nil
}

// DeleteSecret removes a secret.
func (s *Etcd) DeleteSecret(ctx context.Context, name string, hook Hook) error {
	return s.deleteKey(ctx, s.space.Key(etcdSecrets, name), hook)
}

// CreateKey stores a new key record; a key with the same hash or id, on any replica, is
// refused.
func (s *Etcd) CreateKey(ctx context.Context, k Key, hook Hook) error {
	val, err := json.Marshal(k)
	if err != nil {
		return err
	}
	key, hash := s.space.Key(etcdKeys, k.ID), s.space.Key(etcdKeyHashes, k.Hash)
	return etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		ok, err := s.commit(ctx, []clientv3.Cmp{absent(key), absent(hash)},
			[]clientv3.Op{clientv3.OpPut(key, string(val)), clientv3.OpPut(hash, k.ID)}, hook)
		if err == nil && !ok {
			return false, ErrExists
		}
		return ok, err
	})
}

// KeyByHash returns a copy of the key with that hash once the mirror is current, so a key
// revoked on any replica is refused here at once. A stale last-used time is refreshed in the
// background, at most once per lastUsedResolution across replicas.
func (s *Etcd) KeyByHash(ctx context.Context, hash string) (Key, bool, error) {
	if err := s.mirror.Sync(ctx); err != nil {
		return Key{}, false, err
	}
	k, ok := s.keys.lookup(hash, &s.touches, s.writeLastUse)
	return k, ok, nil
}

// HeldKeyByHash returns a copy of the key with that hash as the mirror holds it, which may lag
// etcd by the watch's delay: for admissions, which Authorize follows with KeyByHash.
func (s *Etcd) HeldKeyByHash(hash string) (Key, bool) { return s.keys.byHashCopy(hash) }

// writeLastUse writes a key's last use unless the key changed since this replica saw it
// (another replica touched or revoked it): losing one refresh is harmless.
func (s *Etcd) writeLastUse(updated Key) {
	ctx, cancel := context.WithTimeout(context.Background(), etcdstore.RequestTimeout)
	defer cancel()
	key := s.space.Key(etcdKeys, updated.ID)
	resp, err := s.cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return
	}
	var cur Key
	if json.Unmarshal(resp.Kvs[0].Value, &cur) != nil || cur.Revoked || !lastUseStale(updated.LastUsed, cur.LastUsed) {
		return
	}
	cur.LastUsed = updated.LastUsed
	val, err := json.Marshal(cur)
	if err != nil {
		return
	}
	_, _ = etcdstore.Commit(ctx, s.cli, []clientv3.Cmp{unchanged(resp.Kvs[0])}, []clientv3.Op{clientv3.OpPut(key, string(val))}, nil)
}

// KeyByID returns a copy of the key with that id.
func (s *Etcd) KeyByID(ctx context.Context, id string) (Key, bool, error) {
	if err := s.mirror.Sync(ctx); err != nil {
		return Key{}, false, err
	}
	k, ok := s.keys.byIDCopy(id)
	return k, ok, nil
}

// ListKeys returns keys ordered by creation time.
func (s *Etcd) ListKeys(ctx context.Context) ([]Key, error) {
	if err := s.mirror.Sync(ctx); err != nil {
		return nil, err
	}
	return s.keys.list(), nil
}

// RevokeKey marks a key revoked; every replica refuses it from its next read on.
func (s *Etcd) RevokeKey(ctx context.Context, id string, hook Hook) (Key, error) {
	key := s.space.Key(etcdKeys, id)
	var result Key
	err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		var k Key
		kv, err := s.readJSON(ctx, key, &k)
		if err != nil {
			return false, err
		}
		updated := revoked(k)
		val, err := json.Marshal(updated)
		if err != nil {
			return false, err
		}
		ok, err := s.commit(ctx, []clientv3.Cmp{unchanged(kv)}, []clientv3.Op{clientv3.OpPut(key, string(val))}, hook)
		if ok {
			result = updated
		}
		return ok, err
	})
	return result, err
}
