package store

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/graph"
)

func openStore(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "publisher.db")
	s, err := Open(path, 0)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, path
}

func newGraph(tenant, id string) *graph.Graph {
	return &graph.Graph{ID: id, Tenant: tenant, Nodes: []graph.Node{{ID: "a", Kind: graph.KindAgent, Agent: &graph.AgentNode{}}}}
}

func TestCreateGraphAndDraft(t *testing.T) {
	s, _ := openStore(t)
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

func TestUpdateDraftAdvancesTheRevisionAndWritesNothingOnRefusal(t *testing.T) {
	s, _ := openStore(t)
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

func TestHookRunsInTheWriteTransaction(t *testing.T) {
	s, _ := openStore(t)
	ctx := t.Context()
	record := func(tag string) TxHook {
		return func(tx *bolt.Tx) error { return tx.Bucket(OutboxBucket).Put([]byte(tag), []byte("x")) }
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
		func(*bolt.Tx) error { return errors.New("outbox full") })
	require.ErrorContains(t, err, "outbox full")
	require.NoError(t, s.DeleteGraph(ctx, "acme", "g", record("delete")))

	var tags []string
	require.NoError(t, s.DB().View(func(tx *bolt.Tx) error {
		return tx.Bucket(OutboxBucket).ForEach(func(k, _ []byte) error { tags = append(tags, string(k)); return nil })
	}))
	require.ElementsMatch(t, []string{"create", "update", "publish", "delete"}, tags)
}

func TestPublishNumbersVersionsAndChecksTheDraftRevision(t *testing.T) {
	s, _ := openStore(t)
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
func TestPublishedVersionsAreNeverOverwritten(t *testing.T) {
	s, _ := openStore(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	d, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	_, err = s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d, PublishedBy: "first"}, nil)
	require.NoError(t, err)

	// Rewind the bookkeeping as a bug or a bad restore might.
	require.NoError(t, s.DB().Update(func(tx *bolt.Tx) error {
		m, err := getMeta(tx, graphKey("acme", "g"))
		require.NoError(t, err)
		m.LatestVersion = 0
		return putJSON(tx.Bucket(graphsBucket), graphKey("acme", "g"), m)
	}))
	_, err = s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d, PublishedBy: "second"}, nil)
	require.ErrorIs(t, err, ErrVersionExists)
	v, err := s.Version(ctx, "acme", "g", 1)
	require.NoError(t, err)
	require.Equal(t, "first", v.PublishedBy)
}

func TestDeleteKeepsNumberingForARecreatedGraph(t *testing.T) {
	s, _ := openStore(t)
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
	n, err := s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "version 1 of the deleted graph is never reused")
	infos, _, err := s.ListVersions(ctx, "acme", "g", "", 10)
	require.NoError(t, err)
	require.Equal(t, []int64{2}, versionNumbers(infos))
}

func TestListGraphsPagesWithinOneTenant(t *testing.T) {
	s, _ := openStore(t)
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
func TestAPageTokenNotIssuedForTheListIsRefused(t *testing.T) {
	s, _ := openStore(t)
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

func TestListVersionsOfTheLastGraphInTheFile(t *testing.T) {
	// The cursor walks backwards from past the end of the bucket.
	s, _ := openStore(t)
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

func TestReopenKeepsEverything(t *testing.T) {
	s, path := openStore(t)
	ctx := t.Context()
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "g"), nil))
	d, err := s.Draft(ctx, "acme", "g")
	require.NoError(t, err)
	_, err = s.Publish(ctx, "acme", "g", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s2, err := Open(path, 0)
	require.NoError(t, err)
	defer s2.Close()
	v, err := s2.Version(ctx, "acme", "g", 1)
	require.NoError(t, err)
	b, _ := json.Marshal(v.Graph.Nodes)
	require.JSONEq(t, `[{"id":"a","kind":"agent","agent":{}}]`, string(b))
}

func TestOversizedDraftIsRefused(t *testing.T) {
	s, _ := openStore(t)
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

// The in-memory cache never answers for what the file no longer holds: every lookup is
// confirmed by the read transaction (a draft's revision, a version's existence).
func TestCacheFollowsTheFile(t *testing.T) {
	s, _ := openStore(t)
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

	// A small bound evicts the least recently used.
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
