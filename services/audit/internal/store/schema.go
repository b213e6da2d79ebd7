package store

import (
	"bytes"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// schemaVersion is the layout this binary writes. Bump it with a step in Migrate.
const schemaVersion = 2

// Buckets, declared once. Layout of version 2:
//
//	meta           schema_version -> uint64 BE; head -> seq (8 BE) || hash (32)
//	records        seq (8 BE) -> hash (32) || body (deterministic JSON with seq and prev_hash)
//	by_id          record id -> seq (8 BE) || digest (16) of the record as appended
//	by_tenant      len (2 BE) || tenant || seq (8 BE) -> empty
//	by_run         len (2 BE) || run id || seq (8 BE) -> empty
//	by_tenant_run  len (2 BE) || len (2 BE) || tenant || run id || seq (8 BE) -> empty (v2)
//
// by_tenant_run serves a run of one tenant: run ids are unique within a tenant only, and a
// read of acme's "nightly" through by_run would examine globex's "nightly" as well (its
// budget spent on them, its page token naming them).
var (
	bucketMeta        = []byte("meta")
	bucketRecords     = []byte("records")
	bucketByID        = []byte("by_id")
	bucketByTenant    = []byte("by_tenant")
	bucketByRun       = []byte("by_run")
	bucketByTenantRun = []byte("by_tenant_run")

	keySchemaVersion = []byte("schema_version")
	keyHead          = []byte("head")
)

var allBuckets = [][]byte{bucketMeta, bucketRecords, bucketByID, bucketByTenant, bucketByRun, bucketByTenantRun}

// migrateChunk bounds the records one transaction of the version 1 to 2 step indexes, so a
// long log's upgrade never holds its whole new index in one transaction's memory (a
// variable for tests).
var migrateChunk = 100_000

// Migrate brings the file to schemaVersion: it creates the buckets of a new file and
// refuses a file written by a newer binary, whose layout this one cannot know. A version 1
// file gets by_tenant_run and its records indexed there, migrateChunk records a transaction,
// and only then version 2: a start cut short leaves it at version 1 (an older binary still
// opens it), and the next start indexes it again (a put of an entry it holds changes nothing).
func Migrate(db *bolt.DB) error {
	var have uint64
	err := db.Update(func(tx *bolt.Tx) error {
		var err error
		have, err = migrateBuckets(tx)
		return err
	})
	if err != nil || have != 1 {
		return err
	}
	if err := indexTenantRuns(db); err != nil {
		return err
	}
	return db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, binary.BigEndian.AppendUint64(nil, schemaVersion))
	})
}

// migrateBuckets checks the file's schema version and creates the buckets it lacks; a new
// file is then at schemaVersion. It returns the version the file had.
func migrateBuckets(tx *bolt.Tx) (uint64, error) {
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return 0, fmt.Errorf("audit: create meta bucket: %w", err)
	}
	var have uint64
	if v := meta.Get(keySchemaVersion); v != nil {
		if len(v) != 8 {
			return 0, fmt.Errorf("audit: schema version key is %d bytes, want 8", len(v))
		}
		have = binary.BigEndian.Uint64(v)
	}
	if have > schemaVersion {
		return have, fmt.Errorf("audit: file has schema version %d, this binary knows up to %d", have, schemaVersion)
	}
	if have == schemaVersion {
		for _, name := range allBuckets {
			if tx.Bucket(name) == nil {
				return have, fmt.Errorf("audit: schema version %d file lacks bucket %q", have, name)
			}
		}
		return have, nil
	}
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return have, fmt.Errorf("audit: create bucket %q: %w", name, err)
		}
	}
	if have == 0 { // a new file: nothing to index
		return have, meta.Put(keySchemaVersion, binary.BigEndian.AppendUint64(nil, schemaVersion))
	}
	return have, nil
}

// indexTenantRuns fills by_tenant_run from the records of a version 1 file, migrateChunk
// records a transaction. A record whose body cannot be read is left out: Verify names it,
// and the index check with it.
func indexTenantRuns(db *bolt.DB) error {
	var last []byte // the key the previous transaction ended at
	for done := false; !done; {
		err := db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketByTenantRun)
			cur := tx.Bucket(bucketRecords).Cursor()
			k, v := cur.First()
			if last != nil {
				if k, v = cur.Seek(last); bytes.Equal(k, last) {
					k, v = cur.Next()
				}
			}
			var at []byte
			for n := 0; k != nil && n < migrateChunk; k, v = cur.Next() {
				n, at = n+1, k
				if len(k) != 8 || len(v) < hashLen {
					continue
				}
				f, ok := indexedFields(v[hashLen:])
				if !ok {
					continue
				}
				seq := binary.BigEndian.Uint64(k)
				// requiredKey copies: f points into the file, which bbolt may move as it writes.
				if key, ok := requiredKey(nil, ixByTenantRun, f, seq); ok {
					if err := b.Put(key, noValue); err != nil {
						return fmt.Errorf("audit: index record %d by tenant and run: %w", seq, err)
					}
				}
			}
			last, done = bytes.Clone(at), k == nil
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
