package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/testutil"
)

// api is what the publisher asks of a store (publisher.Store), for the behaviours below.
type api interface {
	CreateGraph(ctx context.Context, g *graph.Graph, hook Hook) error
	Draft(ctx context.Context, tenant, id string) (*graph.Graph, error)
	UpdateDraft(ctx context.Context, tenant, id string, mutate func(cur *graph.Graph) error, hook Hook) (*graph.Graph, error)
	Publish(ctx context.Context, tenant, id string, draftRevision int64, v *graph.Version, hook Hook) (int64, error)
	Version(ctx context.Context, tenant, id string, n int64) (*graph.Version, error)
	ListVersions(ctx context.Context, tenant, id, pageToken string, limit int) ([]graph.Version, string, error)
	ListGraphs(ctx context.Context, tenant, pageToken string, limit int) ([]Summary, string, error)
	Published(ctx context.Context) ([]Summary, error)
	DeleteGraph(ctx context.Context, tenant, id string, hook Hook) error
	Spool() *audit.Spool
	Close() error
}

var (
	_ api = (*Bolt)(nil)
	_ api = (*Etcd)(nil)
)

func spoolConfig(t *testing.T, sink audit.Sink) SpoolConfig {
	return SpoolConfig{Sink: sink, Producer: "publisher", Logger: slog.New(slog.DiscardHandler),
		QuarantinePath: filepath.Join(t.TempDir(), "quarantine.jsonl")}
}

// backend is one implementation under test: open returns a store over that backend's storage
// (for etcd, each call is another replica of the same data; bbolt has one opener at a time)
// and its audit sink.
type backend struct {
	name string
	open func(t *testing.T) (api, *testutil.AuditRecorder)
	// setLatest rewrites a graph's latest version number below the store, as a bug or a bad
	// restore might.
	setLatest func(t *testing.T, s api, tenant, id string, n int64)
}

func backends(t *testing.T, cluster *etcdtest.Cluster) []backend {
	path := filepath.Join(t.TempDir(), "publisher.db")
	root := cluster.Root()
	return []backend{
		{
			name: "bbolt",
			open: func(t *testing.T) (api, *testutil.AuditRecorder) {
				sink := testutil.NewAuditRecorder()
				s, err := OpenBolt(path, 0, spoolConfig(t, sink))
				require.NoError(t, err)
				t.Cleanup(func() { _ = s.Close() })
				return s, sink
			},
			setLatest: func(t *testing.T, s api, tenant, id string, n int64) {
				require.NoError(t, s.(*Bolt).db.Update(func(tx *bolt.Tx) error {
					m, err := getMeta(tx, graphKey(tenant, id))
					require.NoError(t, err)
					m.LatestVersion = n
					return putJSON(tx.Bucket(graphsBucket), graphKey(tenant, id), m)
				}))
			},
		},
		{
			name: "etcd",
			open: func(t *testing.T) (api, *testutil.AuditRecorder) {
				sink := testutil.NewAuditRecorder()
				s, err := OpenEtcd(t.Context(), EtcdConfig{Client: cluster.Client(t, "publisher"), Root: root}, spoolConfig(t, sink))
				require.NoError(t, err)
				t.Cleanup(func() { _ = s.Close() })
				return s, sink
			},
			setLatest: func(t *testing.T, s api, tenant, id string, n int64) {
				e := s.(*Etcd)
				resp, err := e.cli.Get(t.Context(), e.graphKey(tenant, id))
				require.NoError(t, err)
				m, _, err := decodeMeta(resp.Kvs)
				require.NoError(t, err)
				m.LatestVersion = n
				op, err := putJSONOp(e.graphKey(tenant, id), m)
				require.NoError(t, err)
				_, err = e.cli.Do(t.Context(), op)
				require.NoError(t, err)
			},
		},
	}
}

// behaviours is the one table every back end passes.
var behaviours = map[string]func(t *testing.T, b backend){
	"CreateGraphAndDraft":                    testCreateGraphAndDraft,
	"UpdateDraftWritesNothingOnRefusal":      testUpdateDraftAdvancesTheRevisionAndWritesNothingOnRefusal,
	"HookRunsInTheWriteTransaction":          testHookRunsInTheWriteTransaction,
	"PublishNumbersVersions":                 testPublishNumbersVersionsAndChecksTheDraftRevision,
	"PublishedVersionsAreNeverOverwritten":   testPublishedVersionsAreNeverOverwritten,
	"DeleteKeepsNumbering":                   testDeleteKeepsNumberingForARecreatedGraph,
	"ListGraphsPagesWithinOneTenant":         testListGraphsPagesWithinOneTenant,
	"APageTokenNotIssuedForTheListIsRefused": testAPageTokenNotIssuedForTheListIsRefused,
	"ListVersionsOfTheLastGraph":             testListVersionsOfTheLastGraphInTheFile,
	"ReopenKeepsEverything":                  testReopenKeepsEverything,
	"OversizedDraftIsRefused":                testOversizedDraftIsRefused,
	"CacheFollowsTheStore":                   testCacheFollowsTheStore,
	"PublishedListsGraphsWithVersions":       testPublishedListsGraphsWithVersions,
}

// TestBehaviours runs the table against bbolt and against a three-member etcd cluster.
func TestBehaviours(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	for name, f := range behaviours {
		t.Run(name, func(t *testing.T) {
			for _, b := range backends(t, cluster) {
				t.Run(b.name, func(t *testing.T) { f(t, b) })
			}
		})
	}
}

func newGraph(tenant, id string) *graph.Graph {
	return &graph.Graph{ID: id, Tenant: tenant, Nodes: []graph.Node{{ID: "a", Kind: graph.KindAgent, Agent: &graph.AgentNode{}}}}
}

func testCreateGraphAndDraft(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	require.ErrorIs(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil), ErrExists)
	require.NoError(t, s.CreateGraph(ctx, newGraph("other", "g"), nil), "graph ids are per tenant")

	d, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	require.Equal(t, int64(1), d.Revision)
	require.Len(t, d.Nodes, 1)
	_, err = s.Draft(ctx, "acme", "missing")
	require.ErrorIs(t, err, ErrNotFound)
}

func testUpdateDraftAdvancesTheRevisionAndWritesNothingOnRefusal(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	g, err := s.UpdateDraft(ctx, "acme", "g", func(cur *graph.Graph) error {
		cur.Nodes = append(cur.Nodes, graph.Node{ID: "b", Kind: "note"})
		return nil
	}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), g.Revision)

	refuse := errors.New("refused")
	_, err = s.UpdateDraft(ctx, "acme", "g", func(cur *graph.Graph) error {
		cur.Nodes = nil
		return refuse
	}, nil)
	require.ErrorIs(t, err, refuse)
	d, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Revision)
	require.Len(t, d.Nodes, 2)

	_, err = s.UpdateDraft(ctx, "acme", "missing", func(*graph.Graph) error { return nil }, nil)
	require.ErrorIs(t, err, ErrNotFound)
}

// testHookRunsInTheWriteTransaction: every write's records reach the audit log, and a hook's
// error leaves neither the change nor a record.
func testHookRunsInTheWriteTransaction(t *testing.T, b backend) {
	s, sink := b.open(t)
	ctx := t.Context()
	record := func(tag string) Hook {
		return func(rec audit.Recorder) error {
			return rec.Record(audit.NewAdminRecord("publisher", "acme", audit.AdminEvent{Action: tag, ResourceType: "graph", ResourceID: "g", ActorRole: audit.ActorRoleSystem}))
		}
	}
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), record("create")))
	_, err := s.UpdateDraft(ctx, "acme", "g", func(*graph.Graph) error { return nil }, record("update"))
	require.NoError(t, err)
	d, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	_, err = s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d}, record("publish"))
	require.NoError(t, err)

	// A failing hook rolls the change back.
	_, err = s.UpdateDraft(ctx, "acme", "g", func(cur *graph.Graph) error { cur.Nodes = nil; return nil },
		func(audit.Recorder) error { return errors.New("outbox full") })
	require.ErrorContains(t, err, "outbox full")
	d, err = s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	require.Len(t, d.Nodes, 1)
	require.NoError(t, s.DeleteGraph(ctx, "acme", "g", record("delete")))

	fwd := s.Spool().StartForwarding()
	t.Cleanup(func() { fwd.Stop(time.Second) })
	require.NoError(t, s.Spool().Flush(ctx))
	var tags []string
	for _, r := range sink.Records() {
		tags = append(tags, r.Admin.Action)
	}
	require.Equal(t, []string{"create", "update", "publish", "delete"}, tags)
}

func testPublishNumbersVersionsAndChecksTheDraftRevision(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	for want := int64(1); want <= 3; want++ {
		d, err := s.Draft(ctx, "acme", "g")
		require.NoError(t, err)
		n, err := s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d, PublishedBy: "key:k"}, nil)
		require.NoError(t, err)
		require.Equal(t, want, n)
		_, err = s.UpdateDraft(ctx, "acme", "g", func(cur *graph.Graph) error {
			cur.Nodes = append(cur.Nodes, graph.Node{ID: fmt.Sprintf("n%d", want), Kind: "note"})
			return nil
		}, nil)
		require.NoError(t, err)
	}
	_, err := s.Publish(ctx, "acme", "g", 1, &graph.Version{}, nil)
	require.ErrorIs(t, err, ErrStaleRevision, "a draft that changed since it was validated is not published")

	v, err := s.Version(ctx, "acme", "g", 2)
	require.NoError(t, err)
	require.Equal(t, int64(2), v.Version)
	require.Len(t, v.Graph.Nodes, 2)
	latest, err := s.Version(ctx, "acme", "g", 0)
	require.NoError(t, err)
	require.Equal(t, int64(3), latest.Version)
	_, err = s.Version(ctx, "acme", "g", 4)
	require.ErrorIs(t, err, ErrNotFound)

	infos, next, err := s.ListVersions(ctx, "acme", "g", "", 2)
	require.NoError(t, err)
	require.Equal(t, []int64{3, 2}, versionNumbers(infos))
	require.Nil(t, infos[0].Graph, "listings carry no snapshots")
	infos, next, err = s.ListVersions(ctx, "acme", "g", next, 2)
	require.NoError(t, err)
	require.Equal(t, []int64{1}, versionNumbers(infos))
	require.Empty(t, next)
}

// Versions are written with a put-if-absent check: even bookkeeping that points back at an
// existing number cannot overwrite a published version.
func testPublishedVersionsAreNeverOverwritten(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	d, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	_, err = s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d, PublishedBy: "first"}, nil)
	require.NoError(t, err)

	b.setLatest(t, s, "acme", "g", 0)
	_, err = s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d, PublishedBy: "second"}, nil)
	require.ErrorIs(t, err, ErrVersionExists)
	b.setLatest(t, s, "acme", "g", 1)
	readers := []api{s}
	if b.name == "etcd" {
		other, _ := b.open(t) // another replica, no cache of version 1
		readers = append(readers, other)
	}
	for _, s := range readers {
		v, err := s.Version(ctx, "acme", "g", 1)
		require.NoError(t, err)
		require.Equal(t, "first", v.PublishedBy)
	}
}

func testDeleteKeepsNumberingForARecreatedGraph(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "h"), nil))
	d, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	_, err = s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)

	require.NoError(t, s.DeleteGraph(ctx, "acme", "g", nil))
	require.ErrorIs(t, s.DeleteGraph(ctx, "acme", "g", nil), ErrNotFound)
	_, err = s.Draft(ctx, "acme", "g")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.Version(ctx, "acme", "g", 1)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.UpdateDraft(ctx, "acme", "g", func(*graph.Graph) error { return nil }, nil)
	require.ErrorIs(t, err, ErrNotFound)
	list, _, err := s.ListGraphs(ctx, "acme", "", 10)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "h", list[0].ID)

	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	d, err = s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Revision, "the revision continues after the deleted draft's")
	_, err = s.Version(ctx, "acme", "g", 1)
	require.ErrorIs(t, err, ErrNotFound, "the deleted graph's version stays gone")
	n, err := s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "version 1 of the deleted graph is never reused")
	infos, _, err := s.ListVersions(ctx, "acme", "g", "", 10)
	require.NoError(t, err)
	require.Equal(t, []int64{2}, versionNumbers(infos))
}

func testPublishedListsGraphsWithVersions(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	for _, g := range []*graph.Graph{newGraph("acme", "a"), newGraph("acme", "b"), newGraph("globex", "c")} {
		require.NoError(t, s.CreateGraph(ctx, g, nil))
	}
	for _, g := range []*graph.Graph{newGraph("acme", "a"), newGraph("globex", "c")} {
		d, err := s.Draft(ctx, g.Tenant, g.ID)
		require.NoError(t, err)
		_, err = s.Publish(ctx, g.Tenant, g.ID, d.Revision, &graph.Version{Graph: d}, nil)
		require.NoError(t, err)
	}
	require.NoError(t, s.DeleteGraph(ctx, "globex", "c", nil))
	got, err := s.Published(ctx)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "a", got[0].ID)
	require.Equal(t, int64(1), got[0].LatestVersion)
}

func testListGraphsPagesWithinOneTenant(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	for i := range 5 {
		require.NoError(t, s.CreateGraph(ctx, newGraph("acme", fmt.Sprintf("g%d", i)), nil))
	}
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme-2", "x"), nil))
	require.NoError(t, s.CreateGraph(ctx, newGraph("acm", "y"), nil))
	var ids []string
	tok := ""
	for {
		page, next, err := s.ListGraphs(ctx, "acme", tok, 2)
		require.NoError(t, err)
		for _, g := range page {
			ids = append(ids, g.ID)
			require.Equal(t, "acme", g.Tenant)
			require.Equal(t, 1, g.NodeCount)
		}
		if tok = next; tok == "" {
			break
		}
	}
	require.Equal(t, []string{"g0", "g1", "g2", "g3", "g4"}, ids)
	_, _, err := s.ListGraphs(ctx, "acme", "!!", 2)
	require.ErrorIs(t, err, ErrBadPageToken)
}

// TestAPageTokenNotIssuedForTheListIsRefused: a token the store never issued (any valid
// base64url), one issued before tokens were versioned, or one issued for another tenant's or
// another graph's list is ErrBadPageToken, never an empty, final page.
func testAPageTokenNotIssuedForTheListIsRefused(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	for _, g := range []*graph.Graph{newGraph("acme", "g1"), newGraph("acme", "g2"), newGraph("acme", "g3"), newGraph("globex", "g1")} {
		require.NoError(t, s.CreateGraph(ctx, g, nil))
	}
	for _, id := range []string{"g1", "g2"} {
		for range 3 {
			d, err := s.Draft(ctx, "acme", id)
			require.NoError(t, err)
			_, err = s.Publish(ctx, "acme", id, d.Revision, &graph.Version{Graph: d}, nil)
			require.NoError(t, err)
		}
	}
	_, graphsTok, err := s.ListGraphs(ctx, "acme", "", 1)
	require.NoError(t, err)
	require.NotEmpty(t, graphsTok)
	page, _, err := s.ListGraphs(ctx, "acme", graphsTok, 10)
	require.NoError(t, err)
	require.Len(t, page, 2)
	_, versionsTok, err := s.ListVersions(ctx, "acme", "g1", "", 1)
	require.NoError(t, err)
	infos, _, err := s.ListVersions(ctx, "acme", "g1", versionsTok, 10)
	require.NoError(t, err)
	require.Equal(t, []int64{2, 1}, versionNumbers(infos))

	legacyGraphs := base64.RawURLEncoding.EncodeToString([]byte("g1"))
	legacyVersions := base64.RawURLEncoding.EncodeToString([]byte("2"))
	for _, tok := range []string{"zzz", legacyGraphs, versionsTok} {
		_, _, err := s.ListGraphs(ctx, "acme", tok, 10)
		require.ErrorIs(t, err, ErrBadPageToken, tok)
	}
	_, _, err = s.ListGraphs(ctx, "globex", graphsTok, 10)
	require.ErrorIs(t, err, ErrBadPageToken, "another tenant's token")
	for _, tok := range []string{"zzz", legacyVersions, graphsTok} {
		_, _, err := s.ListVersions(ctx, "acme", "g1", tok, 10)
		require.ErrorIs(t, err, ErrBadPageToken, tok)
	}
	_, _, err = s.ListVersions(ctx, "acme", "g2", versionsTok, 10)
	require.ErrorIs(t, err, ErrBadPageToken, "another graph's token")
}

func testListVersionsOfTheLastGraphInTheFile(t *testing.T, b backend) {
	// The cursor walks backwards from past the end of the bucket.
	s, _ := b.open(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("zz", "zz"), nil))
	d, err := s.Draft(ctx, "zz", "zz")
	require.NoError(t, err)
	_, err = s.Publish(ctx, "zz", "zz", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)
	infos, _, err := s.ListVersions(ctx, "zz", "zz", "", 10)
	require.NoError(t, err)
	require.Equal(t, []int64{1}, versionNumbers(infos))
}

func testReopenKeepsEverything(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	d, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	_, err = s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s2, _ := b.open(t)
	v, err := s2.Version(ctx, "acme", "g", 1)
	require.NoError(t, err)
	nodes, _ := json.Marshal(v.Graph.Nodes)
	require.JSONEq(t, `[{"id":"a","kind":"agent","agent":{}}]`, string(nodes))
}

func testOversizedDraftIsRefused(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	big := make([]byte, graph.MaxEncodedBytes)
	for i := range big {
		big[i] = 'a'
	}
	_, err := s.UpdateDraft(ctx, "acme", "g", func(cur *graph.Graph) error {
		cur.Nodes = append(cur.Nodes, graph.Node{ID: "big", Kind: "note", Opaque: json.RawMessage(`{"x":"` + string(big) + `"}`)})
		return nil
	}, nil)
	require.ErrorContains(t, err, "smaller graphs")
}

func versionNumbers(vs []graph.Version) []int64 {
	out := make([]int64, len(vs))
	for i, v := range vs {
		out[i] = v.Version
	}
	return out
}

// The in-memory cache never answers for what the store no longer holds: every lookup is
// confirmed by a read of the store (a draft's revision, a version's existence).
func testCacheFollowsTheStore(t *testing.T, be backend) {
	s, _ := be.open(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g-2"), nil))
	a, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	b, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	require.Same(t, a, b, "a second read of an unchanged draft is not decoded again")

	_, err = s.UpdateDraft(ctx, "acme", "g", func(cur *graph.Graph) error {
		cur.Nodes = append(cur.Nodes, graph.Node{ID: "n", Kind: "note"})
		return nil
	}, nil)
	require.NoError(t, err)
	c, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	require.Equal(t, int64(2), c.Revision)
	require.Len(t, c.Nodes, 2)
	require.Len(t, a.Nodes, 1, "what an earlier reader holds is never modified")

	n, err := s.Publish(ctx, "acme", "g", c.Revision, &graph.Version{Graph: c}, nil)
	require.NoError(t, err)
	v, err := s.Version(ctx, "acme", "g", n)
	require.NoError(t, err)
	require.Len(t, v.Graph.Nodes, 2)

	require.NoError(t, s.DeleteGraph(ctx, "acme", "g", nil))
	_, err = s.Version(ctx, "acme", "g", n)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.Draft(ctx, "acme", "g")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.Draft(ctx, "acme", "g-2")
	require.NoError(t, err, "a graph whose id extends the deleted one's is untouched")
}

// TestCacheEvictsTheLeastRecentlyUsed: a small bound evicts the least recently used.
func TestCacheEvictsTheLeastRecentlyUsed(t *testing.T) {
	small := newCache(10)
	small.put("a", 1, "A", 6)
	small.put("b", 1, "B", 6)
	_, ok := small.get("a", 1)
	require.False(t, ok)
	got, ok := small.get("b", 1)
	require.True(t, ok)
	require.Equal(t, "B", got)
	_, ok = small.get("b", 2)
	require.False(t, ok, "another revision is a miss")
	small.put("huge", 1, "H", 11)
	_, ok = small.get("huge", 1)
	require.False(t, ok, "an entry larger than the bound is not kept")
}

// The stored form keeps every field of a graph, including empty payloads and raw JSON.
func TestGraphCodecRoundTrip(t *testing.T) {
	g := &graph.Graph{
		ID: "g", Tenant: "acme", CapabilityMode: graph.ModeAdvisory, Revision: 7,
		Nodes: []graph.Node{
			{ID: "empty-agent", Kind: graph.KindAgent, Agent: &graph.AgentNode{}},
			{ID: "a", Kind: graph.KindAgent, Agent: &graph.AgentNode{
				CapabilityBindings: []string{"process_spawn"},
				ToolBindings:       []graph.ToolBinding{{Name: "t", NodeID: "t"}},
				MCPServers:         []graph.InlineMCPServer{{Name: "fs", Command: "npx", Args: []string{"-y"}, Env: map[string]string{"K": "v"}}},
			}},
			{ID: "t", Kind: graph.KindMCPTool, MCPTool: &graph.MCPToolNode{
				ServerRef: "docs", ToolName: "t", Title: "T", Description: "d",
				InputSchema: json.RawMessage(`{"type":"object"}`), OutputSchema: json.RawMessage(`{"type":"object","properties":{}}`),
				Annotations: json.RawMessage(`{}`), SchemaHash: "v1:sha256:00", CapabilityBindings: []string{"process_spawn"},
				Flags: []discovery.Finding{{Code: "url_or_email", Severity: "flag", Location: "description", Message: "m"}},
			}},
			{ID: "o", Kind: "note", Opaque: json.RawMessage(`{"x":[1,2]}`)},
			{ID: "bare", Kind: "start"},
		},
		Edges:    []graph.Edge{{From: "a", To: "t", Kind: graph.EdgeTool}},
		Policies: []graph.Policy{{ID: "p", Revoke: []string{"fs.write"}}},
	}
	raw, err := encodeDraft(g)
	require.NoError(t, err)
	var back graph.Graph
	require.NoError(t, decodeGob(raw, &back))
	want, _ := json.Marshal(g)
	got, _ := json.Marshal(&back)
	require.JSONEq(t, string(want), string(got))
	require.NotNil(t, back.Nodes[0].Agent, "an empty agent payload stays an agent payload")
	require.Nil(t, back.Nodes[4].Agent)
	require.Nil(t, back.Nodes[4].Opaque)
}

// etcdReplicas opens n replicas of the publisher's store on one cluster and root.
func etcdReplicas(t *testing.T, cluster *etcdtest.Cluster, n int, cfg EtcdConfig) []*Etcd {
	cfg.Root = cluster.Root()
	var out []*Etcd
	for range n {
		cfg.Client = cluster.Client(t, "publisher")
		s, err := OpenEtcd(t.Context(), cfg, spoolConfig(t, testutil.NewAuditRecorder()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		out = append(out, s)
	}
	return out
}

// TestEtcdConcurrentPublishesKeepVersionsImmutable: two replicas publish one graph at once,
// many times. Each publish commits in a transaction that compares the graph's revision and
// requires its version key to be absent (no lock in memory: the replicas share none), so
// every number is given once, none is skipped, each version holds what its publisher wrote,
// and after a delete no number is given again.
func TestEtcdConcurrentPublishesKeepVersionsImmutable(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	replicas := etcdReplicas(t, cluster, 2, EtcdConfig{})
	ctx := t.Context()
	require.NoError(t, replicas[0].CreateGraph(ctx, newGraph("acme", "g"), nil))
	d, err := replicas[1].Draft(ctx, "acme", "g")
	require.NoError(t, err)

	const workers, each = 6, 5
	var mu sync.Mutex
	byNumber := map[int64]string{}
	var wg sync.WaitGroup
	for w := range workers {
		s := replicas[w%2]
		wg.Go(func() {
			for i := range each {
				tag := fmt.Sprintf("replica%d-worker%d-%d", w%2, w, i)
				n, err := s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d, PublishedBy: tag}, nil)
				require.NoError(t, err)
				mu.Lock()
				require.Empty(t, byNumber[n], "version %d given twice", n)
				byNumber[n] = tag
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, byNumber, workers*each)
	for n := int64(1); n <= workers*each; n++ {
		for _, s := range replicas {
			v, err := s.Version(ctx, "acme", "g", n)
			require.NoError(t, err)
			require.Equal(t, byNumber[n], v.PublishedBy, "version %d holds what its publisher wrote, on every replica", n)
		}
	}

	require.NoError(t, replicas[0].DeleteGraph(ctx, "acme", "g", nil))
	_, err = replicas[1].Version(ctx, "acme", "g", 1)
	require.ErrorIs(t, err, ErrNotFound, "the other replica's cache does not answer for a deleted graph")
	require.NoError(t, replicas[1].CreateGraph(ctx, newGraph("acme", "g"), nil))
	d, err = replicas[0].Draft(ctx, "acme", "g")
	require.NoError(t, err)
	n, err := replicas[0].Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(workers*each+1), n, "numbers are never reused after a delete")
	_, err = replicas[1].Version(ctx, "acme", "g", 1)
	require.ErrorIs(t, err, ErrNotFound, "nor is a version of the deleted graph served")
}

// TestEtcdReplicasSeeDraftChanges: a draft changed on one replica is what the other's next
// read returns, though it had the older one decoded in its cache.
func TestEtcdReplicasSeeDraftChanges(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	replicas := etcdReplicas(t, cluster, 2, EtcdConfig{})
	ctx := t.Context()
	require.NoError(t, replicas[0].CreateGraph(ctx, newGraph("acme", "g"), nil))
	for i := range 10 {
		before, err := replicas[1].Draft(ctx, "acme", "g")
		require.NoError(t, err)
		_, err = replicas[i%2].UpdateDraft(ctx, "acme", "g", func(cur *graph.Graph) error {
			cur.Nodes = append(cur.Nodes, graph.Node{ID: fmt.Sprintf("n%d", i), Kind: "note"})
			return nil
		}, nil)
		require.NoError(t, err)
		for _, s := range replicas {
			after, err := s.Draft(ctx, "acme", "g")
			require.NoError(t, err)
			require.Equal(t, before.Revision+1, after.Revision)
			require.Len(t, after.Nodes, i+2)
		}
	}
}

// TestEtcdLargeDraftsAreChunked: drafts and versions past one etcd request are kept in chunks
// that live and die with the keys that point at them.
func TestEtcdLargeDraftsAreChunked(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	replicas := etcdReplicas(t, cluster, 2, EtcdConfig{InlineBytes: 512, ChunkBytes: 1024, CacheBytes: -1})
	ctx := t.Context()
	big := newGraph("acme", "g")
	for i := range 40 {
		big.Nodes = append(big.Nodes, graph.Node{ID: fmt.Sprintf("n%d", i), Kind: "note", Opaque: json.RawMessage(`{"text":"` + strings.Repeat("x", 100) + `"}`)})
	}
	require.NoError(t, replicas[0].CreateGraph(ctx, big, nil))
	chunks := func() int64 {
		resp, err := replicas[0].cli.Get(ctx, replicas[0].space.Prefix(etcdBlobs), clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		return resp.Count
	}
	draftChunks := chunks()
	require.Greater(t, draftChunks, int64(1))
	d, err := replicas[1].Draft(ctx, "acme", "g")
	require.NoError(t, err)
	require.Len(t, d.Nodes, 41)
	_, err = replicas[1].UpdateDraft(ctx, "acme", "g", func(cur *graph.Graph) error {
		cur.Nodes = cur.Nodes[:30]
		return nil
	}, nil)
	require.NoError(t, err)
	require.Less(t, chunks(), draftChunks, "the replaced draft's chunks went with it")
	d, err = replicas[0].Draft(ctx, "acme", "g")
	require.NoError(t, err)
	require.Len(t, d.Nodes, 30)
	n, err := replicas[0].Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)
	v, err := replicas[1].Version(ctx, "acme", "g", n)
	require.NoError(t, err)
	require.Len(t, v.Graph.Nodes, 30)
	require.NoError(t, replicas[1].DeleteGraph(ctx, "acme", "g", nil))
	require.Zero(t, chunks(), "a deleted graph leaves no chunk")
}

// TestEtcdWritesGoOnWithAMemberKilled: with the leader of three members killed, replicas keep
// publishing and reading once the others elected a new one.
func TestEtcdWritesGoOnWithAMemberKilled(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	replicas := etcdReplicas(t, cluster, 2, EtcdConfig{})
	ctx := t.Context()
	require.NoError(t, replicas[0].CreateGraph(ctx, newGraph("acme", "g"), nil))
	cluster.Kill(cluster.WaitLeader(t))
	cluster.WaitLeader(t)
	for i, s := range replicas {
		d, err := s.Draft(ctx, "acme", "g")
		require.NoError(t, err)
		n, err := s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d}, nil)
		require.NoError(t, err)
		require.Equal(t, int64(i+1), n)
	}
}
