package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/backup"
	"github.com/ringfence/ringfence/internal/boltdb"
)

// Errors callers branch on.
var (
	ErrClosed = errors.New("audit: audit log closed")
	// ErrIDConflict means a record reused the ID of a different stored record. A true
	// retry carries identical content and is answered with the original seq instead.
	ErrIDConflict = errors.New("audit: record id already used by a different record")
	// ErrTooManyRecords means one Append carried more than MaxAppendRecords.
	ErrTooManyRecords = errors.New("audit: too many records in one append")
	// ErrInvalidPageToken means a page token was malformed or made for another filter.
	ErrInvalidPageToken = errors.New("audit: page_token is not one this server issued for this filter")
)

// Limits.
const (
	// MaxAppendRecords bounds one Append call; it matches the spool's largest batch.
	MaxAppendRecords = audit.MaxBatchSize
	// DefaultMaxCommitRecords bounds one group commit. Larger commits amortise the fsync
	// further but hold every caller in the batch for longer.
	DefaultMaxCommitRecords = 8192
	// appendQueue bounds the Append calls waiting for the writer; further callers block
	// (or give up with their context), which is the back-pressure.
	appendQueue = 1024
)

// Options tune a Store. The zero value is production-ready.
type Options struct {
	Logger *slog.Logger
	// MaxCommitRecords bounds the records in one transaction; 0 means the default.
	MaxCommitRecords int
	// NoSync skips fsync. Only for building throw-away fixtures (benchmarks); a log
	// opened with NoSync loses acknowledged records on a crash.
	NoSync bool
	// Chain, when set, is where the records live first: the log is then a copy of a chain
	// that several instances share (see Chain), and the writer hands Chain every commit's
	// new records before committing them here.
	Chain Chain
	// Now, when set, is the log's clock, which stamps receive times (tests); nil is time.Now.
	Now func() time.Time
}

// Chain is a hash chain that several audit instances share (the audit service's sharedLog: the chain in etcd,
// with one writer elected at a time). The local file is then a copy of it: the instance
// that writes extends the shared chain first and its file only once that succeeded, and
// every instance copies what the writer added (Ingest). So the file is always a prefix
// of the shared chain, and appends stay idempotent by ID through the file's by_id index.
type Chain interface {
	// Commit extends the shared chain from prev with vals (each the stored value: hash ||
	// body, for seqs prev.Seq+1, prev.Seq+2, ...), only if the shared chain still ends at
	// prev and this instance may still write it. An error leaves the file unchanged;
	// some of vals may have reached the shared chain, and Ingest brings them here.
	Commit(ctx context.Context, prev Head, vals [][]byte) error
}

// Head is a place in the chain: a seq and the hash of the record there (0 and Genesis
// before the first record).
type Head struct {
	Seq  uint64
	Hash [32]byte
}

// Entry is a stored record with its place in the chain.
type Entry struct {
	Record   audit.Record
	Hash     [32]byte
	PrevHash [32]byte
}

// Store is the hash-chained audit log in one bbolt file. It is safe for concurrent use.
type Store struct {
	db         *bolt.DB
	path       string
	log        *slog.Logger
	chain      Chain
	maxCommit  int
	scanBudget int
	now        func() time.Time

	// mu guards closed and sends on reqs, so no Append can send after Close closed reqs.
	mu         sync.RWMutex
	closed     bool
	reqs       chan *appendReq
	writerDone chan struct{}
	done       chan struct{}

	// headMu guards the durable head and the channel watchers wait on; the writer
	// updates them only after a commit returned.
	headMu   sync.Mutex
	headSeq  uint64
	headHash [32]byte
	changed  chan struct{}
}

type appendReq struct {
	// received is the log's clock when Append took the records: each new one is stamped with it.
	received time.Time
	recs     []audit.Record
	js       [][]byte
	digests  [][16]byte
	seqs     []uint64
	// ingest, when set, holds records of the shared chain to copy as they are (Ingest),
	// from seq first on; recs is then empty.
	ingest [][]byte
	first  uint64
	err    error
	done   chan struct{}
}

// Open opens or creates the log at path, migrates it, and starts the writer.
func Open(path string, opts Options) (*Store, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	db, err := boltdb.OpenUnchecked(path, &bolt.Options{
		// A second process on the same file fails fast instead of hanging.
		Timeout: 2 * time.Second,
		// The freelist is written at every commit. Skipping that (as etcd does) made
		// no measurable difference to append throughput here, but made bbolt walk the
		// whole file at open: 18-22 s for a cold 1,000,000-record log.
		NoFreelistSync: false,
		FreelistType:   bolt.FreelistMapType,
		// A large initial map avoids remaps, which wait for every open read transaction.
		InitialMmapSize: 1 << 30,
		NoSync:          opts.NoSync,
	})
	if err != nil {
		return nil, err
	}
	s := &Store{
		db:         db,
		path:       path,
		log:        logger,
		chain:      opts.Chain,
		maxCommit:  opts.MaxCommitRecords,
		now:        opts.Now,
		reqs:       make(chan *appendReq, appendQueue),
		writerDone: make(chan struct{}),
		done:       make(chan struct{}),
		changed:    make(chan struct{}),
		headHash:   Genesis,
		scanBudget: ScanBudget,
	}
	if s.maxCommit <= 0 {
		s.maxCommit = DefaultMaxCommitRecords
	}
	if s.now == nil {
		s.now = time.Now
	}
	// The log is not checked page by page at start (Verify walks it); damage on the pages
	// read here is still refused with the file's name rather than a panic.
	err = boltdb.Guard(path, func() error {
		if err := Migrate(db); err != nil {
			return err
		}
		return db.Update(func(tx *bolt.Tx) error {
			if v := tx.Bucket(bucketMeta).Get(keyHead); v != nil {
				if len(v) != 8+hashLen {
					return fmt.Errorf("audit: head is %d bytes, want %d", len(v), 8+hashLen)
				}
				s.headSeq = binary.BigEndian.Uint64(v)
				copy(s.headHash[:], v[8:])
			}
			// Head and records commit together, so they disagree only if the file was
			// edited. Appending continues from the head; Verify names the damage.
			if k, _ := tx.Bucket(bucketRecords).Cursor().Last(); (k == nil && s.headSeq != 0) || (k != nil && !bytes.Equal(k, seqKey(s.headSeq))) {
				logger.Error("audit: audit log head does not match its last record; run Verify", "head_seq", s.headSeq)
			}
			return nil
		})
	})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	go s.writeLoop()
	return s, nil
}

// Close stops accepting appends, commits those already queued, and closes the file.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.reqs)
	s.mu.Unlock()
	<-s.writerDone
	close(s.done)
	return s.db.Close()
}

// Head returns the seq and hash of the last durable record (0 and Genesis when empty).
func (s *Store) Head() (uint64, [32]byte) {
	s.headMu.Lock()
	defer s.headMu.Unlock()
	return s.headSeq, s.headHash
}

// Append stores recs in order and returns their seqs once they are durable. It is
// idempotent by Record.ID: a record whose ID is already stored with the same content
// gets the original seq and is not stored again; the same ID with different content is
// ErrIDConflict. All records of one call commit together or not at all. If ctx ends
// while waiting, the records may still be committed; retrying with the same IDs is safe.
func (s *Store) Append(ctx context.Context, recs []audit.Record) ([]uint64, error) {
	return s.appendRecords(ctx, len(recs), func(i int) (audit.Record, []byte) { return recs[i], nil })
}

// AppendEncoded is Append for records a producer's spool in this process has validated and
// encoded (audit.Encode): each body is stored as it is, which is byte for byte what Append
// would encode (a record with a receive time is encoded again without it, as Append does).
func (s *Store) AppendEncoded(ctx context.Context, recs []audit.Encoded) ([]uint64, error) {
	return s.appendRecords(ctx, len(recs), func(i int) (audit.Record, []byte) { return recs[i].Record(), recs[i].Body() })
}

// appendRecords is Append and AppendEncoded: record i is at(i), with its encoding (audit.Encode's)
// or nil, when Append must validate and encode it.
func (s *Store) appendRecords(ctx context.Context, n int, at func(i int) (audit.Record, []byte)) ([]uint64, error) {
	if n == 0 {
		return nil, nil
	}
	if n > MaxAppendRecords {
		return nil, fmt.Errorf("%w: %d, limit %d", ErrTooManyRecords, n, MaxAppendRecords)
	}
	req := &appendReq{
		received: s.now().UTC(),
		recs:     make([]audit.Record, n),
		js:       make([][]byte, n),
		digests:  make([][16]byte, n),
		done:     make(chan struct{}),
	}
	// Validation and encoding happen here, on the callers' goroutines, so the single
	// writer only splices, hashes and writes. The receive time is the log's to write: a
	// producer's is dropped, and it stays out of the digest that makes a resend idempotent.
	for i := range n {
		r, js := at(i)
		if js == nil || !r.ReceiveTime.IsZero() {
			r.Time, r.ReceiveTime = r.Time.UTC(), time.Time{}
			if err := r.Validate(); err != nil {
				return nil, fmt.Errorf("audit: record %d: %w", i, err)
			}
			var err error
			if js, err = json.Marshal(r); err != nil {
				return nil, fmt.Errorf("audit: record %d: encode: %w", i, err)
			}
		}
		// Encode made the body of a record validated, its time in UTC, and json.Marshal of
		// that record is what the branch above makes of it.
		if err := r.CheckReceived(req.received); err != nil {
			return nil, fmt.Errorf("audit: record %d: %w", i, err)
		}
		sum := sha256.Sum256(js)
		req.recs[i], req.js[i] = r, js
		copy(req.digests[i][:], sum[:16])
	}

	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return nil, ErrClosed
	}
	select {
	case s.reqs <- req:
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return nil, ctx.Err()
	}
	select {
	case <-req.done:
		return req.seqs, req.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// writeLoop is the single writer: it takes every Append waiting at the moment, commits
// them in one transaction (one fsync), and only then answers each caller. While one
// commit runs, the next batch gathers, so batches grow with load and no timer is needed.
func (s *Store) writeLoop() {
	defer close(s.writerDone)
	w := &writer{s: s, ch: newChainer(), seq: s.headSeq, prev: s.headHash}
	// held is a copy request met while gathering appends: it commits on its own, next.
	var held *appendReq
	for {
		first := held
		if held = nil; first == nil {
			var ok bool
			if first, ok = <-s.reqs; !ok {
				return
			}
		}
		if first.ingest != nil {
			w.copyChain(first)
			continue
		}
		batch := []*appendReq{first}
		n := len(first.recs)
	gather:
		for n < s.maxCommit {
			select {
			case r, ok := <-s.reqs:
				if !ok {
					break gather
				}
				if r.ingest != nil {
					held = r
					break gather
				}
				batch = append(batch, r)
				n += len(r.recs)
			default:
				break gather
			}
		}
		w.commit(batch)
	}
}

type writer struct {
	s    *Store
	ch   *chainer
	seq  uint64
	prev [32]byte
	// sinceRelease counts the bytes committed since the mapped pages were last released.
	sinceRelease int
}

// noValue is the value of index entries, whose keys say everything. It is empty but
// not nil: a nil value reads like a nested bucket to a cursor.
var noValue = []byte{}

type idEntry struct {
	seq    uint64
	digest [16]byte
}

func (w *writer) commit(batch []*appendReq) {
	seq, prev := w.seq, w.prev
	written := 0
	var chained [][]byte
	err := w.s.update(func(tx *bolt.Tx) error {
		written = 0
		seq, prev = w.seq, w.prev
		chained = chained[:0]
		records := tx.Bucket(bucketRecords)
		// Keys only ever grow, so full pages waste nothing and halve the page count.
		records.FillPercent = 1.0
		byID := tx.Bucket(bucketByID)
		byTenant := tx.Bucket(bucketByTenant)
		byRun := tx.Bucket(bucketByRun)
		byTenantRun := tx.Bucket(bucketByTenantRun)
		byCall := tx.Bucket(bucketByCall)
		byTenantCall := tx.Bucket(bucketByTenantCall)
		inTx := make(map[string]idEntry)

		for _, req := range batch {
			req.seqs = make([]uint64, len(req.recs))
			// First pass: resolve duplicates without writing, so a conflict rejects this
			// call alone and leaves nothing of it behind.
			fresh := make([]bool, len(req.recs))
			inReq := make(map[string][16]byte)
			for i, r := range req.recs {
				d := req.digests[i]
				var known *idEntry
				if e, ok := inTx[r.ID]; ok {
					known = &e
				} else if v := byID.Get([]byte(r.ID)); v != nil {
					if len(v) != 8+16 {
						return fmt.Errorf("audit: id index entry for %q is malformed", r.ID)
					}
					e := idEntry{seq: binary.BigEndian.Uint64(v)}
					copy(e.digest[:], v[8:])
					known = &e
				}
				earlier, repeat := inReq[r.ID]
				switch {
				case known != nil:
					if known.digest != d {
						req.err = fmt.Errorf("%w: %q", ErrIDConflict, r.ID)
					}
					req.seqs[i] = known.seq
				case repeat:
					if earlier != d {
						req.err = fmt.Errorf("%w: %q", ErrIDConflict, r.ID)
					}
				default:
					inReq[r.ID] = d
					fresh[i] = true
				}
			}
			if req.err != nil {
				req.seqs = nil
				continue
			}
			// bbolt keeps references to keys and values until the commit, so each
			// call's keys and values share two allocations instead of one per put.
			valSize, keySize := 0, 0
			for i, r := range req.recs {
				if fresh[i] {
					valSize += hashLen + maxBodyPrefix + len(req.js[i])
					keySize += 8 + len(r.ID) + 8 + 2*(2+8) + len(r.Tenant)
					if tc := r.ToolCall; tc != nil {
						keySize += len(tc.RunID) + 2 + 2 + len(r.Tenant) + len(tc.RunID) + 8
						keySize += 2*(4+2+len(tc.CallID)+8) + 2 + len(r.Tenant)
						if tc.Approval != nil {
							keySize += 2*(4+2+len(tc.Approval.DispatchedCallID)+8) + 2 + len(r.Tenant)
						}
					}
				}
			}
			vals := make([]byte, 0, valSize)
			keys := make([]byte, 0, keySize)
			written += valSize + keySize
			carve := func(buf *[]byte, start int) []byte { return (*buf)[start:len(*buf):len(*buf)] }
			for i, r := range req.recs {
				if !fresh[i] {
					if req.seqs[i] == 0 {
						req.seqs[i] = inTx[r.ID].seq // a repeat within this call
					}
					continue
				}
				seq++
				start := len(vals)
				vals = append(vals, make([]byte, hashLen)...)
				vals = buildBody(vals, seq, &prev, req.received, req.js[i])
				h := w.ch.next(&prev, vals[start+hashLen:])
				copy(vals[start:], h[:])
				val := carve(&vals, start)

				start = len(keys)
				keys = binary.BigEndian.AppendUint64(keys, seq)
				key := carve(&keys, start)
				if err := records.Put(key, val); err != nil {
					return fmt.Errorf("audit: put record %d: %w", seq, err)
				}
				if w.s.chain != nil {
					chained = append(chained, val)
				}
				start = len(keys)
				keys = append(keys, r.ID...)
				idKey := carve(&keys, start)
				start = len(keys)
				keys = binary.BigEndian.AppendUint64(keys, seq)
				keys = append(keys, req.digests[i][:]...)
				if err := byID.Put(idKey, carve(&keys, start)); err != nil {
					return fmt.Errorf("audit: index record %d: %w", seq, err)
				}
				if r.Tenant != "" {
					start = len(keys)
					keys = appendIndexKey(keys, r.Tenant, seq)
					if err := byTenant.Put(carve(&keys, start), noValue); err != nil {
						return fmt.Errorf("audit: index record %d: %w", seq, err)
					}
				}
				if r.ToolCall != nil {
					start = len(keys)
					keys = appendIndexKey(keys, r.ToolCall.RunID, seq)
					if err := byRun.Put(carve(&keys, start), noValue); err != nil {
						return fmt.Errorf("audit: index record %d: %w", seq, err)
					}
					if r.Tenant != "" {
						start = len(keys)
						keys = appendTenantRunKey(keys, r.Tenant, r.ToolCall.RunID, seq)
						if err := byTenantRun.Put(carve(&keys, start), noValue); err != nil {
							return fmt.Errorf("audit: index record %d: %w", seq, err)
						}
					}
					var dispatched string
					if a := r.ToolCall.Approval; a != nil {
						dispatched = a.DispatchedCallID
					}
					for nth := range maxKeysPerIndex {
						call := indexedCall(r.ToolCall.CallID, dispatched, nth)
						if call == "" {
							continue
						}
						start = len(keys)
						keys = appendCallKey(keys, call, seq)
						if err := byCall.Put(carve(&keys, start), noValue); err != nil {
							return fmt.Errorf("audit: index record %d: %w", seq, err)
						}
						if r.Tenant != "" {
							start = len(keys)
							keys = appendTenantCallKey(keys, r.Tenant, call, seq)
							if err := byTenantCall.Put(carve(&keys, start), noValue); err != nil {
								return fmt.Errorf("audit: index record %d: %w", seq, err)
							}
						}
					}
				}
				inTx[r.ID] = idEntry{seq: seq, digest: req.digests[i]}
				req.seqs[i] = seq
				prev = h
			}
		}
		if seq == w.seq {
			return nil
		}
		head := append(seqKey(seq), prev[:]...)
		if err := tx.Bucket(bucketMeta).Put(keyHead, head); err != nil {
			return err
		}
		if w.s.chain == nil {
			return nil
		}
		// The shared chain first: this file may never hold a record it lacks.
		return w.s.chain.Commit(context.Background(), Head{Seq: w.seq, Hash: w.prev}, chained)
	})
	if err != nil {
		w.s.log.Error("audit: commit audit records", "err", err, "records", len(batch))
		for _, req := range batch {
			req.seqs, req.err = nil, fmt.Errorf("audit: commit: %w", err)
			close(req.done)
		}
		return
	}
	w.advance(seq, prev)
	for _, req := range batch {
		close(req.done)
	}
	w.noteWritten(written)
}

// update is the writer's db.Update. The log is not checked page by page at start, so a
// damaged page may first be met here, where bbolt panics: guarded, the commit fails with
// the file's name and the fix (bbolt rolls the transaction back), the appends are refused,
// and the process, with its other services, stays up.
func (s *Store) update(fn func(*bolt.Tx) error) error {
	return boltdb.Guard(s.path, func() error { return s.db.Update(fn) })
}

// advance moves the durable head after a commit and wakes the watchers.
func (w *writer) advance(seq uint64, prev [32]byte) {
	if seq == w.seq {
		return
	}
	w.seq, w.prev = seq, prev
	w.s.headMu.Lock()
	w.s.headSeq, w.s.headHash = seq, prev
	close(w.s.changed)
	w.s.changed = make(chan struct{})
	w.s.headMu.Unlock()
}

// Sink adapts the store to audit.Sink, for a producer spool in the same process.
func (s *Store) Sink() audit.Sink { return storeSink{s} }

type storeSink struct{ s *Store }

var _ audit.EncodedSink = storeSink{}

func (k storeSink) Append(ctx context.Context, recs []audit.Record) error {
	_, err := k.s.Append(ctx, recs)
	return sinkError(err)
}

// AppendEncoded stores the bodies the spool encoded instead of encoding each record again.
func (k storeSink) AppendEncoded(ctx context.Context, recs []audit.Encoded) error {
	_, err := k.s.AppendEncoded(ctx, recs)
	return sinkError(err)
}

// sinkError is the store's error as a spool reads it.
func sinkError(err error) error {
	if errors.Is(err, ErrIDConflict) {
		// No resend changes which record holds the ID: the spool must set this one aside
		// (quarantine) rather than retry it, and everything queued behind it, forever.
		return fmt.Errorf("%w: %w", audit.ErrRejected, err)
	}
	return err
}

// BackupFile copies audit.db as of one read transaction (AdminService.Backup).
func (s *Store) BackupFile() backup.File { return backup.Bolt(s.db) }
