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
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Box seals and opens values. It holds one key or more: the first seals, and every one opens
// (the first tried first), so a key file can name a new key beside the old one while the values
// sealed under the old one are re-sealed (Reseal).
type Box struct {
	aeads []cipher.AEAD
	path  string
}

// LoadOrCreate reads the key file at path, creating it with one key and mode 0600 when it does
// not exist. A key file readable by others is refused. The file holds one key a line, 64 hex
// characters (32 bytes) each; blank lines and lines starting with # are allowed, and CRLF line
// ends, blanks around a key and a UTF-8 byte order mark are taken as an editor writes them. The
// first key seals; every key opens.
func LoadOrCreate(path string) (*Box, error) {
	data, err := readKeyFile(path)
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
		return newBox(path, key)
	}
	if err != nil {
		return nil, err
	}
	keys, err := ParseKeys(path, data)
	if err != nil {
		return nil, err
	}
	return newBox(path, keys...)
}

// MaxKeyFileBytes bounds what is read of a key file: its keys, comments and blank lines. A
// larger file is refused unread (a path named by mistake: a log, a disk image).
const MaxKeyFileBytes = 1 << 20

// MaxKeys bounds the keys of a key file: a value is tried against each key in turn, and a
// rotation adds one, so the lines a re-seal freed are removed long before.
const MaxKeys = 100

// readKeyFile reads the key file at path, a regular file (a link to one is followed) of
// MaxKeyFileBytes at most, that only its owner may read. A missing file answers an error that
// is fs.ErrNotExist; every other refusal names the file, the problem and the fix, never its
// content.
func readKeyFile(path string) ([]byte, error) {
	// O_NONBLOCK: opening a named pipe for reading otherwise waits for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if target, lerr := os.Readlink(path); lerr == nil {
			return nil, fmt.Errorf("secretbox: key file %s is a link to %s, which does not exist: restore the key file it points at (the data was sealed with it), or point secrets_key_file at the key file itself", path, target)
		}
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("secretbox: read key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("secretbox: read key file: %w", err)
	}
	switch {
	case st.IsDir():
		return nil, fmt.Errorf("secretbox: key file %s is a directory: name the key file itself (secrets_key_file, or --file), e.g. %s", path, filepath.Join(path, "secrets.key"))
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("secretbox: key file %s is not a regular file (%v): a key file is a file of its own, one key a line, mode 600; name it (secrets_key_file, or --file)", path, st.Mode().Type())
	case st.Size() > MaxKeyFileBytes:
		return nil, fmt.Errorf("secretbox: key file %s is %d bytes, more than a key file holds (%d bytes at most): it is not a key file; name the key file the data was sealed with (secrets_key_file, or --file)", path, st.Size(), MaxKeyFileBytes)
	case st.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("secretbox: key file %s is readable by others (mode %v): chmod 600 it", path, st.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("secretbox: read key file %s: %w", path, err)
	}
	if len(data) > MaxKeyFileBytes {
		return nil, fmt.Errorf("secretbox: key file %s grew past %d bytes while it was read: it is not a key file; name the key file the data was sealed with (secrets_key_file, or --file)", path, MaxKeyFileBytes)
	}
	return data, nil
}

// byteOrderMark is UTF-8's, which some editors put at the head of a file they save.
const byteOrderMark = "\ufeff"

// ParseKeys reads the keys of a key file's content, in order; name is the file, for errors.
// A line that is not a key, a key that repeats an earlier line, and a file without a key are
// refused, naming the line and never its content.
func ParseKeys(name string, data []byte) ([][]byte, error) {
	var keys [][]byte
	seen := map[string]int{}
	for i, line := range strings.Split(string(data), "\n") {
		// TrimSpace takes a CRLF's \r and trailing blanks; a byte order mark (an editor on
		// Windows writes one) is no space to it, so it goes first.
		line = strings.TrimSpace(strings.TrimPrefix(line, byteOrderMark))
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := hex.DecodeString(line)
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("secretbox: key file %s line %d is not a key: each line holds one key of 64 hex characters (32 bytes), a # comment, or nothing; fix or remove the line (a new key is added as the first line by `secrets-key rotate` of ringfenced, ringfence-registry or ringfence-pool)", name, i+1)
		}
		if first, ok := seen[string(key)]; ok {
			return nil, fmt.Errorf("secretbox: key file %s line %d repeats the key of line %d: remove one of the two lines", name, i+1, first)
		}
		seen[string(key)] = i + 1
		keys = append(keys, key)
		if len(keys) > MaxKeys {
			return nil, fmt.Errorf("secretbox: key file %s holds more than %d keys (line %d holds key %d): each sealed value is tried against every key; keep the first key and the few the data still needs (a start's log says when every sealed value opens with the first key, and the other lines can go)", name, MaxKeys, i+1, len(keys))
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("secretbox: key file %s holds no key: it must hold 64 hex characters (32 bytes) on a line; restore the key file the data was sealed with (an empty file is not a new key)", name)
	}
	return keys, nil
}

// New returns a Box for a 32-byte key.
func New(key []byte) (*Box, error) { return newBox("", key) }

// NewKeys returns a Box whose first key seals and whose every key opens.
func NewKeys(keys ...[]byte) (*Box, error) { return newBox("", keys...) }

func newBox(path string, keys ...[]byte) (*Box, error) {
	if len(keys) == 0 {
		return nil, errors.New("secretbox: no key")
	}
	b := &Box{path: path}
	for _, key := range keys {
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
		b.aeads = append(b.aeads, aead)
	}
	return b, nil
}

// Keys is how many keys the box holds: more than one while a rotation is under way.
func (b *Box) Keys() int { return len(b.aeads) }

// Path is the key file the box was loaded from ("" for New and NewKeys).
func (b *Box) Path() string { return b.path }

// Seal encrypts plaintext bound to context (e.g. "server/<ref>/env"), so a sealed value cannot
// be moved to another record unnoticed.
func (b *Box) Seal(plaintext, context []byte) []byte {
	aead := b.aeads[0]
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plaintext)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return aead.Seal(nonce, nonce, plaintext, context)
}

// ErrOpen means a sealed value could not be decrypted: wrong key file or tampered data.
var ErrOpen = errors.New("secretbox: cannot decrypt a stored secret: the secrets key file does not match this data, or the data was altered")

// Open decrypts a value sealed with the same context, under any key of the box.
func (b *Box) Open(sealed, context []byte) ([]byte, error) {
	plain, _, err := b.open(sealed, context)
	return plain, err
}

// open decrypts sealed and reports the index of the key that opened it.
func (b *Box) open(sealed, context []byte) ([]byte, int, error) {
	for i, aead := range b.aeads {
		n := aead.NonceSize()
		if len(sealed) < n+aead.Overhead() {
			return nil, 0, ErrOpen
		}
		if out, err := aead.Open(nil, sealed[:n], sealed[n:], context); err == nil {
			return out, i, nil
		}
	}
	return nil, 0, ErrOpen
}

// Reseal returns sealed re-sealed under the first key when only a later key opens it
// (resealed true), or sealed itself when the first key opens it; ErrOpen when no key does.
func (b *Box) Reseal(sealed, context []byte) (out []byte, resealed bool, err error) {
	plain, i, err := b.open(sealed, context)
	if err != nil {
		return nil, false, err
	}
	if i == 0 {
		return sealed, false, nil
	}
	return b.Seal(plain, context), true, nil
}
