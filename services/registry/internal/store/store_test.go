package store

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
)

func openStore(t *testing.T) *Store {
	t.Helper()
	box, err := secretbox.New(make([]byte, 32))
	require.NoError(t, err)
	s, err := Open(filepath.Join(t.TempDir(), "registry.db"), box)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestCacheFollowsTheFileWhenWritesFinishOutOfOrder: writes commit in order but return
// in any order. Here the first update commits and then stalls (in a commit handler, after
// bbolt has released the file) while a second update commits and returns; reads must then
// answer the second, also after the first returns. A cache updated after each commit
// ended on the first: the pool enforced grants the stored registration no longer had, and
// an update carrying the read revision was refused forever.
func TestCacheFollowsTheFileWhenWritesFinishOutOfOrder(t *testing.T) {
	s := openStore(t)
	ctx := t.Context()
	require.NoError(t, s.CreateServer(ctx, &mcpserver.Registration{Ref: "docs", Transport: "stdio", Command: "x"}, nil))
	grant := func(g string) func(*mcpserver.Registration) (*mcpserver.Registration, error) {
		return func(cur *mcpserver.Registration) (*mcpserver.Registration, error) {
			next := *cur
			next.Grants = []string{g}
			return &next, nil
		}
	}

	committed, resume := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := s.UpdateServer(ctx, "docs", grant("first"), func(tx *bolt.Tx, _, _ *mcpserver.Registration) error {
			tx.OnCommit(func() {
				close(committed)
				<-resume
			})
			return nil
		})
		first <- err
	}()
	<-committed
	_, err := s.UpdateServer(ctx, "docs", grant("second"), nil)
	require.NoError(t, err)
	close(resume)
	require.NoError(t, <-first)

	p, err := s.ServerPolicy(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, []string{"second"}, p.Grants)
	require.Equal(t, int64(3), p.Revision)

	require.NoError(t, s.DeleteServer(ctx, "docs", nil))
	_, err = s.ServerPolicy(ctx, "docs")
	require.ErrorIs(t, err, ErrNotFound)
}
