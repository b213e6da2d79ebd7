package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// runStore is what the pool asks of its run records (pool.RunStore), for the behaviours below.
type runStore interface {
	CreateRun(ctx context.Context, r Run) error
	PutRun(ctx context.Context, r Run) error
	UpdateRun(ctx context.Context, tenant, id string, mutate func(*Run) error) (Run, error)
	GetRun(ctx context.Context, tenant, id string) (Run, error)
	ActiveRuns(ctx context.Context, host string) ([]Run, error)
}

var (
	_ runStore = (*Store)(nil)
	_ runStore = (*Etcd)(nil)
)

// runBackend opens a fresh run store; a second call on the same back end opens the same
// records again (another replica of it for etcd, the same file reopened for bbolt).
type runBackend struct {
	name string
	open func(t *testing.T) runStore
}

func runBackends(t *testing.T, cluster *etcdtest.Cluster) []runBackend {
	path := filepath.Join(t.TempDir(), "pool.db")
	root := cluster.Root()
	var mu sync.Mutex
	var bolt *Store
	return []runBackend{
		{name: "bbolt", open: func(t *testing.T) runStore {
			mu.Lock()
			defer mu.Unlock()
			if bolt == nil { // one process holds a bbolt file: replicas share the handle
				s, err := Open(path)
				require.NoError(t, err)
				t.Cleanup(func() { _ = s.Close() })
				bolt = s
			}
			return bolt
		}},
		{name: "etcd", open: func(t *testing.T) runStore {
			s, err := OpenEtcd(t.Context(), cluster.Client(t, "pool"), root)
			require.NoError(t, err)
			return s
		}},
	}
}

// runBehaviours is the one table every run store passes.
var runBehaviours = map[string]func(t *testing.T, b runBackend){
	"RunLifeCycle":                 testRunLifeCycle,
	"OnlyTheOwnerWrites":           testOnlyTheOwnerWrites,
	"ActiveRunsAreThoseOfOneHost":  testActiveRunsAreThoseOfOneHost,
	"ConcurrentUpdatesLoseNothing": testConcurrentUpdatesLoseNothing,
}

// TestRunStoreBehaviours runs the table against bbolt and against a three-member etcd cluster.
func TestRunStoreBehaviours(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	for name, test := range runBehaviours {
		for _, b := range runBackends(t, cluster) {
			t.Run(name+"/"+b.name, func(t *testing.T) { test(t, b) })
		}
	}
}

func testRunLifeCycle(t *testing.T, b runBackend) {
	s := b.open(t)
	ctx := t.Context()
	r := Run{ID: "r1", Tenant: "acme", GraphID: "g", Version: 2, State: "running", StartTime: time.Unix(1, 0).UTC(), Host: "h1",
		SelectedServers: []string{"docs"}, LoadedTools: map[string][]string{"a": {"docs__read"}}}
	require.NoError(t, s.CreateRun(ctx, r))
	require.ErrorIs(t, s.CreateRun(ctx, r), ErrExists)
	require.NoError(t, s.CreateRun(ctx, Run{ID: "r1", Tenant: "other", State: "running", Host: "h1"}), "a run id is unique within its tenant only")

	other := b.open(t)
	got, err := other.GetRun(ctx, "acme", "r1")
	require.NoError(t, err)
	require.Equal(t, r, got, "a run created through one handle is read through another")
	_, err = other.GetRun(ctx, "acme", "r2")
	require.ErrorIs(t, err, ErrNotFound)

	r.State, r.Calls = "paused", 3
	require.NoError(t, other.PutRun(ctx, r))
	got, err = s.GetRun(ctx, "acme", "r1")
	require.NoError(t, err)
	require.Equal(t, r, got)

	r.State, r.EndReason, r.EndTime = "completed", "ended by key:ci", time.Unix(5, 0).UTC()
	require.NoError(t, s.PutRun(ctx, r))
	require.ErrorIs(t, s.PutRun(ctx, r), ErrNotOwner, "an ended run is never written again")
	got, err = other.GetRun(ctx, "acme", "r1")
	require.NoError(t, err)
	require.Equal(t, r, got)
}

func testOnlyTheOwnerWrites(t *testing.T, b runBackend) {
	s := b.open(t)
	ctx := t.Context()
	r := Run{ID: "owned", Tenant: "acme", State: "running", Host: "h1"}
	require.NoError(t, s.CreateRun(ctx, r))

	// Host h2 fails the run for h1, whose lease expired.
	lost, err := b.open(t).UpdateRun(ctx, "acme", "owned", func(cur *Run) error {
		cur.State, cur.EndReason, cur.HostLost, cur.Host = "failed", "host h1 lost", cur.Host, ""
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "h1", lost.HostLost)

	r.Calls = 9
	err = s.PutRun(ctx, r)
	require.ErrorIs(t, err, ErrNotOwner, "h1 came back, but the run is no longer its own")
	require.ErrorContains(t, err, "failed")
	got, err := s.GetRun(ctx, "acme", "owned")
	require.NoError(t, err)
	require.Equal(t, lost, got)

	// A mutate that refuses stores nothing.
	refused := errors.New("no")
	_, err = s.UpdateRun(ctx, "acme", "owned", func(cur *Run) error { cur.State = "running"; return refused })
	require.ErrorIs(t, err, refused)
	got, err = s.GetRun(ctx, "acme", "owned")
	require.NoError(t, err)
	require.Equal(t, lost, got)
	_, err = s.UpdateRun(ctx, "acme", "nobody", func(*Run) error { return nil })
	require.ErrorIs(t, err, ErrNotFound)
}

func testActiveRunsAreThoseOfOneHost(t *testing.T, b runBackend) {
	s := b.open(t)
	ctx := t.Context()
	for _, r := range []Run{
		{ID: "a1", Tenant: "t", State: "running", Host: "ha"},
		{ID: "a2", Tenant: "t", State: "paused", Host: "ha"},
		{ID: "a3", Tenant: "t", State: "completed", Host: "ha"},
		{ID: "b1", Tenant: "t", State: "running", Host: "hb"},
	} {
		require.NoError(t, s.CreateRun(ctx, r))
	}
	ids := func(host string) []string {
		runs, err := b.open(t).ActiveRuns(ctx, host)
		require.NoError(t, err)
		var out []string
		for _, r := range runs {
			out = append(out, r.ID)
		}
		return out
	}
	require.ElementsMatch(t, []string{"a1", "a2"}, ids("ha"))
	require.Equal(t, []string{"b1"}, ids("hb"))

	// a1 ends, and b1 moves to ha (ResumeRun re-homed it): each host's list follows.
	_, err := s.UpdateRun(ctx, "t", "a1", func(r *Run) error { r.State = "completed"; return nil })
	require.NoError(t, err)
	_, err = s.UpdateRun(ctx, "t", "b1", func(r *Run) error { r.Host = "ha"; return nil })
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a2", "b1"}, ids("ha"))
	require.Empty(t, ids("hb"))
}

func testConcurrentUpdatesLoseNothing(t *testing.T, b runBackend) {
	ctx := t.Context()
	require.NoError(t, b.open(t).CreateRun(ctx, Run{ID: "busy", Tenant: "t", State: "running", Host: "h"}))
	const writers, each = 4, 5
	var wg sync.WaitGroup
	for w := range writers {
		s := b.open(t)
		wg.Go(func() {
			for i := range each {
				_, err := s.UpdateRun(ctx, "t", "busy", func(r *Run) error {
					if r.LoadedTools == nil {
						r.LoadedTools = map[string][]string{}
					}
					agent := fmt.Sprintf("w%d", w)
					r.LoadedTools[agent] = append(r.LoadedTools[agent], fmt.Sprint(i))
					r.Calls++
					return nil
				})
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	got, err := b.open(t).GetRun(ctx, "t", "busy")
	require.NoError(t, err)
	require.EqualValues(t, writers*each, got.Calls, "every update read the one before it")
	for w := range writers {
		require.Len(t, got.LoadedTools[fmt.Sprintf("w%d", w)], each)
	}
}
