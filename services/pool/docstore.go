package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/ringfence/ringfence/internal/documents"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// The built-in document store: each tenant's documents in the pool's bbolt file, for
// my-documents://<id> references, unless the deployment points the pool at a document
// service of its own (documents.url_template), which then answers every reference and the
// store is off.

// DefaultDocumentMaxBytes bounds one document by default (documents.max_bytes).
const DefaultDocumentMaxBytes = 10 << 20

// maxDocumentName bounds a document's name.
const maxDocumentName = 256

// Errors of the document store.
var (
	errDocumentNotFound   = errors.New("pool: no such document in this tenant")
	errDocumentsElsewhere = errors.New("pool: this pool resolves my-documents:// references through the platform's document service (documents.url_template), so its built-in store is off: upload documents there")
	errDocumentQuota      = errors.New("pool: the tenant's documents would pass documents.max_tenant_bytes: delete documents it no longer needs, or raise RINGFENCE_DOCUMENTS__MAX_TENANT_BYTES")
)

// Document is a stored document's metadata.
type Document = store.Document

// builtinDocuments resolves references from the store: a document of another tenant is as
// missing as one that never was.
type builtinDocuments struct{ store *store.Store }

func (b builtinDocuments) Document(ctx context.Context, tenant, id string, limit int64) ([]byte, error) {
	d, content, err := b.store.GetDocument(ctx, tenant, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, fmt.Errorf("%w: this tenant has no document %q", documents.ErrUnavailable, id)
	case err != nil:
		return nil, fmt.Errorf("%w: document %q cannot be read: %v", documents.ErrUnavailable, id, err)
	case d.Size > limit:
		return nil, fmt.Errorf("%w: document %q is %d bytes, more than the %d this call may still receive", documents.ErrUnavailable, id, d.Size, limit)
	}
	return content, nil
}

// builtin reports whether the built-in store answers references.
func (s *Service) builtin() error {
	if _, ok := s.documents.(builtinDocuments); !ok {
		return errDocumentsElsewhere
	}
	return nil
}

// PutDocument stores content as a new document of tenant and returns it.
func (s *Service) PutDocument(ctx context.Context, tenant, name, mediaType string, content []byte) (*Document, error) {
	if err := s.builtin(); err != nil {
		return nil, err
	}
	switch {
	case len(content) == 0:
		return nil, fieldError("content", "is empty: a document has content")
	case int64(len(content)) > s.cfg.DocumentMaxBytes:
		return nil, fieldError("content", "is %d bytes; a document is at most %d (documents.max_bytes)", len(content), s.cfg.DocumentMaxBytes)
	case len(name) > maxDocumentName:
		return nil, fieldError("name", "is %d bytes; at most %d", len(name), maxDocumentName)
	case len(mediaType) > maxDocumentName:
		return nil, fieldError("media_type", "is %d bytes; at most %d", len(mediaType), maxDocumentName)
	}
	sum := sha256.Sum256(content)
	d := Document{ID: "doc-" + newRunID()[4:], Tenant: orDefaultTenant(tenant), Name: name, MediaType: mediaType,
		Size: int64(len(content)), SHA256: "sha256:" + hex.EncodeToString(sum[:]), CreateTime: time.Now().UTC()}
	err := s.store.PutDocument(ctx, d, content, s.cfg.DocumentMaxTenantBytes)
	if errors.Is(err, store.ErrQuota) {
		return nil, errDocumentQuota
	}
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// GetDocument reads one of tenant's documents.
func (s *Service) GetDocument(ctx context.Context, tenant, id string) (*Document, []byte, error) {
	if err := s.builtin(); err != nil {
		return nil, nil, err
	}
	d, content, err := s.store.GetDocument(ctx, orDefaultTenant(tenant), id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, fmt.Errorf("%w: %q", errDocumentNotFound, id)
	}
	if err != nil {
		return nil, nil, err
	}
	return &d, content, nil
}

// DeleteDocument deletes one of tenant's documents.
func (s *Service) DeleteDocument(ctx context.Context, tenant, id string) error {
	if err := s.builtin(); err != nil {
		return err
	}
	err := s.store.DeleteDocument(ctx, orDefaultTenant(tenant), id)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %q", errDocumentNotFound, id)
	}
	return err
}
