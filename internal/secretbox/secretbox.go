// Package secretbox encrypts secrets at rest with AES-256-GCM under a key file kept apart from
// the data, so a copied bbolt file alone reveals no secret.
package secretbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// Box seals and opens values.
type Box struct {
	aead cipher.AEAD
}

// LoadOrCreate reads the 32-byte key (hex) at path, creating it with mode 0600 when it does not
// exist. A key file readable by others is refused.
func LoadOrCreate(path string) (*Box, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("secretbox: generate key: %w", err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("secretbox: create key file: %w: create its directory (owned by this user, mode 700), or name an existing key file", err)
		}
		if _, err := f.WriteString(hex.EncodeToString(key) + "\n"); err != nil {
			f.Close()
			return nil, fmt.Errorf("secretbox: write key file: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, fmt.Errorf("secretbox: write key file: %w", err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("secretbox: write key file: %w", err)
		}
		return New(key)
	}
	if err != nil {
		return nil, fmt.Errorf("secretbox: read key file: %w", err)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secretbox: key file %s is readable by others (mode %v): chmod 600 it", path, st.Mode().Perm())
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("secretbox: key file %s must hold 64 hex characters (32 bytes)", path)
	}
	return New(key)
}

// New returns a Box for a 32-byte key.
func New(key []byte) (*Box, error) {
	if len(key) != 32 {
		return nil, errors.New("secretbox: key must be 32 bytes")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secretbox: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secretbox: %w", err)
	}
	return &Box{aead: aead}, nil
}

// Seal encrypts plaintext bound to context (e.g. "server/<ref>/env"), so a sealed value cannot
// be moved to another record unnoticed.
func (b *Box) Seal(plaintext, context []byte) []byte {
	nonce := make([]byte, b.aead.NonceSize(), b.aead.NonceSize()+len(plaintext)+b.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return b.aead.Seal(nonce, nonce, plaintext, context)
}

// ErrOpen means a sealed value could not be decrypted: wrong key file or tampered data.
var ErrOpen = errors.New("secretbox: cannot decrypt a stored secret: the secrets key file does not match this data, or the data was altered")

// Open decrypts a value sealed with the same context.
func (b *Box) Open(sealed, context []byte) ([]byte, error) {
	n := b.aead.NonceSize()
	if len(sealed) < n+b.aead.Overhead() {
		return nil, ErrOpen
	}
	out, err := b.aead.Open(nil, sealed[:n], sealed[n:], context)
	if err != nil {
		return nil, ErrOpen
	}
	return out, nil
}
