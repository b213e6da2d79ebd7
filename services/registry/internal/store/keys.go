package store

import (
	"context"
	"encoding/json"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Key is an API key's record: the SHA-256 of the key, never the key.
type Key struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Role       string    `json:"role"`
	Tenant     string    `json:"tenant,omitempty"`
	Hash       string    `json:"hash"`
	CreateTime time.Time `json:"create_time"`
	LastUsed   time.Time `json:"last_used,omitzero"`
	Revoked    bool      `json:"revoked,omitempty"`
	RevokeTime time.Time `json:"revoke_time,omitzero"`
}

// lastUsedResolution bounds how often a key's last-used time is written.
const lastUsedResolution = time.Minute

// lastUsedAhead is how far in the clock's future a stored last use may be before it is written
// again: further ahead, it was written while the clock ran ahead (set back since), and would
// otherwise stay frozen until the clock caught up. Replicas whose clocks disagree by less never
// rewrite each other's.
const lastUsedAhead = time.Hour

// lastUseStale says whether a key last used at last has its last use written at now.
func lastUseStale(now, last time.Time) bool {
	d := now.Sub(last)
	return d > lastUsedResolution || d < -lastUsedAhead
}

// keyTable holds every key record in memory, by hash and by id, so authenticating a call reads
// no disk and no network.
type keyTable struct {
	mu     sync.RWMutex
	byHash map[string]*Key
	byID   map[string]*Key
}

func (t *keyTable) reset(keys []Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byHash, t.byID = make(map[string]*Key, len(keys)), make(map[string]*Key, len(keys))
	for i := range keys {
		t.byHash[keys[i].Hash], t.byID[keys[i].ID] = &keys[i], &keys[i]
	}
}

// put stores k, replacing the record with its id.
func (t *keyTable) put(k Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.byID[k.ID]; ok && old.Hash != k.Hash {
		delete(t.byHash, old.Hash)
	}
	t.byHash[k.Hash], t.byID[k.ID] = &k, &k
}

// remove drops the record with id.
func (t *keyTable) remove(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.byID[id]; ok {
		delete(t.byHash, old.Hash)
		delete(t.byID, id)
	}
}

// exists says whether a key with this hash or id is held.
func (t *keyTable) exists(hash, id string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, byHash := t.byHash[hash]
	_, byID := t.byID[id]
	return byHash || byID
}

func (t *keyTable) byHashCopy(hash string) (Key, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	k, ok := t.byHash[hash]
	if !ok {
		return Key{}, false
	}
	return *k, true
}

func (t *keyTable) byIDCopy(id string) (Key, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	k, ok := t.byID[id]
	if !ok {
		return Key{}, false
	}
	return *k, true
}

// lookup returns a copy of the key with that hash. When the key is live and its last use is
// stale, the table takes the new time, and write stores it in the background (counted in wg,
// which Close waits for), at most once per lastUsedResolution.
func (t *keyTable) lookup(hash string, wg *sync.WaitGroup, write func(updated Key)) (Key, bool) {
	k, ok := t.byHashCopy(hash)
	if !ok || k.Revoked || !lastUseStale(time.Now(), k.LastUsed) {
		return k, ok
	}
	if updated, ok := t.stale(k.ID, time.Now().UTC()); ok {
		wg.Go(func() { write(updated) })
	}
	return k, ok
}

// stale returns the key with id with its last use set to now when the stored one is stale
// (lastUseStale) and the key is not revoked, updating the table, so one caller writes it.
func (t *keyTable) stale(id string, now time.Time) (Key, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := t.byID[id]
	if k == nil || k.Revoked || !lastUseStale(now, k.LastUsed) {
		return Key{}, false
	}
	k.LastUsed = now
	return *k, true
}

// list returns every key ordered by creation time.
func (t *keyTable) list() []Key {
	t.mu.RLock()
	out := make([]Key, 0, len(t.byID))
	for _, k := range t.byID {
		out = append(out, *k)
	}
	t.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreateTime.Equal(out[j].CreateTime) {
			return out[i].CreateTime.Before(out[j].CreateTime)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// revoked is k revoked now, or k as it is when it already was.
func revoked(k Key) Key {
	if !k.Revoked {
		k.Revoked, k.RevokeTime = true, time.Now().UTC()
	}
	return k
}

func (s *Bolt) loadKeys() error {
	var keys []Key
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(keysBucket).ForEach(func(_, v []byte) error {
			var k Key
			if err := json.Unmarshal(v, &k); err != nil {
				return err
			}
			keys = append(keys, k)
			return nil
		})
	})
	s.keys.reset(keys)
	return err
}

// CreateKey stores a new key record; a key with the same hash or id is refused.
func (s *Bolt) CreateKey(ctx context.Context, k Key, hook Hook) error {
	val, err := json.Marshal(k)
	if err != nil {
		return err
	}
	s.keyWrites.Lock()
	defer s.keyWrites.Unlock()
	if s.keys.exists(k.Hash, k.ID) {
		return ErrExists
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(keysBucket).Put([]byte(k.ID), val); err != nil {
			return err
		}
		return runHook(s.recorder(tx), hook)
	})
	if err != nil {
		return err
	}
	s.keys.put(k)
	return nil
}

// KeyByHash returns a copy of the key with that hash. A stale last-used time is refreshed in
// the background, at most once per lastUsedResolution.
func (s *Bolt) KeyByHash(ctx context.Context, hash string) (Key, bool, error) {
	k, ok := s.keys.lookup(hash, &s.touches, s.writeLastUse)
	return k, ok, nil
}

// HeldKeyByHash is KeyByHash without the last-used refresh: one process holds the file, so
// what it holds is current.
func (s *Bolt) HeldKeyByHash(hash string) (Key, bool) { return s.keys.byHashCopy(hash) }

// writeLastUse writes a key's new last use unless it was revoked or removed meanwhile.
func (s *Bolt) writeLastUse(updated Key) {
	val, err := json.Marshal(updated)
	if err != nil {
		return
	}
	id := []byte(updated.ID)
	// Losing a last-used refresh on a crash is harmless; it is rewritten on the next use.
	_ = s.db.Batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(keysBucket)
		if b.Get(id) == nil {
			return nil
		}
		var cur Key
		if err := json.Unmarshal(b.Get(id), &cur); err != nil || cur.Revoked {
			return err
		}
		return b.Put(id, val)
	})
}

// KeyByID returns a copy of the key with that id.
func (s *Bolt) KeyByID(ctx context.Context, id string) (Key, bool, error) {
	k, ok := s.keys.byIDCopy(id)
	return k, ok, nil
}

// ListKeys returns keys ordered by creation time.
func (s *Bolt) ListKeys(ctx context.Context) ([]Key, error) { return s.keys.list(), nil }

// RevokeKey marks a key revoked; it stops working at once.
func (s *Bolt) RevokeKey(ctx context.Context, id string, hook Hook) (Key, error) {
	s.keyWrites.Lock()
	defer s.keyWrites.Unlock()
	k, ok := s.keys.byIDCopy(id)
	if !ok {
		return Key{}, ErrNotFound
	}
	updated := revoked(k)
	val, err := json.Marshal(updated)
	if err != nil {
		return Key{}, err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(keysBucket).Put([]byte(id), val); err != nil {
			return err
		}
		return runHook(s.recorder(tx), hook)
	})
	if err != nil {
		return Key{}, err
	}
	s.keys.put(updated)
	return updated, nil
}
