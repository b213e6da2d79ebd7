package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/boltdb"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/internal/secretbox"
)

// A registry that ran on bbolt and starts on etcd brings what its registry.db holds
// (docs/operations.md, "Moving from bbolt"): ReadBolt reads the file, sealed values as they
// are, and checks this host's secrets key opens every one, before etcd is touched; Etcd.MoveBolt
// copies each item only where etcd holds none of its key (a create-if-absent transaction per
// server, secret and key), moves the audit records waiting in the file's outbox into etcd's,
// and renames the file to <name>.moved-to-etcd, so a later start neither copies again nor
// refuses. The values in etcd are the bbolt values (the layouts match, etcd.go), so nothing
// sealed is opened and sealed again.

// MovedSuffix is added to the name of a bbolt file whose state was moved to etcd.
const MovedSuffix = etcdstore.MovedSuffix

// BoltState is what a registry.db holds, read to be moved to etcd: each value as stored.
type BoltState struct {
	Path    string
	servers []boltItem
	secrets []boltItem
	keys    []boltKey
	outbox  [][]byte
	dropped uint64
	// moveID names the file's outbox for the move (audit.BoltOutboxMoveID).
	moveID string
	// skipped are the entries the move leaves in the renamed file (checkEntries).
	skipped []Skipped
	// resealed counts the values ReadBolt re-sealed under the first key of the key file.
	resealed int
}

type boltItem struct {
	name string
	val  []byte
}

type boltKey struct {
	id, hash string
	val      []byte
}

// Skipped is an entry of a registry.db that a move leaves in the renamed file, because the
// registry never writes one like it: its name is none the registry gives, its value does not
// decode, or it is larger than etcd takes in one request. Only a damaged or altered file holds
// one; the move goes on without it rather than fail at every start.
type Skipped struct {
	// Kind is server, secret or key; Name the entry's name in the file, quoted and clipped
	// (it may hold any byte); Reason why it was not moved. Never the value.
	Kind, Name, Reason string
}

// maxMovedValue bounds a value the move copies: etcd takes at most --max-request-bytes (1.5
// MiB by default) in a request, and the client sends no more (etcdstore.New); the rest is
// room for the key and the transaction around it.
const maxMovedValue = 3<<19 - 64<<10

// Skipped lists the entries the move leaves in the renamed file, and why.
func (st *BoltState) Skipped() []Skipped { return st.skipped }

func (st *BoltState) skip(kind, name, reason string) {
	if len(name) > 80 {
		name = name[:80] + "…"
	}
	st.skipped = append(st.skipped, Skipped{Kind: kind, Name: fmt.Sprintf("%q", name), Reason: reason})
}

// checkEntries keeps of what ReadBolt read the entries the registry could have written, and
// notes the others as skipped: a name that would not be the registry's in etcd (a "/" or a NUL
// puts it under another name's key), a value etcd refuses, one that does not decode.
func (st *BoltState) checkEntries(keys []boltItem) {
	tooLarge := func(val []byte) string {
		return fmt.Sprintf("its value is %d bytes, more than etcd takes in one request (%d)", len(val), maxMovedValue)
	}
	servers := st.servers[:0]
	for _, it := range st.servers {
		var s storedServer
		switch {
		case !ident.Ref.Valid(it.name):
			st.skip("server", it.name, "its name is no server ref ("+ident.Ref.Pattern()+")")
		case len(it.val) > maxMovedValue:
			st.skip("server", it.name, tooLarge(it.val))
		case json.Unmarshal(it.val, &s) != nil:
			st.skip("server", it.name, "its value does not decode as a registration")
		default:
			servers = append(servers, it)
		}
	}
	st.servers = servers
	secrets := st.secrets[:0]
	for _, it := range st.secrets {
		var s storedSecret
		switch {
		case !ident.SecretName.Valid(it.name):
			st.skip("secret", it.name, "its name is no secret name ("+ident.SecretName.Pattern()+")")
		case len(it.val) > maxMovedValue:
			st.skip("secret", it.name, tooLarge(it.val))
		case json.Unmarshal(it.val, &s) != nil:
			st.skip("secret", it.name, "its value does not decode as a secret")
		default:
			secrets = append(secrets, it)
		}
	}
	st.secrets = secrets
	for _, it := range keys {
		var k Key
		switch {
		case len(it.val) > maxMovedValue:
			st.skip("key", it.name, tooLarge(it.val))
		case json.Unmarshal(it.val, &k) != nil:
			st.skip("key", it.name, "its value does not decode as an API key")
		case k.ID != it.name || !etcdName(k.ID):
			st.skip("key", it.name, "its id is not the name it is kept under, or holds a \"/\" or a NUL")
		case !etcdName(k.Hash):
			st.skip("key", it.name, "its hash is empty, or holds a \"/\" or a NUL")
		default:
			st.keys = append(st.keys, boltKey{id: k.ID, hash: k.Hash, val: it.val})
		}
	}
}

// etcdName says whether v may end an etcd key of the registry as one name: not empty, at most
// 256 bytes, with no "/" (which would put it below another name) and no NUL.
func etcdName(v string) bool {
	return v != "" && len(v) <= 256 && !strings.ContainsAny(v, "/\x00")
}

// ReadBolt reads the registry's bbolt file at path, bringing it to the current schema first
// (a file of schema 1 holds URLs in clear, which etcd must not receive), and checks that box
// opens every sealed value in it: every replica sharing etcd opens what this one copies, with
// the key etcd's registrations are sealed with, which OpenEtcd then checks is this one.
// keyFile names the key in the error. The file is closed when ReadBolt returns.
func ReadBolt(path string, box *secretbox.Box, keyFile string) (_ *BoltState, err error) {
	db, err := boltdb.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() {
		if db == nil { // a failed scrub closed it
			return
		}
		if cerr := db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("registry: close %s: %w", path, cerr)
		}
	}()
	if err := boltdb.Migrate(db, allBuckets, migrations(box)); err != nil {
		return nil, err
	}
	if db, err = boltdb.ScrubIfRequested(db); err != nil {
		return nil, err
	}
	st := &BoltState{Path: path}
	var keys []boltItem
	err = db.View(func(tx *bolt.Tx) error {
		st.servers = readItems(tx, serversBucket)
		st.secrets = readItems(tx, secretsBucket)
		keys = readItems(tx, keysBucket)
		var err error
		st.outbox, st.dropped, err = audit.BoltOutboxRecords(tx, string(OutboxBucket))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("registry: read %s to move it to etcd: %w", path, err)
	}
	st.checkEntries(keys)
	closed, first, err := st.unopened(box)
	if err != nil {
		return nil, fmt.Errorf("registry: read %s to move it to etcd: %w", path, err)
	}
	if closed > 0 {
		return nil, fmt.Errorf("registry: %s was not moved to etcd: %d of its sealed values (the first: %s) do not open with this host's secrets key (%s); nothing was copied and the file is left as it is. "+
			"Start with the key file %s was sealed with (secrets_key_file, RINGFENCE_SECRETS_KEY_FILE; default <data_dir>/secrets.key): it must be every registry replica's key, so move this registry first, before any replica has started on etcd with another key",
			path, closed, first, keyFile, filepath.Base(path))
	}
	if err := st.reseal(box); err != nil {
		return nil, fmt.Errorf("registry: read %s to move it to etcd: %w", path, err)
	}
	// Named only once the file may move: one refused above is left as it is.
	if st.moveID, err = audit.BoltOutboxMoveID(db, string(OutboxBucket)); err != nil {
		return nil, fmt.Errorf("registry: read %s to move it to etcd: %w", path, err)
	}
	return st, nil
}

// reseal re-seals under the first key of box the values of st that only a later key opens,
// as a start re-seals the store it opens: otherwise a move made while the key file held an old
// and a new key would bring values sealed under the old one into etcd after the start's
// re-seal had said none was left there.
func (st *BoltState) reseal(box *secretbox.Box) error {
	var n secretbox.ResealCount
	for i, it := range st.servers {
		var s storedServer
		if err := json.Unmarshal(it.val, &s); err != nil {
			return fmt.Errorf("decode server %s: %w", it.name, err)
		}
		if !resealServer(&n, box, &s) {
			continue
		}
		val, err := json.Marshal(&s)
		if err != nil {
			return err
		}
		st.servers[i].val = val
	}
	for i, it := range st.secrets {
		var s storedSecret
		if err := json.Unmarshal(it.val, &s); err != nil {
			return fmt.Errorf("decode secret %s: %w", it.name, err)
		}
		if !resealSecret(&n, box, it.name, &s) {
			continue
		}
		val, err := json.Marshal(s)
		if err != nil {
			return err
		}
		st.secrets[i].val = val
	}
	st.resealed = n.Resealed
	return nil
}

func readItems(tx *bolt.Tx, bucket []byte) []boltItem {
	var out []boltItem
	_ = tx.Bucket(bucket).ForEach(func(k, v []byte) error {
		out = append(out, boltItem{name: string(k), val: bytes.Clone(v)})
		return nil
	})
	return out
}

// unopened counts the servers and secrets whose seals box does not open, and names the first.
func (st *BoltState) unopened(box *secretbox.Box) (n int, first string, err error) {
	note := func(what string) {
		if n++; n == 1 {
			first = what
		}
	}
	for _, it := range st.servers {
		var s storedServer
		if err := json.Unmarshal(it.val, &s); err != nil {
			return 0, "", fmt.Errorf("decode server %s: %w", it.name, err)
		}
		if _, err := openServer(box, &s); errors.Is(err, secretbox.ErrOpen) {
			note(fmt.Sprintf("server %q", it.name))
		} else if err != nil {
			return 0, "", err
		}
	}
	for _, it := range st.secrets {
		var s storedSecret
		if err := json.Unmarshal(it.val, &s); err != nil {
			return 0, "", fmt.Errorf("decode secret %s: %w", it.name, err)
		}
		if _, err := openSecret(box, it.name, s); err != nil {
			note(fmt.Sprintf("secret %q", it.name))
		}
	}
	return n, first, nil
}

// Moved counts what MoveBolt copied, and what etcd held already under the same key (which
// stands).
type Moved struct {
	ServersCopied, ServersInEtcd int
	SecretsCopied, SecretsInEtcd int
	KeysCopied, KeysInEtcd       int
	// AuditRecords is how many records waiting in the file's outbox were moved to etcd's, and
	// AuditDropped the count of records the file's outbox had dropped and not yet reported,
	// brought to be reported from etcd. Both are 0 when an earlier run of the move brought them
	// (it stopped before its rename): they are brought once.
	AuditRecords int
	AuditDropped uint64
	// RenamedTo is the file's new name: <name>.moved-to-etcd, or with a time after it when a
	// file of an earlier move has that name.
	RenamedTo string
	// Skipped are the entries left in the renamed file (BoltState.Skipped).
	Skipped []Skipped
}

// moveStep, when set (by tests), runs after each item is copied; an error stops the move
// there, as a crash would. moveRenaming runs the same way after the audit records are moved,
// before the rename.
var moveStep, moveRenaming func() error

// MoveBolt copies st into etcd, then renames its file to <name>.moved-to-etcd. Each server
// (by ref), secret (by name) and key (by id and by hash: a hash is never registered twice) is
// written only where etcd holds none, so one written on etcd since, or copied by another
// registry first, stands. A move that stops in the middle leaves the file in place: the next
// start copies again, finding what it copied in etcd.
func (s *Etcd) MoveBolt(ctx context.Context, st *BoltState) (Moved, error) {
	var m Moved
	step := func(created bool, copied, inEtcd *int) error {
		if created {
			*copied++
		} else {
			*inEtcd++
		}
		if moveStep != nil {
			return moveStep()
		}
		return nil
	}
	fail := func(err error) (Moved, error) {
		return m, fmt.Errorf("registry: moving %s to etcd (nothing is lost: the file stays, and the next start copies again): %w", st.Path, err)
	}
	for _, it := range st.servers {
		created, err := s.createIfAbsent(ctx, []string{s.space.Key(etcdServers, it.name)}, it.val)
		if err == nil {
			err = step(created, &m.ServersCopied, &m.ServersInEtcd)
		}
		if err != nil {
			return fail(err)
		}
	}
	for _, it := range st.secrets {
		created, err := s.createIfAbsent(ctx, []string{s.space.Key(etcdSecrets, it.name)}, it.val)
		if err == nil {
			err = step(created, &m.SecretsCopied, &m.SecretsInEtcd)
		}
		if err != nil {
			return fail(err)
		}
	}
	for _, k := range st.keys {
		created, err := s.createIfAbsent(ctx, []string{s.space.Key(etcdKeys, k.id), s.space.Key(etcdKeyHashes, k.hash)}, k.val, []byte(k.id))
		if err == nil {
			err = step(created, &m.KeysCopied, &m.KeysInEtcd)
		}
		if err != nil {
			return fail(err)
		}
	}
	out := &audit.EtcdOutbox{Client: s.cli, Prefix: s.space.Prefix(etcdOutbox)}
	imported, err := out.Import(ctx, st.moveID, st.outbox, st.dropped)
	if err != nil {
		return fail(err)
	}
	if imported {
		m.AuditRecords, m.AuditDropped = len(st.outbox), st.dropped
	}
	if moveRenaming != nil {
		if err := moveRenaming(); err != nil {
			return fail(err)
		}
	}
	if m.RenamedTo, err = boltdb.SetAside(st.Path, MovedSuffix); err != nil {
		return fail(err)
	}
	m.Skipped = st.skipped
	return m, nil
}

// createIfAbsent puts vals[i] at keys[i] in one transaction, if etcd holds none of the keys.
func (s *Etcd) createIfAbsent(ctx context.Context, keys []string, vals ...[]byte) (bool, error) {
	cmps := make([]clientv3.Cmp, len(keys))
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		cmps[i], ops[i] = absent(k), clientv3.OpPut(k, string(vals[i]))
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, etcdstore.Unavailable("copy "+keys[0], err)
	}
	return resp.Succeeded, nil
}
