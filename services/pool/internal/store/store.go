// Package store keeps the pool's durable state in one bbolt file: the runs it hosts (so a
// restarted pool knows them and ends or resumes them), their approvals (calls that wait for a
// person, and the outcome of an approved one until the caller's retry takes it), the MCP
// front door's agent tokens (hashed), and the tenants' documents that my-documents://
// arguments name.
package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/boltdb"
)

// Buckets of the pool file.
var (
	// runsBucket: tenant "/" run id -> Run JSON (a run id is unique within its tenant).
	runsBucket = []byte("runs")
	// LegacyOutboxBucket held audit records waiting to be forwarded until the spool moved to
	// files of its own; a start moves what is left there (audit.Spool.Adopt).
	LegacyOutboxBucket = []byte("audit_outbox")
	// approvalsBucket: tenant "/" run id "/" approval id -> Approval JSON.
	approvalsBucket = []byte("approvals")
	// documentsBucket: tenant "/" document id -> Document JSON (the metadata, which a quota
	// check scans); documentContentBucket: the same key -> the content.
	documentsBucket       = []byte("documents")
	documentContentBucket = []byte("document_content")
	// agentTokensBucket: tenant "/" run id "/" token id -> AgentToken JSON (the MCP front
	// door's bearer tokens, hashed); agentTokenHashesBucket: the token's SHA-256 (hex) -> that
	// key, which a presented token is looked up by.
	agentTokensBucket      = []byte("agent_tokens")
	agentTokenHashesBucket = []byte("agent_token_hashes")
	// oauthTokensBucket: tenant "/" user "/" server ref -> the user's OAuth token, sealed by
	// the pool (oauth.go); oauthListingsBucket: the same key -> the Listing the server
	// declared to that user; oauthStatesBucket: SHA-256 (hex) of a sign-in's state -> its
	// SignInState, taken once by the callback.
	oauthTokensBucket   = []byte("oauth_tokens")
	oauthListingsBucket = []byte("oauth_listings")
	oauthStatesBucket   = []byte("oauth_states")
)

var migrations = []boltdb.Migration{
	func(tx *bolt.Tx) error { return nil }, // v1: runs and the outbox
	keyRunsByTenant,                        // v2: runs keyed by tenant and id
	// v3: a run may carry selected_servers and loaded_tools. Older records read as before (no
	// selection, nothing loaded), so nothing moves; the version goes up so that an older
	// binary refuses the file instead of rewriting runs without them, which would widen a
	// run's selection and forget the tools it loaded.
	func(tx *bolt.Tx) error { return nil },
	// v4: approvals and documents, in buckets of their own (created by Open). The version goes
	// up so that an older binary refuses the file instead of running calls that wait for an
	// approval it does not know.
	func(tx *bolt.Tx) error { return nil },
	// v5: the MCP front door's agent tokens, in buckets of their own (created by Open). The
	// version goes up so that an older binary refuses the file instead of keeping runs whose
	// tokens it would never drop.
	func(tx *bolt.Tx) error { return nil },
	// v6: runs carry a user; OAuth tokens, listings and sign-in states, in buckets of their
	// own (created by Open). The version goes up so that an older binary refuses the file
	// instead of running a user's run as nobody.
	func(tx *bolt.Tx) error { return nil },
}

// keyRunsByTenant moves every run from its id to its tenant and id, so that two tenants may
// use the same run id (v1 kept one id space for the whole host).
func keyRunsByTenant(tx *bolt.Tx) error {
	b := tx.Bucket(runsBucket)
	moved := map[string][]byte{}
	err := b.ForEach(func(k, v []byte) error {
		var r Run
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("run %q: %w", k, err)
		}
		moved[string(k)] = runKey(r.Tenant, r.ID)
		return nil
	})
	if err != nil {
		return err
	}
	for old, key := range moved {
		v := bytes.Clone(b.Get([]byte(old)))
		if err := b.Delete([]byte(old)); err != nil {
			return err
		}
		if err := b.Put(key, v); err != nil {
			return err
		}
	}
	return nil
}

// runKey is a run's key: tenant names match ^[a-z0-9_-]{1,64}$ and run ids
// ^[A-Za-z0-9_.-]{1,128}$, so "/" cannot occur in either.
func runKey(tenant, id string) []byte { return []byte(tenant + "/" + id) }

// Errors.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
)

// Run is a run's durable record; sessions are never stored (no process survives the pool).
type Run struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	GraphID   string    `json:"graph_id"`
	Version   int64     `json:"version"`
	State     string    `json:"state"`
	EndReason string    `json:"end_reason,omitempty"`
	StartTime time.Time `json:"start_time"`
	EndTime   time.Time `json:"end_time,omitzero"`
	// Calls and LastActivity are as of the last state change (pause or end): an ended run
	// is read back from here.
	Calls        int64     `json:"calls,omitempty"`
	LastActivity time.Time `json:"last_activity,omitzero"`
	// SelectedServers are the servers StartRun narrowed the run to (those of the graph's),
	// sorted; empty leaves each agent's own selection.
	SelectedServers []string `json:"selected_servers,omitempty"`
	// LoadedTools holds, by agent, the binding names of the deferred tools tool_search loaded
	// in the run, sorted: they stay loaded for the rest of the run, across a restart.
	LoadedTools map[string][]string `json:"loaded_tools,omitempty"`
	// User is the subject the run acts for (StartRun's user); empty for none.
	User string `json:"user,omitempty"`
}

// Store is the pool's bbolt file.
type Store struct {
	db *bolt.DB
}

// Open opens or creates the file.
func Open(path string) (*Store, error) {
	db, err := boltdb.Open(path)
	if err != nil {
		return nil, err
	}
	if err := boltdb.Migrate(db, [][]byte{runsBucket, approvalsBucket, documentsBucket, documentContentBucket, agentTokensBucket, agentTokenHashesBucket, oauthTokensBucket, oauthListingsBucket, oauthStatesBucket}, migrations); err != nil {
		_ = db.Close() // the migration's error is the one to report
		return nil, err
	}
	return &Store{db: db}, nil
}

// DB is the file, for the audit spool that shares it.
func (s *Store) DB() *bolt.DB { return s.db }

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// CreateRun stores a new run; an id its tenant has taken is refused.
func (s *Store) CreateRun(ctx context.Context, r Run) error {
	val, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(runsBucket)
		if b.Get(runKey(r.Tenant, r.ID)) != nil {
			return ErrExists
		}
		return b.Put(runKey(r.Tenant, r.ID), val)
	})
}

// PutRun records a run's new state.
func (s *Store) PutRun(ctx context.Context, r Run) error {
	val, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Batch(func(tx *bolt.Tx) error { return tx.Bucket(runsBucket).Put(runKey(r.Tenant, r.ID), val) })
}

// GetRun reads one of tenant's runs.
func (s *Store) GetRun(ctx context.Context, tenant, id string) (Run, error) {
	var r Run
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(runsBucket).Get(runKey(tenant, id))
		if v == nil {
			return ErrNotFound
		}
		return json.Unmarshal(v, &r)
	})
	return r, err
}

// ActiveRuns lists runs that are running or paused.
func (s *Store) ActiveRuns(ctx context.Context) ([]Run, error) {
	var out []Run
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(runsBucket).ForEach(func(_, v []byte) error {
			var r Run
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			if r.State == "running" || r.State == "paused" {
				out = append(out, r)
			}
			return nil
		})
	})
	return out, err
}
