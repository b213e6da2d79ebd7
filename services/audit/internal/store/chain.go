package store

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"strconv"

	"github.com/ringfence/ringfence/internal/audit"
)

// Genesis is the hash the first record chains from. It is fixed so that two logs, or a
// log and its export, agree on where a chain starts.
var Genesis = sha256.Sum256([]byte("ringfence.audit.v1 genesis"))

// hashLen is the size of a chain hash, stored in front of every body.
const hashLen = sha256.Size

// chainer computes hash_i = SHA-256(hash_{i-1} || body_i) without allocating.
type chainer struct {
	h   hash.Hash
	out [hashLen]byte
}

func newChainer() *chainer { return &chainer{h: sha256.New()} }

func (c *chainer) next(prev *[hashLen]byte, body []byte) [hashLen]byte {
	c.h.Reset()
	c.h.Write(prev[:])
	c.h.Write(body)
	c.h.Sum(c.out[:0])
	return c.out
}

// appendBodyPrefix appends `{"seq":N,"prev_hash":"<hex>"` to dst. Every body starts
// with exactly these bytes, which lets Verify check that a body names its own position
// in the chain without decoding JSON.
func appendBodyPrefix(dst []byte, seq uint64, prev *[hashLen]byte) []byte {
	dst = append(dst, `{"seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, `,"prev_hash":"`...)
	dst = hex.AppendEncode(dst, prev[:])
	return append(dst, '"')
}

// bodyPrefixLen is the length of what appendBodyPrefix writes for seq.
func bodyPrefixLen(seq uint64) int {
	digits := 1
	for n := seq; n >= 10; n /= 10 {
		digits++
	}
	return len(`{"seq":`) + digits + len(`,"prev_hash":"`) + 2*hashLen + len(`"`)
}

// maxBodyPrefix bounds what appendBodyPrefix adds: `{"seq":` (7), up to 20 digits,
// `,"prev_hash":"` (14), 64 hex digits, `"` and the splice's comma.
const maxBodyPrefix = 7 + 20 + 14 + 2*hashLen + 2

// buildBody splices seq and prev_hash in front of the record's own JSON (marshalled
// by the caller with Seq zero, so without a seq field). The result is deterministic
// because the record JSON is: fixed field order, no maps, UTC time.
func buildBody(dst []byte, seq uint64, prev *[hashLen]byte, recJSON []byte) []byte {
	dst = appendBodyPrefix(dst, seq, prev)
	if len(recJSON) > 2 {
		dst = append(dst, ',')
		dst = append(dst, recJSON[1:]...)
	} else {
		dst = append(dst, '}')
	}
	return dst
}

// storedBody is the decoded form of a body.
type storedBody struct {
	audit.Record
	PrevHash string `json:"prev_hash"`
}

func decodeEntry(key, value []byte) (Entry, error) {
	if len(key) != 8 || len(value) < hashLen {
		return Entry{}, errors.New("audit: malformed record")
	}
	var b storedBody
	if err := json.Unmarshal(value[hashLen:], &b); err != nil {
		return Entry{}, fmt.Errorf("audit: decode record %d: %w", binary.BigEndian.Uint64(key), err)
	}
	e := Entry{Record: b.Record}
	copy(e.Hash[:], value[:hashLen])
	if _, err := hex.Decode(e.PrevHash[:], []byte(b.PrevHash)); err != nil {
		return Entry{}, fmt.Errorf("audit: decode record %d: prev_hash: %w", binary.BigEndian.Uint64(key), err)
	}
	return e, nil
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq) }

// appendIndexKey appends len(name) (2 BE) || name || seq (8 BE). The length prefix
// keeps one name's keys from running into another's whatever bytes a tenant or run id
// contains.
func appendIndexKey[T string | []byte](dst []byte, name T, seq uint64) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(name)))
	dst = append(dst, name...)
	return binary.BigEndian.AppendUint64(dst, seq)
}

func indexPrefix(name string) []byte {
	k := appendIndexKey(nil, name, 0)
	return k[:len(k)-8]
}
