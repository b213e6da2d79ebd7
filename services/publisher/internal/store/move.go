package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/boltdb"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/ident"
)

// A publisher that ran on bbolt and starts on etcd brings what its publisher.db holds
// (docs/operations.md, "Moving from bbolt"): Etcd.MoveBolt copies every graph, tombstones
// included (they keep version numbers from being reused), with its draft, versions and their
// listings, each value as bbolt stores it (drafts and versions past etcdstore.InlineBytes go
// through Blobs, as every write does); it moves the audit records waiting in the file's outbox
// into etcd's, then renames the file to <name>.moved-to-etcd.

// MovedSuffix is added to the name of a bbolt file whose state was moved to etcd.
const MovedSuffix = etcdstore.MovedSuffix

// Moved counts what MoveBolt copied, and the graphs etcd held already (which stand).
type Moved struct {
	// GraphsCopied counts graphs and tombstones; VersionsCopied their versions.
	GraphsCopied, GraphsInEtcd int
	VersionsCopied             int
	// AuditRecords is how many records waiting in the file's outbox were moved to etcd's, and
	// AuditDropped the count of records the file's outbox had dropped and not yet reported,
	// brought to be reported from etcd. Both are 0 when an earlier run of the move brought them
	// (it stopped before its rename): they are brought once.
	AuditRecords int
	AuditDropped uint64
	// RenamedTo is the file's new name: <name>.moved-to-etcd, or with a time after it when a
	// file of an earlier move has that name.
	RenamedTo string
	// Skipped are the graphs left in the renamed file, because no publisher writes one like
	// them: the key they are kept under is no <tenant>/<graph id> of valid names, or their meta
	// is larger than etcd takes in one request. Only a damaged or altered file holds one; the
	// move goes on without them rather than fail at every start.
	Skipped []Skipped
}

// Skipped is a graph the move left in the renamed file: Key is the key it is kept under,
// quoted and clipped (it may hold any byte), Reason why. Never a value.
type Skipped struct{ Key, Reason string }

// maxMovedMeta bounds a graph's meta the move copies, in the transaction that makes the graph
// whole (etcd takes at most 1.5 MiB a request; the rest is room for the transaction).
const maxMovedMeta = 3<<19 - 64<<10

// movable says why a graph kept under key, with meta, is not moved, or "" when it is.
func movable(key, meta []byte) (tenant, id, why string) {
	t, i, ok := bytes.Cut(key, []byte("/"))
	switch {
	case !ok:
		return "", "", "its key is not <tenant>/<graph id>"
	case !ident.Ref.Valid(string(t)):
		return "", "", "its tenant is no tenant name (" + ident.Ref.Pattern() + ")"
	case !ident.Ref.Valid(string(i)):
		return "", "", "its graph id is no graph id (" + ident.Ref.Pattern() + ")"
	case len(meta) > maxMovedMeta:
		return "", "", fmt.Sprintf("its meta is %d bytes, more than etcd takes in one request (%d)", len(meta), maxMovedMeta)
	}
	return string(t), string(i), ""
}

// moveStep, when set (by tests), runs after each graph is copied; an error stops the move
// there, as a crash would. moveRenaming runs the same way after the audit records are moved,
// before the rename. moveFlushed runs after each transaction of a graph's parts but its last.
var (
	moveStep, moveRenaming func() error
	moveFlushed            func(owner string)
)

// Limits of one transaction of a move, under etcd's defaults (128 operations, 1.5 MiB a
// request); a value past etcdstore.InlineBytes (512 KiB) goes in chunks staged before it.
const (
	moveTxnOps   = 100
	moveTxnBytes = 1 << 20
)

// errGraphInEtcd stops the copy of a graph that etcd came to hold meanwhile.
var errGraphInEtcd = errors.New("the graph is in etcd")

// MoveBolt copies the publisher's bbolt file at path into etcd, then renames it to
// <name>.moved-to-etcd. A graph is copied whole, and only where etcd holds no graph (live or
// tombstone) of its tenant and id: one there stands, and none of the file's parts are mixed
// into it.
//
// A graph rarely fits one transaction (128 operations, 1.5 MiB): its parts go first, in
// transactions that each hold only while etcd has no meta for the graph, and its meta last, in
// the same kind of transaction. Until the meta is there, nothing reads those keys (every read
// starts from the meta) and no writer uses them (a graph created there meanwhile has a meta
// first, which stops the copy). So the graph appears whole at the meta's commit or not at all.
// What a move that stopped in the middle wrote, the next one clears first (keys of a graph
// without a meta belong to no graph). When another replica creates the graph in the middle of
// the copy, the copy stops, its graph stands, and the parts written for this one are deleted
// where they are still as written (a publish of that replica meanwhile finds a number taken,
// and succeeds once they are gone).
func (s *Etcd) MoveBolt(ctx context.Context, path string) (m Moved, err error) {
	fail := func(err error) (Moved, error) {
		return m, fmt.Errorf("publisher: moving %s to etcd (nothing is lost: the file stays, and the next start copies again): %w", path, err)
	}
	db, err := boltdb.Open(path)
	if err != nil {
		return m, err
	}
	closed := false
	defer func() {
		if !closed {
			_ = db.Close() // the move's error is the one to report
		}
	}()
	if err := boltdb.Migrate(db, allBuckets, migrations); err != nil {
		return m, err
	}
	var owners [][2]string
	var metas [][]byte
	var outbox [][]byte
	var dropped uint64
	err = db.View(func(tx *bolt.Tx) error {
		err := tx.Bucket(graphsBucket).ForEach(func(k, v []byte) error {
			tenant, id, why := movable(k, v)
			if why != "" {
				name := string(k)
				if len(name) > 80 {
					name = name[:80] + "…"
				}
				m.Skipped = append(m.Skipped, Skipped{Key: fmt.Sprintf("%q", name), Reason: why})
				return nil
			}
			owners, metas = append(owners, [2]string{tenant, id}), append(metas, bytes.Clone(v))
			return nil
		})
		if err != nil {
			return err
		}
		outbox, dropped, err = audit.BoltOutboxRecords(tx, string(OutboxBucket))
		return err
	})
	if err != nil {
		return fail(err)
	}
	moveID, err := audit.BoltOutboxMoveID(db, string(OutboxBucket))
	if err != nil {
		return fail(err)
	}
	for i, o := range owners {
		copied, versions, err := s.moveGraph(ctx, db, o[0], o[1], metas[i])
		if err != nil {
			return fail(fmt.Errorf("graph %s/%s: %w", o[0], o[1], err))
		}
		if copied {
			m.GraphsCopied++
			m.VersionsCopied += versions
		} else {
			m.GraphsInEtcd++
		}
		if moveStep != nil {
			if err := moveStep(); err != nil {
				return fail(err)
			}
		}
	}
	out := &audit.EtcdOutbox{Client: s.cli, Prefix: s.space.Prefix(etcdOutbox)}
	imported, err := out.Import(ctx, moveID, outbox, dropped)
	if err != nil {
		return fail(err)
	}
	if imported {
		m.AuditRecords, m.AuditDropped = len(outbox), dropped
	}
	if moveRenaming != nil {
		if err := moveRenaming(); err != nil {
			return fail(err)
		}
	}
	closed = true
	if err := db.Close(); err != nil {
		return fail(err)
	}
	if m.RenamedTo, err = boltdb.SetAside(path, MovedSuffix); err != nil {
		return fail(err)
	}
	return m, nil
}

// moveGraph copies one graph: copied is false when etcd holds one of its tenant and id.
func (s *Etcd) moveGraph(ctx context.Context, db *bolt.DB, tenant, id string, metaVal []byte) (copied bool, versions int, err error) {
	key := s.graphKey(tenant, id)
	own := owner(tenant, id)
	// Clear what a move stopped in the middle wrote: with no meta, these keys are no graph's.
	resp, err := s.cli.Txn(ctx).If(absent(key)).Then(
		clientv3.OpDelete(s.draftKey(tenant, id)),
		clientv3.OpDelete(s.space.Prefix(etcdVersions, tenant, id), clientv3.WithPrefix()),
		clientv3.OpDelete(s.space.Prefix(etcdInfo, tenant, id), clientv3.WithPrefix()),
		s.blobs.DeleteOwnerOp(own),
	).Commit()
	if err != nil {
		return false, 0, etcdstore.Unavailable("clear graph", err)
	}
	if !resp.Succeeded {
		return false, 0, nil
	}
	b := &graphBatch{s: s, ctx: ctx, guard: absent(key), owner: own}
	err = db.View(func(tx *bolt.Tx) error {
		gk := graphKey(tenant, id)
		if draft := tx.Bucket(draftsBucket).Get(gk); draft != nil {
			if err := b.add(s.draftKey(tenant, id), draft, true); err != nil {
				return err
			}
		}
		prefix := versionPrefix(tenant, id)
		for _, bucket := range [][]byte{versionsBucket, versionInfoBucket} {
			c := tx.Bucket(bucket).Cursor()
			for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
				if len(k) != len(prefix)+8 {
					return fmt.Errorf("%s: key %q is not tenant/id/<version>", bucket, k)
				}
				n := int64(binary.BigEndian.Uint64(k[len(prefix):]))
				if bytes.Equal(bucket, versionsBucket) {
					versions++
					err = b.add(s.versionKey(tenant, id, n), v, true)
				} else {
					err = b.add(s.infoKey(tenant, id, n), v, false)
				}
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err == nil {
		err = b.flush(clientv3.OpPut(key, string(metaVal)))
	}
	if errors.Is(err, errGraphInEtcd) {
		return false, 0, b.undo()
	}
	if err != nil {
		return false, 0, err
	}
	return true, versions, nil
}

// graphBatch gathers the puts of a graph's copy into transactions that hold only while guard
// does (etcd has no meta of the graph), and remembers each key's revision to undo them.
type graphBatch struct {
	s     *Etcd
	ctx   context.Context
	guard clientv3.Cmp
	owner string

	ops     []clientv3.Op
	keys    []string // the ops' keys whose values are stored values (for undo)
	vals    [][]byte
	size    int
	written []writtenKey
}

type writtenKey struct {
	key string
	val []byte
	rev int64
}

// add puts val at key; blob stages it through etcdstore.Blobs (a draft or a version). val may
// be bbolt's memory, valid only in its transaction: what is kept is a copy.
func (b *graphBatch) add(key string, val []byte, blob bool) error {
	stored, extra := bytes.Clone(val), []clientv3.Op(nil)
	if blob {
		staged, err := b.s.blobs.Stage(b.ctx, b.owner, val)
		if errors.Is(err, etcdstore.ErrTooLarge) {
			return fmt.Errorf("store: %s cannot move to etcd: %w: make that graph smaller on bbolt first (start the publisher without store.backend=etcd), or keep it on bbolt", key, err)
		}
		if err != nil {
			return etcdstore.Unavailable("stage "+key, err)
		}
		stored, extra = staged.Value, staged.Ops
	}
	if len(b.ops) > 0 && (len(b.ops)+1+len(extra) > moveTxnOps || b.size+len(stored) > moveTxnBytes) {
		if err := b.flush(); err != nil {
			return err
		}
	}
	b.ops = append(append(b.ops, clientv3.OpPut(key, string(stored))), extra...)
	b.keys, b.vals = append(b.keys, key), append(b.vals, stored)
	b.size += len(stored)
	return nil
}

// flush commits the gathered puts and last, if etcd still holds no meta of the graph.
func (b *graphBatch) flush(last ...clientv3.Op) error {
	ops := append(b.ops, last...)
	if len(ops) == 0 {
		return nil
	}
	resp, err := b.s.cli.Txn(b.ctx).If(b.guard).Then(ops...).Commit()
	if err != nil {
		return etcdstore.Unavailable("copy graph", err)
	}
	if !resp.Succeeded {
		return errGraphInEtcd
	}
	for i, k := range b.keys {
		b.written = append(b.written, writtenKey{key: k, val: b.vals[i], rev: resp.Header.Revision})
	}
	b.ops, b.keys, b.vals, b.size = nil, nil, nil, 0
	if moveFlushed != nil && len(last) == 0 {
		moveFlushed(b.owner)
	}
	return nil
}

// undo deletes what the copy wrote of a graph that another replica created meanwhile, each key
// only where it is still as written (with its chunks).
func (b *graphBatch) undo() error {
	for _, w := range b.written {
		ops := append([]clientv3.Op{clientv3.OpDelete(w.key)}, b.s.blobs.DeleteOps(b.owner, w.val)...)
		_, err := b.s.cli.Txn(b.ctx).If(clientv3.Compare(clientv3.ModRevision(w.key), "=", w.rev)).Then(ops...).Commit()
		if err != nil {
			return etcdstore.Unavailable("clear graph", err)
		}
	}
	return nil
}
