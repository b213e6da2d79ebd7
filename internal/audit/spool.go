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
	DefaultBatchSize      = 500
	MaxBatchSize          = 1000
	DefaultBatchBytes     = 1 << 20
	DefaultMinBackoff     = 50 * time.Millisecond
	DefaultMaxBackoff     = 5 * time.Second
	DefaultAttemptTimeout = 30 * time.Second
	DefaultAckDelay       = 20 * time.Millisecond
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
	// AckDelay gathers acknowledgements before forwarded records are deleted from the outbox
	// (one write transaction per AckDelay at most, instead of one per batch).
	AckDelay time.Duration
	Logger   *slog.Logger
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
	ackDelay       time.Duration
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

	// The group commit of Enqueue: waiting calls, and whether one is committing.
	qmu     sync.Mutex
	queue   []*enqueueReq
	leading bool
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
		ackDelay:       orDefault(cfg.AckDelay, DefaultAckDelay),
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
	if len(first) != 8 || len(last) != 8 {
		// Not a key this spool wrote: count the slow way rather than trust it.
		return q.Stats().KeyN
	}
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
	body, err := encodeRecord(rec)
	if err != nil {
		return err
	}
	return s.enqueueEncoded(tx, body)
}

func encodeRecord(rec Record) ([]byte, error) {
	rec.Time = rec.Time.UTC()
	if err := rec.Validate(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("audit: encode record: %w", err)
	}
	return body, nil
}

// enqueueEncoded writes one encoded record. A refusal (ErrSpoolFull) returns before
// anything is written, so the transaction stays usable for other records.
func (s *Spool) enqueueEncoded(tx *bolt.Tx, body []byte) error {
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
			return s.errFull(n)
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

func (s *Spool) errFull(n int) error {
	return fmt.Errorf("%w: %d records wait for the audit service (limit %d)", ErrSpoolFull, n, s.maxPending)
}

// enqueueReq is one Enqueue waiting for a group commit.
type enqueueReq struct {
	body []byte
	err  error
	// ready is closed once: when the record's transaction ended, or when this caller is
	// promoted to commit the next group (lead is then true).
	ready chan struct{}
	lead  bool
}

// maxEnqueueGroup bounds the records one group commit writes.
const maxEnqueueGroup = 1000

// Enqueue adds rec to the outbox in a transaction of its own and returns once it is
// durable in the producer's file. Concurrent callers share transactions: whoever finds
// no commit running commits every record waiting at that moment, and hands the next
// group to the first caller that arrived meanwhile. Unlike DB.Batch this never waits
// for a timer, and one refused record does not re-run the others. Once queued, a call
// waits for its commit even if ctx ends, which takes one bbolt commit at most. Never
// call Enqueue inside a write transaction on the same DB (it would wait for that
// transaction forever); use EnqueueTx there.
func (s *Spool) Enqueue(ctx context.Context, rec Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	body, err := encodeRecord(rec)
	if err != nil {
		return err
	}
	if s.onFull == FailClosed {
		if n := s.Pending(); n >= s.maxPending {
			return s.errFull(n)
		}
	}
	req := &enqueueReq{body: body, ready: make(chan struct{})}
	s.qmu.Lock()
	s.queue = append(s.queue, req)
	if s.leading {
		s.qmu.Unlock()
		<-req.ready
		if !req.lead {
			return req.err
		}
	} else {
		s.leading = true
		s.qmu.Unlock()
	}
	s.commitGroup(req)
	return req.err
}

// commitGroup commits the waiting records (me among them: a leader is always at the
// front of the queue), answers them, and promotes the next waiter if any arrived.
func (s *Spool) commitGroup(me *enqueueReq) {
	s.qmu.Lock()
	n := min(len(s.queue), maxEnqueueGroup)
	group := s.queue[:n:n]
	s.queue = append([]*enqueueReq(nil), s.queue[n:]...)
	s.qmu.Unlock()

	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, r := range group {
			r.err = s.enqueueEncoded(tx, r.body)
			if r.err != nil && !errors.Is(r.err, ErrSpoolFull) {
				return r.err
			}
		}
		return nil
	})
	if err != nil {
		for _, r := range group {
			r.err = fmt.Errorf("audit: spool commit: %w", err)
		}
	}
	for _, r := range group {
		if r != me {
			close(r.ready)
		}
	}

	s.qmu.Lock()
	if len(s.queue) == 0 {
		s.leading = false
		s.qmu.Unlock()
		return
	}
	next := s.queue[0]
	next.lead = true
	s.qmu.Unlock()
	close(next.ready)
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

// CanAccept reports, without writing, whether an Enqueue would be refused for a full spool: a
// producer that must not act without its record (the pool, before it dispatches a call)
// asks first. Under ContinueAndAlarm it never refuses.
func (s *Spool) CanAccept() error {
	if s.onFull == FailClosed {
		if n := s.Pending(); n >= s.maxPending {
			return s.errFull(n)
		}
	}
	return nil
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
//
// Three stages overlap so that the Sink is never idle waiting on the producer's file:
// a reader decodes the next batch while the current one is in flight, a sender keeps
// exactly one batch in flight (which is what keeps the order), and an acknowledger
// deletes acknowledged records in as few transactions as it can. A record acknowledged
// but not yet deleted when Run stops is sent again by the next Run; the log drops it.
func (s *Spool) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("audit: spool is already running")
	}
	defer s.running.Store(false)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan spoolBatch) // unbuffered: the reader holds at most one batch ahead
	acks := &ackMark{signal: make(chan struct{}, 1)}
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	stage := func(f func() error) {
		wg.Go(func() {
			if err := f(); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	stage(func() error { return s.readLoop(ctx, batches) })
	stage(func() error { return s.sendLoop(ctx, batches, acks) })
	stage(func() error { return s.ackLoop(ctx, acks) })
	wg.Wait()
	close(errs)
	return <-errs
}

// spoolBatch is a run of consecutive outbox records. Records that no longer decode are
// not sent; their keys still advance the acknowledgement so they are deleted in order.
type spoolBatch struct {
	last    []byte // key of the last record covered
	recs    []Record
	corrupt uint64
}

// ackMark is the highest key the Sink acknowledged, waiting to be deleted.
type ackMark struct {
	mu      sync.Mutex
	through []byte
	corrupt uint64
	signal  chan struct{}
}

func (a *ackMark) advance(b spoolBatch) {
	a.mu.Lock()
	a.through = b.last
	a.corrupt += b.corrupt
	a.mu.Unlock()
	select {
	case a.signal <- struct{}{}:
	default:
	}
}

func (a *ackMark) take() ([]byte, uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	through, corrupt := a.through, a.corrupt
	a.through, a.corrupt = nil, 0
	return through, corrupt
}

// putBack returns an acknowledgement whose deletion failed, unless a later one
// superseded it.
func (a *ackMark) putBack(through []byte, corrupt uint64) {
	a.mu.Lock()
	if a.through == nil {
		a.through = through
	}
	a.corrupt += corrupt
	a.mu.Unlock()
}

func (s *Spool) readLoop(ctx context.Context, out chan<- spoolBatch) error {
	var after []byte
	var failures int
	for {
		b, err := s.readBatch(after)
		if err != nil {
			if errors.Is(err, bolt.ErrDatabaseNotOpen) {
				return fmt.Errorf("audit: spool database closed: %w", err)
			}
			failures++
			s.log.Error("audit: read spool", "error", err)
			if !s.sleep(ctx, s.backoff(failures)) {
				return nil
			}
			continue
		}
		failures = 0
		if b.last == nil {
			select {
			case <-ctx.Done():
				return nil
			case <-s.wake:
				continue
			}
		}
		select {
		case out <- b:
			after = b.last
		case <-ctx.Done():
			return nil
		}
	}
}

// readBatch reads up to one batch of records after key after (from the front when nil).
func (s *Spool) readBatch(after []byte) (spoolBatch, error) {
	var b spoolBatch
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(s.bucket).Bucket(spoolRecordsKey).Cursor()
		k, v := c.First()
		if after != nil {
			k, v = c.Seek(after)
			if k != nil && string(k) == string(after) {
				k, v = c.Next()
			}
		}
		size := 0
		for n := 0; k != nil && n < s.batchSize; k, v = c.Next() {
			if n > 0 && size+len(v) > s.batchBytes {
				break
			}
			n++
			b.last = append(b.last[:0], k...)
			var r Record
			if err := json.Unmarshal(v, &r); err != nil || r.Validate() != nil {
				// The producer's file was damaged. Dropping the record (and saying so in
				// the trail) beats blocking every record behind it forever.
				s.log.Error("audit: spool record does not decode, dropping it", "bucket", string(s.bucket), "key", fmt.Sprintf("%x", k))
				b.corrupt++
				continue
			}
			size += len(v)
			b.recs = append(b.recs, r)
		}
		return nil
	})
	return b, err
}

func (s *Spool) sendLoop(ctx context.Context, in <-chan spoolBatch, acks *ackMark) error {
	var failures int
	var lastLog time.Time
	for {
		var b spoolBatch
		select {
		case b = <-in:
		case <-ctx.Done():
			return nil
		}
		for len(b.recs) > 0 {
			actx, cancel := context.WithTimeout(ctx, s.attemptTimeout)
			err := s.sink.Append(actx, b.recs)
			cancel()
			if err == nil {
				break
			}
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
		}
		if failures > 0 {
			s.log.Info("audit: forwarding resumed", "failed_attempts", failures, "pending", s.Pending())
			failures = 0
		}
		acks.advance(b)
	}
}

// ackLoop deletes acknowledged records. On the way out it deletes what was already
// acknowledged, so a clean stop does not make the next Run resend it.
func (s *Spool) ackLoop(ctx context.Context, acks *ackMark) error {
	var failures int
	for {
		stopping := false
		select {
		case <-acks.signal:
			// Deleting forwarded records is a write transaction with its own fsyncs, in the
			// same file producers commit to: gather acknowledgements for a moment instead of
			// committing one delete per forwarded batch. A crash meanwhile only resends
			// records the log already holds, and it drops them by id.
			select {
			case <-time.After(s.ackDelay):
			case <-ctx.Done():
				stopping = true
			}
		case <-ctx.Done():
			stopping = true
		}
		through, corrupt := acks.take()
		if through != nil {
			if err := s.ack(through, corrupt); err != nil {
				acks.putBack(through, corrupt)
				if errors.Is(err, bolt.ErrDatabaseNotOpen) {
					if stopping {
						return nil
					}
					return fmt.Errorf("audit: spool database closed: %w", err)
				}
				// The records stay and are resent after a restart; the log drops them.
				failures++
				s.log.Error("audit: delete forwarded records from spool", "error", err)
				if stopping || !s.sleep(ctx, s.backoff(failures)) {
					return nil
				}
				select {
				case acks.signal <- struct{}{}:
				default:
				}
				continue
			}
			failures = 0
		}
		if stopping {
			return nil
		}
	}
}

// ack deletes the outbox up to and including key through, counts records that did not
// decode as dropped, and, now that there is room, reports any dropped records.
func (s *Spool) ack(through []byte, corrupt uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(s.bucket)
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
		if corrupt > 0 {
			if err := b.Put(spoolDroppedKey, binary.BigEndian.AppendUint64(nil, readUint64(b.Get(spoolDroppedKey))+corrupt)); err != nil {
				return err
			}
			tx.OnCommit(func() { s.dropped.Add(corrupt) })
		}
		n := len(keys)
		tx.OnCommit(func() { s.noteForwarded(n) })
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
		s.noteEnqueued()
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

// Forwarder is a running spool forwarder; Stop ends it.
type Forwarder struct {
	spool  *Spool
	cancel context.CancelFunc
	done   chan struct{}
}

// StartForwarding runs the forwarder in the background until Stop: what every producer does
// with its spool for as long as it serves.
func (s *Spool) StartForwarding() *Forwarder {
	ctx, cancel := context.WithCancel(context.Background())
	f := &Forwarder{spool: s, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		if err := s.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Error("audit: the spool forwarder stopped", "error", err)
		}
	}()
	return f
}

// Stop gives the forwarder up to grace to drain what is pending, then stops it. Whatever is
// left stays durable in the outbox and is forwarded after the next start.
func (f *Forwarder) Stop(grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	_ = f.spool.Flush(ctx)
	cancel()
	f.cancel()
	<-f.done
}
