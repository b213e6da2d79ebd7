package registry

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// TestEtcdDownIsUnavailable: with etcd out of reach, a read (GetServer) and a write
// (CreateServer) that carry no deadline each end UNAVAILABLE, naming etcd and what to check,
// rather than wait for as long as etcd is away; once etcd is back the registry serves both.
func TestEtcdDownIsUnavailable(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	svc := etcdReplicas(t, cluster, 1)[0]
	ctx := auth.SystemContext(t.Context(), "test") // no deadline
	_, err := svc.CreateServer(ctx, docsSearch())
	require.NoError(t, err)

	restart := cluster.Down(0)
	defer restart()
	second := docsSearch()
	second.Ref = "docs-search-2"
	calls := map[string]func() error{
		"a read": func() error {
			_, err := svc.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search"})
			return err
		},
		"a write": func() error {
			_, err := svc.CreateServer(ctx, second)
			return err
		},
	}
	for name, call := range calls {
		etcdtest.RequireUnavailable(t, call(), name)
	}

	restart()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := svc.CreateServer(ctx, second)
		assert.NoError(c, err)
	}, 30*time.Second, 100*time.Millisecond, "the registry writes again once etcd is back")
	got, err := svc.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search-2"})
	require.NoError(t, err)
	require.Equal(t, "docs-search-2", got.GetServer().GetRef())
}
