package store

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// schemaVersion is the layout this binary writes. Bump it with a step in Migrate.
const schemaVersion = 1

// Buckets, declared once. Layout of version 1:
//
//	meta       schema_version -> uint64 BE; head -> seq (8 BE) || hash (32)
//	records    seq (8 BE) -> hash (32) || body (deterministic JSON with seq and prev_hash)
//	by_id      record id -> seq (8 BE) || digest (16) of the record as appended
//	by_tenant  len (2 BE) || tenant || seq (8 BE) -> empty
//	by_run     len (2 BE) || run id || seq (8 BE) -> empty
var (
	bucketMeta     = []byte("meta")
	bucketRecords  = []byte("records")
	bucketByID     = []byte("by_id")
	bucketByTenant = []byte("by_tenant")
	bucketByRun    = []byte("by_run")

	keySchemaVersion = []byte("schema_version")
	keyHead          = []byte("head")
)

var allBuckets = [][]byte{bucketMeta, bucketRecords, bucketByID, bucketByTenant, bucketByRun}

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
	// Version 0 (a new file) to 1: create the buckets.
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("audit: create bucket %q: %w", name, err)
		}
	}
	return meta.Put(keySchemaVersion, binary.BigEndian.AppendUint64(nil, schemaVersion))
}
