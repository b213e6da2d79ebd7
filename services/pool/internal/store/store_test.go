package store

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/boltdb"
)

// TestAVersion1FileKeepsItsRuns: a pool file from before run ids were scoped by tenant (runs
// keyed by id alone) opens with every run under its tenant and id, and the same id is then
// free in another tenant.
func TestAVersion1FileKeepsItsRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pool.db")
	db, err := boltdb.Open(path)
	require.NoError(t, err)
	require.NoError(t, boltdb.Migrate(db, [][]byte{runsBucket}, migrations[:1]))
	old := []Run{
		{ID: "nightly", Tenant: "acme", GraphID: "g", Version: 1, State: "paused", StartTime: time.Unix(1, 0).UTC()},
		{ID: "run-1", Tenant: "default", GraphID: "g", Version: 2, State: "completed", StartTime: time.Unix(2, 0).UTC()},
	}
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		for _, r := range old {
			v, err := json.Marshal(r)
			require.NoError(t, err)
			if err := tx.Bucket(runsBucket).Put([]byte(r.ID), v); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, db.Close())

	s, err := Open(path)
	require.NoError(t, err)
	defer s.Close()
	for _, want := range old {
		got, err := s.GetRun(t.Context(), want.Tenant, want.ID)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err = s.GetRun(t.Context(), "default", "nightly")
	require.ErrorIs(t, err, ErrNotFound, "acme's run is acme's alone")
	active, err := s.ActiveRuns(t.Context(), "")
	require.NoError(t, err)
	require.Equal(t, []Run{old[0]}, active)

	require.NoError(t, s.CreateRun(t.Context(), Run{ID: "nightly", Tenant: "default", State: "running"}))
	require.ErrorIs(t, s.CreateRun(t.Context(), Run{ID: "nightly", Tenant: "acme", State: "running"}), ErrExists)
}

// TestSelectionAndLoadedToolsAreKeptAndAnOlderBinaryRefusesTheFile: a run's selected servers
// and loaded tools are stored with it; a version-2 file opens with its runs unchanged, and once
// this version has written the file a binary that knows only version 2 refuses it rather than
// rewriting runs without them.
func TestSelectionAndLoadedToolsAreKeptAndAnOlderBinaryRefusesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pool.db")
	db, err := boltdb.Open(path)
	require.NoError(t, err)
	require.NoError(t, boltdb.Migrate(db, [][]byte{runsBucket}, migrations[:2]))
	old := Run{ID: "r1", Tenant: "default", GraphID: "g", Version: 1, State: "running", StartTime: time.Unix(1, 0).UTC()}
	v, err := json.Marshal(old)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error { return tx.Bucket(runsBucket).Put(runKey(old.Tenant, old.ID), v) }))
	require.NoError(t, db.Close())

	s, err := Open(path)
	require.NoError(t, err)
	got, err := s.GetRun(t.Context(), "default", "r1")
	require.NoError(t, err)
	require.Equal(t, old, got)
	r := Run{ID: "r2", Tenant: "default", GraphID: "g", Version: 1, State: "running", StartTime: time.Unix(2, 0).UTC(),
		SelectedServers: []string{"docs"}, LoadedTools: map[string][]string{"a": {"docs__read_file"}}}
	require.NoError(t, s.CreateRun(t.Context(), r))
	got, err = s.GetRun(t.Context(), "default", "r2")
	require.NoError(t, err)
	require.Equal(t, r, got)
	require.NoError(t, s.Close())

	db, err = boltdb.Open(path)
	require.NoError(t, err)
	defer db.Close()
	err = boltdb.Migrate(db, [][]byte{runsBucket}, migrations[:2])
	require.ErrorContains(t, err, "newer than this binary knows")
}
