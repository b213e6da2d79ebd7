// Package store keeps the pool's durable state. One bbolt file per host holds the runs it hosts
// (so a restarted pool knows them and ends or resumes them), their approvals (calls that wait
// for a person, and the outcome of an approved one until the caller's retry takes it), the MCP
// front door's agent tokens (hashed), and the tenants' documents that my-documents://
// arguments name. With several pool hosts, the run records live in etcd instead (Etcd),
// shared by every host, with the hosts' leases and which host owns each run; both back ends
// keep runs with the same behaviours (RunStore's methods on Store and Etcd).
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
	// oauthClientsBucket: issuer "\n" redirect URI -> the OAuthClient the pool registered
	// there for itself (RFC 7591), its secret sealed by the pool (oauth_clients.go).
	oauthClientsBucket = []byte("oauth_clients")
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
	// ErrNotOwner refuses a write of a run by a host that no longer owns it (its lease expired
	// and another host failed the run, or re-homed it).
	ErrNotOwner = errors.New("the run is owned by another pool host")
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
	// Calls and LastActivity are as of the last state change (pause or end) or the pool's
	// last clean shutdown: an ended run is read back from here.
	Calls        int64     `json:"calls,omitempty"`
	LastActivity time.Time `json:"last_activity,omitzero"`
	// SelectedServers are the servers StartRun narrowed the run to (those of the graph's),
	// sorted; empty leaves each agent's own selection.
	SelectedServers []string `json:"selected_servers,omitempty"`
	// LoadedTools holds, by agent, the binding names of the deferred tools tool_search loaded
	// in the run, sorted: they stay loaded for the rest of the run, across a restart.
	LoadedTools map[string][]string `json:"loaded_tools,omitempty"`
	// Host is the id of the pool host that owns the run while it is running or paused (several
	// hosts on etcd); empty with one host on bbolt.
	Host string `json:"host,omitempty"`
	// HostLost is the id of the host the run was on when that host's lease expired: the run
	// failed for it, and ResumeRun may re-home it on a live host.
	HostLost string `json:"host_lost,omitempty"`
	// User is the subject the run acts for (StartRun's user); empty for none.
	User string `json:"user,omitempty"`
}

// Active reports whether the run is running or paused.
func (r Run) Active() bool { return r.State == "running" || r.State == "paused" }

// owned is PutRun's check: a write of rec by its host replaces cur only if that host still
// owns it.
func owned(cur *Run, rec Run) error {
	if cur.Host != rec.Host || !cur.Active() {
		return fmt.Errorf("%w (%s it, %s)", ErrNotOwner, orNone(cur.Host), cur.State)
	}
	*cur = rec
	return nil
}

func orNone(host string) string {
	if host == "" {
		return "no host owns"
	}
	return "host " + host + " owns"
}

// Store is the pool's bbolt file.
type Store struct {
	db *bolt.DB
	// oauthLocks are LockOAuthToken's locks (oauth.go).
	oauthLocks keyLocks
}

// Open opens or creates the file.
func Open(path string) (*Store, error) {
	db, err := boltdb.Open(path)
	if err != nil {
		return nil, err
	}
	if err := boltdb.Migrate(db, [][]byte{runsBucket, approvalsBucket, documentsBucket, documentContentBucket, agentTokensBucket, agentTokenHashesBucket, oauthTokensBucket, oauthListingsBucket, oauthStatesBucket, oauthClientsBucket}, migrations); err != nil {
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

// PutRun records a run's new state, written by the host that owns it: a run another host
// owns now, or that ended, is refused (ErrNotOwner).
func (s *Store) PutRun(ctx context.Context, r Run) error {
	_, err := s.UpdateRun(ctx, r.Tenant, r.ID, func(cur *Run) error { return owned(cur, r) })
	return err
}

// UpdateRun reads a run, lets mutate change it, and stores the result, in one transaction.
// mutate may run more than once (concurrent writes share transactions, and one that fails is
// retried alone); an error from it stores nothing and is returned.
func (s *Store) UpdateRun(ctx context.Context, tenant, id string, mutate func(*Run) error) (Run, error) {
	var out Run
	err := s.db.Batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(runsBucket)
		v := b.Get(runKey(tenant, id))
		if v == nil {
			return ErrNotFound
		}
		var r Run
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		if err := mutate(&r); err != nil {
			return err
		}
		val, err := json.Marshal(r)
		if err != nil {
			return err
		}
		out = r
		return b.Put(runKey(tenant, id), val)
	})
	return out, err
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

// ActiveRunCount counts the runs in the file that are running or paused, whoever owns them.
func (s *Store) ActiveRunCount(ctx context.Context) (int, error) {
	n := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(runsBucket).ForEach(func(_, v []byte) error {
			var r Run
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			if r.Active() {
				n++
			}
			return nil
		})
	})
	return n, err
}

// ActiveRuns lists the runs host owns that are running or paused.
func (s *Store) ActiveRuns(ctx context.Context, host string) ([]Run, error) {
	var out []Run
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(runsBucket).ForEach(func(_, v []byte) error {
			var r Run
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			if r.Active() && r.Host == host {
				out = append(out, r)
			}
			return nil
		})
	})
	return out, err
}
