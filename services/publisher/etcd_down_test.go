package publisher

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// TestEtcdDownIsUnavailable: with etcd out of reach, a read (ListGraphs, which lists the
// tenant's graphs in etcd) and a write (CreateGraph) that carry no deadline each end
// UNAVAILABLE, naming etcd and what to check, rather than wait for as long as etcd is away;
// once etcd is back the publisher serves both.
func TestEtcdDownIsUnavailable(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	svc := etcdReplicas(t, cluster, 1)[0]
	ctx := acme(t.Context()) // no deadline
	_, err := svc.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"researcher"}})
	require.NoError(t, err)

	restart := cluster.Down(0)
	defer restart()
	calls := map[string]func() error{
		"a read": func() error {
			_, err := svc.ListGraphs(ctx, &publisherv1.ListGraphsRequest{})
			return err
		},
		"a write": func() error {
			_, err := svc.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "h", Agents: []string{"researcher"}})
			return err
		},
	}
	for name, call := range calls {
		etcdtest.RequireUnavailable(t, call(), name)
	}

	restart()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := svc.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "h", Agents: []string{"researcher"}})
		assert.NoError(c, err)
	}, 30*time.Second, 100*time.Millisecond, "the publisher writes again once etcd is back")
	list, err := svc.ListGraphs(ctx, &publisherv1.ListGraphsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetGraphs(), 2)
}
