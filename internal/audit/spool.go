package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Sink is where a spool forwards records: the audit log in-process, or a client of the
// audit service in a split deployment. Append must be idempotent by Record.ID (a resent
// record is stored once) and must return nil only once every record is durable, because
// the spool deletes records as soon as Append returns nil.
type Sink interface {
	Append(ctx context.Context, recs []Record) error
}

// NotLeaderReason is the reason of the ErrorInfo (domain ringfence.audit.v1) an audit
// instance standing by answers Append with, as UNAVAILABLE, when several share the log
// (store.backend=etcd): one leader appends. A producer's client then tries the next audit
// instance it knows at once. The ErrorInfo's metadata "leader" names the leader, if any.
const NotLeaderReason = "AUDIT_NOT_LEADER"

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

// ErrRejected is wrapped by a Sink's error when the audit log refuses the records themselves
// (a client of the audit service maps INVALID_ARGUMENT to it): retrying cannot help, so the
// spool sets such records aside in its quarantine file instead of blocking on them.
var ErrRejected = errors.New("audit: the audit log refused the records")

// ErrSpoolFull is returned by Enqueue and EnqueueTx under FailClosed when the spool is
// at its bound. Producers turn it into a refusal (FAILED_PRECONDITION or UNAVAILABLE).
var ErrSpoolFull = errors.New("audit: spool full")

// Defaults for SpoolConfig.
const (
	DefaultMaxPending         = 100_000
	DefaultMaxQuarantineBytes = 256 << 20
	DefaultBatchSize          = 500
	MaxBatchSize              = 1000
	DefaultBatchBytes         = 1 << 20
	DefaultMinBackoff         = 50 * time.Millisecond
	DefaultMaxBackoff         = 5 * time.Second
	DefaultAttemptTimeout     = 30 * time.Second
	DefaultAckDelay           = 20 * time.Millisecond
	DefaultLinger             = 100 * time.Millisecond
)

// SpoolConfig configures a Spool. Sink, Producer, and either DB and Bucket or Dir are
// required.
type SpoolConfig struct {
	// DB is the producer's own bbolt database: the outbox lives beside the data whose
	// changes it records, so both commit in one transaction (EnqueueTx).
	DB *bolt.DB
	// Bucket names the top-level bucket that holds the outbox.
	Bucket string
	// Dir, instead of DB and Bucket, keeps the outbox in append-only segment files of its
	// own: one fdatasync per commit instead of bbolt's two and its page writes, for a
	// producer that only calls Enqueue (the pool records every tool call this way).
	Dir string
	// Etcd, instead, keeps the outbox in etcd, shared by the producer's replicas, so a change
	// committed to etcd and its record are one transaction (EtcdRecorder).
	Etcd *EtcdOutbox
	Sink Sink
	// QuarantinePath is the JSON-lines file that keeps records the audit log refuses; empty
	// means quarantine.jsonl in Dir, or <DB's file>.audit-quarantine.jsonl.
	QuarantinePath string
	// Producer names the service on records the spool writes itself.
	Producer string
	// MaxPending bounds the outbox; 0 means DefaultMaxPending.
	MaxPending int
	// MaxQuarantineBytes bounds the quarantine file; 0 means DefaultMaxQuarantineBytes. Past
	// it, refused records wait in the outbox (forwarding stops), which then fills and fails
	// closed: nothing is lost, and nothing grows without bound.
	MaxQuarantineBytes int64
	OnFull             FullPolicy
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
	// Linger is how long the forwarder lets records gather before it reads a batch that
	// would not be full: under a steady stream of calls the audit log then commits hundreds
	// of records at a time instead of a handful, for at most Linger more before a record
	// reaches the log. It never delays an Enqueue, nor a Flush. 0 means DefaultLinger;
	// negative, none.
	Linger time.Duration
	Logger *slog.Logger
}

// Spool is a durable, bounded outbox (in the producer's bbolt file, or in files of its
// own) that forwards audit records, in order, to a Sink. It is safe for concurrent use.
type Spool struct {
	out            outbox
	sink           Sink
	quarantinePath string
	producer       string
	maxPending     int
	onFull         FullPolicy
	batchSize      int
	batchBytes     int
	minBackoff     time.Duration
	maxBackoff     time.Duration
	attemptTimeout time.Duration
	ackDelay       time.Duration
	linger         time.Duration
	log            *slog.Logger

	// pending mirrors the outbox size for cheap reads; it is adjusted in commit hooks,
	// so it may lag a commit by an instant but never drifts. The bound itself is always
	// checked inside the transaction.
	pending atomic.Int64
	dropped atomic.Uint64
	running atomic.Bool
	wake    chan struct{}
	// idle is set while the forwarder has found the outbox empty and waits for a record: only
	// then, or once a full batch is pending, does an enqueue wake it. Under a steady stream the
	// forwarder lingers undisturbed instead of being woken by every commit.
	idle atomic.Bool
	// flushing counts the Flush calls waiting: the forwarder does not linger for them.
	flushing atomic.Int32

	mu        sync.Mutex
	progress  chan struct{} // closed and replaced whenever records leave the outbox, or a commit ends
	lastAlarm time.Time

	// quarantineMu orders writes to the quarantine file with RequeueQuarantined.
	quarantineMu  sync.Mutex
	maxQuarantine int64
	// quarantined counts records set aside since the last log line about them: a log that
	// refuses everything is one event, not one error line per record.
	quarantined, quarantineLogged int
	lastQuarantineLog             time.Time

	// The group commit of Enqueue and EnqueueAsync: waiting records, and whether one caller
	// is committing. settled is signalled whenever no commit is running any more.
	qmu     sync.Mutex
	queue   []*enqueueReq
	leading bool
	settled *sync.Cond
	// asyncTimer commits the records EnqueueAsync queued when no Enqueue came to take them
	// along within asyncCommitDelay; armed while such records wait and no commit runs.
	asyncTimer *time.Timer
	asyncArmed bool
	// retrying is set while records of EnqueueAsync wait again after a failed commit (a full
	// disk): the timer then tries every asyncRetryDelay. closing fails them instead, so that
	// Close ends.
	retrying atomic.Bool
	closing  bool
}

// NewSpool opens (creating if needed) the outbox: the bucket in cfg.DB, or the files in
// cfg.Dir.
func NewSpool(cfg SpoolConfig) (*Spool, error) {
	if outboxes(cfg) != 1 || cfg.Sink == nil || cfg.Producer == "" {
		return nil, errors.New("audit: spool needs Sink, Producer, and either DB and Bucket or Dir (or Etcd)")
	}
	if cfg.OnFull != FailClosed && cfg.OnFull != ContinueAndAlarm {
		return nil, fmt.Errorf("audit: unknown spool full policy %d", cfg.OnFull)
	}
	s := &Spool{
		sink:           cfg.Sink,
		producer:       cfg.Producer,
		maxPending:     orDefault(cfg.MaxPending, DefaultMaxPending),
		maxQuarantine:  orDefault(cfg.MaxQuarantineBytes, DefaultMaxQuarantineBytes),
		onFull:         cfg.OnFull,
		batchSize:      min(orDefault(cfg.BatchSize, DefaultBatchSize), MaxBatchSize),
		batchBytes:     orDefault(cfg.BatchBytes, DefaultBatchBytes),
		minBackoff:     orDefault(cfg.MinBackoff, DefaultMinBackoff),
		maxBackoff:     orDefault(cfg.MaxBackoff, DefaultMaxBackoff),
		attemptTimeout: orDefault(cfg.AttemptTimeout, DefaultAttemptTimeout),
		ackDelay:       orDefault(cfg.AckDelay, DefaultAckDelay),
		linger:         cfg.Linger,
		log:            cfg.Logger,
		wake:           make(chan struct{}, 1),
		progress:       make(chan struct{}),
	}
	s.settled = sync.NewCond(&s.qmu)
	if s.log == nil {
		s.log = slog.Default()
	}
	switch {
	case s.linger == 0:
		s.linger = DefaultLinger
	case s.linger < 0:
		s.linger = 0
	}
	if s.maxBackoff < s.minBackoff {
		s.maxBackoff = s.minBackoff
	}
	var err error
	s.quarantinePath = cfg.QuarantinePath
	switch {
	case cfg.Etcd != nil:
		if s.quarantinePath == "" {
			return nil, errors.New("audit: a spool in etcd needs a QuarantinePath on local disk")
		}
		s.out, err = openEtcdOutbox(cfg.Etcd, s.wakeForwarder)
	case cfg.Dir != "":
		s.out, err = openFileOutbox(cfg.Dir, s.log)
		if s.quarantinePath == "" {
			s.quarantinePath = filepath.Join(cfg.Dir, "quarantine.jsonl")
		}
	default:
		s.out, err = openBoltOutbox(cfg.DB, cfg.Bucket)
		if s.quarantinePath == "" {
			s.quarantinePath = cfg.DB.Path() + ".audit-quarantine.jsonl"
		}
	}
	if err != nil {
		return nil, err
	}
	n, err := s.out.count()
	if err != nil {
		_ = s.out.close()
		return nil, err
	}
	s.pending.Store(int64(n))
	return s, nil
}

// Adopt moves the records waiting in the bbolt outbox bucket of db into this spool, oldest
// first, and empties that bucket: for a producer whose outbox moved to files of its own. A
// count of dropped records waiting there is reported at once. The records are durable here
// before they are deleted there; a crash in between forwards them twice, and the audit log
// keeps one of each.
func (s *Spool) Adopt(db *bolt.DB, bucket string) (int, error) {
	if _, ok := s.out.(*boltOutbox); ok {
		return 0, errors.New("audit: only a spool in files adopts a bbolt outbox")
	}
	var bodies [][]byte
	var dropped uint64
	err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			return nil
		}
		dropped = readUint64(b.Get(spoolDroppedKey))
		if q := b.Bucket(spoolRecordsKey); q != nil {
			return q.ForEach(func(_, v []byte) error {
				bodies = append(bodies, append([]byte(nil), v...))
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("audit: read the outbox to adopt: %w", err)
	}
	if dropped > 0 {
		report, err := s.droppedRecord(dropped, 0)
		if err != nil {
			return 0, err
		}
		bodies = append(bodies, report)
	}
	if len(bodies) == 0 {
		return 0, nil
	}
	// Already durable records: the bound does not apply to them.
	if _, err := s.out.add(bodies, nil, func(int) error { return nil }); err != nil {
		return 0, fmt.Errorf("audit: adopt outbox %q: %w", bucket, err)
	}
	s.pending.Add(int64(len(bodies)))
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if err := b.DeleteBucket(spoolRecordsKey); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
			return err
		}
		if _, err := b.CreateBucket(spoolRecordsKey); err != nil {
			return err
		}
		return b.Delete(spoolDroppedKey)
	})
	if err != nil {
		return 0, fmt.Errorf("audit: empty the adopted outbox %q (its records are now forwarded from %s, and may be again after a restart): %w", bucket, s.out.describe(), err)
	}
	s.wakeForwarder()
	return len(bodies), nil
}

// Close commits the records EnqueueAsync left waiting and releases the outbox's files (a
// bbolt outbox belongs to its producer, who closes the database). Stop the forwarder first.
func (s *Spool) Close() error {
	s.qmu.Lock()
	s.closing = true
	s.qmu.Unlock()
	s.commitWaiting()
	return s.out.close()
}

// commitWaiting returns once every queued record is committed (or its commit failed).
func (s *Spool) commitWaiting() {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	for s.leading || len(s.queue) > 0 {
		if s.leading {
			s.settled.Wait()
			continue
		}
		s.leading = true
		s.qmu.Unlock()
		s.commitGroup(nil)
		s.qmu.Lock()
	}
	if s.asyncTimer != nil {
		s.asyncTimer.Stop()
		s.asyncArmed = false
	}
}

func orDefault[T int | int64 | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// EnqueueTx adds rec to the outbox inside the producer's write transaction tx, so the
// record commits if and only if the change it describes commits. It returns an error
// wrapping ErrInvalidRecord for a malformed record and ErrSpoolFull when the outbox is
// full under FailClosed; the producer should then roll back its change. Only a spool
// whose outbox is a bucket of tx's database can do this.
func (s *Spool) EnqueueTx(tx *bolt.Tx, rec Record) error {
	bo, ok := s.out.(*boltOutbox)
	if !ok || tx.DB() != bo.db {
		return errors.New("audit: spool transaction belongs to another database")
	}
	body, err := encodeRecord(&rec)
	if err != nil {
		return err
	}
	dropped, err := bo.addTx(tx, body, s.admit)
	if err != nil {
		return err
	}
	if dropped {
		tx.OnCommit(s.noteDropped)
	} else {
		tx.OnCommit(s.noteEnqueued)
	}
	return nil
}

// EncodedSink is a Sink that also takes records as a spool encoded them: an audit log in the
// same process, which then stores each Encoded's body as it is instead of validating and
// encoding the record a second time. A spool forwards through AppendEncoded when its Sink has
// it; everything Sink.Append promises holds for AppendEncoded too.
type EncodedSink interface {
	Sink
	AppendEncoded(ctx context.Context, recs []Encoded) error
}

// Encoded is a record with its encoding as Encode made it, or without one (Body nil) for a
// record the spool read back from its outbox: the stored bytes may come from another version
// of the producer, so the log encodes that record itself as it does a record that arrives by
// Append. Only this package makes one, so a body is always Encode's output for its record.
type Encoded struct {
	rec  *Record
	body []byte
}

// Encode validates rec, with its time made UTC, and encodes it, as a spool does a record it
// takes (the audit log's Append encodes a record it takes the same way).
func Encode(rec Record) (Encoded, error) {
	body, err := encodeRecord(&rec)
	if err != nil {
		return Encoded{}, err
	}
	return Encoded{rec: &rec, body: body}, nil
}

// Record is the record, validated, its time in UTC (a zero Encoded holds the zero Record,
// which no log takes).
func (e Encoded) Record() Record {
	if e.rec == nil {
		return Record{}
	}
	return *e.rec
}

// Body is the record's JSON as json.Marshal of Record encodes it, or nil when the receiver
// must encode Record itself. The caller must not modify it.
func (e Encoded) Body() []byte { return e.body }

// encodeRecord validates rec, with its time made UTC, and encodes it.
func encodeRecord(rec *Record) ([]byte, error) {
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

// errDropRecord is admit's answer for a record to count as dropped instead of written.
var errDropRecord = errors.New("audit: drop record")

// admit decides the fate of one more record when pending already wait: written (nil),
// refused (ErrSpoolFull, under FailClosed) or dropped (errDropRecord, ContinueAndAlarm).
func (s *Spool) admit(pending int) error {
	if pending < s.maxPending {
		return nil
	}
	if s.onFull == FailClosed {
		return s.errFull(pending)
	}
	return errDropRecord
}

func (s *Spool) errFull(n int) error {
	return fmt.Errorf("%w: %d records wait for the audit service (limit %d)", ErrSpoolFull, n, s.maxPending)
}

// enqueueReq is one record waiting for a group commit.
type enqueueReq struct {
	body []byte
	rec  *Record // what body encodes
	err  error
	// ready is closed once: when the record's transaction ended, or when this caller is
	// promoted to commit the next group (lead is then true). It is nil for EnqueueAsync, whose
	// caller does not wait: failed gets a commit's error instead.
	ready  chan struct{}
	lead   bool
	failed func(error)
}

// maxEnqueueGroup bounds the records one group commit writes.
const maxEnqueueGroup = 1000

// asyncCommitDelay bounds how long a record of EnqueueAsync waits for an Enqueue to take it
// into its commit before the spool commits it alone. Under a steady stream of calls the next
// pending record comes far sooner.
const asyncCommitDelay = 5 * time.Millisecond

// asyncRetryDelay is how often records of EnqueueAsync whose commit failed are tried again.
const asyncRetryDelay = 100 * time.Millisecond

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
	body, err := encodeRecord(&rec)
	if err != nil {
		return err
	}
	if s.onFull == FailClosed {
		if n := s.Pending(); n >= s.maxPending {
			return s.errFull(n)
		}
	}
	req := &enqueueReq{body: body, rec: &rec, ready: make(chan struct{})}
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

// EnqueueAsync adds rec to the outbox without waiting for it: it joins the next group commit,
// an Enqueue's or, when none comes within asyncCommitDelay, one the spool makes. It is for a
// record whose loss in a crash leaves the trail less complete but not wrong: the outcome of a
// call whose pending record is already durable. Under FailClosed the record limit does not
// refuse it (the action it records was taken); under ContinueAndAlarm it may be dropped as any
// record. It returns an error wrapping ErrInvalidRecord before queueing; a commit that failed
// for the storage is tried again (requeue), and one that failed otherwise is given to failed.
// Flush and Close commit what waits.
func (s *Spool) EnqueueAsync(rec Record, failed func(error)) error {
	body, err := encodeRecord(&rec)
	if err != nil {
		return err
	}
	s.qmu.Lock()
	s.queue = append(s.queue, &enqueueReq{body: body, rec: &rec, failed: failed})
	s.armAsync()
	s.qmu.Unlock()
	return nil
}

// armAsync makes sure records waiting in the queue are committed within asyncCommitDelay when
// no commit is running to take them along. The caller holds qmu.
func (s *Spool) armAsync() {
	if s.leading || s.asyncArmed {
		return
	}
	s.asyncArmed = true
	delay := asyncCommitDelay
	if s.retrying.Load() {
		delay = asyncRetryDelay
	}
	if s.asyncTimer == nil {
		s.asyncTimer = time.AfterFunc(delay, s.commitQueued)
		return
	}
	s.asyncTimer.Reset(delay)
}

// commitQueued commits what waits in the queue, unless a commit is running: that one takes
// it along, or hands it on.
func (s *Spool) commitQueued() {
	s.qmu.Lock()
	s.asyncArmed = false
	if s.leading || len(s.queue) == 0 {
		s.qmu.Unlock()
		return
	}
	s.leading = true
	s.qmu.Unlock()
	s.commitGroup(nil)
}

// commitGroup commits the waiting records in groups until me's is committed (a nil me: one
// group), answers them, and promotes the next caller waiting for its commit. Records of
// EnqueueAsync alone wait for the next Enqueue, or for the timer.
func (s *Spool) commitGroup(me *enqueueReq) {
	for {
		s.qmu.Lock()
		n := min(len(s.queue), maxEnqueueGroup)
		group := s.queue[:n:n]
		s.queue = append([]*enqueueReq(nil), s.queue[n:]...)
		s.qmu.Unlock()
		s.commit(group, me)
		if me == nil || slices.Contains(group, me) {
			break
		}
	}

	s.qmu.Lock()
	i := slices.IndexFunc(s.queue, func(r *enqueueReq) bool { return r.ready != nil })
	if i < 0 {
		s.leading = false
		if len(s.queue) > 0 {
			s.armAsync()
		}
		s.settled.Broadcast()
		s.qmu.Unlock()
		s.noteProgress() // a Flush waiting for this commit looks again
		return
	}
	next := s.queue[i]
	next.lead = true
	s.qmu.Unlock()
	close(next.ready)
}

// commit writes one group in one transaction and answers everyone in it but me.
func (s *Spool) commit(group []*enqueueReq, me *enqueueReq) {
	bodies := make([][]byte, len(group))
	recs := make([]*Record, len(group))
	for i, r := range group {
		bodies[i], recs[i] = r.body, r.rec
	}
	// Under FailClosed the limit refuses new actions, not the outcome of one already taken
	// (EnqueueAsync: a dispatched call's outcome, after its answer): those are written past
	// it, at most one for each call that was in flight when the spool filled.
	next := 0
	admit := func(pending int) error {
		r := group[next]
		next++
		if r.failed != nil && s.onFull == FailClosed {
			return nil
		}
		return s.admit(pending)
	}
	errs, err := s.out.add(bodies, recs, admit)
	if err == nil {
		s.retrying.Store(false)
	}
	// A record of EnqueueAsync whose commit failed for the storage (a full disk) waits for the
	// next commit instead of being lost: its caller was answered already (a dispatched call's
	// outcome), and only new calls, refused meanwhile, would make room for it.
	retry := err != nil && !errors.Is(err, errOutboxClosed)
	var again []*enqueueReq
	for i, r := range group {
		switch {
		case retry && r.failed != nil:
			again = append(again, r)
		case err != nil:
			r.err = fmt.Errorf("audit: spool commit: %w", err)
		case errors.Is(errs[i], errDropRecord):
			s.noteDropped()
		case errs[i] != nil:
			r.err = errs[i]
		default:
			s.noteEnqueued()
		}
	}
	for _, r := range group {
		switch {
		case r == me:
		case r.ready != nil:
			close(r.ready)
		case r.err != nil && r.failed != nil:
			r.failed(r.err)
		}
	}
	if len(again) > 0 {
		s.requeue(again, fmt.Errorf("audit: spool commit: %w", err))
	}
}

// requeue puts records of EnqueueAsync whose commit failed back at the head of the queue, in
// their order, for the next commit; while the spool closes they fail with err.
func (s *Spool) requeue(again []*enqueueReq, err error) {
	s.qmu.Lock()
	if s.closing {
		s.qmu.Unlock()
		for _, r := range again {
			r.failed(err)
		}
		return
	}
	if !s.retrying.Swap(true) {
		s.log.Error("audit: records wait in memory for the spool's storage (answered calls' outcomes); retrying", "outbox", s.out.describe(), "records", len(again), "err", err)
	}
	s.queue = append(again, s.queue...)
	s.qmu.Unlock()
}

func (s *Spool) noteEnqueued() {
	if n := s.pending.Add(1); s.idle.Load() || n >= int64(s.batchSize) {
		s.wakeForwarder()
	}
}

func (s *Spool) wakeForwarder() {
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
			"outbox", s.out.describe(), "dropped_total", n, "limit", s.maxPending)
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

// Flush commits what EnqueueAsync queued and waits until the outbox is empty or ctx ends. It
// needs Run to be forwarding.
func (s *Spool) Flush(ctx context.Context) error {
	s.flushing.Add(1)
	defer s.flushing.Add(-1)
	s.wakeForwarder()
	for {
		s.commitQueued()
		s.mu.Lock()
		progress := s.progress
		s.mu.Unlock()
		n, err := s.out.count()
		if err != nil {
			return fmt.Errorf("audit: read spool: %w", err)
		}
		s.qmu.Lock()
		n += len(s.queue)
		if s.leading {
			n++ // a commit is writing records whose callers may have gone (EnqueueAsync)
		}
		s.qmu.Unlock()
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
	last   []byte // key of the last record covered
	recs   []Record
	bodies [][]byte // each record as stored, for the quarantine
	// encoded says which bodies are this process's encoding of their record (Encode), which an
	// EncodedSink stores as they are: those of the records Enqueue handed over from memory.
	encoded []bool
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
	gather := false // whether the next read should let records gather first
	for {
		if gather && !s.gather(ctx) {
			return nil
		}
		// Idle from before the read: a record committed after the read found nothing wakes the
		// wait below (the wake channel keeps it), and one committed before it is in the batch.
		s.idle.Store(true)
		b, err := s.readBatch(after)
		if b.last != nil || err != nil {
			s.idle.Store(false)
		}
		if err != nil {
			if errors.Is(err, errOutboxClosed) {
				return err
			}
			failures++
			s.log.Error("audit: read spool", "err", err)
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
				s.idle.Store(false)
				gather = true
				continue
			}
		}
		select {
		case out <- b:
			after = b.last
			gather = len(b.recs)+int(b.corrupt) < s.batchSize
		case <-ctx.Done():
			return nil
		}
	}
}

// gather waits up to Linger for a full batch of records to be pending: enqueues wake it only
// when one is (noteEnqueued), and Flush does not wait for it. It reports false when ctx ended.
func (s *Spool) gather(ctx context.Context) bool {
	if s.linger <= 0 || s.Pending() >= s.batchSize || s.flushing.Load() > 0 {
		return true
	}
	t := time.NewTimer(s.linger)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-s.wake:
			if s.Pending() >= s.batchSize || s.flushing.Load() > 0 {
				return true
			}
		}
	}
}

// readBatch reads up to one batch of records after key after (from the front when nil).
func (s *Spool) readBatch(after []byte) (spoolBatch, error) {
	var b spoolBatch
	entries, err := s.out.read(after, s.batchSize, s.batchBytes)
	if err != nil {
		return b, err
	}
	b.recs, b.bodies = make([]Record, 0, len(entries)), make([][]byte, 0, len(entries))
	b.encoded = make([]bool, 0, len(entries))
	for _, e := range entries {
		b.last = e.key
		if e.rec != nil {
			// Validated and encoded by this process's Enqueue: nothing to decode.
			b.recs = append(b.recs, *e.rec)
			b.bodies = append(b.bodies, e.body)
			b.encoded = append(b.encoded, true)
			continue
		}
		var r Record
		err := json.Unmarshal(e.body, &r)
		if err == nil {
			err = r.Validate()
		}
		if err != nil {
			// The producer's file was damaged, or a newer producer validates more strictly
			// than the one that wrote it. Setting the record aside (quarantine, counted as
			// dropped in the trail) beats blocking every record behind it forever, and keeps
			// its content for whoever investigates.
			s.log.Error("audit: spool record does not decode, setting it aside", "outbox", s.out.describe(), "key", fmt.Sprintf("%x", e.key), "err", err)
			if qerr := s.quarantine(e.body, fmt.Errorf("does not decode as a valid record: %w", err)); qerr != nil {
				return b, fmt.Errorf("audit: quarantine an undecodable spool record: %w", qerr)
			}
			b.corrupt++
			continue
		}
		b.recs = append(b.recs, r)
		b.bodies = append(b.bodies, e.body)
		b.encoded = append(b.encoded, false)
	}
	return b, nil
}

func (s *Spool) sendLoop(ctx context.Context, in <-chan spoolBatch, acks *ackMark) error {
	f := &forwardFailures{}
	for {
		var b spoolBatch
		select {
		case b = <-in:
		case <-ctx.Done():
			return nil
		}
		err := s.send(ctx, &b, 0, len(b.recs), f)
		if errors.Is(err, ErrRejected) || errors.Is(err, ErrInvalidRecord) {
			// The log refuses something in the batch for what it is, which no retry changes:
			// find it and set it aside instead of holding every later record behind it.
			var q uint64
			q, err = s.sendEach(ctx, &b, err, f)
			b.corrupt += q
		}
		if err != nil {
			return nil // only the end of ctx stops a send
		}
		if f.count > 0 {
			s.log.Info("audit: forwarding resumed", "failed_attempts", f.count, "pending", s.Pending())
			f.count = 0
		}
		acks.advance(b)
	}
}

// forwardFailures counts consecutive failed forwards, for backoff and for logging an outage
// once rather than at every retry.
type forwardFailures struct {
	count   int
	lastLog time.Time
}

// appendTo hands the batch's records lo to hi to the Sink: with their bodies to an EncodedSink,
// which then stores them as they are, else as records.
func (s *Spool) appendTo(ctx context.Context, b *spoolBatch, lo, hi int) error {
	es, ok := s.sink.(EncodedSink)
	if !ok {
		return s.sink.Append(ctx, b.recs[lo:hi])
	}
	recs := make([]Encoded, 0, hi-lo)
	for i := lo; i < hi; i++ {
		e := Encoded{rec: &b.recs[i]}
		if b.encoded[i] {
			e.body = b.bodies[i]
		}
		recs = append(recs, e)
	}
	return es.AppendEncoded(ctx, recs)
}

// send appends the batch's records lo to hi to the Sink, retrying transient failures with
// backoff. It returns nil once they are taken, the Sink's refusal of the records themselves
// (ErrRejected or ErrInvalidRecord), or ctx's error.
func (s *Spool) send(ctx context.Context, b *spoolBatch, lo, hi int, f *forwardFailures) error {
	for lo < hi {
		actx, cancel := context.WithTimeout(ctx, s.attemptTimeout)
		err := s.appendTo(actx, b, lo, hi)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, ErrRejected) || errors.Is(err, ErrInvalidRecord):
			return err
		}
		f.count++
		// Log the first failure and then every 30 s, not every retry: an outage is one
		// event, and the pending count tells how it grows.
		if f.count == 1 || time.Since(f.lastLog) >= 30*time.Second {
			s.log.Error("audit: forward to audit log failed, will retry",
				"err", err, "attempts", f.count, "pending", s.Pending())
			f.lastLog = time.Now()
		}
		if !s.sleep(ctx, s.backoff(f.count)) {
			return ctx.Err()
		}
	}
	return nil
}

// sendEach sends a refused batch one record at a time and quarantines each record the log
// refuses. It returns how many records are missing from the trail for it.
func (s *Spool) sendEach(ctx context.Context, b *spoolBatch, batchErr error, f *forwardFailures) (uint64, error) {
	s.log.Error("audit: the audit log refused a batch; sending its records one by one", "err", batchErr, "records", len(b.recs))
	var missing uint64
	for i, r := range b.recs {
		err := s.send(ctx, b, i, i+1, f)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if qerr := s.quarantine(b.bodies[i], err); qerr != nil {
			// Nowhere to keep it: keep forwarding blocked rather than lose the record.
			s.log.Error("audit: cannot quarantine a refused record; forwarding waits", "record", r.ID, "err", qerr)
			for {
				if !s.sleep(ctx, s.maxBackoff) {
					return 0, ctx.Err()
				}
				if qerr = s.quarantine(b.bodies[i], err); qerr == nil {
					break
				}
			}
		}
		s.quarantined++
		if s.quarantineLogged == 0 || time.Since(s.lastQuarantineLog) >= 30*time.Second {
			s.log.Error("audit: the audit log refused records; they are kept in the quarantine file and counted as dropped",
				"record", r.ID, "err", err, "quarantine", s.quarantinePath, "records_since_last_report", s.quarantined)
			s.quarantined, s.lastQuarantineLog = 0, time.Now()
			s.quarantineLogged++
		}
		// The spool's own report of dropped records is not counted again if the log refuses
		// it too: that would report the report forever.
		if !(r.Kind == KindAdmin && r.Producer == s.producer && r.Admin != nil && r.Admin.Action == ActionAuditRecordsDropped) {
			missing++
		}
	}
	return missing, nil
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
				if errors.Is(err, errOutboxClosed) {
					if stopping {
						return nil
					}
					return err
				}
				// The records stay and are resent after a restart; the log drops them.
				failures++
				s.log.Error("audit: delete forwarded records from spool", "err", err)
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
	removed, reported, err := s.out.remove(through, corrupt, s.droppedRecord)
	if err != nil {
		return err
	}
	s.dropped.Add(corrupt)
	s.noteForwarded(removed)
	if reported > 0 {
		s.log.Error("audit: spool had room again; recorded the dropped audit records", "outbox", s.out.describe(), "dropped", reported)
		s.noteEnqueued()
	}
	return nil
}

// droppedRecord is the audit_records_dropped record that reports n dropped records, or nil
// while the outbox (holding pending records) has no room for it.
func (s *Spool) droppedRecord(n uint64, pending int) ([]byte, error) {
	if pending >= s.maxPending {
		return nil, nil
	}
	change, err := json.Marshal(map[string]any{"dropped": n, "limit": s.maxPending})
	if err != nil {
		return nil, err
	}
	rec := NewAdminRecord(s.producer, "", AdminEvent{
		ActorRole:    ActorRoleSystem,
		Action:       ActionAuditRecordsDropped,
		ResourceType: "audit_spool",
		ResourceID:   s.out.describe(),
		Change:       change,
	})
	return json.Marshal(rec)
}

func (s *Spool) noteForwarded(n int) {
	s.pending.Add(-int64(n))
	s.noteProgress()
}

// noteProgress wakes whoever waits in Flush.
func (s *Spool) noteProgress() {
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
			s.log.Error("audit: the spool forwarder stopped", "err", err)
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
