// Package boltdb opens the bbolt files every service keeps in its data directory and runs
// their schema migrations, so each store declares only its buckets and its steps.
package boltdb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Open opens (creating if needed) the bbolt file at path with mode 0600. A file held by another
// process is reported as such instead of blocking forever.
func Open(path string) (*bolt.DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("boltdb: create data directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("boltdb: %s is locked by another process (a server still running on the same data directory?): stop it, or give this one its own data_dir (RINGFENCE_DATA_DIR)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("boltdb: open %s: %w", path, err)
	}
	return db, nil
}

var (
	metaBucket = []byte("meta")
	versionKey = []byte("schema_version")
)

// Migration moves a store from version-1 to its version.
type Migration func(tx *bolt.Tx) error

// Migrate creates buckets and runs every migration past the stored schema version, in one
// transaction. migrations[i] brings the schema to version i+1. A file written by a newer
// version is refused rather than misread.
func Migrate(db *bolt.DB, buckets [][]byte, migrations []Migration) error {
	return db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		for _, b := range buckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("boltdb: create bucket %s: %w", b, err)
			}
		}
		var current uint64
		if v := meta.Get(versionKey); len(v) == 8 {
			current = binary.BigEndian.Uint64(v)
		}
		if current > uint64(len(migrations)) {
			return fmt.Errorf("boltdb: %s has schema version %d, newer than this binary knows (%d): run a newer ringfence", tx.DB().Path(), current, len(migrations))
		}
		for v := current; v < uint64(len(migrations)); v++ {
			if err := migrations[v](tx); err != nil {
				return fmt.Errorf("boltdb: migrate to schema version %d: %w", v+1, err)
			}
		}
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], uint64(len(migrations)))
		return meta.Put(versionKey, buf[:])
	})
}

// scrubKey in the meta bucket marks a file whose free pages may still hold data a migration
// replaced (bbolt never overwrites a freed page until it reuses it).
var scrubKey = []byte("scrub_pending")

// RequestScrub marks the file, inside a migration's transaction, for ScrubIfRequested: the
// migration replaced values that must not survive in the file's free pages (plaintext it
// sealed). The mark commits with the migration, so a crash before the scrub retries it.
func RequestScrub(tx *bolt.Tx) error {
	return tx.Bucket(metaBucket).Put(scrubKey, []byte{1})
}

// ScrubIfRequested rewrites a file marked by RequestScrub with only its live data (bbolt's
// Compact into a new file, which then replaces the old one), so what a migration replaced is
// gone from the disk file rather than only unreachable. db is closed and the reopened file
// returned; without a mark db is returned as it is.
func ScrubIfRequested(db *bolt.DB) (*bolt.DB, error) {
	var marked bool
	if err := db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(metaBucket); meta != nil {
			marked = meta.Get(scrubKey) != nil
		}
		return nil
	}); err != nil || !marked {
		return db, err
	}
	path := db.Path()
	tmp := path + ".scrub"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return db, fmt.Errorf("boltdb: scrub %s: %w", path, err)
	}
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return db, fmt.Errorf("boltdb: scrub %s: %w", path, err)
	}
	err = bolt.Compact(dst, db, 64<<20)
	if err == nil {
		err = dst.Update(func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Delete(scrubKey) })
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return db, fmt.Errorf("boltdb: scrub %s: %w", path, err)
	}
	if err := db.Close(); err != nil {
		return nil, fmt.Errorf("boltdb: scrub %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("boltdb: scrub %s: %w", path, err)
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		_ = dir.Sync() // the rename survives a crash
		dir.Close()
	}
	return Open(path)
}
