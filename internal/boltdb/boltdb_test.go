package boltdb

import (
	"bytes"
	"fmt"
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

// TestOpenRefusesADamagedFile: a file cut short, emptied, or with a damaged page that only a
// walk over the file reaches is refused at open with its name and the fix, never a panic,
// and never silently opened as a new store; the file is left as it was.
func TestOpenRefusesADamagedFile(t *testing.T) {
	// written is a closed file with enough keys in bucket b for several leaf pages, and the
	// id of one of them, which opening and migrating the file never read.
	written := func(t *testing.T) (string, int) {
		path := filepath.Join(t.TempDir(), "x.db")
		db, err := Open(path)
		require.NoError(t, err)
		require.NoError(t, db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket([]byte("b"))
			if err != nil {
				return err
			}
			for i := range 2000 {
				if err := b.Put([]byte(fmt.Sprintf("key-%05d", i)), bytes.Repeat([]byte{'v'}, 64)); err != nil {
					return err
				}
			}
			return nil
		}))
		leaf := -1
		require.NoError(t, db.View(func(tx *bolt.Tx) error {
			for id := 2; leaf < 0; id++ {
				info, err := tx.Page(id)
				if err != nil || info == nil {
					return fmt.Errorf("no leaf page below %d: %v", id, err)
				}
				if info.Type == "leaf" {
					leaf = id
				}
			}
			return nil
		}))
		require.NoError(t, db.Close())
		return path, leaf
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string, leaf int)
		want   string
	}{
		{"emptied", func(t *testing.T, path string, _ int) { require.NoError(t, os.Truncate(path, 0)) },
			"is empty (0 bytes), which no crash leaves: it was truncated; restore it from a backup"},
		{"cut short", func(t *testing.T, path string, _ int) { require.NoError(t, os.Truncate(path, 4096)) },
			"is damaged (file size too small 4096): "},
		{"meta pages overwritten", func(t *testing.T, path string, _ int) { overwrite(t, path, 0, 2*os.Getpagesize()) },
			"is damaged (invalid database): "},
		{"a leaf page overwritten", func(t *testing.T, path string, leaf int) { overwrite(t, path, leaf*os.Getpagesize(), os.Getpagesize()) },
			"is damaged (panic: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, leaf := written(t)
			tc.damage(t, path, leaf)
			before, err := os.ReadFile(path)
			require.NoError(t, err)
			db, err := Open(path)
			if db != nil {
				db.Close()
			}
			require.ErrorContains(t, err, path+" "+tc.want)
			require.ErrorContains(t, err, "docs/operations.md#backups")
			after, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, before, after, "a damaged file is left as it was")
		})
	}
}

// TestOpenCreatesAWholeFile: a new file appears only once bbolt has written its first pages
// (so an empty one is always damage), and a leftover from a crash during creation is replaced.
func TestOpenCreatesAWholeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	require.NoError(t, os.WriteFile(path+".new", []byte("left by a crash"), 0o600))
	db, err := Open(path)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Positive(t, st.Size())
	_, err = os.Stat(path + ".new")
	require.ErrorIs(t, err, os.ErrNotExist)
}

// overwrite fills n bytes of the file at path from off with 0xA5.
func overwrite(t *testing.T, path string, off, n int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{0xA5}, n), int64(off))
	require.NoError(t, err)
	require.NoError(t, f.Close())
}
