package store

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
)

// TestTheLogStampsItsOwnReceiveTime: every record the log takes carries the log's receive
// time beside the producer's time, inside the hashed body; a producer's receive time is
// discarded; a resend keeps the first receive time and is still the same record (idempotent);
// and the chain, the indexes and an export verify.
func TestTheLogStampsItsOwnReceiveTime(t *testing.T) {
	s, _ := newStore(t)
	rec := toolRec(call{tenant: "acme", run: "r1", server: "files", tool: "read"}, "c1")
	rec.Time = time.Now().Add(-time.Hour).UTC() // spooled through an outage
	forged := rec
	forged.ReceiveTime = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	before := time.Now()
	first := appendAll(t, s, forged)
	after := time.Now()

	page, err := s.List(t.Context(), Filter{}, 10, "")
	require.NoError(t, err)
	got := page.Entries[0].Record
	require.Equal(t, rec.Time, got.Time, "the producer's time is kept")
	require.False(t, got.ReceiveTime.Before(before.Truncate(time.Nanosecond).UTC()) || got.ReceiveTime.After(after.UTC()),
		"the log's clock, not the producer's claim: %s", got.ReceiveTime)

	time.Sleep(time.Millisecond)
	again := appendAll(t, s, rec)
	require.Equal(t, first, again, "a resend is the same record, whatever the clock says now")
	page, err = s.List(t.Context(), Filter{}, 10, "")
	require.NoError(t, err)
	require.Len(t, page.Entries, 1)
	require.Equal(t, got.ReceiveTime, page.Entries[0].Record.ReceiveTime)

	appendAll(t, s, adminRec("acme", audit.ActionPublish))
	requireVerified(t, s, 2)
	var export bytes.Buffer
	_, err = s.Export(t.Context(), &export, Filter{})
	require.NoError(t, err)
	require.Contains(t, export.String(), `"receive_time":"`)
	res, err := VerifyExport(&export, true)
	require.NoError(t, err)
	require.True(t, res.OK, "%+v", res)
}

// TestAReceiveTimeChangedInPlaceIsFound: the receive time is hashed with the record, so an
// edit of it breaks the chain.
func TestAReceiveTimeChangedInPlaceIsFound(t *testing.T) {
	s, path := newStore(t)
	appendAll(t, s, adminRec("", audit.ActionCreate), adminRec("", audit.ActionUpdate))
	require.NoError(t, s.Close())
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		v := bytes.Clone(b.Get(seqKey(1)))
		i := bytes.Index(v, []byte(receiveTimeKey)) + len(receiveTimeKey)
		copy(v[i:], "1999")
		return b.Put(seqKey(1), v)
	}))
	require.NoError(t, db.Close())
	s = openStore(t, path)
	res, err := s.Verify(t.Context(), nil)
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Equal(t, uint64(1), res.FirstBroken)
}

// TestRecordsFromTheFutureAreRefused: a record whose time is further ahead of the log's clock
// than audit.MaxClockSkew is refused as invalid (its producer's spool quarantines it), naming
// the bound and the fix; one within the bound is taken.
func TestRecordsFromTheFutureAreRefused(t *testing.T) {
	s, _ := newStore(t)
	near := adminRec("", audit.ActionCreate)
	near.Time = time.Now().Add(audit.MaxClockSkew - time.Minute)
	appendAll(t, s, near)

	far := adminRec("", audit.ActionUpdate)
	far.Time = time.Now().Add(audit.MaxClockSkew + time.Hour)
	_, err := s.Append(t.Context(), []audit.Record{far})
	require.ErrorIs(t, err, audit.ErrInvalidRecord)
	require.ErrorContains(t, err, "ahead of the audit log's clock")
	require.ErrorContains(t, err, "more than the 5m0s a producer's clock may run ahead: fix the producer host's clock (NTP)")
	head, _ := s.Head()
	require.Equal(t, uint64(1), head, "nothing of the refused append was stored")
}

// TestASpoolQuarantinesARecordFromTheFuture: through a producer's spool, the refused record is
// set aside in the quarantine file instead of being retried forever, and the records behind
// it reach the log.
func TestASpoolQuarantinesARecordFromTheFuture(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, filepath.Join(dir, "audit.db"))
	spool, err := audit.NewSpool(audit.SpoolConfig{
		Dir: filepath.Join(dir, "spool"), Sink: s.Sink(), Producer: "pool",
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = spool.Close() })
	fwd := spool.StartForwarding()
	t.Cleanup(func() { fwd.Stop(time.Second) })

	future := toolRec(call{tenant: "acme", run: "r1", server: "s", tool: "x"}, "future")
	future.Time = time.Now().Add(24 * time.Hour)
	later := toolRec(call{tenant: "acme", run: "r1", server: "s", tool: "x"}, "later")
	require.NoError(t, spool.Enqueue(t.Context(), future))
	require.NoError(t, spool.Enqueue(t.Context(), later))
	require.NoError(t, spool.Flush(t.Context()))

	require.Eventually(t, func() bool {
		page, err := s.List(t.Context(), Filter{}, 10, "")
		require.NoError(t, err)
		return slices.Equal([]string{"later", "admin:audit_records_dropped"}, callIDs(recordsOf(page)))
	}, 10*time.Second, 10*time.Millisecond, "the record behind it is not held up, and the gap is on record")
	q, err := os.ReadFile(filepath.Join(dir, "spool", "quarantine.jsonl"))
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(string(q), "\n"))
	require.Contains(t, string(q), `"call_id":"future"`)
	require.Contains(t, string(q), "ahead of the audit log's clock")
}
