package store

import (
	"context"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/secretbox"
)

// Secret describes a stored secret without its value.
type Secret struct {
	Name       string
	UpdateTime time.Time
}

type storedSecret struct {
	Sealed     []byte    `json:"sealed"`
	UpdateTime time.Time `json:"update_time"`
}

func secretContext(name string) []byte { return []byte("registry/secret/" + name) }

// sealSecret is a secret's value at rest.
func sealSecret(box *secretbox.Box, name, value string) ([]byte, storedSecret, error) {
	st := storedSecret{Sealed: box.Seal([]byte(value), secretContext(name)), UpdateTime: time.Now().UTC()}
	val, err := json.Marshal(st)
	return val, st, err
}

// openSecret is a stored secret's clear value.
func openSecret(box *secretbox.Box, name string, st storedSecret) (string, error) {
	plain, err := box.Open(st.Sealed, secretContext(name))
	if err != nil {
		return "", err
	}
	return string(plain), nil
}

// PutSecret creates or replaces a secret; the value is sealed before it reaches the file.
func (s *Bolt) PutSecret(ctx context.Context, name, value string, hook Hook) (Secret, error) {
	val, st, err := sealSecret(s.box, name, value)
	if err != nil {
		return Secret{}, err
	}
	err = s.db.Batch(func(tx *bolt.Tx) error {
		if err := tx.Bucket(secretsBucket).Put([]byte(name), val); err != nil {
			return err
		}
		return runHook(s.recorder(tx), hook)
	})
	return Secret{Name: name, UpdateTime: st.UpdateTime}, err
}

// SecretValue returns a secret's clear value.
func (s *Bolt) SecretValue(ctx context.Context, name string) (string, error) {
	var st storedSecret
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(secretsBucket).Get([]byte(name))
		if v == nil {
			return ErrNotFound
		}
		return json.Unmarshal(v, &st)
	})
	if err != nil {
		return "", err
	}
	return openSecret(s.box, name, st)
}

// ListSecrets lists every secret name in order.
func (s *Bolt) ListSecrets(ctx context.Context) ([]Secret, error) {
	var out []Secret
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(secretsBucket).ForEach(func(k, v []byte) error {
			var st storedSecret
			if err := json.Unmarshal(v, &st); err != nil {
				return err
			}
			out = append(out, Secret{Name: string(k), UpdateTime: st.UpdateTime})
			return nil
		})
	})
	return out, err
}

// DeleteSecret removes a secret.
func (s *Bolt) DeleteSecret(ctx context.Context, name string, hook Hook) error {
	return s.db.Batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(secretsBucket)
		if b.Get([]byte(name)) == nil {
			return ErrNotFound
		}
		if err := b.Delete([]byte(name)); err != nil {
			return err
		}
		return runHook(s.recorder(tx), hook)
	})
}
