package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/internal/testutil"
)

// graphState is what a store answers of one graph.
type graphState struct {
	Draft    *graph.Graph
	Versions []*graph.Version
	Infos    []graph.Version
}

func stateOf(t *testing.T, s api, tenant, id string) graphState {
	t.Helper()
	ctx := t.Context()
	var st graphState
	var err error
	st.Draft, err = s.Draft(ctx, tenant, id)
	require.NoError(t, err)
	st.Infos, _, err = s.ListVersions(ctx, tenant, id, "", 1000)
	require.NoError(t, err)
	for _, info := range st.Infos {
		v, err := s.Version(ctx, tenant, id, info.Version)
		require.NoError(t, err)
		st.Versions = append(st.Versions, v)
	}
	return st
}

// publisherToMove writes a publisher.db as a publisher on bbolt leaves it: a graph whose draft
// and versions are past etcdstore.InlineBytes, one with more versions than one etcd
// transaction holds, a tombstone, another tenant's graph, and the audit records of their
// creation still in the outbox.
func publisherToMove(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "publisher.db")
	s, err := OpenBolt(path, 0, spoolConfig(t, testutil.NewAuditRecorder()))
	require.NoError(t, err)
	ctx := t.Context()
	record := func(id string) Hook {
		return func(rec audit.Recorder) error {
			return rec.Record(audit.NewAdminRecord("publisher", "acme", audit.AdminEvent{Action: "create", ResourceType: "graph", ResourceID: id, ActorRole: audit.ActorRoleSystem}))
		}
	}
	publish := func(tenant, id string, times int) {
		for range times {
			d, err := s.Draft(ctx, tenant, id)
			require.NoError(t, err)
			_, err = s.Publish(ctx, tenant, id, d.Revision, &graph.Version{Graph: d, PublishedBy: "key:k", PublishTime: time.Now().UTC()}, nil)
			require.NoError(t, err)
			_, err = s.UpdateDraft(ctx, tenant, id, func(cur *graph.Graph) error {
				cur.Nodes = append(cur.Nodes, graph.Node{ID: fmt.Sprintf("n%d", len(cur.Nodes)), Kind: "note"})
				return nil
			}, nil)
			require.NoError(t, err)
		}
	}
	big := newGraph("acme", "big")
	big.Nodes = append(big.Nodes, graph.Node{ID: "big", Kind: "note", Opaque: json.RawMessage(`{"text":"` + strings.Repeat("x", etcdstore.InlineBytes+100<<10) + `"}`)})
	require.NoError(t, s.CreateGraph(ctx, big, record("big")))
	publish("acme", "big", 2)
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "many"), record("many")))
	publish("acme", "many", 60)
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "gone"), nil))
	publish("acme", "gone", 2)
	require.NoError(t, s.DeleteGraph(ctx, "acme", "gone", nil))
	require.NoError(t, s.CreateGraph(ctx, newGraph("other", "g"), record("g")))
	publish("other", "g", 1)
	require.NoError(t, s.Close())
	return path
}

// TestMoveBoltToEtcd: a publisher.db's graphs move to etcd whole (drafts and versions past
// 512 KiB through chunks, graphs past one transaction, tombstones), a graph etcd held stands,
// the waiting audit records are sent, the file is renamed, and numbering goes on.
func TestMoveBoltToEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	path := publisherToMove(t)
	ctx := t.Context()

	want := map[string]graphState{}
	old, err := OpenBolt(path, 0, spoolConfig(t, testutil.NewAuditRecorder()))
	require.NoError(t, err)
	for _, id := range []string{"big", "many"} {
		want[id] = stateOf(t, old, "acme", id)
	}
	require.Len(t, want["many"].Versions, 60)
	require.NoError(t, old.Close())

	first, err := OpenEtcd(ctx, EtcdConfig{Client: cluster.Client(t, "publisher"), Root: root, CacheBytes: -1}, spoolConfig(t, testutil.NewAuditRecorder()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Close() })
	// etcd already holds other/g, created on etcd since: it stands.
	require.NoError(t, first.CreateGraph(ctx, newGraph("other", "g"), nil))
	// A move that stopped in the middle left a version of acme/many, whose meta it never wrote,
	// under the number the next publish takes.
	_, err = first.cli.Put(ctx, first.versionKey("acme", "many", 61), "left over")
	require.NoError(t, err)

	m, err := first.MoveBolt(ctx, path)
	require.NoError(t, err)
	require.Equal(t, Moved{GraphsCopied: 3, GraphsInEtcd: 1, VersionsCopied: 62, AuditRecords: 3, RenamedTo: path + MovedSuffix}, m)
	require.NoFileExists(t, path)
	require.FileExists(t, path+MovedSuffix)

	sink := testutil.NewAuditRecorder()
	s, err := OpenEtcd(ctx, EtcdConfig{Client: cluster.Client(t, "publisher"), Root: root, CacheBytes: -1}, spoolConfig(t, sink))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	for id, w := range want {
		require.Equal(t, w, stateOf(t, s, "acme", id), id)
	}
	chunks, err := s.cli.Get(ctx, s.space.Prefix(etcdBlobs), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Equal(t, int64(3), chunks.Count, "the big draft and its two versions are one chunk each")
	_, err = s.Draft(ctx, "acme", "gone")
	require.ErrorIs(t, err, ErrNotFound, "a tombstone stays a tombstone")
	g, err := s.Draft(ctx, "other", "g")
	require.NoError(t, err)
	require.Equal(t, int64(1), g.Revision, "the graph etcd held stands")
	vs, _, err := s.ListVersions(ctx, "other", "g", "", 10)
	require.NoError(t, err)
	require.Empty(t, vs)

	// Numbering goes on from the file's.
	d, err := s.Draft(ctx, "acme", "many")
	require.NoError(t, err)
	n, err := s.Publish(ctx, "acme", "many", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(61), n)
	require.NoError(t, s.CreateGraph(ctx, newGraph("acme", "gone"), nil))
	d, err = s.Draft(ctx, "acme", "gone")
	require.NoError(t, err)
	require.Equal(t, int64(4), d.Revision, "the re-created graph's revision continues the tombstone's")
	n, err = s.Publish(ctx, "acme", "gone", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(3), n, "the tombstone's numbers are not reused")

	fwd := s.Spool().StartForwarding()
	t.Cleanup(func() { fwd.Stop(time.Second) })
	require.NoError(t, s.Spool().Flush(ctx))
	var ids []string
	for _, rec := range sink.Records() {
		ids = append(ids, rec.Admin.ResourceID)
	}
	require.Equal(t, []string{"big", "many", "g"}, ids)

	// The file put back copies nothing again, nor sends its audit records again (etcd marks
	// its outbox moved).
	require.NoError(t, os.Rename(path+MovedSuffix, path))
	m, err = s.MoveBolt(ctx, path)
	require.NoError(t, err)
	require.Equal(t, Moved{GraphsInEtcd: 4, RenamedTo: path + MovedSuffix}, m)
}

// TestMoveBoltStoppedInTheMiddle: a move that stops after a graph leaves the file; the next
// copies the rest.
func TestMoveBoltStoppedInTheMiddle(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	path := publisherToMove(t)
	ctx := t.Context()
	s := etcdReplicas(t, cluster, 1, EtcdConfig{CacheBytes: -1})[0]
	steps := 0
	moveStep = func() error {
		if steps++; steps == 2 {
			return errors.New("crash")
		}
		return nil
	}
	t.Cleanup(func() { moveStep = nil })
	_, err := s.MoveBolt(ctx, path)
	require.ErrorContains(t, err, "the file stays, and the next start copies again")
	require.FileExists(t, path)

	moveStep = nil
	m, err := s.MoveBolt(ctx, path)
	require.NoError(t, err)
	require.Equal(t, Moved{GraphsCopied: 2, GraphsInEtcd: 2, VersionsCopied: 61, AuditRecords: 3, RenamedTo: path + MovedSuffix}, m)
	vs, _, err := s.ListVersions(ctx, "acme", "many", "", 100)
	require.NoError(t, err)
	require.Len(t, vs, 60)
}

// TestMoveBoltStopsForAGraphCreatedMeanwhile: a graph another replica creates while its parts
// are being copied stands, and none of the file's parts stay in it: its first publish is
// version 1, and it lists no other.
func TestMoveBoltStopsForAGraphCreatedMeanwhile(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	path := publisherToMove(t)
	ctx := t.Context()
	replicas := etcdReplicas(t, cluster, 2, EtcdConfig{CacheBytes: -1})
	s, other := replicas[0], replicas[1]
	created := false
	moveFlushed = func(owner string) {
		if owner == "acme/many" && !created {
			created = true
			require.NoError(t, other.CreateGraph(ctx, newGraph("acme", "many"), nil))
		}
	}
	t.Cleanup(func() { moveFlushed = nil })
	m, err := s.MoveBolt(ctx, path)
	require.NoError(t, err)
	require.True(t, created, "acme/many's parts took more than one transaction")
	require.Equal(t, Moved{GraphsCopied: 3, GraphsInEtcd: 1, VersionsCopied: 3, AuditRecords: 3, RenamedTo: path + MovedSuffix}, m)

	d, err := other.Draft(ctx, "acme", "many")
	require.NoError(t, err)
	require.Equal(t, int64(1), d.Revision)
	require.Len(t, d.Nodes, 1)
	n, err := other.Publish(ctx, "acme", "many", d.Revision, &graph.Version{Graph: d}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	vs, _, err := other.ListVersions(ctx, "acme", "many", "", 100)
	require.NoError(t, err)
	require.Equal(t, []int64{1}, versionNumbers(vs))
	left, err := s.cli.Get(ctx, s.space.Prefix(etcdVersions, "acme", "many"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Equal(t, int64(1), left.Count, "only the new graph's version")
}

// TestMoveBoltRunAgainAfterItsImportBringsTheDropsOnce: a move that stopped after it brought the
// file's audit outbox into etcd (before its rename: a crash, a failed rename) and runs again
// brings neither the outbox's dropped count nor its records a second time: etcd holds the count
// the file held, once, and each record once; the second run says it brought none.
func TestMoveBoltRunAgainAfterItsImportBringsTheDropsOnce(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	ctx := t.Context()

	// A publisher.db whose outbox held 2 records and dropped 3 (ContinueAndAlarm, full).
	path := filepath.Join(t.TempDir(), "publisher.db")
	cfg := spoolConfig(t, testutil.NewAuditRecorder())
	cfg.MaxPending, cfg.OnFull = 2, audit.ContinueAndAlarm
	b, err := OpenBolt(path, 0, cfg)
	require.NoError(t, err)
	for i := range 5 {
		id := fmt.Sprintf("g%d", i)
		require.NoError(t, b.CreateGraph(ctx, newGraph("acme", id), func(rec audit.Recorder) error {
			return rec.Record(audit.NewAdminRecord("publisher", "acme", audit.AdminEvent{Action: "create", ResourceType: "graph", ResourceID: id, ActorRole: audit.ActorRoleSystem}))
		}))
	}
	require.NoError(t, b.Close())

	s := etcdReplicas(t, cluster, 1, EtcdConfig{CacheBytes: -1})[0]
	moveRenaming = func() error { return errors.New("crash") }
	t.Cleanup(func() { moveRenaming = nil })
	_, err = s.MoveBolt(ctx, path)
	require.ErrorContains(t, err, "the file stays, and the next start copies again")
	require.FileExists(t, path)

	moveRenaming = nil
	m, err := s.MoveBolt(ctx, path)
	require.NoError(t, err)
	require.Equal(t, Moved{GraphsInEtcd: 5, RenamedTo: path + MovedSuffix}, m, "the first run brought the outbox")

	outbox := s.space.Prefix(etcdOutbox)
	cli := cluster.Client(t, "publisher")
	resp, err := cli.Get(ctx, outbox+"dropped/", clientv3.WithPrefix())
	require.NoError(t, err)
	var dropped uint64
	for _, kv := range resp.Kvs {
		n, err := strconv.ParseUint(string(kv.Value), 10, 64)
		require.NoError(t, err)
		dropped += n
	}
	require.Equal(t, uint64(3), dropped, "the count the file held, once")
	resp, err = cli.Get(ctx, outbox+"records/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Equal(t, int64(2), resp.Count, "each record the file held, once")
}

// TestMoveBoltSkipsWhatThePublisherNeverWrites: a publisher.db damaged or altered to hold
// graphs no publisher writes (a key that is no <tenant>/<graph id>, one that climbs with "..",
// one with a NUL, a meta larger than etcd takes) is moved without them, each named with its
// reason, rather than fail at every start; the rest is moved, nothing is written outside the
// publisher's prefix, and the file is renamed.
func TestMoveBoltSkipsWhatThePublisherNeverWrites(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	path := publisherToMove(t)
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(graphsBucket)
		meta := bytes.Clone(b.Get(graphKey("acme", "big")))
		for k, v := range map[string][]byte{
			"no-tenant":       meta,
			"acme/../../x":    meta,
			"acme/a\x00b":     meta,
			"acme/huge-graph": bytes.Repeat([]byte("m"), 2<<20),
		} {
			if err := b.Put([]byte(k), v); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, db.Close())

	s, err := OpenEtcd(t.Context(), EtcdConfig{Client: cluster.Client(t, "publisher"), Root: root, CacheBytes: -1}, spoolConfig(t, testutil.NewAuditRecorder()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	m, err := s.MoveBolt(t.Context(), path)
	require.NoError(t, err)
	require.Positive(t, m.GraphsCopied)
	require.ElementsMatch(t, []Skipped{
		{Key: `"no-tenant"`, Reason: "its key is not <tenant>/<graph id>"},
		{Key: `"acme/../../x"`, Reason: "its graph id is no graph id (" + ident.Ref.Pattern() + ")"},
		{Key: `"acme/a\x00b"`, Reason: "its graph id is no graph id (" + ident.Ref.Pattern() + ")"},
		{Key: `"acme/huge-graph"`, Reason: fmt.Sprintf("its meta is %d bytes, more than etcd takes in one request (%d)", 2<<20, maxMovedMeta)},
	}, m.Skipped)
	require.FileExists(t, path+MovedSuffix)
	require.NoFileExists(t, path)

	all, err := cluster.Client(t, "publisher").Get(t.Context(), "\x00", clientv3.WithFromKey())
	require.NoError(t, err)
	require.NotEmpty(t, all.Kvs)
	for _, kv := range all.Kvs {
		k := string(kv.Key)
		require.True(t, strings.HasPrefix(k, root+"/"), "%q is outside the prefix %s", k, root)
		for _, bad := range []string{"no-tenant", "..", "\x00", "huge-graph"} {
			require.NotContains(t, k, bad)
		}
	}
	_, err = s.Draft(t.Context(), "acme", "big")
	require.NoError(t, err, "the rest is moved")
}
