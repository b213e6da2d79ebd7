package store

import (
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/boltdb"
)

// Buckets of the publisher file. Keys are "<tenant>/<graph id>" (both ^[a-z0-9_-]{1,64}$, so
// "/" cannot occur inside them); version keys append "/" and the version as 8 big-endian bytes,
// so a graph's versions sort by number.
var (
	// graphsBucket: tenant/id -> meta JSON (revision, latest version, counts). A deleted graph
	// leaves a tombstone here, so a graph re-created under its id never reuses a version number
	// or a draft revision.
	graphsBucket = []byte("graphs")
	// draftsBucket: tenant/id -> graph.Graph (gob).
	draftsBucket = []byte("drafts")
	// versionsBucket: tenant/id/<version> -> graph.Version (gob). Written once, never updated.
	versionsBucket = []byte("versions")
	// versionInfoBucket: tenant/id/<version> -> graph.Version JSON without the graph, so
	// listing versions does not decode every snapshot.
	versionInfoBucket = []byte("version_info")
	// OutboxBucket holds audit records waiting to be forwarded; written in the same
	// transactions as the changes they record.
	OutboxBucket = []byte("audit_outbox")
)

var allBuckets = [][]byte{graphsBucket, draftsBucket, versionsBucket, versionInfoBucket, OutboxBucket}

// migrations[i] brings the file to schema version i+1.
var migrations = []boltdb.Migration{
	func(*bolt.Tx) error { return nil }, // v1: the buckets above
}
