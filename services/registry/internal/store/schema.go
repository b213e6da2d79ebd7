package store

import (
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/boltdb"
)

// Buckets of the registry file.
var (
	// serversBucket: ref -> storedServer JSON.
	serversBucket = []byte("servers")
	// secretsBucket: name -> storedSecret JSON (value sealed).
	secretsBucket = []byte("secrets")
	// keysBucket: key id -> Key JSON (hash only, never the key).
	keysBucket = []byte("keys")
	// OutboxBucket holds audit records waiting to be forwarded; written in the same
	// transactions as the changes they record.
	OutboxBucket = []byte("audit_outbox")
)

var allBuckets = [][]byte{serversBucket, secretsBucket, keysBucket, OutboxBucket}

// migrations[i] brings the file to schema version i+1.
var migrations = []boltdb.Migration{
	func(*bolt.Tx) error { return nil }, // v1: the buckets above
}
