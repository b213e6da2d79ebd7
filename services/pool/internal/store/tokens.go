package store

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"
)

// AgentToken is a bearer token of the MCP front door, kept with its run: which agent of which
// run it speaks for, and until when. The token itself is never stored: Hash is its SHA-256,
// which a presented token is looked up by.
type AgentToken struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	RunID  string `json:"run_id"`
	Agent  string `json:"agent"`
	// Hash is the lowercase hex SHA-256 of the token.
	Hash       string    `json:"hash"`
	CreateTime time.Time `json:"create_time"`
	ExpireTime time.Time `json:"expire_time"`
	// CreatedBy names who minted it, as admin records name an actor.
	CreatedBy string `json:"created_by,omitempty"`
}

func tokenKey(tenant, run, id string) []byte { return []byte(tenant + "/" + run + "/" + id) }

// PutAgentToken stores a new token and its hash index, durably.
func (s *Store) PutAgentToken(ctx context.Context, t AgentToken) error {
	val, err := json.Marshal(t)
	if err != nil {
		return err
	}
	key := tokenKey(t.Tenant, t.RunID, t.ID)
	return s.db.Batch(func(tx *bolt.Tx) error {
		if err := tx.Bucket(agentTokensBucket).Put(key, val); err != nil {
			return err
		}
		return tx.Bucket(agentTokenHashesBucket).Put([]byte(t.Hash), key)
	})
}

// AgentTokenByHash finds the token whose SHA-256 is hash; ErrNotFound when none is stored (a
// wrong token, or one revoked or dropped with its run).
func (s *Store) AgentTokenByHash(ctx context.Context, hash string) (AgentToken, error) {
	var t AgentToken
	err := s.db.View(func(tx *bolt.Tx) error {
		key := tx.Bucket(agentTokenHashesBucket).Get([]byte(hash))
		if key == nil {
			return ErrNotFound
		}
		v := tx.Bucket(agentTokensBucket).Get(key)
		if v == nil {
			return ErrNotFound
		}
		return json.Unmarshal(v, &t)
	})
	return t, err
}

// RunAgentTokens reads a run's tokens, in the order of their ids.
func (s *Store) RunAgentTokens(ctx context.Context, tenant, run string) ([]AgentToken, error) {
	var out []AgentToken
	prefix := []byte(tenant + "/" + run + "/")
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(agentTokensBucket).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			var t AgentToken
			if err := json.Unmarshal(v, &t); err != nil {
				return err
			}
			out = append(out, t)
		}
		return nil
	})
	return out, err
}

// DeleteAgentTokens removes tokens of a run by id (unknown ids are skipped) and returns those
// it removed.
func (s *Store) DeleteAgentTokens(ctx context.Context, tenant, run string, ids ...string) ([]AgentToken, error) {
	var gone []AgentToken
	err := s.db.Batch(func(tx *bolt.Tx) error {
		gone = gone[:0] // Batch may run the function again
		b, idx := tx.Bucket(agentTokensBucket), tx.Bucket(agentTokenHashesBucket)
		for _, id := range ids {
			key := tokenKey(tenant, run, id)
			v := b.Get(key)
			if v == nil {
				continue
			}
			var t AgentToken
			if err := json.Unmarshal(v, &t); err != nil {
				return err
			}
			if err := idx.Delete([]byte(t.Hash)); err != nil {
				return err
			}
			if err := b.Delete(key); err != nil {
				return err
			}
			gone = append(gone, t)
		}
		return nil
	})
	return gone, err
}

// ExpiredAgentTokens lists every token that expired before now, across runs, at most limit.
func (s *Store) ExpiredAgentTokens(ctx context.Context, now time.Time, limit int) ([]AgentToken, error) {
	var out []AgentToken
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(agentTokensBucket).Cursor()
		for k, v := c.First(); k != nil && len(out) < limit; k, v = c.Next() {
			var t AgentToken
			if err := json.Unmarshal(v, &t); err != nil {
				return err
			}
			if t.ExpireTime.Before(now) {
				out = append(out, t)
			}
		}
		return nil
	})
	return out, err
}
