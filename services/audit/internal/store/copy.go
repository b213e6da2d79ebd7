package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// ErrNotAPrefix means records of the shared chain do not continue this file's copy: a
// gap before them, a record that does not chain, or one that differs from the copy's at
// the same seq. The copy is left as it was.
var ErrNotAPrefix = errors.New("audit: the shared chain does not continue this copy")

// Ingest copies records of the shared chain (see Chain) into the file as they are: vals
// are stored values (hash || body) for seqs first, first+1, .... Records the file holds
// already are checked to be the same and skipped; the others must continue the file's
// chain, each body naming its seq and the previous hash and hashing to its stored hash,
// so a copy verifies what it takes. All of vals commit together or none.
func (s *Store) Ingest(ctx context.Context, first uint64, vals [][]byte) error {
	if len(vals) == 0 {
		return nil
	}
	if first == 0 {
		return fmt.Errorf("%w: records start at seq 1, not 0", ErrNotAPrefix)
	}
	req := &appendReq{ingest: vals, first: first, done: make(chan struct{})}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	select {
	case s.reqs <- req:
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	select {
	case <-req.done:
		return req.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// copyChain commits one Ingest.
func (w *writer) copyChain(req *appendReq) {
	defer close(req.done)
	seq, prev := w.seq, w.prev
	written := 0
	err := w.s.update(func(tx *bolt.Tx) error {
		seq, prev = w.seq, w.prev
		records := tx.Bucket(bucketRecords)
		records.FillPercent = 1.0
		byID := tx.Bucket(bucketByID)
		var prefix []byte
		for i, v := range req.ingest {
			at := req.first + uint64(i)
			if len(v) < hashLen {
				return fmt.Errorf("%w: record %d is shorter than its hash", ErrNotAPrefix, at)
			}
			if at <= seq {
				if have := records.Get(seqKey(at)); len(have) < hashLen || !bytes.Equal(have[:hashLen], v[:hashLen]) {
					return fmt.Errorf("%w: record %d differs from the one this copy holds", ErrNotAPrefix, at)
				}
				continue
			}
			if at != seq+1 {
				return fmt.Errorf("%w: it resumes at record %d, but this copy ends at %d", ErrNotAPrefix, at, seq)
			}
			body := v[hashLen:]
			prefix = appendBodyPrefix(prefix[:0], at, &prev)
			if !bytes.HasPrefix(body, prefix) {
				return fmt.Errorf("%w: record %d does not name its seq and the previous hash", ErrNotAPrefix, at)
			}
			if h := w.ch.next(&prev, body); !bytes.Equal(h[:], v[:hashLen]) {
				return fmt.Errorf("%w: record %d does not hash to its stored hash", ErrNotAPrefix, at)
			}
			f, ok := indexedFields(body)
			if !ok {
				return fmt.Errorf("%w: record %d is not a JSON object with a string id", ErrNotAPrefix, at)
			}
			if byID.Get(f.id) != nil {
				return fmt.Errorf("%w: record %d reuses the id of an earlier record", ErrNotAPrefix, at)
			}
			// bbolt keeps references to keys and values until the commit.
			if err := records.Put(seqKey(at), bytes.Clone(v)); err != nil {
				return fmt.Errorf("audit: put record %d: %w", at, err)
			}
			for ix := range numIndexes {
				for nth := range maxKeysPerIndex {
					key, ok := requiredKey(nil, ix, f, at, nth)
					if !ok {
						continue
					}
					val := noValue
					if ix == ixByID {
						val, _ = appendIDValue(nil, nil, at, body)
					}
					if err := tx.Bucket(indexBuckets[ix]).Put(key, val); err != nil {
						return fmt.Errorf("audit: index record %d: %w", at, err)
					}
					written += len(key) + len(val)
				}
			}
			written += 8 + len(v)
			seq, prev = at, [32]byte(v[:hashLen])
		}
		if seq == w.seq {
			return nil
		}
		return tx.Bucket(bucketMeta).Put(keyHead, append(seqKey(seq), prev[:]...))
	})
	if err != nil {
		if !errors.Is(err, ErrNotAPrefix) {
			err = fmt.Errorf("audit: copy the shared chain: %w", err)
		}
		req.err = err
		return
	}
	w.advance(seq, prev)
	w.noteWritten(written)
}

// appendIDValue appends to dst the by_id value of record seq: its seq and the digest of
// the record as its producer sent it, the body without what buildBody spliced in. scratch
// holds that JSON, and is returned grown for the next call.
func appendIDValue(dst, scratch []byte, seq uint64, body []byte) (val, grown []byte) {
	scratch = producerJSON(scratch[:0], body, seq)
	sum := sha256.Sum256(scratch)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	return append(dst, sum[:16]...), scratch
}
