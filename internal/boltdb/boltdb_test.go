package boltdb

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

func TestMigrateRunsOnceAndRefusesNewerFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	db, err := Open(path)
	require.NoError(t, err)
	runs := 0
	step := func(*bolt.Tx) error { runs++; return nil }
	require.NoError(t, Migrate(db, [][]byte{[]byte("a")}, []Migration{step, step}))
	require.Equal(t, 2, runs)
	require.NoError(t, Migrate(db, [][]byte{[]byte("a")}, []Migration{step, step}))
	require.Equal(t, 2, runs, "applied migrations do not run again")
	err = Migrate(db, nil, []Migration{step})
	require.ErrorContains(t, err, "newer than this binary knows")
	require.NoError(t, db.Close())
}

func TestOpenReportsALockedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	db, err := Open(path)
	require.NoError(t, err)
	defer db.Close()
	_, err = Open(path)
	require.ErrorContains(t, err, "locked by another process")
}
