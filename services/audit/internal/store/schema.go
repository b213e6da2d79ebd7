package store

import (
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

// Migrate brings the file in tx to schemaVersion: it creates the buckets of a new file
// and refuses a file written by a newer binary, whose layout this one cannot know.
func Migrate(tx *bolt.Tx) error {
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return fmt.Errorf("audit: create meta bucket: %w", err)
	}
	var have uint64
	if v := meta.Get(keySchemaVersion); v != nil {
		if len(v) != 8 {
			return fmt.Errorf("audit: schema version key is %d bytes, want 8", len(v))
		}
		have = binary.BigEndian.Uint64(v)
	}
	if have > schemaVersion {
		return fmt.Errorf("audit: file has schema version %d, this binary knows up to %d", have, schemaVersion)
	}
	if have == schemaVersion {
		for _, name := range allBuckets {
			if tx.Bucket(name) == nil {
				return fmt.Errorf("audit: schema version %d file lacks bucket %q", have, name)
			}
		}
		return nil
	}
	// Version 0 (a new file) to 2: create the buckets. Version 1 to 2: create by_tenant_run
	// and index the records the file holds in it.
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("audit: create bucket %q: %w", name, err)
		}
	}
	if have == 1 {
		if err := indexTenantRuns(tx); err != nil {
			return err
		}
	}
	return meta.Put(keySchemaVersion, binary.BigEndian.AppendUint64(nil, schemaVersion))
}

// indexTenantRuns fills by_tenant_run from the records of a version 1 file. A record whose
// body cannot be read is left out: Verify names it, and the index check with it.
func indexTenantRuns(tx *bolt.Tx) error {
	b := tx.Bucket(bucketByTenantRun)
	cur := tx.Bucket(bucketRecords).Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.Next() {
		if len(k) != 8 || len(v) < hashLen {
			continue
		}
		f, ok := indexedFields(v[hashLen:])
		if !ok {
			continue
		}
		// requiredKey copies: f points into the file, which bbolt may move as it writes.
		if key, ok := requiredKey(nil, ixByTenantRun, f, binary.BigEndian.Uint64(k)); ok {
			if err := b.Put(key, noValue); err != nil {
				return fmt.Errorf("audit: index record %d by tenant and run: %w", binary.BigEndian.Uint64(k), err)
			}
		}
	}
	return nil
}
