package publisher

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/services/publisher/internal/store"
	"github.com/ringfence/ringfence/services/registry"
)

// etcdReplicas opens n publisher services on one etcd cluster and prefix, resolving grants
// through one registry (bbolt: the registry is not what these tests are about). with, if
// any, changes each replica's Config.
func etcdReplicas(t *testing.T, cluster *etcdtest.Cluster, n int, with ...func(*Config)) []*Service {
	t.Helper()
	dir := t.TempDir()
	box, err := secretbox.New(make([]byte, 32))
	require.NoError(t, err)
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := registry.Open(registry.Config{DBPath: filepath.Join(dir, "registry.db"), Secrets: box, Roles: roles, Logger: quiet, AuditSink: testutil.NewAuditRecorder()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	root := cluster.Root()
	var out []*Service
	for range n {
		cfg := Config{DBPath: filepath.Join(t.TempDir(), "publisher.db"), Etcd: cluster.Client(t, "publisher"), EtcdRoot: root,
			Policies: reg, AllowInlineMCPServers: true, Logger: quiet, AuditSink: testutil.NewAuditRecorder()}
		for _, w := range with {
			w(&cfg)
		}
		svc, err := Open(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = svc.Close() })
		out = append(out, svc)
	}
	return out
}

func acme(ctx context.Context) context.Context {
	return auth.WithTenancy(auth.WithPrincipal(ctx, auth.Principal{System: "test"}), auth.Tenancy{Tenant: "acme"})
}

// TestPublishersOnEtcdShareGraphs: two publisher services on one cluster are one publisher.
// A draft edited through one is what the other validates and publishes; both publishing at
// once never share a version number.
func TestPublishersOnEtcdShareGraphs(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	replicas := etcdReplicas(t, cluster, 2)
	ctx := acme(t.Context())
	_, err := replicas[0].CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"researcher"}})
	require.NoError(t, err)
	d, err := replicas[1].GetDraft(ctx, &publisherv1.GetDraftRequest{GraphId: "g"})
	require.NoError(t, err)
	d.GetDraft().Nodes = append(d.GetDraft().Nodes, &publisherv1.Node{Id: "note", Kind: "note"})
	_, err = replicas[1].ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: d.GetDraft()})
	require.NoError(t, err)

	var mu sync.Mutex
	numbers := map[int64]bool{}
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			resp, err := replicas[i%2].Publish(ctx, &publisherv1.PublishRequest{GraphId: "g"})
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			require.False(t, numbers[resp.GetVersion()], "version %d given twice", resp.GetVersion())
			numbers[resp.GetVersion()] = true
		})
	}
	wg.Wait()
	require.Len(t, numbers, 6)
	v, err := replicas[0].PublishedVersion(t.Context(), "acme", "g", 0)
	require.NoError(t, err)
	require.Equal(t, int64(6), v.Version)
	require.Len(t, v.Graph.Nodes, 2, "the draft the other replica wrote")
}

// racingStore makes the store's first UpdateDraft lose its transaction to another replica,
// which changes an inline server's env between the read and the commit.
type racingStore struct {
	Store
	other *Service
	once  sync.Once
}

func (r *racingStore) UpdateDraft(ctx context.Context, tenant, id string, mutate func(*graph.Graph) error, hook store.Hook) (*graph.Graph, error) {
	return r.Store.UpdateDraft(ctx, tenant, id, func(cur *graph.Graph) error {
		r.once.Do(func() {
			d, err := r.other.GetDraft(ctx, &publisherv1.GetDraftRequest{GraphId: id})
			if err == nil {
				d.GetDraft().GetNodes()[0].GetAgent().GetMcpServers()[0].Env["TOKEN"] = "from-the-other-replica"
				_, err = r.other.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: id, Draft: d.GetDraft()})
			}
			if err != nil {
				panic(err)
			}
		})
		return mutate(cur)
	}, hook)
}

// TestARetriedDraftEditKeepsWhatTheMasksStandFor: a draft written back with an inline env's
// mask keeps the stored value; when another replica changed that value first, the edit runs
// again on the newer draft, and the mask then stands for the newer value.
func TestARetriedDraftEditKeepsWhatTheMasksStandFor(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	replicas := etcdReplicas(t, cluster, 2)
	ctx := acme(t.Context())
	created, err := replicas[0].CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"researcher"}})
	require.NoError(t, err)
	d := created.GetDraft()
	d.GetNodes()[0].GetAgent().McpServers = []*publisherv1.InlineMcpServer{{Name: "fs", Command: "npx", Env: map[string]string{"TOKEN": "first"}}}
	_, err = replicas[0].ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: d})
	require.NoError(t, err)

	got, err := replicas[0].GetDraft(ctx, &publisherv1.GetDraftRequest{GraphId: "g"})
	require.NoError(t, err)
	require.Equal(t, mcpserver.SecretMask, got.GetDraft().GetNodes()[0].GetAgent().GetMcpServers()[0].GetEnv()["TOKEN"])
	replicas[0].store = &racingStore{Store: replicas[0].store, other: replicas[1]}
	got.GetDraft().Revision = 0 // no revision check: the edit applies to whatever is stored
	resp, err := replicas[0].ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: got.GetDraft()})
	require.NoError(t, err)
	require.Equal(t, int64(4), resp.GetDraft().GetRevision(), "after the other replica's edit")
	_, err = replicas[1].Publish(ctx, &publisherv1.PublishRequest{GraphId: "g"})
	require.NoError(t, err)
	v, err := replicas[1].PublishedVersion(t.Context(), "acme", "g", 1)
	require.NoError(t, err)
	require.Equal(t, "from-the-other-replica", v.Graph.Nodes[0].Agent.MCPServers[0].Env["TOKEN"])
}

// TestAStartOnAnotherPrefixThanTheMoveWarns: a publisher started on etcd over a data_dir whose
// publisher.db was moved into etcd, on a prefix that holds no graph (a typo in
// store.etcd_prefix), warns naming the prefix and the moved file, instead of serving no graph
// without a word; once a graph is there, it says nothing.
func TestAStartOnAnotherPrefixThanTheMoveWarns(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	box, err := secretbox.New(make([]byte, 32))
	require.NoError(t, err)
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := registry.Open(registry.Config{DBPath: filepath.Join(t.TempDir(), "registry.db"), Secrets: box, Roles: roles, Logger: quiet, AuditSink: testutil.NewAuditRecorder()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "publisher.db"+store.MovedSuffix), nil, 0o600))
	typo := cluster.Root()
	open := func() (*Service, string) {
		var logs testutil.SyncBuffer
		svc, err := Open(Config{DBPath: filepath.Join(dir, "publisher.db"), Etcd: cluster.Client(t, "publisher"), EtcdRoot: typo,
			Policies: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil)), AuditSink: testutil.NewAuditRecorder()})
		require.NoError(t, err)
		return svc, logs.String()
	}
	svc, logs := open()
	require.Contains(t, logs, "level=WARN")
	require.Contains(t, logs, "publisher: etcd holds no graph under "+typo+"/publisher/, yet publisher.db.moved-to-etcd is left by a move of this data_dir's publisher.db into etcd: check that store.etcd_endpoints and store.etcd_prefix name the cluster and prefix it was moved into")
	_, err = svc.CreateGraph(acme(t.Context()), &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"researcher"}})
	require.NoError(t, err)
	require.NoError(t, svc.Close())
	svc, logs = open()
	require.NoError(t, svc.Close())
	require.NotContains(t, logs, "etcd holds no graph")
}
