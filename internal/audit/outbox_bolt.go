package audit

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Keys inside a bbolt outbox's bucket.
var (
	spoolRecordsKey = []byte("records")
	spoolDroppedKey = []byte("dropped")
)

// boltOutbox keeps records in a bucket of the producer's bbolt file, so a producer can
// commit a change and its record in one transaction.
type boltOutbox struct {
	db     *bolt.DB
	bucket []byte
}

func openBoltOutbox(db *bolt.DB, bucket string) (*boltOutbox, error) {
	o := &boltOutbox{db: db, bucket: []byte(bucket)}
	err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(o.bucket)
		if err != nil {
			return err
		}
		if _, err = b.CreateBucketIfNotExists(spoolRecordsKey); err != nil {
			return err
		}
		// A file served on bbolt again (moved to etcd, then renamed back) holds records and
		// drops its move did not bring: its next move is another one (BoltOutboxMoveID).
		return b.Delete(boltOutboxMoveIDKey)
	})
	if err != nil {
		return nil, fmt.Errorf("audit: open spool bucket %q: %w", bucket, err)
	}
	return o, nil
}

func (o *boltOutbox) describe() string { return string(o.bucket) }

func (o *boltOutbox) close() error { return nil }

// closedErr marks the producer's database being closed under the forwarder.
func closedErr(err error) error {
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
		return fmt.Errorf("%w: %w", errOutboxClosed, err)
	}
	return err
}

func (o *boltOutbox) count() (int, error) {
	var n int
	err := o.db.View(func(tx *bolt.Tx) error {
		n = queueLen(tx.Bucket(o.bucket).Bucket(spoolRecordsKey))
		return nil
	})
	return n, closedErr(err)
}

// queueLen counts the outbox in O(log n): keys come from NextSequence and only a prefix
// is ever deleted, so the keys present are contiguous.
func queueLen(q *bolt.Bucket) int {
	c := q.Cursor()
	first, _ := c.First()
	if first == nil {
		return 0
	}
	last, _ := c.Last()
	if len(first) != 8 || len(last) != 8 {
		// Not a key this spool wrote: count the slow way rather than trust it.
		return q.Stats().KeyN
	}
	return int(binary.BigEndian.Uint64(last) - binary.BigEndian.Uint64(first) + 1)
}

// add ignores recs: a bbolt outbox also takes records inside its producer's transactions
// (addTx), which may roll back, so it keeps none in memory.
func (o *boltOutbox) add(bodies [][]byte, _ []*Record, admit func(int) error) ([]error, error) {
	errs := make([]error, len(bodies))
	err := o.db.Update(func(tx *bolt.Tx) error {
		for i, body := range bodies {
			dropped, err := o.addTx(tx, body, admit)
			switch {
			case dropped:
				errs[i] = errDropRecord
			case errors.Is(err, ErrSpoolFull):
				errs[i] = err
			case err != nil:
				return err
			}
		}
		return nil
	})
	return errs, closedErr(err)
}

// addTx writes one encoded record in tx, or counts it as dropped (dropped is then true).
// A refusal returns before anything is written, so the transaction stays usable.
func (o *boltOutbox) addTx(tx *bolt.Tx, body []byte, admit func(int) error) (dropped bool, err error) {
	b := tx.Bucket(o.bucket)
	if b == nil {
		return false, fmt.Errorf("audit: spool bucket %q is missing", o.bucket)
	}
	q := b.Bucket(spoolRecordsKey)
	if q == nil {
		return false, fmt.Errorf("audit: spool bucket %q has no records bucket", o.bucket)
	}
	switch err := admit(queueLen(q)); {
	case errors.Is(err, errDropRecord):
		d := binary.BigEndian.AppendUint64(nil, readUint64(b.Get(spoolDroppedKey))+1)
		if err := b.Put(spoolDroppedKey, d); err != nil {
			return false, fmt.Errorf("audit: count dropped record: %w", err)
		}
		return true, nil
	case err != nil:
		return false, err
	}
	seq, err := q.NextSequence()
	if err != nil {
		return false, fmt.Errorf("audit: spool sequence: %w", err)
	}
	if err := q.Put(binary.BigEndian.AppendUint64(nil, seq), body); err != nil {
		return false, fmt.Errorf("audit: spool record: %w", err)
	}
	return false, nil
}

func (o *boltOutbox) read(after []byte, n, maxBytes int) ([]outboxEntry, error) {
	var out []outboxEntry
	err := o.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(o.bucket).Bucket(spoolRecordsKey).Cursor()
		k, v := c.First()
		if after != nil {
			k, v = c.Seek(after)
			if k != nil && string(k) == string(after) {
				k, v = c.Next()
			}
		}
		size := 0
		for ; k != nil && len(out) < n; k, v = c.Next() {
			if len(out) > 0 && size+len(v) > maxBytes {
				break
			}
			size += len(v)
			// Copies: bbolt's slices are only valid inside the transaction.
			out = append(out, outboxEntry{key: append([]byte(nil), k...), body: append([]byte(nil), v...)})
		}
		return nil
	})
	return out, closedErr(err)
}

func (o *boltOutbox) remove(through []byte, corrupt uint64, report func(uint64, int) ([]byte, error)) (removed int, reported uint64, err error) {
	err = o.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(o.bucket)
		q := b.Bucket(spoolRecordsKey)
		var keys [][]byte
		c := q.Cursor()
		for k, _ := c.First(); k != nil && string(k) <= string(through); k, _ = c.Next() {
			keys = append(keys, k)
		}
		for _, k := range keys {
			if err := q.Delete(k); err != nil {
				return err
			}
		}
		removed = len(keys)
		dropped := readUint64(b.Get(spoolDroppedKey)) + corrupt
		if dropped == 0 {
			return nil
		}
		body, err := report(dropped, queueLen(q))
		if err != nil {
			return err
		}
		if body == nil {
			return b.Put(spoolDroppedKey, binary.BigEndian.AppendUint64(nil, dropped))
		}
		seq, err := q.NextSequence()
		if err != nil {
			return err
		}
		if err := q.Put(binary.BigEndian.AppendUint64(nil, seq), body); err != nil {
			return err
		}
		reported = dropped
		return b.Delete(spoolDroppedKey)
	})
	if err != nil {
		return 0, 0, closedErr(err)
	}
	return removed, reported, nil
}

func readUint64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}
