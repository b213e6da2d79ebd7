package audit

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Sink is where a spool forwards records: the audit log in-process, or a client of the
// audit service in a split deployment. Append must be idempotent by Record.ID (a resent
// record is stored once) and must return nil only once every record is durable, because
// the spool deletes records as soon as Append returns nil.
type Sink interface {
	Append(ctx context.Context, recs []Record) error
}

// FullPolicy says what a spool does when it holds MaxPending records.
type FullPolicy int

const (
	// FailClosed refuses the enqueue with ErrSpoolFull, so the producer refuses the
	// operation: no change happens without its audit record.
	FailClosed FullPolicy = iota
	// ContinueAndAlarm drops the record, counts it, logs an error, and reports the count
	// in an audit_records_dropped record once there is room. The operator chose
	// availability over a complete trail; the trail still says that records are missing.
	ContinueAndAlarm
)

// ErrSpoolFull is returned by Enqueue and EnqueueTx under FailClosed when the spool is
// at its bound. Producers turn it into a refusal (FAILED_PRECONDITION or UNAVAILABLE).
var ErrSpoolFull = errors.New("audit: spool full")

// Defaults for SpoolConfig.
const (
	DefaultMaxPending     = 100_000
	DefaultBatchSize      = 256
	MaxBatchSize          = 1000
	DefaultBatchBytes     = 1 << 20
	DefaultMinBackoff     = 50 * time.Millisecond
	DefaultMaxBackoff     = 5 * time.Second
	DefaultAttemptTimeout = 30 * time.Second
)

// SpoolConfig configures a Spool. DB, Bucket, Sink and Producer are required.
type SpoolConfig struct {
	// DB is the producer's own bbolt database: the outbox lives beside the data whose
	// changes it records, so both commit in one transaction.
	DB *bolt.DB
	// Bucket names the top-level bucket that holds the outbox.
	Bucket string
	Sink   Sink
	// Producer names the service on records the spool writes itself.
	Producer string
	// MaxPending bounds the outbox; 0 means DefaultMaxPending.
	MaxPending int
	OnFull     FullPolicy
	// BatchSize and BatchBytes bound one forwarded batch (at least one record is always
	// sent, however large).
	BatchSize  int
	BatchBytes int
	// MinBackoff and MaxBackoff bound the retry delay after a failed forward.
	MinBackoff, MaxBackoff time.Duration
	// AttemptTimeout bounds one Sink.Append, so a hung audit service cannot stall the
	// forwarder forever.
	AttemptTimeout time.Duration
	Logger         *slog.Logger
}

// Keys inside the spool's bucket.
var (
	spoolRecordsKey = []byte("records")
	spoolDroppedKey = []byte("dropped")
)

// Spool is a durable, bounded outbox in the producer's bbolt file that forwards audit
// records, in order, to a Sink. It is safe for concurrent use.
type Spool struct {
	db             *bolt.DB
	bucket         []byte
	sink           Sink
	producer       string
	maxPending     int
	onFull         FullPolicy
	batchSize      int
	batchBytes     int
	minBackoff     time.Duration
	maxBackoff     time.Duration
	attemptTimeout time.Duration
	log            *slog.Logger

	// pending mirrors the outbox size for cheap reads; it is adjusted in commit hooks,
	// so it may lag a commit by an instant but never drifts. The bound itself is always
	// checked inside the transaction.
	pending atomic.Int64
	dropped atomic.Uint64
	running atomic.Bool
	wake    chan struct{}

	mu        sync.Mutex
	progress  chan struct{} // closed and replaced whenever records leave the outbox
	lastAlarm time.Time
}

// NewSpool opens (creating if needed) the outbox bucket in cfg.DB.
func NewSpool(cfg SpoolConfig) (*Spool, error) {
	if cfg.DB == nil || cfg.Bucket == "" || cfg.Sink == nil || cfg.Producer == "" {
		return nil, errors.New("audit: spool needs DB, Bucket, Sink and Producer")
	}
	if cfg.OnFull != FailClosed && cfg.OnFull != ContinueAndAlarm {
		return nil, fmt.Errorf("audit: unknown spool full policy %d", cfg.OnFull)
	}
	s := &Spool{
		db:             cfg.DB,
		bucket:         []byte(cfg.Bucket),
		sink:           cfg.Sink,
		producer:       cfg.Producer,
		maxPending:     orDefault(cfg.MaxPending, DefaultMaxPending),
		onFull:         cfg.OnFull,
		batchSize:      min(orDefault(cfg.BatchSize, DefaultBatchSize), MaxBatchSize),
		batchBytes:     orDefault(cfg.BatchBytes, DefaultBatchBytes),
		minBackoff:     orDefault(cfg.MinBackoff, DefaultMinBackoff),
		maxBackoff:     orDefault(cfg.MaxBackoff, DefaultMaxBackoff),
		attemptTimeout: orDefault(cfg.AttemptTimeout, DefaultAttemptTimeout),
		log:            cfg.Logger,
		wake:           make(chan struct{}, 1),
		progress:       make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.maxBackoff < s.minBackoff {
		s.maxBackoff = s.minBackoff
	}
	var n int
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(s.bucket)
		if err != nil {
			return err
		}
		q, err := b.CreateBucketIfNotExists(spoolRecordsKey)
		if err != nil {
			return err
		}
		n = queueLen(q)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("audit: open spool bucket %q: %w", cfg.Bucket, err)
	}
	s.pending.Store(int64(n))
	return s, nil
}

func orDefault[T int | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
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
	return int(binary.BigEndian.Uint64(last) - binary.BigEndian.Uint64(first) + 1)
}

// EnqueueTx adds rec to the outbox inside the producer's write transaction tx, so the
// record commits if and only if the change it describes commits. It returns an error
// wrapping ErrInvalidRecord for a malformed record and ErrSpoolFull when the outbox is
// full under FailClosed; the producer should then roll back its change.
func (s *Spool) EnqueueTx(tx *bolt.Tx, rec Record) error {
	if tx.DB() != s.db {
		return errors.New("audit: spool transaction belongs to another database")
	}
	rec.Time = rec.Time.UTC()
	if err := rec.Validate(); err != nil {
		return err
	}
	body, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("audit: encode record: %w", err)
	}
	b := tx.Bucket(s.bucket)
	if b == nil {
		return fmt.Errorf("audit: spool bucket %q is missing", s.bucket)
	}
	q := b.Bucket(spoolRecordsKey)
	if q == nil {
		return fmt.Errorf("audit: spool bucket %q has no records bucket", s.bucket)
	}
	if n := queueLen(q); n >= s.maxPending {
		if s.onFull == FailClosed {
			return fmt.Errorf("%w: %d records wait for the audit service (limit %d)", ErrSpoolFull, n, s.maxPending)
		}
		d := binary.BigEndian.AppendUint64(nil, readUint64(b.Get(spoolDroppedKey))+1)
		if err := b.Put(spoolDroppedKey, d); err != nil {
			return fmt.Errorf("audit: count dropped record: %w", err)
		}
		tx.OnCommit(s.noteDropped)
		return nil
	}
	seq, err := q.NextSequence()
	if err != nil {
		return fmt.Errorf("audit: spool sequence: %w", err)
	}
	if err := q.Put(binary.BigEndian.AppendUint64(nil, seq), body); err != nil {
		return fmt.Errorf("audit: spool record: %w", err)
	}
	tx.OnCommit(s.noteEnqueued)
	return nil
}

// Enqueue adds rec to the outbox in a transaction of its own, batched with concurrent
// callers through DB.Batch. It returns once the record is durable in the producer's file.
func (s *Spool) Enqueue(ctx context.Context, rec Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rec.Time = rec.Time.UTC()
	if err := rec.Validate(); err != nil {
		return err
	}
	// A failing function makes DB.Batch re-run the whole batch, so refuse early while
	// the outbox is known full; EnqueueTx still decides exactly inside the transaction.
	if s.onFull == FailClosed {
		if n := s.Pending(); n >= s.maxPending {
			return fmt.Errorf("%w: %d records wait for the audit service (limit %d)", ErrSpoolFull, n, s.maxPending)
		}
	}
	return s.db.Batch(func(tx *bolt.Tx) error { return s.EnqueueTx(tx, rec) })
}

func (s *Spool) noteEnqueued() {
	s.pending.Add(1)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// noteDropped alarms at most every ten seconds: under a pool's call rate a log line per
// dropped record would bury the alarm and the disk.
func (s *Spool) noteDropped() {
	n := s.dropped.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now(); s.lastAlarm.IsZero() || now.Sub(s.lastAlarm) >= 10*time.Second {
		s.log.Error("audit: spool full, dropping audit records because the operator chose to continue",
			"bucket", string(s.bucket), "dropped_total", n, "limit", s.maxPending)
		s.lastAlarm = now
	}
}

// Pending returns how many records wait in the outbox.
func (s *Spool) Pending() int {
	return int(max(s.pending.Load(), 0))
}

// Dropped returns how many records this process dropped because the outbox was full
// under ContinueAndAlarm.
func (s *Spool) Dropped() uint64 { return s.dropped.Load() }

// Flush waits until the outbox is empty or ctx ends. It needs Run to be forwarding.
func (s *Spool) Flush(ctx context.Context) error {
	for {
		s.mu.Lock()
		progress := s.progress
		s.mu.Unlock()
		var n int
		err := s.db.View(func(tx *bolt.Tx) error {
			n = queueLen(tx.Bucket(s.bucket).Bucket(spoolRecordsKey))
			return nil
		})
		if err != nil {
			return fmt.Errorf("audit: read spool: %w", err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return fmt.Errorf("audit: flush spool with %d records pending: %w", n, ctx.Err())
		}
	}
}

// Run forwards the outbox to the Sink until ctx ends, in order and in batches, deleting
// records only after the Sink acknowledged them. A failed forward is retried with
// exponential backoff and jitter; new enqueues wake an idle forwarder at once. Run
// returns nil when ctx ends and an error only when the database is unusable. Only one
// Run may be active per Spool.
func (s *Spool) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("audit: spool is already running")
	}
	defer s.running.Store(false)

	var failures int
	var lastLog time.Time
	for {
		if ctx.Err() != nil {
			return nil
		}
		keys, recs, err := s.readBatch()
		if err != nil {
			if errors.Is(err, bolt.ErrDatabaseNotOpen) {
				return fmt.Errorf("audit: spool database closed: %w", err)
			}
			s.log.Error("audit: read spool", "error", err)
			if !s.sleep(ctx, s.backoff(failures+1)) {
				return nil
			}
			continue
		}
		if len(recs) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-s.wake:
				continue
			}
		}

		actx, cancel := context.WithTimeout(ctx, s.attemptTimeout)
		err = s.sink.Append(actx, recs)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			failures++
			// Log the first failure and then every 30 s, not every retry: an outage is
			// one event, and the pending count tells how it grows.
			if failures == 1 || time.Since(lastLog) >= 30*time.Second {
				s.log.Error("audit: forward to audit log failed, will retry",
					"error", err, "attempts", failures, "pending", s.Pending())
				lastLog = time.Now()
			}
			if !s.sleep(ctx, s.backoff(failures)) {
				return nil
			}
			continue
		}
		if failures > 0 {
			s.log.Info("audit: forwarding resumed", "failed_attempts", failures, "pending", s.Pending())
			failures = 0
		}
		if err := s.ack(keys); err != nil {
			// The records stay in the outbox and are resent; the log drops the duplicates.
			if errors.Is(err, bolt.ErrDatabaseNotOpen) {
				return fmt.Errorf("audit: spool database closed: %w", err)
			}
			s.log.Error("audit: delete forwarded records from spool", "error", err)
			if !s.sleep(ctx, s.backoff(1)) {
				return nil
			}
		}
	}
}

// readBatch reads the front of the outbox. A record that no longer decodes (the
// producer's file was damaged) is removed and counted as dropped, so it cannot block
// every record behind it forever.
func (s *Spool) readBatch() (keys [][]byte, recs []Record, err error) {
	var corrupt []byte
	err = s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(s.bucket).Bucket(spoolRecordsKey).Cursor()
		size := 0
		for k, v := c.First(); k != nil && len(recs) < s.batchSize; k, v = c.Next() {
			if len(recs) > 0 && size+len(v) > s.batchBytes {
				break
			}
			var r Record
			if err := json.Unmarshal(v, &r); err != nil || r.Validate() != nil {
				if len(recs) == 0 {
					corrupt = append([]byte(nil), k...)
				}
				break
			}
			size += len(v)
			keys = append(keys, append([]byte(nil), k...))
			recs = append(recs, r)
		}
		return nil
	})
	if err != nil || corrupt == nil {
		return keys, recs, err
	}
	s.log.Error("audit: spool record does not decode, dropping it", "bucket", string(s.bucket), "key", binary.BigEndian.Uint64(corrupt))
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(s.bucket)
		if err := b.Bucket(spoolRecordsKey).Delete(corrupt); err != nil {
			return err
		}
		if err := b.Put(spoolDroppedKey, binary.BigEndian.AppendUint64(nil, readUint64(b.Get(spoolDroppedKey))+1)); err != nil {
			return err
		}
		tx.OnCommit(func() {
			s.dropped.Add(1)
			s.noteForwarded(1)
		})
		return s.reportDropped(tx, b)
	})
	return nil, nil, err
}

// ack deletes acknowledged records and, now that there is room, reports any records
// dropped while the outbox was full.
func (s *Spool) ack(keys [][]byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(s.bucket)
		q := b.Bucket(spoolRecordsKey)
		for _, k := range keys {
			if err := q.Delete(k); err != nil {
				return err
			}
		}
		tx.OnCommit(func() { s.noteForwarded(len(keys)) })
		return s.reportDropped(tx, b)
	})
}

// reportDropped turns the durable dropped count into an audit_records_dropped record
// when the outbox has room, in the transaction that made the room.
func (s *Spool) reportDropped(tx *bolt.Tx, b *bolt.Bucket) error {
	n := readUint64(b.Get(spoolDroppedKey))
	if n == 0 {
		return nil
	}
	q := b.Bucket(spoolRecordsKey)
	if queueLen(q) >= s.maxPending {
		return nil
	}
	change, err := json.Marshal(map[string]any{"dropped": n, "limit": s.maxPending})
	if err != nil {
		return err
	}
	rec := NewAdminRecord(s.producer, "", AdminEvent{
		ActorRole:    ActorRoleSystem,
		Action:       ActionAuditRecordsDropped,
		ResourceType: "audit_spool",
		ResourceID:   string(s.bucket),
		Change:       change,
	})
	body, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	seq, err := q.NextSequence()
	if err != nil {
		return err
	}
	if err := q.Put(binary.BigEndian.AppendUint64(nil, seq), body); err != nil {
		return err
	}
	if err := b.Delete(spoolDroppedKey); err != nil {
		return err
	}
	tx.OnCommit(func() {
		s.log.Error("audit: spool had room again; recorded the dropped audit records", "bucket", string(s.bucket), "dropped", n)
		s.pending.Add(1)
	})
	return nil
}

func (s *Spool) noteForwarded(n int) {
	s.pending.Add(-int64(n))
	s.mu.Lock()
	close(s.progress)
	s.progress = make(chan struct{})
	s.mu.Unlock()
}

// backoff returns the delay before retry number attempt: exponential from MinBackoff,
// capped at MaxBackoff, with half of it jittered so many producers recovering from one
// outage do not retry in lockstep.
func (s *Spool) backoff(attempt int) time.Duration {
	d := s.minBackoff
	for i := 1; i < attempt && d < s.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, s.maxBackoff)
	half := d / 2
	return half + rand.N(half+1)
}

func (s *Spool) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func readUint64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}
