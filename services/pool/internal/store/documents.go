package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Document is a stored document's metadata.
type Document struct {
	ID         string    `json:"id"`
	Tenant     string    `json:"tenant"`
	Name       string    `json:"name,omitempty"`
	MediaType  string    `json:"media_type,omitempty"`
	Size       int64     `json:"size"`
	SHA256     string    `json:"sha256"`
	CreateTime time.Time `json:"create_time"`
}

// ErrQuota: the tenant's documents would pass their bound.
var ErrQuota = errors.New("quota")

func documentKey(tenant, id string) []byte { return []byte(tenant + "/" + id) }

// PutDocument stores a new document and its content, unless the tenant's documents would
// then hold more than tenantLimit bytes (ErrQuota; 0 is no limit) or the id is taken
// (ErrExists).
func (s *Store) PutDocument(ctx context.Context, d Document, content []byte, tenantLimit int64) error {
	meta, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		docs := tx.Bucket(documentsBucket)
		key := documentKey(d.Tenant, d.ID)
		if docs.Get(key) != nil {
			return ErrExists
		}
		if tenantLimit > 0 {
			used, err := tenantUsage(docs, d.Tenant)
			if err != nil {
				return err
			}
			if used+d.Size > tenantLimit {
				return ErrQuota
			}
		}
		if err := docs.Put(key, meta); err != nil {
			return err
		}
		return tx.Bucket(documentContentBucket).Put(key, content)
	})
}

// tenantUsage sums the sizes of a tenant's documents, reading their metadata only.
func tenantUsage(docs *bolt.Bucket, tenant string) (int64, error) {
	var used int64
	prefix := []byte(tenant + "/")
	c := docs.Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		var d Document
		if err := json.Unmarshal(v, &d); err != nil {
			return 0, err
		}
		used += d.Size
	}
	return used, nil
}

// GetDocument reads one of tenant's documents with its content (a copy: bbolt's memory is
// valid only inside the transaction).
func (s *Store) GetDocument(ctx context.Context, tenant, id string) (Document, []byte, error) {
	var d Document
	var content []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		key := documentKey(tenant, id)
		meta := tx.Bucket(documentsBucket).Get(key)
		if meta == nil {
			return ErrNotFound
		}
		if err := json.Unmarshal(meta, &d); err != nil {
			return err
		}
		content = bytes.Clone(tx.Bucket(documentContentBucket).Get(key))
		return nil
	})
	return d, content, err
}

// DeleteDocument deletes one of tenant's documents.
func (s *Store) DeleteDocument(ctx context.Context, tenant, id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		key := documentKey(tenant, id)
		docs := tx.Bucket(documentsBucket)
		if docs.Get(key) == nil {
			return ErrNotFound
		}
		if err := docs.Delete(key); err != nil {
			return err
		}
		return tx.Bucket(documentContentBucket).Delete(key)
	})
}
