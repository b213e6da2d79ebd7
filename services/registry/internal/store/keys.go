package store

import (
	"context"
	"encoding/json"
	"sort"
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

func (s *Store) loadKeys() error {
	s.keysByHash = make(map[string]*Key)
	s.keysByID = make(map[string]*Key)
	return s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(keysBucket).ForEach(func(_, v []byte) error {
			var k Key
			if err := json.Unmarshal(v, &k); err != nil {
				return err
			}
			s.keysByHash[k.Hash] = &k
			s.keysByID[k.ID] = &k
			return nil
		})
	})
}

// CreateKey stores a new key record; a key with the same hash or id is refused.
func (s *Store) CreateKey(ctx context.Context, k Key, hook TxHook) error {
	val, err := json.Marshal(k)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.keysByHash[k.Hash]; dup {
		return ErrExists
	}
	if _, dup := s.keysByID[k.ID]; dup {
		return ErrExists
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(keysBucket).Put([]byte(k.ID), val); err != nil {
			return err
		}
		return runHook(tx, hook)
	})
	if err != nil {
		return err
	}
	kk := k
	s.keysByHash[k.Hash], s.keysByID[k.ID] = &kk, &kk
	return nil
}

// KeyByHash returns a copy of the key with that hash. A stale last-used time is refreshed in
// the background, at most once per lastUsedResolution.
func (s *Store) KeyByHash(hash string) (Key, bool) {
	s.mu.RLock()
	k, ok := s.keysByHash[hash]
	var out Key
	if ok {
		out = *k
	}
	s.mu.RUnlock()
	if ok && !out.Revoked && time.Since(out.LastUsed) > lastUsedResolution {
		s.touch(out.ID)
	}
	return out, ok
}

func (s *Store) touch(id string) {
	now := time.Now().UTC()
	s.mu.Lock()
	k := s.keysByID[id]
	if k == nil || now.Sub(k.LastUsed) <= lastUsedResolution {
		s.mu.Unlock()
		return
	}
	k.LastUsed = now
	updated := *k
	s.mu.Unlock()
	s.touches.Add(1)
	go func() {
		defer s.touches.Done()
		val, err := json.Marshal(updated)
		if err != nil {
			return
		}
		// Losing a last-used refresh on a crash is harmless; it is rewritten on the next use.
		_ = s.db.Batch(func(tx *bolt.Tx) error {
			b := tx.Bucket(keysBucket)
			if b.Get([]byte(id)) == nil {
				return nil
			}
			var cur Key
			if err := json.Unmarshal(b.Get([]byte(id)), &cur); err != nil || cur.Revoked {
				return err
			}
			return b.Put([]byte(id), val)
		})
	}()
}

// KeyByID returns a copy of the key with that id.
func (s *Store) KeyByID(id string) (Key, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	k, ok := s.keysByID[id]
	if !ok {
		return Key{}, false
	}
	return *k, true
}

// ListKeys returns keys ordered by creation time.
func (s *Store) ListKeys(ctx context.Context) []Key {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Key, 0, len(s.keysByID))
	for _, k := range s.keysByID {
		out = append(out, *k)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreateTime.Equal(out[j].CreateTime) {
			return out[i].CreateTime.Before(out[j].CreateTime)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// RevokeKey marks a key revoked; it stops working at once.
func (s *Store) RevokeKey(ctx context.Context, id string, hook TxHook) (Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keysByID[id]
	if !ok {
		return Key{}, ErrNotFound
	}
	updated := *k
	if !updated.Revoked {
		updated.Revoked, updated.RevokeTime = true, time.Now().UTC()
	}
	val, err := json.Marshal(updated)
	if err != nil {
		return Key{}, err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(keysBucket).Put([]byte(id), val); err != nil {
			return err
		}
		return runHook(tx, hook)
	})
	if err != nil {
		return Key{}, err
	}
	*k = updated
	return updated, nil
}
