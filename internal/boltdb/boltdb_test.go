package boltdb

import (
	"os"
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

// TestScrubRemovesWhatAMigrationReplaced: bbolt leaves a replaced value in a free page of
// the file; a migration that asks for a scrub leaves no trace of it on disk, and the mark
// goes with the scrub.
func TestScrubRemovesWhatAMigrationReplaced(t *testing.T) {
	const canary = "canary-plaintext-31c7"
	path := filepath.Join(t.TempDir(), "x.db")
	db, err := Open(path)
	require.NoError(t, err)
	bucket := []byte("a")
	write := func(v string) func(tx *bolt.Tx) error {
		return func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte("k"), []byte(v)) }
	}
	require.NoError(t, Migrate(db, [][]byte{bucket}, []Migration{write(canary)}))

	replace := func(tx *bolt.Tx) error {
		if err := write("sealed")(tx); err != nil {
			return err
		}
		return RequestScrub(tx)
	}
	require.NoError(t, Migrate(db, [][]byte{bucket}, []Migration{write(canary), replace}))
	require.NoError(t, db.Sync())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(raw), canary, "without a scrub the replaced value is still in the file")

	db, err = ScrubIfRequested(db)
	require.NoError(t, err)
	raw, err = os.ReadFile(path)
	require.NoError(t, err)
	require.NotContains(t, string(raw), canary)
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		require.Equal(t, "sealed", string(tx.Bucket(bucket).Get([]byte("k"))))
		require.Nil(t, tx.Bucket(metaBucket).Get(scrubKey), "the mark is gone")
		return nil
	}))
	same, err := ScrubIfRequested(db)
	require.NoError(t, err)
	require.Same(t, db, same, "an unmarked file is left alone")
	require.NoError(t, db.Close())
}
