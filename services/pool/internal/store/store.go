// Package store keeps the pool's durable state in one bbolt file: the runs it hosts (so a
// restarted pool knows them and ends or resumes them) and the audit outbox every call attempt
// is written to before its answer leaves the pool.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/boltdb"
)

// Buckets of the pool file.
var (
	// runsBucket: run id -> Run JSON.
	runsBucket = []byte("runs")
	// LegacyOutboxBucket held audit records waiting to be forwarded until the spool moved to
	// files of its own; a start moves what is left there (audit.Spool.Adopt).
	LegacyOutboxBucket = []byte("audit_outbox")
)

var migrations = []boltdb.Migration{
	func(tx *bolt.Tx) error { return nil }, // v1: runs and the outbox
}

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
	if err := boltdb.Migrate(db, [][]byte{runsBucket}, migrations); err != nil {
		db.Close()
		return nil, err
	}
	return &Store{db: db}, nil
}

// DB is the file, for the audit spool that shares it.
func (s *Store) DB() *bolt.DB { return s.db }

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// CreateRun stores a new run; a taken id is refused.
func (s *Store) CreateRun(ctx context.Context, r Run) error {
	val, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(runsBucket)
		if b.Get([]byte(r.ID)) != nil {
			return ErrExists
		}
		return b.Put([]byte(r.ID), val)
	})
}

// PutRun records a run's new state.
func (s *Store) PutRun(ctx context.Context, r Run) error {
	val, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Batch(func(tx *bolt.Tx) error { return tx.Bucket(runsBucket).Put([]byte(r.ID), val) })
}

// GetRun reads one run.
func (s *Store) GetRun(ctx context.Context, id string) (Run, error) {
	var r Run
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(runsBucket).Get([]byte(id))
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
