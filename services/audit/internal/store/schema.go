package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// schemaVersion is the layout this binary writes. Bump it with a step in migrationSteps.
const schemaVersion = 3

// Buckets, declared once. Layout of version 3:
//
//	meta            schema_version -> uint64 BE; head -> seq (8 BE) || hash (32)
//	records         seq (8 BE) -> hash (32) || body (deterministic JSON with seq and prev_hash)
//	by_id           record id -> seq (8 BE) || digest (16) of the record as appended
//	by_tenant       len (2 BE) || tenant || seq (8 BE) -> empty
//	by_run          len (2 BE) || run id || seq (8 BE) -> empty
//	by_tenant_run   len (2 BE) || len (2 BE) || tenant || run id || seq (8 BE) -> empty (v2)
//	by_call         epoch (4 BE) || len (2 BE) || call id || seq (8 BE) -> empty (v3)
//	by_tenant_call  epoch (4 BE) || len (2 BE) || len (2 BE) || tenant || call id || seq (8 BE) -> empty (v3)
//
// where epoch is seq >> callEpochShift (4,096 records an epoch: see callEpochShift).
//
// by_tenant_run serves a run of one tenant: run ids are unique within a tenant only, and a
// read of acme's "nightly" through by_run would examine globex's "nightly" as well (its
// budget spent on them, its page token naming them). by_call and by_tenant_call are the same
// pair for a call id (the caller's choice, so no more unique): a tool-call record has an entry
// under its tool_call.call_id and, when set and different, under its
// tool_call.approval.dispatched_call_id (the retry handed the call's approved outcome), the
// two ids a call filter matches; a record without a call id has none.
var (
	bucketMeta         = []byte("meta")
	bucketRecords      = []byte("records")
	bucketByID         = []byte("by_id")
	bucketByTenant     = []byte("by_tenant")
	bucketByRun        = []byte("by_run")
	bucketByTenantRun  = []byte("by_tenant_run")
	bucketByCall       = []byte("by_call")
	bucketByTenantCall = []byte("by_tenant_call")

	keySchemaVersion = []byte("schema_version")
	keyHead          = []byte("head")
)

var allBuckets = [][]byte{bucketMeta, bucketRecords, bucketByID, bucketByTenant, bucketByRun, bucketByTenantRun, bucketByCall, bucketByTenantCall}

// migrationSteps[v] are the indexes a version v file lacks that version v+1 has: the step
// fills them from the records, then marks the file v+1.
var migrationSteps = map[uint64][]int{
	1: {ixByTenantRun},
	2: {ixByCall, ixByTenantCall},
}

// migrateChunk bounds the records one transaction of a migration step indexes, so a long
// log's upgrade never holds its whole new index in one transaction's memory (a variable for
// tests).
var migrateChunk = 100_000

// Migrate brings the file to schemaVersion: it creates the buckets of a new file and
// refuses a file written by a newer binary, whose layout this one cannot know. An older file
// is brought up one version at a time (1 to 2 to 3): each step indexes its records in the
// indexes the next version adds, migrateChunk records a transaction, and only then marks the
// file with that version. A start cut short leaves the file at the version it had (which the
// binary that wrote it still opens), and the next start indexes it again (a put of an entry
// it holds changes nothing).
func Migrate(db *bolt.DB) error {
	var have uint64
	err := db.Update(func(tx *bolt.Tx) error {
		var err error
		have, err = migrateBuckets(tx)
		return err
	})
	if err != nil || have == 0 {
		return err
	}
	for v := have; v < schemaVersion; v++ {
		if err := indexRecords(db, migrationSteps[v]); err != nil {
			return fmt.Errorf("audit: upgrade the log from schema version %d to %d: %w", v, v+1, err)
		}
		err := db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(keySchemaVersion, binary.BigEndian.AppendUint64(nil, v+1))
		})
		if err != nil {
			return err
		}
	}
	return nil
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

// indexRecords fills indexes ixs from the records of the file, migrateChunk records a
// transaction. A record whose body cannot be read is left out: Verify names it, and the
// index check with it. Each transaction's keys are put in key order: bbolt splits a node only
// at the commit, and keys in seq order interleave the tenants of by_tenant_run and
// by_tenant_call, so each put moved every key after it in a node that grew to the chunk's
// size (4.7 s for 100,000 records, against 0.3 s sorted).
func indexRecords(db *bolt.DB, ixs []int) error {
	var last []byte // the key the previous transaction ended at
	keys := make([][][]byte, len(ixs))
	for done := false; !done; {
		for i := range keys {
			keys[i] = keys[i][:0]
		}
		err := db.Update(func(tx *bolt.Tx) error {
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
				for i, ix := range ixs {
					for nth := range maxKeysPerIndex {
						// requiredKey copies: f points into the file, which bbolt may move as it writes.
						if key, ok := requiredKey(nil, ix, f, seq, nth); ok {
							keys[i] = append(keys[i], key)
						}
					}
				}
			}
			last, done = bytes.Clone(at), k == nil
			for i, ix := range ixs {
				slices.SortFunc(keys[i], bytes.Compare)
				b := tx.Bucket(indexBuckets[ix])
				for _, key := range keys[i] {
					if err := b.Put(key, noValue); err != nil {
						return fmt.Errorf("audit: index record %d by %s: %w", binary.BigEndian.Uint64(key[len(key)-8:]), indexSubject[ix], err)
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
