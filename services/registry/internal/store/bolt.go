package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/boltdb"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/paging"
	"github.com/ringfence/ringfence/internal/secretbox"
)

// Bolt is the registry's bbolt file, the only writer of which is this process.
type Bolt struct {
	db    *bolt.DB
	box   *secretbox.Box
	spool *audit.Spool

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

	// keys is an in-memory copy of the keys bucket, so authenticating a call never touches
	// disk; keyWrites orders the writes that check it before they commit.
	keys      keyTable
	keyWrites sync.Mutex
	touches   sync.WaitGroup
}

// OpenBolt opens or creates the file at path; box seals secrets. The audit spool's outbox is
// a bucket of the same file, so a change and its record commit together.
func OpenBolt(path string, box *secretbox.Box, spool SpoolConfig) (*Bolt, error) {
	db, err := boltdb.Open(path)
	if err != nil {
		return nil, err
	}
	if err := boltdb.Migrate(db, allBuckets, migrations(box)); err != nil {
		_ = db.Close() // the migration's error is the one to report
		return nil, err
	}
	s := &Bolt{db: db, box: box, servers: make(map[string]*storedServer)}
	if err := s.checkSecretsKey(path); err != nil {
		_ = db.Close() // the key's error is the one to report
		return nil, err
	}
	resealed, err := s.reseal()
	if err != nil {
		_ = db.Close() // the re-seal's error is the one to report
		return nil, err
	}
	// A migration that sealed plaintext, or a re-seal, asked for its old pages to leave the file.
	if db, err = boltdb.ScrubIfRequested(db); err != nil {
		if db != nil {
			_ = db.Close() // the scrub's error is the one to report
		}
		return nil, err
	}
	s.db = db
	log := spool.Logger
	if log == nil {
		log = slog.Default()
	}
	box.LogResealed(log, "registry", resealed.Resealed, resealed.Unopened)
	if err := s.loadKeys(); err != nil {
		_ = db.Close() // the error above is the one to report
		return nil, err
	}
	spool.DB, spool.Bucket = db, string(OutboxBucket)
	if s.spool, err = audit.NewSpool(spool); err != nil {
		_ = db.Close() // the spool's error is the one to report
		return nil, err
	}
	return s, nil
}

// checkSecretsKey refuses a secrets key that does not open what the file holds sealed: a
// data directory restored without its key file gets a new key at start, and every secret,
// env value and URL would then fail at its first use. It opens the first sealed value it
// finds; a file with none (nothing sealed yet) takes any key.
func (s *Bolt) checkSecretsKey(path string) error {
	var what string
	var err error
	_ = s.db.View(func(tx *bolt.Tx) error {
		if k, v := tx.Bucket(secretsBucket).Cursor().First(); k != nil {
			var st storedSecret
			if err = json.Unmarshal(v, &st); err == nil {
				what = fmt.Sprintf("secret %q", k)
				_, err = openSecret(s.box, string(k), st)
			}
			return nil
		}
		c := tx.Bucket(serversBucket).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			var st storedServer
			if err = json.Unmarshal(v, &st); err != nil {
				return nil
			}
			if len(st.EnvSealed) > 0 || len(st.URLSealed) > 0 {
				what = fmt.Sprintf("server %q", k)
				_, err = openServer(s.box, &st)
				return nil
			}
		}
		return nil
	})
	if errors.Is(err, secretbox.ErrOpen) {
		keyFile := "the key file"
		if p := s.box.Path(); p != "" {
			keyFile = "the key file, " + p + ","
		}
		return fmt.Errorf("registry: the secrets key does not open what %s holds sealed (%s): start with the key file it was sealed with, or with that key as a line of the key file (RINGFENCE_SECRETS_KEY_FILE, default <data_dir>/secrets.key; a restored backup needs the secrets.key kept with it). "+
			"After `secrets-key rotate`, %s may have lost the old key's line before a start re-sealed under the new one: put that line back after the first, start, and remove it only once the log says every sealed value opens with the first key", path, what, keyFile)
	}
	if err != nil {
		return fmt.Errorf("registry: read %s: %w", path, err)
	}
	return nil
}

// boltRecorder is the recorder of one write transaction; tests reach the transaction.
type boltRecorder struct {
	audit.Recorder
	tx *bolt.Tx
}

func (s *Bolt) recorder(tx *bolt.Tx) boltRecorder {
	return boltRecorder{Recorder: s.spool.TxRecorder(tx), tx: tx}
}

// DB exposes the file, for tests.
func (s *Bolt) DB() *bolt.DB { return s.db }

// Spool is the audit spool whose outbox is in this file.
func (s *Bolt) Spool() *audit.Spool { return s.spool }

// Close waits for pending key touches and closes the file.
func (s *Bolt) Close() error {
	s.touches.Wait()
	_ = s.spool.Close() // a bucket of db: nothing of its own to release
	return s.db.Close()
}

// CreateServer stores a new registration at revision 1.
func (s *Bolt) CreateServer(ctx context.Context, r *mcpserver.Registration, hook Hook) error {
	now := time.Now().UTC()
	r.Revision, r.CreateTime, r.UpdateTime = 1, now, now
	val, err := encodeServer(s.box, r)
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
		return runHook(s.recorder(tx), hook)
	})
	if err == nil {
		s.forgetServer(r.Ref)
	}
	return err
}

// GetServer returns a registration with its env in clear.
func (s *Bolt) GetServer(ctx context.Context, ref string) (*mcpserver.Registration, error) {
	st, err := s.stored(ref)
	if err != nil {
		return nil, err
	}
	return openServer(s.box, st)
}

// GetServerMasked returns a registration whose env holds its keys with empty values and whose
// URL is masked (mcpserver.MaskURL), without opening a seal: what responses need, since they
// mask every value anyway.
func (s *Bolt) GetServerMasked(ctx context.Context, ref string) (*mcpserver.Registration, error) {
	st, err := s.stored(ref)
	if err != nil {
		return nil, err
	}
	return st.masked(), nil
}

// ServerView returns build's view of ref's registration, masked as GetServerMasked returns
// it, built once per stored revision: the registry's GetServer answers from it without
// converting the registration on every read. Callers share the view and must not modify it.
func (s *Bolt) ServerView(ctx context.Context, ref string, build func(*mcpserver.Registration) any) (any, error) {
	st, err := s.stored(ref)
	if err != nil {
		return nil, err
	}
	return st.viewOf(build), nil
}

// stored returns the decoded registration; callers must not modify it.
func (s *Bolt) stored(ref string) (*storedServer, error) {
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
func (s *Bolt) forgetServer(ref string) {
	s.serversMu.Lock()
	defer s.serversMu.Unlock()
	delete(s.servers, ref)
	s.serversGen++
}

// maxCachedServers bounds the registration cache.
const maxCachedServers = 10000

// ServerPolicy returns what a registration allows without opening its sealed env: the pool
// asks for it before every call.
func (s *Bolt) ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error) {
	st, err := s.stored(ref)
	if err != nil {
		return mcpserver.Policy{}, err
	}
	return st.policy(), nil
}

type warmTargets struct {
	gen     uint64
	targets []mcpserver.WarmTarget
}

// WarmTargets returns every registration whose prewarm is above 0, in ref order. The answer is
// read from the file once per committed write (serversGen): a read that raced a write is
// stamped with the generation from before it, so the next call reads again.
func (s *Bolt) WarmTargets(ctx context.Context) ([]mcpserver.WarmTarget, error) {
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
				Ref      string   `json:"ref"`
				Prewarm  int      `json:"prewarm"`
				Revision int64    `json:"revision"`
				Grants   []string `json:"grants"`
			}
			if err := json.Unmarshal(v, &st); err != nil {
				return err
			}
			// Grants that miss the floor deny every call: no warm container would be taken
			// (a registration stored before the registry refused that, CheckPrewarm).
			if st.Prewarm > 0 && len(mcpserver.FloorMissing(st.Grants)) == 0 {
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
func (s *Bolt) ListServers(ctx context.Context, pageToken string, limit int) ([]*mcpserver.Registration, string, error) {
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
// enough to be a typo of it, or "". It reads keys only: for a "did you mean" on a ref that is
// not registered.
func (s *Bolt) ClosestRef(ref string) string {
	var best string
	_ = s.db.View(func(tx *bolt.Tx) error {
		best = closestRef(ref, func(yield func(string) bool) {
			c := tx.Bucket(serversBucket).Cursor()
			for k, _ := c.First(); k != nil && yield(string(k)); k, _ = c.Next() {
			}
		})
		return nil
	})
	return best
}

// UpdateServer replaces a registration: mutate receives the stored one and returns the new one
// (it may refuse); the revision advances by one.
func (s *Bolt) UpdateServer(ctx context.Context, ref string, mutate func(cur *mcpserver.Registration) (*mcpserver.Registration, error), hook UpdateHook) (*mcpserver.Registration, error) {
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
		cur, err := openServer(s.box, &st)
		if err != nil {
			return err
		}
		next, err := mutate(cur)
		if err != nil {
			return err
		}
		next.Ref, next.Revision, next.CreateTime, next.UpdateTime = cur.Ref, cur.Revision+1, cur.CreateTime, time.Now().UTC()
		val, err := encodeServer(s.box, next)
		if err != nil {
			return err
		}
		if err := b.Put([]byte(ref), val); err != nil {
			return err
		}
		if hook != nil {
			if err := hook(s.recorder(tx), cur, next); err != nil {
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
func (s *Bolt) DeleteServer(ctx context.Context, ref string, hook Hook) error {
	err := s.db.Batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(serversBucket)
		if b.Get([]byte(ref)) == nil {
			return ErrNotFound
		}
		if err := b.Delete([]byte(ref)); err != nil {
			return err
		}
		return runHook(s.recorder(tx), hook)
	})
	if err == nil {
		s.forgetServer(ref)
	}
	return err
}
