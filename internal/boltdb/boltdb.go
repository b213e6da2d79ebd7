// Package boltdb opens the bbolt files every service keeps in its data directory and runs
// their schema migrations, so each store declares only its buckets and its steps.
package boltdb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Open opens (creating if needed) the bbolt file at path with mode 0600 and checks every page
// of it (bbolt's Tx.Check): a damaged page found later would panic the server in the middle of
// a request, so a damaged file is refused at start, named, with the fix. A file held by another
// process is reported as such instead of blocking forever.
func Open(path string) (*bolt.DB, error) {
	db, err := OpenUnchecked(path, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, err
	}
	err = Guard(path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			// The check runs in a goroutine of its own that reads the transaction until it
			// closes the channel: drain it before the transaction ends.
			var first error
			for err := range tx.Check() {
				if first == nil {
					first = err // the first damage is enough to name the file
				}
			}
			return first
		})
	})
	if err != nil {
		_ = db.Close() // the damage is the error to report
		var d *DamagedError
		if !errors.As(err, &d) {
			err = &DamagedError{Path: path, Err: err}
		}
		return nil, err
	}
	return db, nil
}

// OpenUnchecked is Open with opts and without the walk over every page: for a file too large
// to read whole at every start (the audit log, whose chain `ringfence audit verify` walks).
// Damage that bbolt finds while opening is still refused, as a DamagedError.
func OpenUnchecked(path string, opts *bolt.Options) (*bolt.DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("boltdb: create data directory: %w", err)
	}
	if err := create(path); err != nil {
		return nil, err
	}
	var db *bolt.DB
	err := Guard(path, func() (err error) {
		db, err = bolt.Open(path, 0o600, opts)
		return err
	})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, fmt.Errorf("boltdb: %s is locked by another process (a server still running on the same data directory?): stop it, or give this one its own data_dir (RINGFENCE_DATA_DIR)", path)
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrChecksum), errors.Is(err, bolterrors.ErrVersionMismatch),
		err != nil && strings.HasPrefix(err.Error(), "file size too small"):
		return nil, &DamagedError{Path: path, Err: err}
	case err != nil:
		var d *DamagedError
		if errors.As(err, &d) {
			return nil, err
		}
		return nil, fmt.Errorf("boltdb: open %s: %w", path, err)
	}
	return db, nil
}

// DamagedError is a bbolt file that cannot be read as one: its pages or meta pages are damaged,
// or it was cut short. The server refuses to start rather than start empty or panic later.
type DamagedError struct {
	Path string
	Err  error
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("boltdb: %s is damaged (%v): stop every server on this data directory, keep the file aside for investigation and restore the data directory from a backup (docs/operations.md#backups); nothing was written to it", e.Path, e.Err)
}

func (e *DamagedError) Unwrap() error { return e.Err }

// Guard runs fn, which reads the file at path through bbolt, and turns a panic into a
// DamagedError: bbolt panics on a page that is not what its parent says (a damaged file),
// and a server must refuse such a file with its name, not crash with a stack trace.
func Guard(path string, fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &DamagedError{Path: path, Err: fmt.Errorf("%v", r)}
		}
	}()
	return fn()
}

// create makes a missing file at path whole or not at all: bbolt writes the first pages of a
// file it finds empty, so a crash between creating the file and writing them would leave an
// empty file that the next start took for a new store. Built aside and renamed into place, a
// new file is never empty, and so an empty file at path is one that was truncated: it is
// refused instead of silently starting with nothing.
func create(path string) error {
	st, err := os.Stat(path)
	switch {
	case err == nil && st.Size() == 0:
		return fmt.Errorf("boltdb: %s is empty (0 bytes), which no crash leaves: it was truncated; restore it from a backup (docs/operations.md#backups), or remove it to start this store empty", path)
	case err == nil:
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("boltdb: %w", err)
	}
	tmp := path + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("boltdb: create %s: %w", path, err)
	}
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return fmt.Errorf("boltdb: create %s: %w", path, err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("boltdb: create %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("boltdb: create %s: %w", path, err)
	}
	return syncDir(path)
}

// SetAside renames the file at path to path+suffix, kept but no longer used, and syncs the
// directory so the new name survives a crash. A file already under that name (set aside
// before) is kept too: the new one then takes path+suffix+"-<UTC time>". It returns the new
// name.
func SetAside(path, suffix string) (string, error) {
	to := path + suffix
	if _, err := os.Lstat(to); err == nil {
		to += "-" + time.Now().UTC().Format("20060102T150405.000000000Z")
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("boltdb: %w", err)
	}
	if err := os.Rename(path, to); err != nil {
		return "", fmt.Errorf("boltdb: %w", err)
	}
	return to, syncDir(to)
}

// syncDir makes a rename into path's directory survive a crash.
func syncDir(path string) error {
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("boltdb: %w", err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("boltdb: sync %s: %w", filepath.Dir(path), err)
	}
	return nil
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
	_ = syncDir(path) // best effort: the file is whole either way
	return Open(path)
}
