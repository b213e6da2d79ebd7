package testutil

import (
	"context"
	"sync"

	"github.com/ringfence/ringfence/internal/audit"
)

// AuditRecorder is an in-memory audit.Sink for one package's unit tests: it keeps every record
// a spool forwards, once per id, in arrival order.
type AuditRecorder struct {
	mu   sync.Mutex
	recs []audit.Record
	seen map[string]bool
}

var _ audit.Sink = (*AuditRecorder)(nil)

// NewAuditRecorder returns an empty recorder.
func NewAuditRecorder() *AuditRecorder { return &AuditRecorder{seen: make(map[string]bool)} }

// Append implements audit.Sink.
func (a *AuditRecorder) Append(_ context.Context, recs []audit.Record) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range recs {
		if !a.seen[r.ID] {
			a.seen[r.ID] = true
			a.recs = append(a.recs, r)
		}
	}
	return nil
}

// Records returns a copy of what arrived so far.
func (a *AuditRecorder) Records() []audit.Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]audit.Record(nil), a.recs...)
}
