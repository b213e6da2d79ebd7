package store

import (
	"bytes"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/boltdb"
	"github.com/ringfence/ringfence/internal/secretbox"
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

// migrations[i] brings the file to schema version i+1; box seals what a step must seal.
func migrations(box *secretbox.Box) []boltdb.Migration {
	return []boltdb.Migration{
		func(*bolt.Tx) error { return nil }, // v1: the buckets above
		func(tx *bolt.Tx) error { return sealURLs(tx, box) },
	}
}

// sealURLs is v2: a remote server's URL is sealed like its env values (its query may carry
// a credential), with its masked form beside it for responses. The plaintext leaves the
// file's free pages too: the step asks for a scrub.
func sealURLs(tx *bolt.Tx, box *secretbox.Box) error {
	b := tx.Bucket(serversBucket)
	type update struct {
		key, val []byte
	}
	var updates []update
	err := b.ForEach(func(k, v []byte) error {
		var st storedServer
		if err := json.Unmarshal(v, &st); err != nil {
			return fmt.Errorf("decode server %s: %w", k, err)
		}
		if st.URL == "" {
			return nil
		}
		st.sealURL(box, st.URL)
		val, err := json.Marshal(&st)
		if err != nil {
			return err
		}
		updates = append(updates, update{bytes.Clone(k), val})
		return nil
	})
	if err != nil {
		return err
	}
	for _, u := range updates { // not inside ForEach: bbolt forbids changing a bucket it iterates
		if err := b.Put(u.key, u.val); err != nil {
			return err
		}
	}
	if len(updates) == 0 {
		return nil
	}
	return boltdb.RequestScrub(tx)
}
