package publisher

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/services/publisher/internal/store"
)

// What the publisher on etcd answers for a draft that etcd cannot keep, or a stored one that
// cannot be read back whole: neither is etcd out of reach, and neither is helped by trying
// again, so neither is UNAVAILABLE.

// smallBlobs makes what etcd keeps of one draft small: 64 chunks of 1 KiB, past 512 bytes.
func smallBlobs(cfg *Config) { cfg.EtcdInlineBytes, cfg.EtcdChunkBytes = 512, 1024 }

// withNotes is d with n note nodes of about 1 KB each.
func withNotes(t *testing.T, d *publisherv1.Graph, n int) *publisherv1.Graph {
	t.Helper()
	for i := range n {
		note, err := structpb.NewStruct(map[string]any{"text": fmt.Sprintf("%d %s", i, strings.Repeat("x", 1000))})
		require.NoError(t, err)
		d.Nodes = append(d.Nodes, &publisherv1.Node{Id: fmt.Sprintf("note-%d", i), Kind: "note", Data: &publisherv1.Node_Opaque{Opaque: note}})
	}
	return d
}

// TestADraftPastWhatEtcdKeeps: a draft larger than etcd keeps of one value is refused
// RESOURCE_EXHAUSTED naming its size, the limit and the fix, not UNAVAILABLE, which would
// have the caller send it again; the stored draft stays as it was.
func TestADraftPastWhatEtcdKeeps(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	svc := etcdReplicas(t, cluster, 1, smallBlobs)[0]
	ctx := acme(t.Context())
	created, err := svc.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"researcher"}})
	require.NoError(t, err)

	_, err = svc.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: withNotes(t, created.GetDraft(), 80)})
	st := testutil.RequireStatus(t, err, codes.ResourceExhausted)
	require.Contains(t, st.Message(), `the draft of graph "g" cannot be stored on etcd`)
	require.Contains(t, st.Message(), "more than etcd keeps")
	require.Contains(t, st.Message(), "it keeps at most 65536 (64 chunks of 1024 bytes)", "the limit")
	require.Contains(t, st.Message(), "make the draft smaller", "the fix")

	got, err := svc.GetDraft(ctx, &publisherv1.GetDraftRequest{GraphId: "g"})
	require.NoError(t, err)
	require.Len(t, got.GetDraft().GetNodes(), 1, "the stored draft stays")
	require.Equal(t, created.GetDraft().GetRevision(), got.GetDraft().GetRevision())
}

// TestADamagedDraftOnEtcdIsDataLoss: a draft and a version stored in chunks, changed behind
// the publisher's back, are read as DATA_LOSS naming the key and what to do (restore from an
// etcd snapshot), not UNAVAILABLE; so is an edit, which reads the draft first. Deleting the
// graph still works, and takes the chunks with it.
func TestADamagedDraftOnEtcdIsDataLoss(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	svc := etcdReplicas(t, cluster, 1, smallBlobs, func(cfg *Config) { cfg.CacheBytes = -1 })[0]
	ctx := acme(t.Context())
	created, err := svc.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"researcher"}})
	require.NoError(t, err)
	stored, err := svc.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: withNotes(t, created.GetDraft(), 8)})
	require.NoError(t, err)
	published, err := svc.Publish(ctx, &publisherv1.PublishRequest{GraphId: "g"})
	require.NoError(t, err)
	require.Equal(t, int64(1), published.GetVersion())

	cli := cluster.Client(t, "publisher")
	prefix := svc.store.(*store.Etcd).Prefix()
	chunks, err := cli.Get(ctx, prefix+"blobs/acme/g/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	require.Greater(t, len(chunks.Kvs), 2, "the draft and the version are stored in chunks")
	for _, kv := range chunks.Kvs {
		_, err = cli.Put(ctx, string(kv.Key), "not what was written")
		require.NoError(t, err)
	}

	calls := map[string]func() error{
		"a read": func() error {
			_, err := svc.GetDraft(ctx, &publisherv1.GetDraftRequest{GraphId: "g"})
			return err
		},
		"an edit": func() error {
			_, err := svc.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: stored.GetDraft()})
			return err
		},
	}
	for name, call := range calls {
		st := testutil.RequireStatus(t, call(), codes.DataLoss, name)
		require.Contains(t, st.Message(), "the draft under "+prefix+"drafts/acme/g cannot be read", name)
		require.Contains(t, st.Message(), "does not match its digest", name)
		require.Contains(t, st.Message(), "restore the publisher's keys from an etcd snapshot", "%s names the fix", name)
	}
	_, err = svc.GetVersion(ctx, &publisherv1.GetVersionRequest{GraphId: "g", Version: 1})
	st := testutil.RequireStatus(t, err, codes.DataLoss, "a version")
	require.Contains(t, st.Message(), "the version under "+prefix+"versions/acme/g/00000000000000000001 cannot be read")
	require.Contains(t, st.Message(), "restore the publisher's keys from an etcd snapshot")

	_, err = svc.DeleteGraph(ctx, &publisherv1.DeleteGraphRequest{GraphId: "g"})
	require.NoError(t, err)
	left, err := cli.Get(ctx, prefix+"blobs/acme/g/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, left.Count, "the damaged chunks went with the graph")
}

// TestADraftOnEtcdThatDoesNotDecodeIsDataLoss: a draft stored whole (no chunks, so no digest)
// whose value was changed behind the publisher's back does not decode: DATA_LOSS naming its
// key and what to do, not INTERNAL.
func TestADraftOnEtcdThatDoesNotDecodeIsDataLoss(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	svc := etcdReplicas(t, cluster, 1, func(cfg *Config) { cfg.CacheBytes = -1 })[0]
	ctx := acme(t.Context())
	_, err := svc.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"researcher"}})
	require.NoError(t, err)
	key := svc.store.(*store.Etcd).Prefix() + "drafts/acme/g"
	_, err = cluster.Client(t, "publisher").Put(ctx, key, "\x00not a draft")
	require.NoError(t, err)

	_, err = svc.GetDraft(ctx, &publisherv1.GetDraftRequest{GraphId: "g"})
	st := testutil.RequireStatus(t, err, codes.DataLoss)
	require.Contains(t, st.Message(), "the draft under "+key+" cannot be read: etcdstore: a stored value is damaged")
	require.Contains(t, st.Message(), "restore the publisher's keys from an etcd snapshot")
}
