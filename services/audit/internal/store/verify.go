package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/boltdb"
)

// VerifyResult says whether the chain holds. When it does not, FirstBroken is the seq of
// the first record that fails and Reason says how; Checked counts the records that
// verified before it. HeadSeq and HeadHash are the head the walk covered: the head in
// meta when it started (0 and Genesis for an empty log), which an OK result proves.
type VerifyResult struct {
	OK          bool
	Checked     uint64
	FirstBroken uint64
	Reason      string
	HeadSeq     uint64
	HeadHash    [32]byte
}

// verifyChunk bounds the records checked per read transaction: a long read transaction
// would hold back the writer's remaps and the freelist.
const verifyChunk = 1 << 16

// Verify recomputes the chain from Genesis up to the head as it stood when Verify
// started: for every record it checks the key is the next seq, the body starts with its
// own seq and the previous hash, and the stored hash is SHA-256(previous hash || body).
// It checks the head in the meta bucket, so a truncated tail is reported too, and that
// the by_id, by_tenant, by_run, by_tenant_run, by_call and by_tenant_call indexes hold
// exactly the entries the records require, so no record is hidden from a filtered read.
// progress, if not nil, is called after each chunk.
//
// The chain proves the log was not edited in place; a whole rewrite of the file with a
// freshly computed chain is detectable only against a head recorded elsewhere (an
// exported Head, or a peer's copy).
func (s *Store) Verify(ctx context.Context, progress func(done uint64)) (VerifyResult, error) {
	return s.VerifyThrough(ctx, progress, Anchor{})
}

// indexPass is what the indexes' side of Verify found: the first record it could not
// read and why, or an error.
type indexPass struct {
	seq    uint64
	reason string
	err    error
}

// Anchor is a head kept outside the log (what `audit verify` printed once): the chain must
// still pass through it. It catches what the chain alone cannot: records cut from the end
// with the head rewritten to match, or the whole log rewritten with a fresh chain.
type Anchor struct {
	Seq  uint64
	Hash [32]byte
}

// VerifyThrough is Verify, also checking the chain passes through anchor (none when its Seq
// is 0).
func (s *Store) VerifyThrough(ctx context.Context, progress func(done uint64), anchor Anchor) (VerifyResult, error) {
	// A damaged page bbolt panics on is the file's damage named, not the end of the process
	// (Verify runs in the background too).
	var res VerifyResult
	err := boltdb.Guard(s.path, func() (err error) {
		res, err = s.walk(ctx, progress)
		return err
	})
	// The walk mapped every page of the file.
	if rerr := s.releaseMapped(); rerr != nil {
		s.log.Warn("audit: could not release the log's mapped pages after a verify", "err", rerr)
	}
	if err != nil {
		return res, err
	}
	return s.CheckAnchor(res, anchor)
}

// Reasons of an anchor the chain does not pass through.
const (
	reasonAnchorMismatch = "the chain does not pass through the anchor you kept: the log was rewritten at or before this record"
	reasonAnchorPastHead = "the log ends at seq %d, before the anchor you kept (seq %d): records were removed from its end"
)

// CheckAnchor checks that the chain a walk verified (res, from Verify) passes through
// anchor, and returns res as VerifyThrough would have answered it with that anchor. A
// walk verifies the hash stored at every seq before its first broken record, so the
// anchor's is read, not recomputed; res stands for the file only while nothing else
// writes it, which is what a caller keeping res for later has to make sure of.
func (s *Store) CheckAnchor(res VerifyResult, anchor Anchor) (VerifyResult, error) {
	if anchor.Seq == 0 {
		return res, nil
	}
	verified := res.HeadSeq // the records the walk verified: 1..verified
	if !res.OK {
		verified = res.FirstBroken - min(res.FirstBroken, 1)
	}
	switch {
	case anchor.Seq <= verified:
		var stored [32]byte
		if err := s.db.View(func(tx *bolt.Tx) error {
			if v := tx.Bucket(bucketRecords).Get(seqKey(anchor.Seq)); len(v) >= hashLen {
				copy(stored[:], v[:hashLen])
			}
			return nil
		}); err != nil {
			return res, fmt.Errorf("audit: verify: %w", err)
		}
		if stored != anchor.Hash {
			res.OK, res.Checked, res.FirstBroken, res.Reason = false, anchor.Seq-1, anchor.Seq, reasonAnchorMismatch
		}
	case res.OK:
		res.OK, res.Checked, res.FirstBroken, res.Reason = false, res.HeadSeq, res.HeadSeq+1, fmt.Sprintf(reasonAnchorPastHead, res.HeadSeq, anchor.Seq)
	}
	// Otherwise the chain breaks at or before the anchor, and that stands.
	return res, nil
}

// walk is Verify: the chain, the head and the indexes, without an anchor.
func (s *Store) walk(ctx context.Context, progress func(done uint64)) (VerifyResult, error) {
	var (
		headSeq  uint64
		headHash = Genesis
		haveHead bool
		badHead  bool
		pastHead bool
	)
	// Head and the last key are read in one snapshot, so a concurrent append cannot look
	// like a record planted past the head.
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyHead); v != nil {
			if len(v) != 8+hashLen {
				badHead = true
				return nil
			}
			haveHead = true
			headSeq = binary.BigEndian.Uint64(v)
			copy(headHash[:], v[8:])
		}
		if k, _ := tx.Bucket(bucketRecords).Cursor().Last(); k != nil && (len(k) != 8 || binary.BigEndian.Uint64(k) > headSeq) {
			pastHead = true
		}
		return nil
	})
	if err != nil {
		return VerifyResult{}, fmt.Errorf("audit: verify: %w", err)
	}
	if badHead {
		return VerifyResult{Reason: "head in meta is malformed", HeadHash: headHash}, nil
	}

	// Verify touches every record page in key order, which is not file order: after
	// years of copy-on-write commits the pages are scattered, and faulting them in one
	// by one is slow on a cold cache. Asking the kernel to read the whole file ahead,
	// in large sequential reads, costs nothing when it is already cached.
	stopReadAhead := s.readAhead(ctx)
	defer stopReadAhead()

	// The indexes' side runs beside the chain walk (see indexChecker.records).
	ix := newIndexChecker()
	ixCtx, stopIndex := context.WithCancel(ctx)
	ixDone := make(chan indexPass, 1)
	go func() {
		var p indexPass
		p.err = boltdb.Guard(s.path, func() (err error) {
			p.seq, p.reason, err = ix.records(ixCtx, s.db, headSeq)
			return err
		})
		ixDone <- p
	}()
	var ixPass *indexPass
	indexResult := func() indexPass {
		if ixPass == nil {
			p := <-ixDone
			ixPass = &p
		}
		return *ixPass
	}
	defer func() {
		stopIndex()
		indexResult()
	}()

	ch := newChainer()
	prev := Genesis
	next := uint64(1)
	var prefix []byte
	res := VerifyResult{HeadSeq: headSeq, HeadHash: headHash}
	broken := func(seq uint64, reason string) (VerifyResult, error) {
		stopIndex()
		if p := indexResult(); p.reason != "" && p.seq < seq {
			seq, reason, res.Checked = p.seq, p.reason, p.seq-1
		}
		res.FirstBroken, res.Reason = seq, reason
		return res, nil
	}
	for next <= headSeq {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		var (
			brokenAt uint64
			reason   string
			ended    bool
		)
		err := s.db.View(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucketRecords).Cursor()
			k, v := c.Seek(seqKey(next))
			for n := 0; n < verifyChunk && next <= headSeq; n++ {
				if k == nil {
					ended = true
					return nil
				}
				if len(k) != 8 {
					brokenAt, reason = next, "malformed key in records bucket"
					return nil
				}
				if got := binary.BigEndian.Uint64(k); got != next {
					brokenAt, reason = next, fmt.Sprintf("record missing: next stored seq is %d", got)
					return nil
				}
				if len(v) < hashLen {
					brokenAt, reason = next, "record shorter than its hash"
					return nil
				}
				body := v[hashLen:]
				prefix = appendBodyPrefix(prefix[:0], next, &prev)
				if !bytes.HasPrefix(body, prefix) {
					brokenAt, reason = next, "body does not name its seq and the previous hash"
					return nil
				}
				h := ch.next(&prev, body)
				if !bytes.Equal(h[:], v[:hashLen]) {
					brokenAt, reason = next, "hash mismatch: record or its stored hash was changed"
					return nil
				}
				prev = h
				res.Checked++
				next++
				k, v = c.Next()
			}
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("audit: verify: %w", err)
		}
		if brokenAt != 0 {
			return broken(brokenAt, reason)
		}
		if ended {
			return broken(next, fmt.Sprintf("log ends at seq %d but its head says %d", next-1, headSeq))
		}
		if progress != nil {
			progress(res.Checked)
		}
	}
	if p := indexResult(); p.err != nil {
		return res, fmt.Errorf("audit: verify: %w", p.err)
	} else if p.reason != "" {
		return broken(p.seq, p.reason)
	} else if p.seq != 0 {
		return broken(p.seq, "the records changed while Verify read them; run it again")
	}
	if haveHead && prev != headHash {
		return broken(headSeq, "head hash in meta does not match the last record")
	}
	// Records past the head would be invisible to every reader that trusts the head.
	if pastHead {
		return broken(headSeq+1, "records exist past the head in meta")
	}
	var extraAt uint64
	var extra string
	if err := s.db.View(func(tx *bolt.Tx) error {
		extraAt, extra = ix.indexes(tx, headSeq)
		return nil
	}); err != nil {
		return res, fmt.Errorf("audit: verify: %w", err)
	}
	if extra != "" {
		return broken(extraAt, extra)
	}
	res.OK, res.HeadHash = true, prev
	return res, nil
}

// readAhead reads the file front to back in large reads on another goroutine, so the
// page cache fills at the disk's sequential speed while Verify walks the records in key
// order, which after years of copy-on-write commits is scattered across the file.
// Reading is advice: a failure only makes Verify slower. The returned func stops it.
func (s *Store) readAhead(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.Open(s.db.Path())
		if err != nil {
			return
		}
		defer f.Close()
		buf := make([]byte, 4<<20)
		for off := int64(0); ctx.Err() == nil; off += int64(len(buf)) {
			if n, err := f.ReadAt(buf, off); n == 0 || err != nil {
				return
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// exportLine is one line of Export: the stored hash and the body exactly as hashed.
type exportLine struct {
	Hash   string          `json:"hash"`
	Record json.RawMessage `json:"record"`
}

// maxExportLine bounds one line read by VerifyExport.
const maxExportLine = 4 << 20

// VerifyExport checks an Export stream offline: each line's hash must equal
// SHA-256(prev_hash || record bytes), and where consecutive lines have consecutive seqs
// the second's prev_hash must be the first's hash. A filtered export verifies record by
// record. With complete set (an unfiltered export) the stream must also start at seq 1
// and have no gaps, so a removed line is caught; the end of the stream can only be
// checked against a head recorded elsewhere.
func VerifyExport(r io.Reader, complete bool) (VerifyResult, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxExportLine)
	ch := newChainer()
	var (
		res      VerifyResult
		lastSeq  uint64
		lastHash [32]byte
		prefix   []byte
	)
	for sc.Scan() {
		var line exportLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			res.FirstBroken, res.Reason = lastSeq+1, "line is not an export record"
			return res, nil
		}
		var head struct {
			Seq      uint64 `json:"seq"`
			PrevHash string `json:"prev_hash"`
		}
		var stored, prev [32]byte
		if json.Unmarshal(line.Record, &head) != nil || head.Seq == 0 ||
			hexInto(prev[:], head.PrevHash) != nil || hexInto(stored[:], line.Hash) != nil {
			res.FirstBroken, res.Reason = lastSeq+1, "record lacks seq, prev_hash or hash"
			return res, nil
		}
		switch {
		case complete && head.Seq != lastSeq+1:
			res.FirstBroken, res.Reason = lastSeq+1, fmt.Sprintf("record missing: next line has seq %d", head.Seq)
			return res, nil
		case head.Seq == 1 && prev != Genesis:
			res.FirstBroken, res.Reason = 1, "first record does not chain from genesis"
			return res, nil
		case lastSeq != 0 && head.Seq <= lastSeq:
			res.FirstBroken, res.Reason = head.Seq, "seqs are not increasing"
			return res, nil
		case lastSeq != 0 && head.Seq == lastSeq+1 && prev != lastHash:
			res.FirstBroken, res.Reason = head.Seq, "prev_hash does not match the previous record"
			return res, nil
		}
		prefix = appendBodyPrefix(prefix[:0], head.Seq, &prev)
		if !bytes.HasPrefix(line.Record, prefix) {
			res.FirstBroken, res.Reason = head.Seq, "body does not start with its seq and prev_hash"
			return res, nil
		}
		if h := ch.next(&prev, line.Record); h != stored {
			res.FirstBroken, res.Reason = head.Seq, "hash mismatch"
			return res, nil
		}
		lastSeq, lastHash = head.Seq, stored
		res.Checked++
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			res.FirstBroken, res.Reason = lastSeq+1, "line too long"
			return res, nil
		}
		return res, fmt.Errorf("audit: read export: %w", err)
	}
	res.OK = true
	return res, nil
}

func hexInto(dst []byte, s string) error {
	if hex.DecodedLen(len(s)) != len(dst) {
		return errors.New("wrong length")
	}
	_, err := hex.Decode(dst, []byte(s))
	return err
}

// Reasons of a tenant's view of a broken chain (CheckTenant).
const (
	reasonBrokenBeforeTenant = "the chain breaks before this record, at a record of another tenant: this record and every later one cannot be vouched for; a Verify by a key bound to no tenant names the break"
	reasonBrokenAfterTenant  = "the chain breaks after the last of this tenant's records, at a record of another tenant: the records through head_seq verified, but one of this tenant's records cut from the end would look the same; a Verify by a key bound to no tenant names the break"
	reasonAnchorNotTenant    = "the anchor names no record of this tenant that the log holds: the record was removed, or the anchor is not one this tenant's Verify answered"
)

// CheckTenant is a walk's result (from Verify, without an anchor) as a caller confined to
// tenant may see it. One hash chain spans every tenant, so the whole chain was walked; the
// answer speaks of tenant's records only, and says nothing of other tenants' beyond that the
// chain breaks at one of theirs:
//
//   - Checked counts tenant's records that verified; HeadSeq and HeadHash are the last of them
//     (0 and Genesis for none): what the tenant keeps as its anchor.
//   - When the chain is broken, FirstBroken is tenant's first record at or after the break,
//     with the walk's reason when the break is that record itself; a break after tenant's last
//     record fails the answer with FirstBroken 0.
//   - An anchor must be one of tenant's records, still holding the hash kept.
func (s *Store) CheckTenant(res VerifyResult, tenant string, anchor Anchor) (VerifyResult, error) {
	verified := res.HeadSeq // the records the walk verified: 1..verified
	if !res.OK {
		verified = res.FirstBroken - min(res.FirstBroken, 1)
	}
	out := VerifyResult{OK: true, HeadHash: Genesis}
	var afterBreak uint64 // tenant's first record past the verified ones
	anchorHeld := false
	var anchorHash [32]byte
	var beforeAnchor uint64 // tenant's verified records before the anchor
	err := s.db.View(func(tx *bolt.Tx) error {
		records := tx.Bucket(bucketRecords)
		prefix := indexPrefix(tenant)
		c := tx.Bucket(bucketByTenant).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && len(k) == len(prefix)+8; k, _ = c.Next() {
			seq := binary.BigEndian.Uint64(k[len(prefix):])
			if seq == anchor.Seq {
				anchorHeld = true
				if v := records.Get(seqKey(seq)); len(v) >= hashLen {
					copy(anchorHash[:], v[:hashLen])
				}
			}
			if seq > verified {
				if afterBreak == 0 {
					afterBreak = seq
				}
				continue
			}
			if anchor.Seq != 0 && seq < anchor.Seq {
				beforeAnchor++
			}
			out.Checked++
			out.HeadSeq = seq
			if v := records.Get(seqKey(seq)); len(v) >= hashLen {
				copy(out.HeadHash[:], v[:hashLen])
			}
		}
		return nil
	})
	if err != nil {
		return VerifyResult{}, fmt.Errorf("audit: verify: %w", err)
	}
	if !res.OK {
		out.OK = false
		switch {
		case afterBreak == res.FirstBroken:
			out.FirstBroken, out.Reason = afterBreak, res.Reason
		case afterBreak != 0:
			out.FirstBroken, out.Reason = afterBreak, reasonBrokenBeforeTenant
		default:
			out.Reason = reasonBrokenAfterTenant
		}
	}
	switch {
	case anchor.Seq == 0:
	case !anchorHeld:
		if out.OK || anchor.Seq <= verified {
			out.OK, out.Checked, out.FirstBroken, out.Reason = false, beforeAnchor, anchor.Seq, reasonAnchorNotTenant
		}
	case anchor.Seq <= verified && anchorHash != anchor.Hash:
		out.OK, out.Checked, out.FirstBroken, out.Reason = false, beforeAnchor, anchor.Seq, reasonAnchorMismatch
	}
	return out, nil
}
