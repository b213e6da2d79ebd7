package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/paging"
)

// The publisher's keys in etcd, under <root>/publisher/ (etcdstore.Space); tenants and graph
// ids hold no "/":
//
//	meta/schema_version                       the layout's version (etcdstore.Migrate)
//	graphs/<tenant>/<id>                      meta JSON (revision, latest version, counts);
//	                                          a deleted graph's stays as a tombstone
//	drafts/<tenant>/<id>                      the draft (gob), in place or chunked (etcdstore.Blobs)
//	versions/<tenant>/<id>/<n, 20 digits>     a published version (gob), written once
//	version_info/<tenant>/<id>/<max-n, 20 digits>
//	                                          the version without its graph (JSON), newest first
//	blobs/<tenant>/<id>/<blob id>/<chunk>     chunks of drafts and versions past 512 KiB
//	audit_outbox/...                          audit records waiting for the audit log
const (
	etcdGraphs   = "graphs"
	etcdDrafts   = "drafts"
	etcdVersions = "versions"
	etcdInfo     = "version_info"
	etcdBlobs    = "blobs"
	etcdOutbox   = "audit_outbox"
)

// etcdMigrations are the etcd layout's schema versions; migrations[i] brings it to i+1.
var etcdMigrations = []etcdstore.Migration{
	func(context.Context, *clientv3.Client, etcdstore.Space) error { return nil }, // v1: the keys above
}

// Etcd keeps the publisher's state in etcd, shared by every replica of the publisher. Every
// read starts with a linearizable read of the graph's meta, so it sees every write any replica
// acknowledged before it; the decoded drafts and versions cached in memory are used only when
// that meta says they are current (a draft's revision, a version's existence), as in Bolt.
// Writes are transactions that compare the meta's revision: two replicas publishing one graph
// at once get different numbers, and a number is never written twice, nor reused after a
// delete (the tombstone keeps the count).
type Etcd struct {
	cli   *clientv3.Client
	space etcdstore.Space
	blobs *etcdstore.Blobs
	cache *cache
	spool *audit.Spool
}

// EtcdConfig says where the publisher's state lives in etcd.
type EtcdConfig struct {
	Client *clientv3.Client
	// Root is the prefix of every Ringfence key (store.etcd_prefix); the publisher's are under
	// <Root>/publisher/.
	Root string
	// CacheBytes bounds the decoded graphs kept in memory, as for OpenBolt.
	CacheBytes int
	// InlineBytes and ChunkBytes override etcdstore's (tests make them small).
	InlineBytes, ChunkBytes int
	Logger                  *slog.Logger
}

// OpenEtcd opens the publisher's part of etcd. spool is the audit spool to open beside it: its
// outbox is in etcd too (audit_outbox/), and its QuarantinePath must be set (a file on this
// replica's disk).
func OpenEtcd(ctx context.Context, cfg EtcdConfig, spool SpoolConfig) (*Etcd, error) {
	s := &Etcd{cli: cfg.Client, space: etcdstore.NewSpace(cfg.Root, "publisher"), cache: newCacheOf(cfg.CacheBytes)}
	s.blobs = etcdstore.NewBlobs(s.cli, s.space.Prefix(etcdBlobs), cfg.InlineBytes, cfg.ChunkBytes)
	if err := etcdstore.Migrate(ctx, s.cli, s.space, etcdMigrations); err != nil {
		return nil, err
	}
	spool.Etcd = &audit.EtcdOutbox{Client: s.cli, Prefix: s.space.Prefix(etcdOutbox)}
	var err error
	if s.spool, err = audit.NewSpool(spool); err != nil {
		return nil, err
	}
	return s, nil
}

// Spool is the audit spool whose outbox is in etcd.
func (s *Etcd) Spool() *audit.Spool { return s.spool }

// Empty says whether etcd holds no graph of any tenant under this publisher's prefix (a
// deleted graph's tombstone counts as one).
func (s *Etcd) Empty(ctx context.Context) (bool, error) {
	resp, err := s.cli.Get(ctx, s.space.Prefix(etcdGraphs), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return false, etcdstore.Unavailable("count the publisher's graphs", err)
	}
	return resp.Count == 0, nil
}

// Prefix is the etcd prefix of every key of this publisher (<root>/publisher/).
func (s *Etcd) Prefix() string { return s.space.Prefix() }

// Close releases the staging lease and stops the spool; the client stays open.
func (s *Etcd) Close() error { return errors.Join(s.blobs.Close(), s.spool.Close()) }

func owner(tenant, id string) string { return tenant + "/" + id }

func (s *Etcd) graphKey(tenant, id string) string { return s.space.Key(etcdGraphs, tenant, id) }
func (s *Etcd) draftKey(tenant, id string) string { return s.space.Key(etcdDrafts, tenant, id) }

func (s *Etcd) versionKey(tenant, id string, n int64) string {
	return s.space.Key(etcdVersions, tenant, id, fmt.Sprintf("%020d", n))
}

// infoKey sorts the newest version first, so a listing is one forward range.
func (s *Etcd) infoKey(tenant, id string, n int64) string {
	return s.space.Key(etcdInfo, tenant, id, fmt.Sprintf("%020d", math.MaxInt64-n))
}

// readMeta reads a graph's meta; kv is nil when it has none.
func decodeMeta(kvs []*mvccpb.KeyValue) (*meta, *mvccpb.KeyValue, error) {
	if len(kvs) == 0 {
		return nil, nil, nil
	}
	var m meta
	if err := json.Unmarshal(kvs[0].Value, &m); err != nil {
		return nil, nil, fmt.Errorf("store: decode graph %s: %w", kvs[0].Key, err)
	}
	return &m, kvs[0], nil
}

// liveMeta reads a graph's meta, a tombstone being absent, and the revision it was read at.
func (s *Etcd) liveMeta(ctx context.Context, tenant, id string) (*meta, *mvccpb.KeyValue, int64, error) {
	resp, err := s.cli.Get(ctx, s.graphKey(tenant, id))
	if err != nil {
		return nil, nil, 0, etcdstore.Unavailable("read graph", err)
	}
	m, kv, err := decodeMeta(resp.Kvs)
	if err == nil && (m == nil || m.Deleted) {
		err = ErrNotFound
	}
	return m, kv, resp.Header.Revision, err
}

// metaAndDraft reads a live graph's meta and its stored draft in one snapshot.
func (s *Etcd) metaAndDraft(ctx context.Context, tenant, id string) (*meta, *mvccpb.KeyValue, []byte, int64, error) {
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.graphKey(tenant, id)), clientv3.OpGet(s.draftKey(tenant, id))).Commit()
	if err != nil {
		return nil, nil, nil, 0, etcdstore.Unavailable("read draft", err)
	}
	m, kv, err := decodeMeta(resp.Responses[0].GetResponseRange().GetKvs())
	if err != nil {
		return nil, nil, nil, 0, err
	}
	if m == nil || m.Deleted {
		return nil, nil, nil, 0, ErrNotFound
	}
	draft := resp.Responses[1].GetResponseRange().GetKvs()
	if len(draft) == 0 {
		return nil, nil, nil, 0, fmt.Errorf("store: graph %s/%s has no draft", tenant, id)
	}
	return m, kv, draft[0].Value, resp.Header.Revision, nil
}

// commit commits ops and the hook's records if cmps hold. Chunks staged for it that expired
// first make it run again (false), as a compare that failed does.
func (s *Etcd) commit(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op, hook Hook) (bool, error) {
	rec, err := s.spool.EtcdRecorder(ctx)
	if err != nil {
		return false, err
	}
	if err := runHook(rec, hook); err != nil {
		return false, err
	}
	resp, err := etcdstore.Commit(ctx, s.cli, cmps, ops, rec)
	if etcdstore.IsStagingExpired(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// stageErr is a failure to stage what (a draft, a version) of graph id: past what etcd keeps
// says what to shrink (RESOURCE_EXHAUSTED: trying again cannot help), and anything else is
// etcd out of reach (Blobs says so itself).
func stageErr(what, id string, err error) error {
	if errors.Is(err, etcdstore.ErrTooLarge) {
		return fmt.Errorf("publisher: the %s of graph %q cannot be stored on etcd: %w: make the draft smaller (fewer nodes, shorter notes and opaque values)", what, id, err)
	}
	return etcdstore.Unavailable("stage "+what, err)
}

// loadErr is a failure to read what (a draft, a version) of graph id, stored under key: a
// value that cannot be read back whole names the key and the fix (DATA_LOSS: trying again
// cannot help), and anything else is etcd out of reach (Blobs says so itself).
func loadErr(what, id, key string, err error) error {
	if errors.Is(err, etcdstore.ErrDamaged) {
		return fmt.Errorf("publisher: the %s under %s cannot be read: %w: restore the publisher's keys from an etcd snapshot (docs/operations.md, \"Scaling out\", Backup); without one, delete the graph (ringfence graphs delete --graph %s) and create it again", what, key, err, id)
	}
	return etcdstore.Unavailable("read "+what, err)
}

func absent(key string) clientv3.Cmp { return clientv3.Compare(clientv3.CreateRevision(key), "=", 0) }

func unchanged(kv *mvccpb.KeyValue) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)
}

func putJSONOp(key string, v any) (clientv3.Op, error) {
	val, err := json.Marshal(v)
	if err != nil {
		return clientv3.Op{}, err
	}
	return clientv3.OpPut(key, string(val)), nil
}

// CreateGraph stores a new graph's draft. Its revision continues after a deleted graph of the
// same id, so a client holding a revision of the old draft cannot overwrite the new one.
func (s *Etcd) CreateGraph(ctx context.Context, g *graph.Graph, hook Hook) error {
	key := s.graphKey(g.Tenant, g.ID)
	var size int
	err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return false, etcdstore.Unavailable("read graph", err)
		}
		m, kv, err := decodeMeta(resp.Kvs)
		cmp := absent(key)
		switch {
		case err != nil:
			return false, err
		case m == nil:
			m = &meta{Tenant: g.Tenant, ID: g.ID}
		case !m.Deleted:
			return false, ErrExists
		default:
			cmp = unchanged(kv)
		}
		m.create(g, time.Now().UTC())
		val, err := encodeDraft(g)
		if err != nil {
			return false, err
		}
		size = len(val)
		staged, err := s.blobs.Stage(ctx, owner(g.Tenant, g.ID), val)
		if err != nil {
			return false, stageErr("draft", g.ID, err)
		}
		metaOp, err := putJSONOp(key, m)
		if err != nil {
			return false, err
		}
		ops := append([]clientv3.Op{clientv3.OpPut(s.draftKey(g.Tenant, g.ID), string(staged.Value)), metaOp}, staged.Ops...)
		return s.commit(ctx, []clientv3.Cmp{cmp}, ops, hook)
	})
	if err == nil {
		s.cache.put(draftCacheKey(g.Tenant, g.ID), g.Revision, g, size)
	}
	return err
}

// Draft returns a graph's draft (shared: do not modify it).
func (s *Etcd) Draft(ctx context.Context, tenant, id string) (*graph.Graph, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdstore.RequestTimeout)
	defer cancel()
	ck := draftCacheKey(tenant, id)
	m, _, _, err := s.liveMeta(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if v, ok := s.cache.get(ck, m.DraftRevision); ok {
		return v.(*graph.Graph), nil
	}
	_, _, stored, rev, err := s.metaAndDraft(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	g, size, err := s.loadDraft(ctx, tenant, id, stored, rev)
	if err != nil {
		return nil, err
	}
	s.cache.put(ck, g.Revision, g, size)
	return g, nil
}

// loadDraft reads and decodes the draft stored as stored (read at rev), and returns its
// encoded size. A draft that does not decode is damaged, as one whose chunks do not add up.
func (s *Etcd) loadDraft(ctx context.Context, tenant, id string, stored []byte, rev int64) (*graph.Graph, int, error) {
	raw, err := s.blobs.Load(ctx, owner(tenant, id), stored, rev)
	if err != nil {
		return nil, 0, loadErr("draft", id, s.draftKey(tenant, id), err)
	}
	g, err := decodeDraft(raw, owner(tenant, id))
	if err != nil {
		return nil, 0, loadErr("draft", id, s.draftKey(tenant, id), fmt.Errorf("%w: %w", etcdstore.ErrDamaged, err))
	}
	return g, len(raw), nil
}

// UpdateDraft changes a draft in one transaction: mutate receives the stored draft and edits it
// in place (or refuses with an error, which writes nothing). The revision advances by one.
// When another replica changed the draft first, mutate runs again on what it wrote.
func (s *Etcd) UpdateDraft(ctx context.Context, tenant, id string, mutate func(cur *graph.Graph) error, hook Hook) (*graph.Graph, error) {
	var out *graph.Graph
	var size int
	err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		m, kv, stored, rev, err := s.metaAndDraft(ctx, tenant, id)
		if err != nil {
			return false, err
		}
		g, _, err := s.loadDraft(ctx, tenant, id, stored, rev)
		if err != nil {
			return false, err
		}
		if err := mutate(g); err != nil {
			return false, err
		}
		m.update(g, time.Now().UTC())
		val, err := encodeDraft(g)
		if err != nil {
			return false, err
		}
		staged, err := s.blobs.Stage(ctx, owner(tenant, id), val)
		if err != nil {
			return false, stageErr("draft", id, err)
		}
		metaOp, err := putJSONOp(string(kv.Key), m)
		if err != nil {
			return false, err
		}
		ops := append([]clientv3.Op{clientv3.OpPut(s.draftKey(tenant, id), string(staged.Value)), metaOp}, staged.Ops...)
		ops = append(ops, s.blobs.DeleteOps(owner(tenant, id), stored)...)
		ok, err := s.commit(ctx, []clientv3.Cmp{unchanged(kv)}, ops, hook)
		if ok {
			out, size = g, len(val)
		}
		return ok, err
	})
	if err != nil {
		return nil, err
	}
	s.cache.put(draftCacheKey(tenant, id), out.Revision, out, size)
	return out, nil
}

// Publish stores v as the graph's next version, provided the draft is still at draftRevision
// (what was validated is what gets published). It returns the new version number. The
// transaction compares the meta's revision and requires the version's key to be absent: a
// replica that published at the same moment makes this one run again on the next number, and
// an existing version is refused, never overwritten.
func (s *Etcd) Publish(ctx context.Context, tenant, id string, draftRevision int64, v *graph.Version, hook Hook) (int64, error) {
	var n int64
	var size int
	err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		m, kv, _, err := s.liveMeta(ctx, tenant, id)
		if err != nil {
			return false, err
		}
		if m.DraftRevision != draftRevision {
			return false, ErrStaleRevision
		}
		n = m.publish(v)
		val, err := encodeGob(v)
		if err != nil {
			return false, err
		}
		size = len(val)
		staged, err := s.blobs.Stage(ctx, owner(tenant, id), val)
		if err != nil {
			return false, stageErr("version", id, err)
		}
		vk := s.versionKey(tenant, id, n)
		infoOp, err := putJSONOp(s.infoKey(tenant, id, n), info(v))
		if err != nil {
			return false, err
		}
		metaOp, err := putJSONOp(string(kv.Key), m)
		if err != nil {
			return false, err
		}
		ops := append([]clientv3.Op{clientv3.OpPut(vk, string(staged.Value)), infoOp, metaOp}, staged.Ops...)
		ok, err := s.commit(ctx, []clientv3.Cmp{unchanged(kv), absent(vk)}, ops, hook)
		if ok || err != nil {
			return ok, err
		}
		// Which compare failed: a meta that moved means another writer, to run again after;
		// a version that exists under an unchanged meta is bookkeeping gone wrong.
		check, err := s.cli.Txn(ctx).If(unchanged(kv), clientv3.Compare(clientv3.CreateRevision(vk), ">", 0)).Commit()
		if err != nil {
			return false, etcdstore.Unavailable("read graph", err)
		}
		if check.Succeeded {
			return false, ErrVersionExists
		}
		return false, nil
	})
	if err != nil {
		return 0, err
	}
	s.cache.put(versionCacheKey(tenant, id, n), 0, v, size)
	return n, nil
}

// Version returns a published version (shared: do not modify it); n == 0 means the latest.
func (s *Etcd) Version(ctx context.Context, tenant, id string, n int64) (*graph.Version, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdstore.RequestTimeout)
	defer cancel()
	m, _, rev, err := s.liveMeta(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		n = m.LatestVersion
	}
	if n < max(m.FirstVersion, 1) || n > m.LatestVersion {
		return nil, ErrNotFound
	}
	vk := s.versionKey(tenant, id, n)
	ck := versionCacheKey(tenant, id, n)
	// Version n of this graph exists (the meta says so) and is the only one there ever was
	// under that number: a cached one is it.
	if v, ok := s.cache.get(ck, 0); ok {
		return v.(*graph.Version), nil
	}
	resp, err := s.cli.Get(ctx, vk, clientv3.WithRev(rev))
	if err != nil {
		return nil, etcdstore.Unavailable("read version", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, ErrNotFound
	}
	raw, err := s.blobs.Load(ctx, owner(tenant, id), resp.Kvs[0].Value, rev)
	if err != nil {
		return nil, loadErr("version", id, vk, err)
	}
	var v graph.Version
	if err := decodeGob(raw, &v); err != nil {
		return nil, loadErr("version", id, vk, fmt.Errorf("%w: decode version %d of %s/%s: %w", etcdstore.ErrDamaged, n, tenant, id, err))
	}
	s.cache.put(ck, 0, &v, len(raw))
	return &v, nil
}

// ListVersions returns up to limit versions without their graphs, newest first, after the
// page token, and the next token.
func (s *Etcd) ListVersions(ctx context.Context, tenant, id, pageToken string, limit int) ([]graph.Version, string, error) {
	before, err := versionsAfter(tenant, id, pageToken)
	if err != nil {
		return nil, "", err
	}
	m, _, rev, err := s.liveMeta(ctx, tenant, id)
	if err != nil {
		return nil, "", err
	}
	start := m.LatestVersion
	if before > 0 && before-1 < start {
		start = before - 1
	}
	resp, err := s.cli.Get(ctx, s.infoKey(tenant, id, start), clientv3.WithRange(etcdstore.RangeEnd(s.space.Prefix(etcdInfo, tenant, id))),
		clientv3.WithLimit(int64(limit)+1), clientv3.WithRev(rev))
	if err != nil {
		return nil, "", etcdstore.Unavailable("list versions", err)
	}
	var out []graph.Version
	for _, kv := range resp.Kvs {
		if len(out) == limit {
			return out, versionsToken(tenant, id, out[len(out)-1].Version), nil
		}
		var v graph.Version
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return nil, "", fmt.Errorf("store: decode %s: %w", kv.Key, err)
		}
		out = append(out, v)
	}
	return out, "", nil
}

// ListGraphs returns up to limit of a tenant's graphs after the page token, and the next token.
func (s *Etcd) ListGraphs(ctx context.Context, tenant, pageToken string, limit int) ([]Summary, string, error) {
	after, err := paging.DecodeToken(pageToken, "publisher.graphs", tenant)
	if err != nil {
		return nil, "", err
	}
	prefix := s.space.Prefix(etcdGraphs, tenant)
	key, end := prefix, etcdstore.RangeEnd(prefix)
	if after != "" {
		key = s.graphKey(tenant, after) + "\x00"
	}
	var out []Summary
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(limit) + 1)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, key, opts...)
		if err != nil {
			return nil, "", etcdstore.Unavailable("list graphs", err)
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			m, _, err := decodeMeta([]*mvccpb.KeyValue{kv})
			if err != nil {
				return nil, "", err
			}
			if m.Deleted {
				continue
			}
			if len(out) == limit {
				return out, graphsToken(tenant, out[len(out)-1].ID), nil
			}
			out = append(out, m.summary())
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, "", nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Published lists every graph of every tenant that has a published version, with its latest
// version number.
func (s *Etcd) Published(ctx context.Context) ([]Summary, error) {
	kvs, _, err := etcdstore.List(ctx, s.cli, s.space.Prefix(etcdGraphs))
	if err != nil {
		return nil, etcdstore.Unavailable("list graphs", err)
	}
	var out []Summary
	for _, kv := range kvs {
		m, _, err := decodeMeta([]*mvccpb.KeyValue{kv})
		if err != nil {
			return nil, err
		}
		if !m.Deleted && m.LatestVersion > 0 {
			out = append(out, m.summary())
		}
	}
	return out, nil
}

// DeleteGraph removes a graph's draft, versions and their chunks, and leaves a tombstone that
// keeps its numbering, in one transaction.
func (s *Etcd) DeleteGraph(ctx context.Context, tenant, id string, hook Hook) error {
	err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		m, kv, _, err := s.liveMeta(ctx, tenant, id)
		if err != nil {
			return false, err
		}
		m.remove(time.Now().UTC())
		metaOp, err := putJSONOp(string(kv.Key), m)
		if err != nil {
			return false, err
		}
		ops := []clientv3.Op{
			clientv3.OpDelete(s.draftKey(tenant, id)),
			clientv3.OpDelete(s.space.Prefix(etcdVersions, tenant, id), clientv3.WithPrefix()),
			clientv3.OpDelete(s.space.Prefix(etcdInfo, tenant, id), clientv3.WithPrefix()),
			s.blobs.DeleteOwnerOp(owner(tenant, id)),
			metaOp,
		}
		return s.commit(ctx, []clientv3.Cmp{unchanged(kv)}, ops, hook)
	})
	// Lookups confirm against etcd first, so this only frees memory.
	s.cache.drop(draftCacheKey(tenant, id))
	s.cache.dropPrefix(versionCachePrefix(tenant, id))
	return err
}
