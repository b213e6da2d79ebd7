package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"

	bolt "go.etcd.io/bbolt"
)

// indexChecker proves, alongside Verify's chain walk, that the indexes say what the
// records say. The chain covers the records bucket only: deleting a by_run or by_tenant
// entry would hide a record from `list --run` and `--tenant` while the chain still
// verified, and a changed by_id entry would turn a producer's honest retry into an ID
// conflict.
//
// Looking every entry up costs a B+tree search per entry, several times the chain
// itself. Instead the checker sums a keyed hash of every entry the records require and,
// in one sequential pass per index, of every entry the index holds: equal counts and
// sums mean equal sets. The key is drawn at random per Verify, so nobody who edits the
// file can make a different set sum the same. Only when the sums differ does the checker
// look entries up, to name the record.
type indexChecker struct {
	seed                maphash.Seed
	want, have          [numIndexes]indexSum
	entry, js, key, idv []byte // scratch
}

// The indexes the checker covers, by position in its sums.
const (
	ixByID = iota
	ixByTenant
	ixByRun
	ixByTenantRun
	ixByCall
	ixByTenantCall
	numIndexes
)

var indexBuckets = [numIndexes][]byte{bucketByID, bucketByTenant, bucketByRun, bucketByTenantRun, bucketByCall, bucketByTenantCall}

// indexSubject is what each index is read by, for messages.
var indexSubject = [numIndexes]string{"id", "tenant", "run", "tenant and run", "call", "tenant and call"}

// maxKeysPerIndex bounds the entries one record has in one index: two in by_call and
// by_tenant_call (its call id and the call whose approved outcome it was handed), one elsewhere.
const maxKeysPerIndex = 2

type indexSum struct{ n, sum uint64 }

func newIndexChecker() *indexChecker { return &indexChecker{seed: maphash.MakeSeed()} }

func (c *indexChecker) add(s *indexSum, key, val []byte) {
	c.entry = append(append(c.entry[:0], key...), val...)
	s.n++
	s.sum += maphash.Bytes(c.seed, c.entry)
}

// records adds the index entries the records up to headSeq require, reading them in
// chunks like the chain walk, which it runs beside: it needs nothing the walk computes,
// so Verify takes the longer of the two instead of their sum. It returns the first
// record whose body cannot be read, and why. If the walk then finds the chain broken,
// its answer stands for every record from there on.
func (c *indexChecker) records(ctx context.Context, db *bolt.DB, headSeq uint64) (uint64, string, error) {
	next := uint64(1)
	for next <= headSeq {
		if err := ctx.Err(); err != nil {
			return 0, "", err
		}
		var badAt uint64
		var reason string
		err := db.View(func(tx *bolt.Tx) error {
			cur := tx.Bucket(bucketRecords).Cursor()
			k, v := cur.Seek(seqKey(next))
			for n := 0; n < verifyChunk && next <= headSeq; n++ {
				if len(k) != 8 || binary.BigEndian.Uint64(k) != next || len(v) < hashLen {
					badAt = next // the chain walk names what is wrong here
					return nil
				}
				if r := c.record(next, v[hashLen:]); r != "" {
					badAt, reason = next, r
					return nil
				}
				next++
				k, v = cur.Next()
			}
			return nil
		})
		if err != nil || badAt != 0 {
			return badAt, reason, err
		}
	}
	return 0, "", nil
}

// record adds the index entries record seq requires, from its body. It returns a reason
// when the body cannot be read.
func (c *indexChecker) record(seq uint64, body []byte) string {
	f, ok := indexedFields(body)
	if !ok {
		return "body is not a JSON object with a string id"
	}
	for ix := range numIndexes {
		for nth := range maxKeysPerIndex {
			key, ok := requiredKey(c.key[:0], ix, f, seq, nth)
			if !ok {
				continue
			}
			c.key = key
			val := noValue
			if ix == ixByID {
				val = c.idValue(seq, body)
			}
			c.add(&c.want[ix], key, val)
		}
	}
	return ""
}

// requiredKey is the nth key (from 0, below maxKeysPerIndex) a record with fields f at seq
// needs in index ix, appended to dst (by_id's is the id itself); false when it needs no nth
// there. It copies: f may point into the read-only file.
func requiredKey(dst []byte, ix int, f bodyFields, seq uint64, nth int) ([]byte, bool) {
	if ix == ixByCall || ix == ixByTenantCall {
		call := indexedCall(f.call, f.dispatched, nth)
		if ix == ixByCall {
			return appendCallKey(dst, call, seq), call != nil
		}
		return appendTenantCallKey(dst, f.tenant, call, seq), f.tenant != nil && call != nil
	}
	if nth != 0 {
		return dst, false
	}
	switch ix {
	case ixByID:
		return append(dst, f.id...), true
	case ixByTenant:
		return appendIndexKey(dst, f.tenant, seq), f.tenant != nil
	case ixByRun:
		return appendIndexKey(dst, f.run, seq), f.run != nil
	default:
		return appendTenantRunKey(dst, f.tenant, f.run, seq), f.tenant != nil && f.run != nil
	}
}

// indexedCall is the nth call id a tool-call record is indexed by in by_call and
// by_tenant_call: 0 its own call_id, 1 its approval's dispatched_call_id unless that is the
// same; nil (or "") for none. The writer reads them from the record, Verify and the
// migration from the body, and both must name the same ids.
func indexedCall[T string | []byte](call, dispatched T, nth int) T {
	var none T
	switch {
	case nth == 0:
		return call
	case nth == 1 && string(dispatched) != string(call):
		return dispatched
	}
	return none
}

// idValue is the by_id value record seq requires: its seq and the digest of the record
// as its producer sent it, the body without what buildBody spliced in.
func (c *indexChecker) idValue(seq uint64, body []byte) []byte {
	c.idv, c.js = appendIDValue(c.idv[:0], c.js, seq, body)
	return c.idv
}

// indexes sums what the indexes hold at or below headSeq and compares it with what the
// records required. It returns the seq of the first entry or record at fault and why, or
// an empty reason when the indexes hold exactly the required entries.
func (c *indexChecker) indexes(tx *bolt.Tx, headSeq uint64) (uint64, string) {
	// Records appended since Verify began have entries too; beyond the head now, none.
	now := headSeq
	if v := tx.Bucket(bucketMeta).Get(keyHead); len(v) == 8+hashLen {
		now = max(now, binary.BigEndian.Uint64(v))
	}
	for ix, name := range indexBuckets {
		cur := tx.Bucket(name).Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			seq, ok := entrySeq(ix, k, v)
			switch {
			case !ok:
				return 0, fmt.Sprintf("%s index holds a malformed entry", name)
			case seq > now:
				return seq, fmt.Sprintf("%s index names record %d, past the head", name, seq)
			case seq <= headSeq:
				c.add(&c.have[ix], k, v)
			}
		}
	}
	if c.have == c.want {
		return 0, ""
	}
	if seq, reason := c.missing(tx, headSeq); reason != "" {
		return seq, reason
	}
	return c.extra(tx, headSeq)
}

// missing names the first record up to headSeq whose index entries are absent or wrong.
func (c *indexChecker) missing(tx *bolt.Tx, headSeq uint64) (uint64, string) {
	byID := tx.Bucket(bucketByID)
	cur := tx.Bucket(bucketRecords).Cursor()
	for k, v := cur.First(); len(k) == 8 && len(v) >= hashLen; k, v = cur.Next() {
		seq := binary.BigEndian.Uint64(k)
		if seq > headSeq {
			break
		}
		body := v[hashLen:]
		f, ok := indexedFields(body)
		if !ok {
			return seq, "body is not a JSON object with a string id"
		}
		got := byID.Get(f.id)
		switch {
		case got == nil:
			return seq, fmt.Sprintf("by_id index lacks record id %q", f.id)
		case len(got) != 8+16 || binary.BigEndian.Uint64(got) != seq:
			return seq, fmt.Sprintf("by_id index entry for id %q does not name this record", f.id)
		case !bytes.Equal(got, c.idValue(seq, body)):
			return seq, fmt.Sprintf("record does not match the digest its by_id entry kept at append (id %q): the record or the entry was changed", f.id)
		}
		for _, ix := range []int{ixByTenant, ixByRun, ixByTenantRun, ixByCall, ixByTenantCall} {
			for nth := range maxKeysPerIndex {
				if key, ok := requiredKey(nil, ix, f, seq, nth); ok && tx.Bucket(indexBuckets[ix]).Get(key) == nil {
					return seq, fmt.Sprintf("%s index lacks this record, so reads for %s %s do not show it", indexBuckets[ix], indexSubject[ix], keyName(ix, key))
				}
			}
		}
	}
	return 0, ""
}

// extra names the first entry at or below headSeq that no record requires: every
// required entry exists (missing found none), so an index with more entries than
// required holds a planted or stale one.
func (c *indexChecker) extra(tx *bolt.Tx, headSeq uint64) (uint64, string) {
	for ix, name := range indexBuckets {
		if c.have[ix] == c.want[ix] {
			continue
		}
		cur := tx.Bucket(name).Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			if seq, _ := entrySeq(ix, k, v); seq <= headSeq && !requires(tx, ix, k, seq) {
				return seq, fmt.Sprintf("%s index holds %d entries where its records require %d; the first unaccounted for names record %d", name, c.have[ix].n, c.want[ix].n, seq)
			}
		}
		return 0, fmt.Sprintf("%s index holds %d entries up to the head, %d expected", name, c.have[ix].n, c.want[ix].n)
	}
	return 0, ""
}

// entrySeq reads the seq an entry of index ix names.
func entrySeq(ix int, k, v []byte) (uint64, bool) {
	if ix == ixByID {
		if len(v) != 8+16 {
			return 0, false
		}
		return binary.BigEndian.Uint64(v), true
	}
	var epoch []byte
	if ix == ixByCall || ix == ixByTenantCall {
		if len(k) < 4 {
			return 0, false
		}
		epoch, k = k[:4], k[4:]
	}
	if len(k) < 2+8 || int(binary.BigEndian.Uint16(k))+2+8 != len(k) {
		return 0, false
	}
	seq := binary.BigEndian.Uint64(k[len(k)-8:])
	if epoch != nil && binary.BigEndian.Uint32(epoch) != callEpoch(seq) {
		return 0, false // in no epoch a read of its call looks in
	}
	return seq, true
}

// keyName is what an entry of index ix (not by_id) is read by, quoted for a message: `"run-1"`,
// or for a tenant's run or call `"acme" and "run-1"`.
func keyName(ix int, key []byte) string {
	if ix == ixByCall || ix == ixByTenantCall {
		key = key[4:] // the epoch
	}
	name := key[2 : len(key)-8]
	if ix != ixByTenantRun && ix != ixByTenantCall {
		return fmt.Sprintf("%q", name)
	}
	n := int(binary.BigEndian.Uint16(name))
	return fmt.Sprintf("%q and %q", name[2:2+n], name[2+n:])
}

// requires reports whether record seq needs key k in index ix.
func requires(tx *bolt.Tx, ix int, k []byte, seq uint64) bool {
	v := tx.Bucket(bucketRecords).Get(seqKey(seq))
	if len(v) < hashLen {
		return false
	}
	f, ok := indexedFields(v[hashLen:])
	if !ok {
		return false
	}
	for nth := range maxKeysPerIndex {
		if key, ok := requiredKey(nil, ix, f, seq, nth); ok && bytes.Equal(k, key) {
			return true
		}
	}
	return false
}

// bodyFields are the fields of a body the indexes are keyed by; tenant and run are nil
// when the record has none, call and dispatched (tool_call.call_id and
// tool_call.approval.dispatched_call_id) when it has none or an empty one.
type bodyFields struct {
	id, tenant, run, call, dispatched []byte
}

// indexedFields reads id, tenant, tool_call.run_id, tool_call.call_id and
// tool_call.approval.dispatched_call_id from a body without decoding the rest of it: Verify
// reads every record, and a full json.Unmarshal of each would cost more than the chain
// itself. The first occurrence of a member counts, and the walk stops after tool_call, the
// last member of a record: the chain has proved the body is what our encoder wrote.
func indexedFields(body []byte) (bodyFields, bool) {
	var f bodyFields
	seen := 0
	ok := eachMember(body, func(key, val []byte) walk {
		var good bool
		switch string(key) {
		case "id":
			if f.id != nil {
				return walkOn
			}
			f.id, good = jsonString(val)
		case "tenant":
			if seen&seenTenant != 0 {
				return walkOn
			}
			seen |= seenTenant
			f.tenant, good = jsonString(val)
			if len(f.tenant) == 0 {
				f.tenant = nil // written only when set; an empty one is not indexed
			}
		case "tool_call":
			if seen&seenToolCall != 0 {
				return walkOn
			}
			seen |= seenToolCall
			good = toolCallFields(&f, val)
			if good && f.id != nil {
				return walkDone
			}
		default:
			good = true
		}
		if !good {
			return walkBad
		}
		return walkOn
	})
	return f, ok && f.id != nil
}

const (
	seenTenant = 1 << iota
	seenToolCall
	seenRun
	seenCall
	seenApproval
	seenDispatched
)

// toolCallFields reads run_id, call_id and approval.dispatched_call_id from the tool_call
// object val into f. Every tool-call record is indexed by its run id, even an empty one; by
// a call id only when it is set.
func toolCallFields(f *bodyFields, val []byte) bool {
	f.run = []byte{}
	seen := 0
	// first reports whether the member bit stands for is met for the first time.
	first := func(bit int) bool {
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	}
	// str reads a string member into dst, nil when empty.
	str := func(dst *[]byte, val []byte) walk {
		s, ok := jsonString(val)
		if !ok {
			return walkBad
		}
		if *dst = s; len(s) == 0 && dst != &f.run {
			*dst = nil
		}
		return walkOn
	}
	return eachMember(val, func(key, val []byte) walk {
		switch string(key) {
		case "run_id":
			if first(seenRun) {
				return str(&f.run, val)
			}
		case "call_id":
			if first(seenCall) {
				return str(&f.call, val)
			}
		case "approval":
			if !first(seenApproval) || string(val) == "null" {
				return walkOn
			}
			ok := eachMember(val, func(key, val []byte) walk {
				if string(key) == "dispatched_call_id" && first(seenDispatched) {
					return str(&f.dispatched, val)
				}
				return walkOn
			})
			if !ok {
				return walkBad
			}
		}
		return walkOn
	})
}

// walk is what an eachMember visitor asks for next.
type walk int

const (
	walkOn   walk = iota // the next member
	walkDone             // stop: the walk succeeded
	walkBad              // stop: the walk failed
)

// eachMember calls visit with the raw key and value of each member of the JSON object
// in b, which must be exactly one object unless visit stops the walk early. It reports
// false on malformed JSON or when visit does.
func eachMember(b []byte, visit func(key, val []byte) walk) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		ks := i
		ke := skipValue(b, ks)
		if ke < 0 || b[ks] != '"' {
			return false
		}
		i = skipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		vs := skipSpace(b, i+1)
		ve := skipValue(b, vs)
		if ve < 0 {
			return false
		}
		switch visit(b[ks+1:ke-1], b[vs:ve]) {
		case walkDone:
			return true
		case walkBad:
			return false
		}
		i = skipSpace(b, ve)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// skipValue returns the index just past the JSON value starting at b[i], or -1. It
// checks structure only (balanced brackets, terminated strings), which is all a walk
// over our own encoder's output needs; values are decoded by their readers.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		for j := i + 1; ; j++ {
			n := bytes.IndexByte(b[j:], '"')
			if n < 0 {
				return -1
			}
			j += n
			// The quote ends the string unless an odd run of backslashes escapes it.
			escapes := 0
			for p := j - 1; p > i && b[p] == '\\'; p-- {
				escapes++
			}
			if escapes%2 == 0 {
				return j + 1
			}
		}
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end := skipValue(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	default:
		j := i
	scan:
		for ; j < len(b); j++ {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				break scan
			}
		}
		if j == i {
			return -1
		}
		return j
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// jsonString returns the text of a JSON string value: its raw bytes when it has no
// escapes (the common case), else the decoded text.
func jsonString(val []byte) ([]byte, bool) {
	if len(val) < 2 || val[0] != '"' || val[len(val)-1] != '"' {
		return nil, false
	}
	raw := val[1 : len(val)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw, true
	}
	var s string
	if json.Unmarshal(val, &s) != nil {
		return nil, false
	}
	return []byte(s), true
}
