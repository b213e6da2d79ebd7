package pool

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/mcpserver"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
)

// What a refresh answers when it cannot have the lock of the user's token (userToken): another
// host holding it past the wait is "refreshed elsewhere", and etcd going away during the wait
// is etcd out of reach, each naming what to do.

// dueTokenLockedElsewhere signs Alice in on h1 to the tickets server, lets her token come due,
// and locks it on h2: h1's next use of it must refresh, and wait for h2's lock.
func dueTokenLockedElsewhere(t *testing.T, w *oauthWorld, h1, h2 *Service) (res *mcpserver.Resolved, unlock func()) {
	t.Helper()
	res, err := w.reg.ResolveRegistration(w.ctx, "tickets")
	require.NoError(t, err)
	w.signInOn(h1, res)
	w.clock.advance(5 * time.Minute) // the token is due
	unlock, err = h2.oauth.LockOAuthToken(w.ctx, auth.DefaultTenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	return res, unlock
}

// TestARefreshOfATokenHeldElsewhere: a refresh on h1 that finds the user's token locked by h2
// for longer than it waits answers UNAVAILABLE saying the token is being refreshed elsewhere,
// to try again, and does not blame etcd, which answered all along.
func TestARefreshOfATokenHeldElsewhere(t *testing.T) {
	w, h1, h2 := twoOAuthHosts(t)
	tenant := auth.DefaultTenant
	res, unlock := dueTokenLockedElsewhere(t, w, h1, h2)
	defer unlock()

	h1.lockWait = 300 * time.Millisecond
	_, err := h1.userToken(w.ctx, tenant, oauthtest.Alice, res)
	st := rftestutil.RequireStatus(t, h1.errors.Status(w.ctx, err), codes.Unavailable)
	require.Contains(t, st.Message(), "being refreshed elsewhere")
	require.Contains(t, st.Message(), "try again")
	require.NotContains(t, st.Message(), "etcd", "etcd answered: it is not the problem")
}

// TestARefreshWhoseLockWaitEtcdEnds: a refresh on h1 waits for the lock h2 holds, and etcd
// goes away meanwhile: the refresh answers UNAVAILABLE naming etcd and store.etcd_endpoints,
// not that the token is being refreshed elsewhere, which nobody could tell.
func TestARefreshWhoseLockWaitEtcdEnds(t *testing.T) {
	w := oauthHarness(t)
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	h1 := w.openHost(cluster, root, "h1", filepath.Join(t.TempDir(), "pool.db"), w.poolCfg.Secrets)
	defer h1.Close(context.Background())
	h2 := w.openHost(cluster, root, "h2", filepath.Join(t.TempDir(), "pool.db"), w.poolCfg.Secrets)
	defer h2.Close(context.Background())
	tenant := auth.DefaultTenant
	res, unlock := dueTokenLockedElsewhere(t, w, h1, h2)
	defer unlock()

	h1.lockWait = 5 * time.Second // long enough that etcd goes away well before it ends
	done := make(chan error, 1)
	go func() {
		_, err := h1.userToken(w.ctx, tenant, oauthtest.Alice, res)
		done <- err
	}()
	// h1 waits once its key is queued behind h2's.
	cli := cluster.Client(t, "pool")
	queue := etcdstore.NewSpace(root, "pool").Prefix("oauth", "locks", tenant, oauthtest.Alice, "tickets")
	require.Eventually(t, func() bool {
		resp, err := cli.Get(w.ctx, queue, clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2
	}, 10*time.Second, 10*time.Millisecond, "h1 waits for h2's lock")

	restart := cluster.Down(0)
	defer restart() // before the hosts close, which hand their runs back through etcd
	st := h1.errors.Status(w.ctx, <-done)
	etcdtest.RequireUnavailable(t, st, "a refresh whose wait etcd ended")
	require.NotContains(t, st.Error(), "elsewhere", "nobody could tell who held the lock")
}
