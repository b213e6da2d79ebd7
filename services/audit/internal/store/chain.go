package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"time"

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

// receiveTimeLayout is the receive time's fixed-width form (UTC, nanoseconds), so the
// splice has one length whatever the time.
const receiveTimeLayout = "2006-01-02T15:04:05.000000000Z"

// receiveTimeKey starts the spliced receive time.
const receiveTimeKey = `,"receive_time":"`

// receiveTimeLen is the length of the spliced receive time: key, time and closing quote.
const receiveTimeLen = len(receiveTimeKey) + len(receiveTimeLayout) + 1

// maxBodyPrefix bounds what buildBody adds: `{"seq":` (7), up to 20 digits,
// `,"prev_hash":"` (14), 64 hex digits, `"`, the receive time and the splice's comma.
const maxBodyPrefix = 7 + 20 + 14 + 2*hashLen + 1 + receiveTimeLen + 1

// buildBody splices seq, prev_hash and the log's receive time in front of the record's own
// JSON (marshalled by the caller with Seq and ReceiveTime zero, so without those fields). The
// result is deterministic because the record JSON is: fixed field order, no maps, UTC time.
// What the producer sent is the body after the splice (producerJSON recovers it).
func buildBody(dst []byte, seq uint64, prev *[hashLen]byte, received time.Time, recJSON []byte) []byte {
	dst = appendBodyPrefix(dst, seq, prev)
	dst = append(dst, receiveTimeKey...)
	dst = received.UTC().AppendFormat(dst, receiveTimeLayout)
	dst = append(dst, '"')
	if len(recJSON) > 2 {
		dst = append(dst, ',')
		dst = append(dst, recJSON[1:]...)
	} else {
		dst = append(dst, '}')
	}
	return dst
}

// producerJSON appends to dst the record as its producer sent it (what the by_id digest
// covers): body without what buildBody spliced in, the receive time of records that have one
// included.
func producerJSON(dst, body []byte, seq uint64) []byte {
	dst = append(dst, '{')
	rest := body[min(bodyPrefixLen(seq), len(body)):]
	if bytes.HasPrefix(rest, []byte(receiveTimeKey)) && len(rest) >= receiveTimeLen {
		rest = rest[receiveTimeLen:]
	}
	if len(rest) > 1 {
		return append(dst, rest[1:]...)
	}
	return append(dst, '}')
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

// appendTenantRunKey appends by_tenant_run's key of a tenant's run: an index key whose name is len(tenant) (2 BE) ||
// tenant || run, so that no tenant and run run into another pair.
func appendTenantRunKey[T string | []byte](dst []byte, tenant, run T, seq uint64) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(2+len(tenant)+len(run)))
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(tenant)))
	dst = append(dst, tenant...)
	dst = append(dst, run...)
	return binary.BigEndian.AppendUint64(dst, seq)
}

// callEpochShift sizes the epochs that lead the call indexes' keys: 4,096 records each.
// Call ids are the caller's choice and mostly random (the pool's, an LLM provider's), so
// keyed by the id alone each record's entries would land on random pages of an index as large
// as the log, and every commit would rewrite as many pages as it has records (appends on a
// 300,000-record log fell below a third of what they were). Led by the epoch of the record's
// seq, a commit's entries land in the newest epoch's few pages, and a call is read as one range
// per epoch (244 seeks on a log of a million records: well under a millisecond).
const callEpochShift = 12

// callEpoch is the epoch of the record at seq in the call indexes.
func callEpoch(seq uint64) uint32 { return uint32(seq >> callEpochShift) }

// appendCallKey appends by_call's key of a call: epoch (4 BE) || len(call) (2 BE) || call ||
// seq (8 BE).
func appendCallKey[T string | []byte](dst []byte, call T, seq uint64) []byte {
	return appendIndexKey(binary.BigEndian.AppendUint32(dst, callEpoch(seq)), call, seq)
}

// appendTenantCallKey appends by_tenant_call's key of a tenant's call: epoch (4 BE) || the
// rest as by_tenant_run's key of a tenant's run, the call id in place of the run id.
func appendTenantCallKey[T string | []byte](dst []byte, tenant, call T, seq uint64) []byte {
	return appendTenantRunKey(binary.BigEndian.AppendUint32(dst, callEpoch(seq)), tenant, call, seq)
}

func tenantRunPrefix(tenant, run string) []byte {
	k := appendTenantRunKey(nil, tenant, run, 0)
	return k[:len(k)-8]
}

func indexPrefix(name string) []byte {
	k := appendIndexKey(nil, name, 0)
	return k[:len(k)-8]
}
