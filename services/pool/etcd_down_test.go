package pool

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/testutil/pinned"
)

// TestEtcdDownAnswersTokenCallsUnavailable: with etcd out of reach, a read of a run's agent
// tokens (ListAgentTokens, a listing of etcd) and a write of one (CreateAgentToken) that
// carry no deadline each end UNAVAILABLE, naming etcd and what to check, rather than wait for
// as long as etcd is away; once etcd is back the host serves both.
func TestEtcdDownAnswersTokenCallsUnavailable(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	h := newHarness(t, harnessOpts{noImage: true})
	h.server("docs", nil)
	h.publishSurface("g", nil, pinned.Tool{Server: "docs", Tool: "read_file", Description: "Read."})
	p := openPoolWith(t, h, Config{DBPath: filepath.Join(t.TempDir(), "pool.db"), Etcd: cluster.Client(t, "pool"), EtcdRoot: cluster.Root(),
		HostID: "h1", HostAddr: "127.0.0.1:1", HostLeaseTTL: time.Second, Peers: unreachable{}, FrontDoorURL: "http://127.0.0.1:8000/mcp"})
	defer p.Close(context.Background())
	srv := NewServer(p)
	ctx := h.ctx // no deadline
	started, err := srv.StartRun(ctx, &poolv1.StartRunRequest{GraphId: "g"})
	require.NoError(t, err)
	runID := started.GetRun().GetRunId()

	restart := cluster.Down(0)
	defer restart() // before Close, which hands the host's runs back through etcd
	calls := map[string]func() error{
		"a read": func() error {
			_, err := srv.ListAgentTokens(ctx, &poolv1.ListAgentTokensRequest{RunId: runID})
			return err
		},
		"a write": func() error {
			_, err := srv.CreateAgentToken(ctx, &poolv1.CreateAgentTokenRequest{RunId: runID, Agent: "a"})
			return err
		},
	}
	for name, call := range calls {
		etcdtest.RequireUnavailable(t, call(), name)
	}

	restart()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := srv.CreateAgentToken(ctx, &poolv1.CreateAgentTokenRequest{RunId: runID, Agent: "a"})
		assert.NoError(c, err)
	}, 30*time.Second, 100*time.Millisecond, "the host writes again once etcd is back")
	list, err := srv.ListAgentTokens(ctx, &poolv1.ListAgentTokensRequest{RunId: runID})
	require.NoError(t, err)
	require.NotEmpty(t, list.GetTokens())
}
