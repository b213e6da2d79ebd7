// Package store keeps the registry's state in one bbolt file: registrations (env values
// sealed), named secrets (sealed), and API keys (hashes only). Every write is durable before
// it is acknowledged and before any in-memory state changes.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/boltdb"
	"github.com/ringfence/ringfence/internal/humanize"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/paging"
	"github.com/ringfence/ringfence/internal/secretbox"
)

// Errors the service maps to codes.
var (
	ErrNotFound      = errors.New("not found")
	ErrExists        = errors.New("already exists")
	ErrStaleRevision = errors.New("stale revision")
	ErrBadPageToken  = paging.ErrBadToken // a page token this store did not issue for the list
)

// TxHook runs inside a write transaction, so what it writes (an audit record) commits or rolls
// back with the change.
type TxHook func(tx *bolt.Tx) error

// Store is the registry's bbolt file.
type Store struct {
	db  *bolt.DB
	box *secretbox.Box

	// servers caches decoded registrations (sealed values stay sealed): every pool call reads
	// a policy. This process is the file's only writer, and a committed write drops the
	// ref's entry; the next read fills it from the file. Writes commit in order but finish
	// in any order, so they only ever drop entries, and a read fills one only if no write
	// finished while it read (serversGen unchanged): then nothing newer can be lost.
	serversMu  sync.RWMutex
	servers    map[string]*storedServer
	serversGen uint64
	// warm is the last WarmTargets answer and the serversGen it was read at: the pools poll
	// it every few seconds, and it changes only with a write.
	warm atomic.Pointer[warmTargets]

	// keys is an in-memory copy of the keys bucket, so authenticating a call never touches disk.
	mu         sync.RWMutex
	keysByHash map[string]*Key
	keysByID   map[string]*Key
	touches    sync.WaitGroup
}

// Open opens or creates the file at path; box seals secrets.
func Open(path string, box *secretbox.Box) (*Store, error) {
	db, err := boltdb.Open(path)
	if err != nil {
		return nil, err
	}
	if err := boltdb.Migrate(db, allBuckets, migrations(box)); err != nil {
		_ = db.Close() // the migration's error is the one to report
		return nil, err
	}
	// A migration that sealed plaintext asked for its old pages to leave the file.
	if db, err = boltdb.ScrubIfRequested(db); err != nil {
		if db != nil {
			_ = db.Close() // the scrub's error is the one to report
		}
		return nil, err
	}
	s := &Store{db: db, box: box, servers: make(map[string]*storedServer)}
	if err := s.loadKeys(); err != nil {
		_ = db.Close() // the error above is the one to report
		return nil, err
	}
	return s, nil
}

// DB exposes the file so producers can share its transactions (the audit outbox lives here).
func (s *Store) DB() *bolt.DB { return s.db }

// Close waits for pending key touches and closes the file.
func (s *Store) Close() error {
	s.touches.Wait()
	return s.db.Close()
}

// storedServer is a registration at rest: env keys in clear, values sealed as one blob bound
// to the ref; the URL sealed (its query may hold a credential) beside its masked form in
// clear, which is all responses show, so reading one never opens a seal.
type storedServer struct {
	Ref         string   `json:"ref"`
	Description string   `json:"description,omitempty"`
	Transport   string   `json:"transport"`
	Command     string   `json:"command,omitempty"`
	Args        []string `json:"args,omitempty"`
	EnvKeys     []string `json:"env_keys,omitempty"`
	EnvSealed   []byte   `json:"env_sealed,omitempty"`
	// URL is the clear URL of schema version 1; migration 2 seals it, and nothing writes it.
	URL                  string              `json:"url,omitempty"`
	URLSealed            []byte              `json:"url_sealed,omitempty"`
	URLMasked            string              `json:"url_masked,omitempty"`
	Headers              map[string]string   `json:"headers,omitempty"`
	Grants               []string            `json:"grants"`
	Include              []string            `json:"include,omitempty"`
	Exclude              []string            `json:"exclude,omitempty"`
	ToolPermissions      map[string][]string `json:"tool_permissions,omitempty"`
	ClientSessionTimeout time.Duration       `json:"client_session_timeout,omitempty"`
	ToolCallTimeout      time.Duration       `json:"tool_call_timeout,omitempty"`
	KeepMarkup           bool                `json:"keep_markup,omitempty"`
	StrictInputs         bool                `json:"strict_inputs,omitempty"`
	Prewarm              int                 `json:"prewarm,omitempty"`
	MaxResultBytes       int64               `json:"max_result_bytes,omitempty"`
	Revision             int64               `json:"revision"`
	CreateTime           time.Time           `json:"create_time"`
	UpdateTime           time.Time           `json:"update_time"`

	// view memoizes ServerView's answer for this revision; a write replaces the whole entry.
	view atomic.Pointer[any]
}

func envContext(ref string) []byte { return []byte("registry/server/" + ref + "/env") }

func urlContext(ref string) []byte { return []byte("registry/server/" + ref + "/url") }

// sealURL stores url sealed, with its masked form in clear.
func (st *storedServer) sealURL(box *secretbox.Box, url string) {
	st.URL, st.URLSealed, st.URLMasked = "", nil, ""
	if url != "" {
		st.URLSealed = box.Seal([]byte(url), urlContext(st.Ref))
		st.URLMasked = mcpserver.MaskURL(url)
	}
}

func (s *Store) seal(r *mcpserver.Registration) (*storedServer, error) {
	st := &storedServer{
		Ref: r.Ref, Description: r.Description, Transport: r.Transport, Command: r.Command, Args: r.Args,
		Headers: r.Headers, Grants: r.Grants, Include: r.Filter.Include, Exclude: r.Filter.Exclude,
		ToolPermissions: r.ToolPermissions, ClientSessionTimeout: r.ClientSessionTimeout,
		ToolCallTimeout: r.ToolCallTimeout, KeepMarkup: r.KeepMarkup, StrictInputs: r.StrictInputs, Prewarm: r.Prewarm,
		MaxResultBytes: r.MaxResultBytes,
		Revision:       r.Revision, CreateTime: r.CreateTime, UpdateTime: r.UpdateTime,
	}
	if st.Grants == nil {
		st.Grants = []string{}
	}
	st.sealURL(s.box, r.URL)
	if len(r.Env) > 0 {
		for k := range r.Env {
			st.EnvKeys = append(st.EnvKeys, k)
		}
		sort.Strings(st.EnvKeys)
		plain, err := json.Marshal(r.Env)
		if err != nil {
			return nil, err
		}
		st.EnvSealed = s.box.Seal(plain, envContext(r.Ref))
	}
	return st, nil
}

func (s *Store) open(st *storedServer) (*mcpserver.Registration, error) {
	r := st.withoutEnv()
	if len(st.URLSealed) > 0 {
		plain, err := s.box.Open(st.URLSealed, urlContext(st.Ref))
		if err != nil {
			return nil, err
		}
		r.URL = string(plain)
	}
	if len(st.EnvSealed) > 0 {
		plain, err := s.box.Open(st.EnvSealed, envContext(st.Ref))
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(plain, &r.Env); err != nil {
			return nil, fmt.Errorf("store: decode env of %s: %w", st.Ref, err)
		}
	}
	return r, nil
}

// withoutEnv is the registration with no env at all and its URL masked (mcpserver.MaskURL).
func (st *storedServer) withoutEnv() *mcpserver.Registration {
	return &mcpserver.Registration{
		Ref: st.Ref, Description: st.Description, Transport: st.Transport, Command: st.Command, Args: st.Args,
		URL: st.URLMasked, Headers: st.Headers, Grants: st.Grants,
		Filter:          mcpserver.ToolFilter{Include: st.Include, Exclude: st.Exclude},
		ToolPermissions: st.ToolPermissions, ClientSessionTimeout: st.ClientSessionTimeout,
		ToolCallTimeout: st.ToolCallTimeout, KeepMarkup: st.KeepMarkup, StrictInputs: st.StrictInputs, Prewarm: st.Prewarm,
		MaxResultBytes: st.MaxResultBytes,
		Revision:       st.Revision, CreateTime: st.CreateTime, UpdateTime: st.UpdateTime,
	}
}

// masked is the registration with every env value empty and the keys kept, and its URL
// masked, without opening a seal.
func (st *storedServer) masked() *mcpserver.Registration {
	r := st.withoutEnv()
	if len(st.EnvKeys) > 0 {
		r.Env = make(map[string]string, len(st.EnvKeys))
		for _, k := range st.EnvKeys {
			r.Env[k] = ""
		}
	}
	return r
}

// CreateServer stores a new registration at revision 1.
func (s *Store) CreateServer(ctx context.Context, r *mcpserver.Registration, hook TxHook) error {
	now := time.Now().UTC()
	r.Revision, r.CreateTime, r.UpdateTime = 1, now, now
	st, err := s.seal(r)
	if err != nil {
		return err
	}
	val, err := json.Marshal(st)
	if err != nil {
		return err
	}
	err = s.db.Batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(serversBucket)
		if b.Get([]byte(r.Ref)) != nil {
			return ErrExists
		}
		if err := b.Put([]byte(r.Ref), val); err != nil {
			return err
		}
		return runHook(tx, hook)
	})
	if err == nil {
		s.forgetServer(r.Ref)
	}
	return err
}

// GetServer returns a registration with its env in clear.
func (s *Store) GetServer(ctx context.Context, ref string) (*mcpserver.Registration, error) {
	st, err := s.stored(ref)
	if err != nil {
		return nil, err
	}
	return s.open(st)
}

// GetServerMasked returns a registration whose env holds its keys with empty values and whose
// URL is masked (mcpserver.MaskURL), without opening a seal: what responses need, since they
// mask every value anyway.
func (s *Store) GetServerMasked(ctx context.Context, ref string) (*mcpserver.Registration, error) {
	st, err := s.stored(ref)
	if err != nil {
		return nil, err
	}
	return st.masked(), nil
}

// ServerView returns build's view of ref's registration, masked as GetServerMasked returns
// it, built once per stored revision: the registry's GetServer answers from it without
// converting the registration on every read. Callers share the view and must not modify it.
func (s *Store) ServerView(ref string, build func(*mcpserver.Registration) any) (any, error) {
	st, err := s.stored(ref)
	if err != nil {
		return nil, err
	}
	if v := st.view.Load(); v != nil {
		return *v, nil
	}
	v := build(st.masked())
	st.view.Store(&v)
	return v, nil
}

// stored returns the decoded registration; callers must not modify it.
func (s *Store) stored(ref string) (*storedServer, error) {
	s.serversMu.RLock()
	cached, ok := s.servers[ref]
	gen := s.serversGen
	s.serversMu.RUnlock()
	if ok {
		return cached, nil
	}
	var st storedServer
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(serversBucket).Get([]byte(ref))
		if v == nil {
			return ErrNotFound
		}
		return json.Unmarshal(v, &st)
	})
	if err != nil {
		return nil, err
	}
	s.serversMu.Lock()
	if s.serversGen == gen {
		if len(s.servers) >= maxCachedServers {
			clear(s.servers)
		}
		s.servers[ref] = &st
	}
	s.serversMu.Unlock()
	return &st, nil
}

// forgetServer drops ref's cached registration after a committed write.
func (s *Store) forgetServer(ref string) {
	s.serversMu.Lock()
	defer s.serversMu.Unlock()
	delete(s.servers, ref)
	s.serversGen++
}

// maxCachedServers bounds the registration cache.
const maxCachedServers = 10000

// ServerPolicy returns what a registration allows without opening its sealed env: the pool
// asks for it before every call.
func (s *Store) ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error) {
	st, err := s.stored(ref)
	if err != nil {
		return mcpserver.Policy{}, err
	}
	return mcpserver.Policy{
		Ref: st.Ref, Description: st.Description, Grants: st.Grants, Revision: st.Revision, ToolPermissions: st.ToolPermissions,
		Filter: mcpserver.ToolFilter{Include: st.Include, Exclude: st.Exclude}, StrictInputs: st.StrictInputs,
	}, nil
}

type warmTargets struct {
	gen     uint64
	targets []mcpserver.WarmTarget
}

// WarmTargets returns every registration whose prewarm is above 0, in ref order. The answer is
// read from the file once per committed write (serversGen): a read that raced a write is
// stamped with the generation from before it, so the next call reads again.
func (s *Store) WarmTargets(ctx context.Context) ([]mcpserver.WarmTarget, error) {
	s.serversMu.RLock()
	gen := s.serversGen
	s.serversMu.RUnlock()
	if w := s.warm.Load(); w != nil && w.gen == gen {
		return w.targets, nil
	}
	var out []mcpserver.WarmTarget
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(serversBucket).ForEach(func(_, v []byte) error {
			var st struct {
				Ref      string `json:"ref"`
				Prewarm  int    `json:"prewarm"`
				Revision int64  `json:"revision"`
			}
			if err := json.Unmarshal(v, &st); err != nil {
				return err
			}
			if st.Prewarm > 0 {
				out = append(out, mcpserver.WarmTarget{Ref: st.Ref, Prewarm: st.Prewarm, Revision: st.Revision})
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	s.warm.Store(&warmTargets{gen: gen, targets: out})
	return out, nil
}

// ListServers returns up to limit registrations after the page token, and the next token,
// masked as GetServerMasked returns them: a listing opens no seal.
func (s *Store) ListServers(ctx context.Context, pageToken string, limit int) ([]*mcpserver.Registration, string, error) {
	after, err := paging.DecodeToken(pageToken, serversTokenScope)
	if err != nil {
		return nil, "", err
	}
	var out []*mcpserver.Registration
	var next string
	err = s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(serversBucket).Cursor()
		k, v := c.First()
		if after != "" {
			k, v = c.Seek([]byte(after))
			if k != nil && string(k) == after {
				k, v = c.Next()
			}
		}
		for ; k != nil; k, v = c.Next() {
			if len(out) == limit {
				next = paging.EncodeToken(out[len(out)-1].Ref, serversTokenScope)
				return nil
			}
			var st storedServer
			if err := json.Unmarshal(v, &st); err != nil {
				return err
			}
			out = append(out, st.masked())
		}
		return nil
	})
	return out, next, err
}

// ClosestRef returns the registered ref nearest to ref by edit distance, when one is near
// enough to be a typo of it (at most a third of its length, and 2 or fewer for short refs),
// or "". It reads keys only: for a "did you mean" on a ref that is not registered.
func (s *Store) ClosestRef(ref string) string {
	best, bestDist := "", max(2, len(ref)/3)+1
	_ = s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(serversBucket).Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			// Refs whose lengths differ by more than the bound cannot be within it.
			if d := len(k) - len(ref); d >= bestDist || -d >= bestDist {
				continue
			}
			if d := humanize.EditDistance(ref, string(k)); d < bestDist {
				best, bestDist = string(k), d
			}
		}
		return nil
	})
	return best
}

// UpdateServer replaces a registration: mutate receives the stored one and returns the new one
// (it may refuse); the revision advances by one.
func (s *Store) UpdateServer(ctx context.Context, ref string, mutate func(cur *mcpserver.Registration) (*mcpserver.Registration, error), hook func(tx *bolt.Tx, before, after *mcpserver.Registration) error) (*mcpserver.Registration, error) {
	var result *mcpserver.Registration
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(serversBucket)
		v := b.Get([]byte(ref))
		if v == nil {
			return ErrNotFound
		}
		var st storedServer
		if err := json.Unmarshal(v, &st); err != nil {
			return err
		}
		cur, err := s.open(&st)
		if err != nil {
			return err
		}
		next, err := mutate(cur)
		if err != nil {
			return err
		}
		next.Ref, next.Revision, next.CreateTime, next.UpdateTime = cur.Ref, cur.Revision+1, cur.CreateTime, time.Now().UTC()
		sealed, err := s.seal(next)
		if err != nil {
			return err
		}
		val, err := json.Marshal(sealed)
		if err != nil {
			return err
		}
		if err := b.Put([]byte(ref), val); err != nil {
			return err
		}
		if hook != nil {
			if err := hook(tx, cur, next); err != nil {
				return err
			}
		}
		result = next
		return nil
	})
	if err == nil {
		s.forgetServer(ref)
	}
	return result, err
}

// DeleteServer removes a registration.
func (s *Store) DeleteServer(ctx context.Context, ref string, hook TxHook) error {
	err := s.db.Batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(serversBucket)
		if b.Get([]byte(ref)) == nil {
			return ErrNotFound
		}
		if err := b.Delete([]byte(ref)); err != nil {
			return err
		}
		return runHook(tx, hook)
	})
	if err == nil {
		s.forgetServer(ref)
	}
	return err
}

func runHook(tx *bolt.Tx, hook TxHook) error {
	if hook == nil {
		return nil
	}
	return hook(tx)
}

// serversTokenScope is the scope of ListServers' page tokens (paging.EncodeToken).
const serversTokenScope = "registry.servers"
