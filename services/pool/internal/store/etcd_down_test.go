package store

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// TestEtcdDownIsUnavailable: with etcd out of reach, the pool's OAuth state and agent tokens
// answer a call without a deadline with etcdstore.ErrUnavailable naming what to check, rather
// than wait for as long as etcd is away: a sign-in's state (its lease's grant, then its
// write), the lock of a user's token and of a client registration (their leases' grants), a
// token's read, and the listing of expired agent tokens; once etcd is back they answer again.
func TestEtcdDownIsUnavailable(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	s, err := OpenEtcd(t.Context(), cluster.Client(t, "pool"), cluster.Root())
	require.NoError(t, err)
	ctx := t.Context() // no deadline
	now := time.Now()

	restart := cluster.Down(0)
	defer restart()
	calls := map[string]func() error{
		"put a sign-in": func() error { return s.PutSignInState(ctx, "h1", signIn("alice", "tickets", now.Add(time.Hour)), now) },
		"lock a token": func() error {
			unlock, err := s.LockOAuthToken(ctx, "acme", "alice", "tickets")
			if err == nil {
				unlock()
			}
			return err
		},
		"lock a client": func() error {
			unlock, err := s.LockOAuthClient(ctx, "https://as.example", "https://pool.example/oauth/callback")
			if err == nil {
				unlock()
			}
			return err
		},
		"read a token":        func() error { _, err := s.OAuthToken(ctx, "acme", "alice", "tickets"); return err },
		"list expired tokens": func() error { _, err := s.ExpiredAgentTokens(ctx, now, 10); return err },
	}
	// At once: each waits for its bound.
	var mu sync.Mutex
	errs := map[string]error{}
	var wg sync.WaitGroup
	for name, call := range calls {
		wg.Go(func() {
			err := call()
			mu.Lock()
			defer mu.Unlock()
			errs[name] = err
		})
	}
	wg.Wait()
	for name := range calls {
		require.ErrorIs(t, errs[name], etcdstore.ErrUnavailable, name)
		require.Contains(t, errs[name].Error(), "store.etcd_endpoints", "%s names what to check", name)
	}

	restart()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.NoError(c, s.PutSignInState(ctx, "h2", signIn("bob", "tickets", time.Now().Add(time.Hour)), time.Now()))
	}, 30*time.Second, 100*time.Millisecond, "the sign-in state is written again once etcd is back")
	got, err := s.TakeSignInState(ctx, "h2")
	require.NoError(t, err)
	require.Equal(t, "bob", got.User)
}

// TestALockWaitThatEtcdEndsIsUnavailable: a wait for a lock that another pool host holds,
// during which etcd goes away, ends with etcdstore.ErrUnavailable naming what to check, never
// ErrLockHeld: the wait ran out on a watch that etcd no longer fed, and nobody could tell
// whether the holder still held the lock (its lease lapses while etcd is away).
func TestALockWaitThatEtcdEndsIsUnavailable(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	ctx := t.Context()
	s, err := OpenEtcd(ctx, cluster.Client(t, "pool"), root)
	require.NoError(t, err)
	other, err := OpenEtcd(ctx, cluster.Client(t, "pool"), root)
	require.NoError(t, err)
	unlock, err := other.LockOAuthToken(ctx, "acme", "alice", "tickets")
	require.NoError(t, err)
	defer unlock()

	// Long enough that etcd goes away well before it ends.
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		unlock, err := s.LockOAuthToken(waitCtx, "acme", "alice", "tickets")
		if err == nil {
			unlock()
		}
		done <- err
	}()
	// s waits once its key is queued behind the holder's.
	cli := cluster.Client(t, "pool")
	queue := s.oauthKey(etcdOAuthLocks, "acme", "alice", "tickets") + "/"
	require.Eventually(t, func() bool {
		resp, err := cli.Get(ctx, queue, clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2
	}, 5*time.Second, 10*time.Millisecond, "the second holder waits")

	restart := cluster.Down(0)
	defer restart()
	err = <-done
	require.ErrorIs(t, err, etcdstore.ErrUnavailable)
	require.NotErrorIs(t, err, ErrLockHeld, "nobody could tell who held it")
	require.Contains(t, err.Error(), "store.etcd_endpoints", "names what to check")
}
