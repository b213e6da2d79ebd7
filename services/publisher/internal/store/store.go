// Package store keeps the publisher's state: each tenant's graphs, their drafts (with a
// revision for optimistic concurrency) and their published versions, which are written once
// with a put-if-absent check and never changed; a deleted graph leaves a tombstone, so its
// version numbers are never reused. Two back ends hold it: Bolt, one bbolt file (the embedded
// default), and Etcd, an etcd cluster shared by every replica. In both, every write is durable
// before it is acknowledged and takes a hook that runs inside the same transaction (the audit
// outbox), and decoded drafts and versions are cached in memory, each use confirmed against
// the store first.
package store

import (
	"bytes"
	"encoding/gob"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/paging"
)

// Errors the service maps to codes.
var (
	ErrNotFound      = errors.New("not found")
	ErrExists        = errors.New("already exists")
	ErrStaleRevision = errors.New("stale revision")
	ErrBadPageToken  = paging.ErrBadToken // a page token this store did not issue for the list
	// ErrVersionExists means a version number was about to be written twice: published
	// versions are immutable, so the write is refused rather than overwriting one.
	ErrVersionExists = errors.New("store: a published version with this number already exists; versions are never overwritten")
	// ErrDamaged means a draft or version in the bbolt file does not decode: its bytes were
	// changed by something other than the publisher, or lost. Trying again cannot help, so it
	// is DATA_LOSS, as etcdstore.ErrDamaged is on etcd; the message names the graph and the fix.
	ErrDamaged = errors.New("store: a stored value is damaged")
)

// Hook runs inside a write's transaction with the recorder of that transaction: the audit
// records it takes commit with the change or not at all. An error rolls the write back. A back
// end that retries a transaction (etcd, when another replica wrote first) runs it again.
type Hook func(rec audit.Recorder) error

// SpoolConfig is the audit spool a store opens beside its data, for the outbox its hooks write
// into; the store fills in where the outbox lives.
type SpoolConfig = audit.SpoolConfig

func runHook(rec audit.Recorder, hook Hook) error {
	if hook == nil {
		return nil
	}
	return hook(rec)
}

// meta is a graph's bookkeeping, small enough to read for listings.
type meta struct {
	Tenant        string `json:"tenant"`
	ID            string `json:"id"`
	DraftRevision int64  `json:"draft_revision"`
	LatestVersion int64  `json:"latest_version"`
	// FirstVersion is the first number this graph's current life may publish: versions
	// FirstVersion..LatestVersion exist (a delete removes every one, and numbers are never
	// reused), so a read can tell without looking. Files written before it have 0.
	FirstVersion int64     `json:"first_version,omitempty"`
	NodeCount    int       `json:"node_count"`
	CreateTime   time.Time `json:"create_time"`
	UpdateTime   time.Time `json:"update_time"`
	// Deleted marks a tombstone: the graph is gone, its numbering is kept.
	Deleted bool `json:"deleted,omitempty"`
}

// create makes m the meta of g, a new graph: a tombstone's revision and numbering continue,
// so a client holding a revision of the old draft cannot overwrite the new one.
func (m *meta) create(g *graph.Graph, now time.Time) {
	m.Deleted, m.FirstVersion = false, m.LatestVersion+1
	m.DraftRevision++
	m.NodeCount, m.CreateTime, m.UpdateTime = len(g.Nodes), now, now
	g.Revision, g.UpdateTime = m.DraftRevision, now
}

// update advances m and g, g's edited draft, to the next revision.
func (m *meta) update(g *graph.Graph, now time.Time) {
	m.DraftRevision++
	m.NodeCount, m.UpdateTime = len(g.Nodes), now
	g.ID, g.Tenant, g.Revision, g.UpdateTime = m.ID, m.Tenant, m.DraftRevision, now
}

// publish numbers v as the graph's next version and returns the number.
func (m *meta) publish(v *graph.Version) int64 {
	n := m.LatestVersion + 1
	v.Tenant, v.GraphID, v.Version = m.Tenant, m.ID, n
	m.LatestVersion = n
	return n
}

// remove makes m a tombstone.
func (m *meta) remove(now time.Time) {
	m.Deleted, m.NodeCount, m.UpdateTime = true, 0, now
}

func (m *meta) summary() Summary {
	return Summary{Tenant: m.Tenant, ID: m.ID, DraftRevision: m.DraftRevision, LatestVersion: m.LatestVersion, NodeCount: m.NodeCount, UpdateTime: m.UpdateTime}
}

// Summary describes a graph without its nodes.
type Summary struct {
	Tenant        string
	ID            string
	DraftRevision int64
	LatestVersion int64
	NodeCount     int
	UpdateTime    time.Time
}

// info is v without its graph, as listings show it.
func info(v *graph.Version) *graph.Version {
	i := *v
	i.Graph = nil
	return &i
}

func newCacheOf(cacheBytes int) *cache {
	switch {
	case cacheBytes == 0:
		return newCache(DefaultCacheBytes)
	case cacheBytes > 0:
		return newCache(cacheBytes)
	}
	return nil
}

func draftCacheKey(tenant, id string) string { return "d:" + tenant + "/" + id }

func versionCachePrefix(tenant, id string) string { return "v:" + tenant + "/" + id + "/" }

func versionCacheKey(tenant, id string, n int64) string {
	return versionCachePrefix(tenant, id) + strconv.FormatInt(n, 10)
}

// versionsAfter decodes ListVersions' page token: the versions listed are those below it
// (-1 for the first page).
func versionsAfter(tenant, id, pageToken string) (int64, error) {
	if pageToken == "" {
		return -1, nil
	}
	tok, err := paging.DecodeToken(pageToken, "publisher.versions", tenant, id)
	if err != nil {
		return 0, err
	}
	before, err := strconv.ParseInt(tok, 10, 64)
	if err != nil || before < 1 {
		return 0, ErrBadPageToken
	}
	return before, nil
}

func versionsToken(tenant, id string, last int64) string {
	return paging.EncodeToken(strconv.FormatInt(last, 10), "publisher.versions", tenant, id)
}

func graphsToken(tenant, last string) string {
	return paging.EncodeToken(last, "publisher.graphs", tenant)
}

// Drafts and versions are stored with encoding/gob rather than JSON: decoding a 10,000-node
// graph from gob takes about a seventh of the time JSON does, and that decode, not the
// validation, dominated a cold ValidateDraft. Small records (meta, version info) stay JSON.
func encodeGob(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func decodeGob(raw []byte, v any) error {
	return gob.NewDecoder(bytes.NewReader(raw)).Decode(v)
}

func encodeDraft(g *graph.Graph) ([]byte, error) {
	val, err := encodeGob(g)
	if err != nil {
		return nil, err
	}
	if len(val) > graph.MaxEncodedBytes {
		return nil, fielderr.New("graph", "is %d bytes stored; at most %d: split it into smaller graphs", len(val), graph.MaxEncodedBytes)
	}
	return val, nil
}

func decodeDraft(raw []byte, what string) (*graph.Graph, error) {
	var g graph.Graph
	if err := decodeGob(raw, &g); err != nil {
		return nil, fmt.Errorf("store: decode draft %s: %w", what, err)
	}
	return &g, nil
}
