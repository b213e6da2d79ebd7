package pool

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/testutil/pinned"
)

// TestRunRecordsLiveInEtcd: on etcd a pool host keeps its run records there, not in its file:
// the same host id started on an empty file restores its runs with their selection and loaded
// tools, and another host id restores none of them.
func TestRunRecordsLiveInEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	h := newHarness(t, harnessOpts{noImage: true})
	h.server("docs", nil)
	h.publishSurface("g", func(a *publisherv1.AgentNode) { a.DeferTools = true },
		pinned.Tool{Server: "docs", Tool: "read_file", Description: "Read."}, pinned.Tool{Server: "docs", Tool: "write_file", Description: "Write."})
	open := func(host string) *Service {
		return openPoolWith(t, h, Config{DBPath: filepath.Join(t.TempDir(), "pool.db"), Etcd: cluster.Client(t, "pool"), EtcdRoot: root, HostID: host})
	}
	p := open("h1")
	info, err := p.StartRun(h.ctx, auth.DefaultTenant, "g", 0, "", "docs")
	require.NoError(t, err)
	require.Equal(t, "h1", info.Run.Host)
	runID := info.Run.ID
	r, err := p.lookup(h.ctx, runID, "")
	require.NoError(t, err)
	require.NoError(t, p.loadTools(h.ctx, r, "a", []string{"docs__write_file"}))
	require.NoError(t, p.Close(context.Background()))

	other := open("h2")
	require.Empty(t, other.runs.byKey, "h2 owns none of h1's runs")
	require.NoError(t, other.Close(context.Background()))

	p = open("h1")
	defer p.Close(context.Background())
	l, err := p.ListAgentTools(h.ctx, runID, "", "a")
	require.NoError(t, err)
	resp := listingToProto(l)
	require.Equal(t, []string{"docs__write_file", "tool_search"}, toolNames(resp), "restored from etcd, on a new file")
	require.Equal(t, []string{"docs"}, resp.GetSelectedServers())
}
