package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// fakeSink stands in for the audit log: it stores each ID once (as the log's
// idempotency does) and can be switched down, or told to lose acknowledgements.
type fakeSink struct {
	mu       sync.Mutex
	down     atomic.Bool
	loseAcks atomic.Int32 // store the batch, then fail this many more calls
	byID     map[string]bool
	refuse   map[string]bool // record ids the log refuses for what they are
	// refuseReports makes the log refuse the spool's own audit_records_dropped reports too.
	refuseReports atomic.Bool
	stored        []Record
	calls         int
	delivered     int // records received, resends included
}

func newFakeSink() *fakeSink {
	return &fakeSink{byID: make(map[string]bool), refuse: make(map[string]bool)}
}

var _ Sink = (*fakeSink)(nil)

func (f *fakeSink) Append(ctx context.Context, recs []Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down.Load() {
		return errors.New("audit service unavailable")
	}
	for _, r := range recs {
		if f.refuse[r.ID] || f.refuseReports.Load() && r.Kind == KindAdmin && r.Admin.Action == ActionAuditRecordsDropped {
			// All or nothing, as the audit log validates a batch before it appends any.
			return fmt.Errorf("%w: record %s: rpc error: code = InvalidArgument", ErrRejected, r.ID)
		}
	}
	f.delivered += len(recs)
	for _, r := range recs {
		if !f.byID[r.ID] {
			f.byID[r.ID] = true
			f.stored = append(f.stored, r)
		}
	}
	if f.loseAcks.Load() > 0 {
		f.loseAcks.Add(-1)
		return errors.New("connection reset after commit")
	}
	return nil
}

func (f *fakeSink) records() []Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Record(nil), f.stored...)
}

func openBolt(t *testing.T, path string) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	require.NoError(t, err)
	return db
}

type spoolEnv struct {
	db    *bolt.DB
	sink  *fakeSink
	spool *Spool
	logs  *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newSpoolEnv(t *testing.T, mutate func(*SpoolConfig)) *spoolEnv {
	return newSpoolEnvOf(t, "bbolt", mutate)
}

// spoolKinds are the outboxes a spool can keep: a bucket in the producer's bbolt file, or
// segment files of its own.
var spoolKinds = []string{"bbolt", "files"}

// newSpoolEnvOf builds a spool of one kind; env.db is nil for "files".
func newSpoolEnvOf(t *testing.T, kind string, mutate func(*SpoolConfig)) *spoolEnv {
	t.Helper()
	env := &spoolEnv{sink: newFakeSink(), logs: &syncBuffer{}}
	cfg := SpoolConfig{
		Sink: env.sink, Producer: "registry",
		MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(env.logs, nil)),
	}
	switch kind {
	case "files":
		cfg.Dir = filepath.Join(t.TempDir(), "spool")
	case "etcd":
		etcdSpoolConfig(t, &cfg)
	default:
		env.db = openBolt(t, filepath.Join(t.TempDir(), "producer.db"))
		t.Cleanup(func() { _ = env.db.Close() })
		cfg.DB, cfg.Bucket = env.db, "audit_outbox"
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := NewSpool(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	env.spool = s
	return env
}

// forEachKind runs f as a subtest for each kind of outbox.
func forEachKind(t *testing.T, f func(t *testing.T, kind string)) {
	for _, kind := range spoolKinds {
		t.Run(kind, func(t *testing.T) { f(t, kind) })
	}
}

// run starts the forwarder for the rest of the test.
func (e *spoolEnv) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.spool.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

func toolRecord(i int, producer string) Record {
	tc := ToolCallAttempt{RunID: "run-" + producer, CallID: fmt.Sprintf("%s-%d", producer, i), Attempt: 1, ToolName: "t"}
	tc.Succeeded()
	return NewToolCallRecord("pool", "tenant-a", tc)
}

func ids(recs []Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

func TestSpoolForwardsInOrder(t *testing.T) { forEachKind(t, testSpoolForwardsInOrder) }

func testSpoolForwardsInOrder(t *testing.T, kind string) {
	env := newSpoolEnvOf(t, kind, func(c *SpoolConfig) { c.BatchSize = 7 })
	env.run(t)
	var want []string
	for i := range 200 {
		r := toolRecord(i, "p")
		require.NoError(t, env.spool.Enqueue(t.Context(), r))
		want = append(want, r.ID)
	}
	require.NoError(t, env.spool.Flush(t.Context()))
	require.Equal(t, want, ids(env.sink.records()))
	require.Equal(t, 0, env.spool.Pending())
}

// TestSpoolOutage keeps producing while the audit log is down and loses
// acknowledgements on recovery: every record still arrives once, in each producer's
// order, and resends really happened.
func TestSpoolOutage(t *testing.T) { forEachKind(t, testSpoolOutage) }

func testSpoolOutage(t *testing.T, kind string) {
	env := newSpoolEnvOf(t, kind, func(c *SpoolConfig) { c.BatchSize = 16 })
	env.sink.down.Store(true)
	env.run(t)

	const producers, perProducer = 4, 150
	want := make([][]string, producers)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range perProducer {
				r := toolRecord(i, fmt.Sprint(p))
				require.NoError(t, env.spool.Enqueue(t.Context(), r))
				want[p] = append(want[p], r.ID)
			}
		})
	}
	wg.Wait()
	require.Equal(t, producers*perProducer, env.spool.Pending(), "nothing leaves the outbox while the log is down")
	require.Empty(t, env.sink.records())

	env.sink.loseAcks.Store(3)
	env.sink.down.Store(false)
	require.NoError(t, env.spool.Flush(t.Context()))

	got := env.sink.records()
	require.Len(t, got, producers*perProducer, "exactly once")
	byProducer := make([][]string, producers)
	for _, r := range got {
		var p int
		_, err := fmt.Sscanf(r.ToolCall.CallID, "%d-", &p)
		require.NoError(t, err)
		byProducer[p] = append(byProducer[p], r.ID)
	}
	require.Equal(t, want, byProducer, "each producer's records in its order")
	env.sink.mu.Lock()
	require.Greater(t, env.sink.delivered, producers*perProducer, "lost acknowledgements caused resends")
	env.sink.mu.Unlock()
	require.Contains(t, env.logs.String(), "forward to audit log failed")
}

func TestSpoolFailClosed(t *testing.T) { forEachKind(t, testSpoolFailClosed) }

func testSpoolFailClosed(t *testing.T, kind string) {
	env := newSpoolEnvOf(t, kind, func(c *SpoolConfig) { c.MaxPending = 5 })
	env.sink.down.Store(true)
	for i := range 5 {
		require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(i, "p")))
	}
	err := env.spool.Enqueue(t.Context(), toolRecord(5, "p"))
	require.ErrorIs(t, err, ErrSpoolFull)
	require.ErrorContains(t, err, "limit 5")
	require.ErrorIs(t, env.spool.CanAccept(), ErrSpoolFull)
	if env.db != nil {
		testFailClosedTx(t, env)
	}
	require.Equal(t, 5, env.spool.Pending())
	require.Zero(t, env.spool.Dropped())

	env.sink.down.Store(false)
	env.run(t)
	require.NoError(t, env.spool.Flush(t.Context()))
	require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(7, "p")), "room again once the log took the backlog")
	require.NoError(t, env.spool.Flush(t.Context()))
	require.Len(t, env.sink.records(), 6)
}

// testFailClosedTx: inside a producer transaction the change rolls back with its refused
// record.
func testFailClosedTx(t *testing.T, env *spoolEnv) {
	err := env.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("servers"))
		if err != nil {
			return err
		}
		if err := b.Put([]byte("files"), []byte("{}")); err != nil {
			return err
		}
		return env.spool.EnqueueTx(tx, toolRecord(6, "p"))
	})
	require.ErrorIs(t, err, ErrSpoolFull)
	require.NoError(t, env.db.View(func(tx *bolt.Tx) error {
		require.Nil(t, tx.Bucket([]byte("servers")), "the change did not happen without its record")
		return nil
	}))
}

func TestSpoolContinueAndAlarm(t *testing.T) { forEachKind(t, testSpoolContinueAndAlarm) }

func testSpoolContinueAndAlarm(t *testing.T, kind string) {
	env := newSpoolEnvOf(t, kind, func(c *SpoolConfig) { c.MaxPending = 5; c.OnFull = ContinueAndAlarm })
	env.sink.down.Store(true)
	var kept []string
	for i := range 8 {
		r := toolRecord(i, "p")
		require.NoError(t, env.spool.Enqueue(t.Context(), r))
		if i < 5 {
			kept = append(kept, r.ID)
		}
	}
	wantDropped := 3
	if env.db != nil {
		// The producer's change commits even though its record is dropped.
		require.NoError(t, env.db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("servers"))
			if err != nil {
				return err
			}
			if err := b.Put([]byte("files"), []byte("{}")); err != nil {
				return err
			}
			return env.spool.EnqueueTx(tx, toolRecord(8, "p"))
		}))
		wantDropped++
	}
	require.Equal(t, uint64(wantDropped), env.spool.Dropped())
	require.Equal(t, 5, env.spool.Pending())
	require.Contains(t, env.logs.String(), "level=ERROR")
	require.Contains(t, env.logs.String(), "dropping audit records")

	env.sink.down.Store(false)
	env.run(t)
	require.NoError(t, env.spool.Flush(t.Context()))
	got := env.sink.records()
	require.Len(t, got, 6)
	require.Equal(t, kept, ids(got[:5]))
	report := got[5]
	require.Equal(t, KindAdmin, report.Kind)
	require.Equal(t, ActionAuditRecordsDropped, report.Admin.Action)
	require.Equal(t, ActorRoleSystem, report.Admin.ActorRole)
	require.Equal(t, "registry", report.Producer)
	require.JSONEq(t, fmt.Sprintf(`{"dropped":%d,"limit":5}`, wantDropped), string(report.Admin.Change))
}

func TestSpoolEnqueueTxIsAtomicWithTheChange(t *testing.T) {
	env := newSpoolEnv(t, nil)
	env.run(t)
	rolledBack := toolRecord(1, "p")
	errAbort := errors.New("producer validation failed")
	err := env.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("servers"))
		if err != nil {
			return err
		}
		if err := b.Put([]byte("files"), []byte("{}")); err != nil {
			return err
		}
		if err := env.spool.EnqueueTx(tx, rolledBack); err != nil {
			return err
		}
		return errAbort
	})
	require.ErrorIs(t, err, errAbort)
	require.Equal(t, 0, env.spool.Pending())

	committed := toolRecord(2, "p")
	require.NoError(t, env.db.Update(func(tx *bolt.Tx) error {
		return env.spool.EnqueueTx(tx, committed)
	}))
	require.NoError(t, env.spool.Flush(t.Context()))
	require.Equal(t, []string{committed.ID}, ids(env.sink.records()), "no event without its change")
}

func TestSpoolRejects(t *testing.T) {
	env := newSpoolEnv(t, nil)
	bad := toolRecord(1, "p")
	bad.ToolCall.OperationResidualDuplicateRisk = false
	require.ErrorIs(t, env.spool.Enqueue(t.Context(), bad), ErrInvalidRecord)
	require.ErrorIs(t, env.db.Update(func(tx *bolt.Tx) error { return env.spool.EnqueueTx(tx, bad) }), ErrInvalidRecord)

	other := openBolt(t, filepath.Join(t.TempDir(), "other.db"))
	t.Cleanup(func() { _ = other.Close() })
	err := other.Update(func(tx *bolt.Tx) error { return env.spool.EnqueueTx(tx, toolRecord(2, "p")) })
	require.ErrorContains(t, err, "another database")
	require.Equal(t, 0, env.spool.Pending())

	_, err = NewSpool(SpoolConfig{DB: env.db, Bucket: "x", Sink: env.sink})
	require.ErrorContains(t, err, "needs Sink, Producer, and either DB and Bucket or Dir")
}

func TestSpoolSurvivesReopen(t *testing.T) { forEachKind(t, testSpoolSurvivesReopen) }

func testSpoolSurvivesReopen(t *testing.T, kind string) {
	path := filepath.Join(t.TempDir(), "producer.db")
	sink := newFakeSink()
	open := func() (*Spool, func()) {
		cfg := SpoolConfig{Sink: sink, Producer: "publisher"}
		if kind == "files" {
			cfg.Dir = path + ".spool"
		} else {
			db := openBolt(t, path)
			cfg.DB, cfg.Bucket = db, "outbox"
			s, err := NewSpool(cfg)
			require.NoError(t, err)
			return s, func() { require.NoError(t, db.Close()) }
		}
		s, err := NewSpool(cfg)
		require.NoError(t, err)
		return s, func() { require.NoError(t, s.Close()) }
	}
	s, closeIt := open()
	var want []string
	for i := range 50 {
		r := toolRecord(i, "p")
		require.NoError(t, s.Enqueue(t.Context(), r))
		want = append(want, r.ID)
	}
	closeIt()

	s, closeIt = open()
	t.Cleanup(closeIt)
	require.Equal(t, 50, s.Pending())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	require.NoError(t, s.Flush(t.Context()))
	require.ErrorContains(t, s.Run(ctx), "already running")
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, want, ids(sink.records()))
}

func TestSpoolSetsAsideAnUndecodableRecord(t *testing.T) {
	env := newSpoolEnv(t, nil)
	good := toolRecord(2, "p")
	require.NoError(t, env.db.Update(func(tx *bolt.Tx) error {
		q := tx.Bucket([]byte("audit_outbox")).Bucket(spoolRecordsKey)
		seq, err := q.NextSequence()
		if err != nil {
			return err
		}
		if err := q.Put(seqKeyForTest(seq), []byte("{not json")); err != nil {
			return err
		}
		return env.spool.EnqueueTx(tx, good)
	}))
	env.run(t)
	require.NoError(t, env.spool.Flush(t.Context()))
	got := env.sink.records()
	require.Len(t, got, 2)
	require.Equal(t, good.ID, got[0].ID)
	require.Equal(t, ActionAuditRecordsDropped, got[1].Admin.Action)
	require.Equal(t, uint64(1), env.spool.Dropped())
	var change map[string]any
	require.NoError(t, json.Unmarshal(got[1].Admin.Change, &change))
	require.EqualValues(t, 1, change["dropped"])

	// Its bytes are kept for whoever investigates.
	raw, err := os.ReadFile(env.spool.quarantinePath)
	require.NoError(t, err)
	var q quarantineLine
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(raw), &q))
	require.Equal(t, []byte("{not json"), q.Raw)
	require.Contains(t, q.Refusal, "does not decode")
}

func seqKeyForTest(seq uint64) []byte {
	return []byte{byte(seq >> 56), byte(seq >> 48), byte(seq >> 40), byte(seq >> 32), byte(seq >> 24), byte(seq >> 16), byte(seq >> 8), byte(seq)}
}

func TestSpoolBackoffIsBoundedAndJittered(t *testing.T) {
	env := newSpoolEnv(t, func(c *SpoolConfig) { c.MinBackoff = 50 * time.Millisecond; c.MaxBackoff = 5 * time.Second })
	for attempt := 1; attempt <= 40; attempt++ {
		want := min(50*time.Millisecond<<min(attempt-1, 20), 5*time.Second)
		for range 20 {
			d := env.spool.backoff(attempt)
			require.GreaterOrEqual(t, d, want/2)
			require.LessOrEqual(t, d, want)
		}
	}
}

// TestSpoolConcurrentEnqueueAtTheBound races many producers against the bound: exactly
// MaxPending records are accepted, every other call is refused, nobody hangs.
func TestSpoolConcurrentEnqueueAtTheBound(t *testing.T) {
	forEachKind(t, testSpoolConcurrentEnqueueAtTheBound)
}

func testSpoolConcurrentEnqueueAtTheBound(t *testing.T, kind string) {
	for _, policy := range []FullPolicy{FailClosed, ContinueAndAlarm} {
		t.Run(fmt.Sprint("policy=", policy), func(t *testing.T) {
			env := newSpoolEnvOf(t, kind, func(c *SpoolConfig) { c.MaxPending = 1000; c.OnFull = policy })
			env.sink.down.Store(true)
			var accepted, refused atomic.Int64
			var wg sync.WaitGroup
			for g := range 32 {
				wg.Go(func() {
					for i := range 100 {
						err := env.spool.Enqueue(t.Context(), toolRecord(i, fmt.Sprint(g)))
						switch {
						case err == nil:
							accepted.Add(1)
						case errors.Is(err, ErrSpoolFull):
							refused.Add(1)
						default:
							t.Errorf("unexpected error: %v", err)
						}
					}
				})
			}
			wg.Wait()
			require.Equal(t, 1000, env.spool.Pending())
			if policy == FailClosed {
				require.Equal(t, int64(1000), accepted.Load())
				require.Equal(t, int64(2200), refused.Load())
				require.Zero(t, env.spool.Dropped())
			} else {
				require.Equal(t, int64(3200), accepted.Load())
				require.Equal(t, uint64(2200), env.spool.Dropped())
			}

			env.sink.down.Store(false)
			env.run(t)
			require.NoError(t, env.spool.Flush(t.Context()))
			want := 1000
			if policy == ContinueAndAlarm {
				want++ // the audit_records_dropped report
			}
			require.Len(t, env.sink.records(), want)
		})
	}
}

// TestSpoolQuarantinesRecordsTheLogRefuses: a record the audit log refuses for what it is
// does not hold up the records behind it: it is kept in the quarantine file, with the
// refusal, and the trail reports it as dropped.
func TestSpoolQuarantinesRecordsTheLogRefuses(t *testing.T) {
	forEachKind(t, testSpoolQuarantinesRecordsTheLogRefuses)
}

func testSpoolQuarantinesRecordsTheLogRefuses(t *testing.T, kind string) {
	env := newSpoolEnvOf(t, kind, func(c *SpoolConfig) { c.BatchSize = 8 })
	var want []string
	var refused Record
	for i := range 20 {
		r := toolRecord(i, "p")
		if i == 7 {
			refused = r
			env.sink.mu.Lock()
			env.sink.refuse[r.ID] = true
			env.sink.mu.Unlock()
		} else {
			want = append(want, r.ID)
		}
		require.NoError(t, env.spool.Enqueue(t.Context(), r))
	}
	env.run(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	require.NoError(t, env.spool.Flush(ctx), "forwarding is not blocked")
	got := env.sink.records()
	require.Len(t, got, 20)
	require.Equal(t, want, ids(got[:19]), "every other record, in order")
	report := got[19]
	require.Equal(t, ActionAuditRecordsDropped, report.Admin.Action)
	var change map[string]any
	require.NoError(t, json.Unmarshal(report.Admin.Change, &change))
	require.EqualValues(t, 1, change["dropped"])

	data, err := os.ReadFile(env.spool.quarantinePath)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 1)
	var q struct {
		Refusal string `json:"refusal"`
		Record  Record `json:"record"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &q))
	require.Equal(t, refused.ID, q.Record.ID, "the refused record, whole")
	require.Equal(t, refused.ToolCall.CallID, q.Record.ToolCall.CallID)
	require.Contains(t, q.Refusal, "InvalidArgument")
	require.Contains(t, env.logs.String(), "refused records")
}

// TestSpoolQuarantineIsBounded: past its bound the quarantine takes nothing more; refused
// records wait in the outbox, which fills and fails closed, and the log says so once rather
// than once per record.
func TestSpoolQuarantineIsBounded(t *testing.T) {
	env := newSpoolEnvOf(t, "files", func(c *SpoolConfig) {
		c.MaxQuarantineBytes = 1500
		c.MaxPending = 12
		c.OnFull = FailClosed
		c.MaxBackoff = 20 * time.Millisecond
	})
	for i := range 12 {
		r := toolRecord(i, "p")
		env.sink.mu.Lock()
		env.sink.refuse[r.ID] = true
		env.sink.mu.Unlock()
		require.NoError(t, env.spool.Enqueue(t.Context(), r))
	}
	env.run(t)
	require.Eventually(t, func() bool { return strings.Contains(env.logs.String(), "cannot quarantine") }, 10*time.Second, 10*time.Millisecond)
	fi, err := os.Stat(env.spool.quarantinePath)
	require.NoError(t, err)
	require.LessOrEqual(t, fi.Size(), int64(1500), "the quarantine stays within its bound")
	require.Positive(t, env.spool.Pending(), "what it cannot take waits in the outbox")
	require.Equal(t, 1, strings.Count(env.logs.String(), "refused records;"), "one log line, not one per record")
	for env.spool.CanAccept() == nil {
		require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(100+env.spool.Pending(), "p")))
	}
	require.ErrorIs(t, env.spool.CanAccept(), ErrSpoolFull, "the outbox fills and fails closed")
}

// TestSpoolDoesNotReportItsRefusedReportForever: when the log refuses the spool's report of
// dropped records as well, the report is quarantined without being counted again.
func TestSpoolDoesNotReportItsRefusedReportForever(t *testing.T) {
	env := newSpoolEnvOf(t, "files", nil)
	env.sink.refuseReports.Store(true)
	bad := toolRecord(0, "p")
	env.sink.refuse[bad.ID] = true
	require.NoError(t, env.spool.Enqueue(t.Context(), bad))
	require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(1, "p")))
	env.run(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	require.NoError(t, env.spool.Flush(ctx))
	time.Sleep(100 * time.Millisecond) // a second report would be forwarded by now
	require.NoError(t, env.spool.Flush(ctx))
	require.Len(t, env.sink.records(), 1)
	data, err := os.ReadFile(env.spool.quarantinePath)
	require.NoError(t, err)
	require.Len(t, strings.Split(strings.TrimSpace(string(data)), "\n"), 2, "the record and the one report of it")
}

// TestSpoolLingersForFullerBatches: records enqueued one after another reach the log in
// one batch when they arrive within Linger, and a full batch does not wait out Linger.
func TestSpoolLingersForFullerBatches(t *testing.T) { forEachKind(t, testSpoolLingersForFullerBatches) }

func testSpoolLingersForFullerBatches(t *testing.T, kind string) {
	// In a synctest bubble the linger runs on the bubble's clock, which moves only once every
	// goroutine of the bubble is blocked: the twenty fsync'd enqueues are within the linger
	// however slow the disk or the race detector, and the first record is seen waiting.
	t.Run("partial batches gather", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			env := newSpoolEnvOf(t, kind, func(c *SpoolConfig) { c.Linger = time.Second })
			env.run(t)
			synctest.Wait() // the forwarder found the outbox empty and waits to be woken
			calls := func() int {
				env.sink.mu.Lock()
				defer env.sink.mu.Unlock()
				return env.sink.calls
			}
			require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(0, "p")))
			synctest.Wait()
			require.Zero(t, calls(), "the forwarder woke and lingers instead of sending one record")
			for i := 1; i < 20; i++ {
				require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(i, "p")))
			}
			synctest.Wait()
			require.Zero(t, calls(), "still within the linger")
			require.NoError(t, env.spool.Flush(t.Context()))
			require.Len(t, env.sink.records(), 20)
			require.Equal(t, 1, calls(), "twenty records enqueued within the linger are one batch")
		})
	})
	t.Run("a flush does not wait out the linger", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			env := newSpoolEnvOf(t, kind, func(c *SpoolConfig) { c.Linger = time.Hour })
			env.run(t)
			synctest.Wait()
			require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(0, "p")))
			synctest.Wait() // lingering
			start := time.Now()
			require.NoError(t, env.spool.Flush(t.Context()))
			require.Len(t, env.sink.records(), 1)
			require.Less(t, time.Since(start), time.Hour, "the flush cut the linger short")
		})
	})
	t.Run("a full batch goes at once", func(t *testing.T) {
		env := newSpoolEnvOf(t, kind, func(c *SpoolConfig) { c.Linger = time.Hour; c.BatchSize = 5 })
		env.run(t)
		for i := range 5 {
			require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(i, "p")))
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		require.NoError(t, env.spool.Flush(ctx), "a full batch is forwarded without waiting out an hour's linger")
		require.Len(t, env.sink.records(), 5)
	})
}

// TestSpoolEnqueueAsync: a record given to EnqueueAsync is committed with the next Enqueue's
// record, in the same commit and before it; with no Enqueue coming, within asyncCommitDelay by
// the spool itself; by Flush and Close at once; a full spool refuses it at once, and a failed
// commit reaches its callback.
func TestSpoolEnqueueAsync(t *testing.T) { forEachKind(t, testSpoolEnqueueAsync) }

func testSpoolEnqueueAsync(t *testing.T, kind string) {
	noFailure := func(err error) { t.Errorf("commit failed: %v", err) }
	count := func(s *Spool) int {
		n, err := s.out.count()
		require.NoError(t, err)
		return n
	}
	t.Run("rides with the next enqueue", func(t *testing.T) {
		env := newSpoolEnvOf(t, kind, nil)
		first, second := toolRecord(0, "p"), toolRecord(1, "p")
		require.NoError(t, env.spool.EnqueueAsync(first, noFailure))
		require.NoError(t, env.spool.Enqueue(t.Context(), second))
		require.Equal(t, 2, count(env.spool), "both committed when the enqueue returns")
		env.run(t)
		require.NoError(t, env.spool.Flush(t.Context()))
		require.Equal(t, ids([]Record{first, second}), ids(env.sink.records()))
	})
	t.Run("committed alone in time", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			env := newSpoolEnvOf(t, kind, nil)
			require.NoError(t, env.spool.EnqueueAsync(toolRecord(0, "p"), noFailure))
			synctest.Wait()
			require.Zero(t, count(env.spool), "waiting for an enqueue to ride with")
			time.Sleep(asyncCommitDelay)
			synctest.Wait()
			require.Equal(t, 1, count(env.spool), "committed by the spool once none came")
		})
	})
	t.Run("flush commits what waits", func(t *testing.T) {
		env := newSpoolEnvOf(t, kind, nil)
		env.run(t)
		rec := toolRecord(0, "p")
		require.NoError(t, env.spool.EnqueueAsync(rec, noFailure))
		require.NoError(t, env.spool.Flush(t.Context()))
		require.Equal(t, ids([]Record{rec}), ids(env.sink.records()))
	})
	t.Run("close commits what waits", func(t *testing.T) {
		env := newSpoolEnvOf(t, kind, nil)
		require.NoError(t, env.spool.EnqueueAsync(toolRecord(0, "p"), noFailure))
		require.NoError(t, env.spool.Close())
		if kind == "files" {
			reopened := fileSpool(t, env.spool.out.describe(), newFakeSink(), nil)
			t.Cleanup(func() { _ = reopened.Close() })
			require.Equal(t, 1, count(reopened), "durable before the files closed")
		} else {
			require.Equal(t, 1, count(env.spool), "committed before the spool closed")
		}
	})
	t.Run("written past the limit under fail_closed", func(t *testing.T) {
		// The limit refuses new actions; the outcome of one already taken is recorded.
		env := newSpoolEnvOf(t, kind, func(c *SpoolConfig) { c.MaxPending = 1 })
		require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(0, "p")))
		require.ErrorIs(t, env.spool.CanAccept(), ErrSpoolFull)
		require.ErrorIs(t, env.spool.Enqueue(t.Context(), toolRecord(1, "p")), ErrSpoolFull)
		require.NoError(t, env.spool.EnqueueAsync(toolRecord(2, "p"), noFailure))
		require.NoError(t, env.spool.Close())
		if kind == "files" {
			reopened := fileSpool(t, env.spool.out.describe(), newFakeSink(), nil)
			t.Cleanup(func() { _ = reopened.Close() })
			require.Equal(t, 2, count(reopened))
		} else {
			require.Equal(t, 2, count(env.spool))
		}
	})
	if kind == "files" {
		t.Run("a failed commit reaches the callback", func(t *testing.T) {
			env := newSpoolEnvOf(t, kind, nil)
			require.NoError(t, env.spool.out.close())
			failed := make(chan error, 1)
			require.NoError(t, env.spool.EnqueueAsync(toolRecord(0, "p"), func(err error) { failed <- err }))
			require.ErrorIs(t, <-failed, errOutboxClosed)
		})
	}
}

// TestSpoolWakesTheForwarderOnlyWhenItWaits: a commit wakes the forwarder when it found the
// outbox empty, or once a full batch is pending; while it lingers over a partial batch, the
// commits of a steady stream of calls leave it be.
func TestSpoolWakesTheForwarderOnlyWhenItWaits(t *testing.T) {
	env := newSpoolEnvOf(t, "files", func(c *SpoolConfig) { c.BatchSize = 3 })
	woken := func() bool {
		select {
		case <-env.spool.wake:
			return true
		default:
			return false
		}
	}
	require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(0, "p")))
	require.False(t, woken(), "a forwarder that lingers over a partial batch is not woken")
	env.spool.idle.Store(true)
	require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(1, "p")))
	require.True(t, woken(), "a forwarder waiting for records is woken")
	env.spool.idle.Store(false)
	require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(2, "p")))
	require.True(t, woken(), "a full batch wakes the forwarder")
}

// TestSpoolRequeuesQuarantinedRecords: once the audit log takes what it refused, the
// quarantined records go back through the outbox with their IDs, the file is set aside, and a
// line that is not a record stays quarantined.
func TestSpoolRequeuesQuarantinedRecords(t *testing.T) {
	forEachKind(t, testSpoolRequeuesQuarantinedRecords)
}

func testSpoolRequeuesQuarantinedRecords(t *testing.T, kind string) {
	env := newSpoolEnvOf(t, kind, nil)
	n, err := env.spool.RequeueQuarantined()
	require.NoError(t, err)
	require.Zero(t, n, "no quarantine file, nothing to do")

	refused := toolRecord(1, "p")
	env.sink.mu.Lock()
	env.sink.refuse[refused.ID] = true
	env.sink.mu.Unlock()
	require.NoError(t, env.spool.Enqueue(t.Context(), refused))
	env.run(t)
	require.NoError(t, env.spool.Flush(t.Context()))
	f, err := os.OpenFile(env.spool.quarantinePath, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString("{not a record\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())

	env.sink.mu.Lock()
	delete(env.sink.refuse, refused.ID) // the audit log was upgraded
	env.sink.mu.Unlock()
	n, err = env.spool.RequeueQuarantined()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, env.spool.Flush(t.Context()))
	var got []string
	for _, r := range env.sink.records() {
		if r.Kind == KindToolCall {
			got = append(got, r.ID)
		}
	}
	require.Equal(t, []string{refused.ID}, got, "the record reached the log with its ID")

	aside, err := filepath.Glob(env.spool.quarantinePath + ".requeued-*")
	require.NoError(t, err)
	require.Len(t, aside, 1, "the requeued file is kept aside")
	left, err := os.ReadFile(env.spool.quarantinePath)
	require.NoError(t, err)
	require.Equal(t, "{not a record\n", string(left), "what is not a record stays quarantined")
	n, err = env.spool.RequeueQuarantined()
	require.NoError(t, err)
	require.Zero(t, n)
	left, err = os.ReadFile(env.spool.quarantinePath)
	require.NoError(t, err)
	require.Equal(t, "{not a record\n", string(left), "a file of non-records is left alone")
}
