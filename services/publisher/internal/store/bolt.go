package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/boltdb"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/paging"
)

// Bolt is the publisher's bbolt file, with decoded drafts and versions cached in memory.
// Graphs returned by reads are shared with the cache and other readers: never modify them.
type Bolt struct {
	db    *bolt.DB
	cache *cache
	spool *audit.Spool
}

// OpenBolt opens or creates the file at path. cacheBytes bounds the decoded graphs kept in
// memory (0: DefaultCacheBytes, negative: none). The audit spool's outbox is a bucket of the
// same file, so a change and its record commit together.
func OpenBolt(path string, cacheBytes int, spool SpoolConfig) (*Bolt, error) {
	db, err := boltdb.Open(path)
	if err != nil {
		return nil, err
	}
	if err := boltdb.Migrate(db, allBuckets, migrations); err != nil {
		_ = db.Close() // the error above is the one to report
		return nil, err
	}
	spool.DB, spool.Bucket = db, string(OutboxBucket)
	sp, err := audit.NewSpool(spool)
	if err != nil {
		_ = db.Close() // the spool's error is the one to report
		return nil, err
	}
	return &Bolt{db: db, cache: newCacheOf(cacheBytes), spool: sp}, nil
}

// DB exposes the file, for tests.
func (s *Bolt) DB() *bolt.DB { return s.db }

// Spool is the audit spool whose outbox is in this file.
func (s *Bolt) Spool() *audit.Spool { return s.spool }

// Close closes the file.
func (s *Bolt) Close() error {
	_ = s.spool.Close() // a bucket of db: nothing of its own to release
	return s.db.Close()
}

func graphKey(tenant, id string) []byte { return []byte(tenant + "/" + id) }

func versionPrefix(tenant, id string) []byte { return []byte(tenant + "/" + id + "/") }

func versionKey(tenant, id string, n int64) []byte {
	k := versionPrefix(tenant, id)
	return binary.BigEndian.AppendUint64(k, uint64(n))
}

// damaged is a draft or version of graph tenant/id in this file that does not decode (err):
// DATA_LOSS naming the graph, the file and the fix. Deleting the graph does not read it, so
// that works on a damaged one.
func (s *Bolt) damaged(what, tenant, id string, err error) error {
	file := filepath.Base(s.db.Path())
	return fmt.Errorf("publisher: the %s of graph %q in tenant %q cannot be read from %s: %w: %w: restore %s from a backup (ringfence backup, docs/operations.md \"Backups\"); without one, delete the graph (ringfence graphs delete --graph %s) and create it again",
		what, id, tenant, file, ErrDamaged, err, file, id)
}

func getMeta(tx *bolt.Tx, key []byte) (*meta, error) {
	v := tx.Bucket(graphsBucket).Get(key)
	if v == nil {
		return nil, ErrNotFound
	}
	var m meta
	if err := json.Unmarshal(v, &m); err != nil {
		return nil, fmt.Errorf("store: decode graph %s: %w", key, err)
	}
	return &m, nil
}

// liveMeta returns a graph's meta, treating a tombstone as absent.
func liveMeta(tx *bolt.Tx, key []byte) (*meta, error) {
	m, err := getMeta(tx, key)
	if err != nil {
		return nil, err
	}
	if m.Deleted {
		return nil, ErrNotFound
	}
	return m, nil
}

func putJSON(b *bolt.Bucket, key []byte, v any) error {
	val, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, val)
}

// CreateGraph stores a new graph's draft. Its revision continues after a deleted graph of the
// same id, so a client holding a revision of the old draft cannot overwrite the new one.
func (s *Bolt) CreateGraph(ctx context.Context, g *graph.Graph, hook Hook) error {
	key := graphKey(g.Tenant, g.ID)
	var size int
	err := s.db.Update(func(tx *bolt.Tx) error {
		now := time.Now().UTC()
		m, err := getMeta(tx, key)
		switch {
		case errors.Is(err, ErrNotFound):
			m = &meta{Tenant: g.Tenant, ID: g.ID}
		case err != nil:
			return err
		case !m.Deleted:
			return ErrExists
		}
		m.create(g, now)
		val, err := encodeDraft(g)
		if err != nil {
			return err
		}
		size = len(val)
		if err := tx.Bucket(draftsBucket).Put(key, val); err != nil {
			return err
		}
		if err := putJSON(tx.Bucket(graphsBucket), key, m); err != nil {
			return err
		}
		return runHook(s.spool.TxRecorder(tx), hook)
	})
	if err == nil {
		s.cache.put(draftCacheKey(g.Tenant, g.ID), g.Revision, g, size)
	}
	return err
}

// Draft returns a graph's draft (shared: do not modify it).
func (s *Bolt) Draft(ctx context.Context, tenant, id string) (*graph.Graph, error) {
	ck := draftCacheKey(tenant, id)
	var out *graph.Graph
	var size int
	var decoded bool
	err := s.db.View(func(tx *bolt.Tx) error {
		key := graphKey(tenant, id)
		m, err := liveMeta(tx, key)
		if err != nil {
			return err
		}
		if v, ok := s.cache.get(ck, m.DraftRevision); ok {
			out = v.(*graph.Graph)
			return nil
		}
		v := tx.Bucket(draftsBucket).Get(key)
		if v == nil {
			return ErrNotFound
		}
		g, err := decodeDraft(v, string(key))
		if err != nil {
			return s.damaged("draft", tenant, id, err)
		}
		out, size, decoded = g, len(v), true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if decoded {
		s.cache.put(ck, out.Revision, out, size)
	}
	return out, nil
}

// UpdateDraft changes a draft in one transaction: mutate receives the stored draft and edits it
// in place (or refuses with an error, which writes nothing). The revision advances by one.
func (s *Bolt) UpdateDraft(ctx context.Context, tenant, id string, mutate func(cur *graph.Graph) error, hook Hook) (*graph.Graph, error) {
	key := graphKey(tenant, id)
	var out *graph.Graph
	var size int
	err := s.db.Update(func(tx *bolt.Tx) error {
		m, err := liveMeta(tx, key)
		if err != nil {
			return err
		}
		v := tx.Bucket(draftsBucket).Get(key)
		if v == nil {
			return fmt.Errorf("store: graph %s has no draft", key)
		}
		g, err := decodeDraft(v, string(key))
		if err != nil {
			return s.damaged("draft", tenant, id, err)
		}
		if err := mutate(g); err != nil {
			return err
		}
		m.update(g, time.Now().UTC())
		val, err := encodeDraft(g)
		if err != nil {
			return err
		}
		if err := tx.Bucket(draftsBucket).Put(key, val); err != nil {
			return err
		}
		if err := putJSON(tx.Bucket(graphsBucket), key, m); err != nil {
			return err
		}
		if err := runHook(s.spool.TxRecorder(tx), hook); err != nil {
			return err
		}
		out, size = g, len(val)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.cache.put(draftCacheKey(tenant, id), out.Revision, out, size)
	return out, nil
}

// Publish stores v as the graph's next version, provided the draft is still at draftRevision
// (what was validated is what gets published). It returns the new version number. A version
// key that already exists is refused, never overwritten.
func (s *Bolt) Publish(ctx context.Context, tenant, id string, draftRevision int64, v *graph.Version, hook Hook) (int64, error) {
	key := graphKey(tenant, id)
	var n int64
	var size int
	err := s.db.Update(func(tx *bolt.Tx) error {
		m, err := liveMeta(tx, key)
		if err != nil {
			return err
		}
		if m.DraftRevision != draftRevision {
			return ErrStaleRevision
		}
		n = m.publish(v)
		vk := versionKey(tenant, id, n)
		versions := tx.Bucket(versionsBucket)
		if versions.Get(vk) != nil {
			return ErrVersionExists
		}
		val, err := encodeGob(v)
		if err != nil {
			return err
		}
		size = len(val)
		if err := versions.Put(vk, val); err != nil {
			return err
		}
		if err := putJSON(tx.Bucket(versionInfoBucket), vk, info(v)); err != nil {
			return err
		}
		if err := putJSON(tx.Bucket(graphsBucket), key, m); err != nil {
			return err
		}
		return runHook(s.spool.TxRecorder(tx), hook)
	})
	if err != nil {
		return 0, err
	}
	s.cache.put(versionCacheKey(tenant, id, n), 0, v, size)
	return n, nil
}

// Version returns a published version (shared: do not modify it); n == 0 means the latest.
func (s *Bolt) Version(ctx context.Context, tenant, id string, n int64) (*graph.Version, error) {
	var out *graph.Version
	var size int
	var decoded bool
	err := s.db.View(func(tx *bolt.Tx) error {
		m, err := liveMeta(tx, graphKey(tenant, id))
		if err != nil {
			return err
		}
		if n == 0 {
			n = m.LatestVersion
		}
		raw := tx.Bucket(versionsBucket).Get(versionKey(tenant, id, n))
		if raw == nil {
			return ErrNotFound
		}
		if v, ok := s.cache.get(versionCacheKey(tenant, id, n), 0); ok {
			out = v.(*graph.Version)
			return nil
		}
		var v graph.Version
		if err := decodeGob(raw, &v); err != nil {
			return s.damaged(fmt.Sprintf("version %d", n), tenant, id, fmt.Errorf("store: decode version %d of %s/%s: %w", n, tenant, id, err))
		}
		out, size, decoded = &v, len(raw), true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if decoded {
		s.cache.put(versionCacheKey(tenant, id, n), 0, out, size)
	}
	return out, nil
}

// ListVersions returns up to limit versions without their graphs, newest first, after the
// page token, and the next token.
func (s *Bolt) ListVersions(ctx context.Context, tenant, id, pageToken string, limit int) ([]graph.Version, string, error) {
	before, err := versionsAfter(tenant, id, pageToken)
	if err != nil {
		return nil, "", err
	}
	var out []graph.Version
	var next string
	err = s.db.View(func(tx *bolt.Tx) error {
		m, err := liveMeta(tx, graphKey(tenant, id))
		if err != nil {
			return err
		}
		start := m.LatestVersion
		if before > 0 && before-1 < start {
			start = before - 1
		}
		prefix := versionPrefix(tenant, id)
		c := tx.Bucket(versionInfoBucket).Cursor()
		k, v := c.Seek(versionKey(tenant, id, start))
		if k == nil || !bytes.Equal(k, versionKey(tenant, id, start)) {
			k, v = c.Prev()
		}
		for ; k != nil && bytes.HasPrefix(k, prefix) && len(k) == len(prefix)+8; k, v = c.Prev() {
			if len(out) == limit {
				next = versionsToken(tenant, id, out[len(out)-1].Version)
				return nil
			}
			var info graph.Version
			if err := json.Unmarshal(v, &info); err != nil {
				return err
			}
			out = append(out, info)
		}
		return nil
	})
	return out, next, err
}

// ListGraphs returns up to limit of a tenant's graphs after the page token, and the next token.
func (s *Bolt) ListGraphs(ctx context.Context, tenant, pageToken string, limit int) ([]Summary, string, error) {
	after, err := paging.DecodeToken(pageToken, "publisher.graphs", tenant)
	if err != nil {
		return nil, "", err
	}
	prefix := []byte(tenant + "/")
	var out []Summary
	var next string
	err = s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(graphsBucket).Cursor()
		k, v := c.Seek(prefix)
		if after != "" {
			k, v = c.Seek(graphKey(tenant, after))
			if k != nil && bytes.Equal(k, graphKey(tenant, after)) {
				k, v = c.Next()
			}
		}
		for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			var m meta
			if err := json.Unmarshal(v, &m); err != nil {
				return err
			}
			if m.Deleted {
				continue
			}
			if len(out) == limit {
				next = graphsToken(tenant, out[len(out)-1].ID)
				return nil
			}
			out = append(out, m.summary())
		}
		return nil
	})
	return out, next, err
}

// Published lists every graph of every tenant that has a published version, with its latest
// version number.
func (s *Bolt) Published(ctx context.Context) ([]Summary, error) {
	var out []Summary
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(graphsBucket).ForEach(func(_, v []byte) error {
			var m meta
			if err := json.Unmarshal(v, &m); err != nil {
				return err
			}
			if !m.Deleted && m.LatestVersion > 0 {
				out = append(out, m.summary())
			}
			return ctx.Err()
		})
	})
	return out, err
}

// DeleteGraph removes a graph's draft and versions and leaves a tombstone that keeps its
// numbering.
func (s *Bolt) DeleteGraph(ctx context.Context, tenant, id string, hook Hook) error {
	key := graphKey(tenant, id)
	err := s.db.Update(func(tx *bolt.Tx) error {
		m, err := liveMeta(tx, key)
		if err != nil {
			return err
		}
		if err := tx.Bucket(draftsBucket).Delete(key); err != nil {
			return err
		}
		prefix := versionPrefix(tenant, id)
		for _, name := range [][]byte{versionsBucket, versionInfoBucket} {
			c := tx.Bucket(name).Cursor()
			for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		m.remove(time.Now().UTC())
		if err := putJSON(tx.Bucket(graphsBucket), key, m); err != nil {
			return err
		}
		return runHook(s.spool.TxRecorder(tx), hook)
	})
	// Lookups confirm against the file first, so this only frees memory.
	s.cache.drop(draftCacheKey(tenant, id))
	s.cache.dropPrefix(versionCachePrefix(tenant, id))
	return err
}
