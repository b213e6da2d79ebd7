package audit

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// fileSpool opens a files-kind spool in dir for one test step.
func fileSpool(t *testing.T, dir string, sink Sink, env *spoolEnv) *Spool {
	t.Helper()
	cfg := SpoolConfig{Dir: dir, Sink: sink, Producer: "pool"}
	if env != nil {
		cfg.Logger = env.spool.log
	}
	s, err := NewSpool(cfg)
	require.NoError(t, err)
	return s
}

func segments(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	require.NoError(t, err)
	return m
}

// enqueueRecords enqueues n tool-call records in order and returns them.
func enqueueRecords(t *testing.T, s *Spool, n int) []Record {
	t.Helper()
	out := make([]Record, n)
	for i := range out {
		out[i] = toolRecord(i, "p")
		require.NoError(t, s.Enqueue(t.Context(), out[i]))
	}
	return out
}

func drain(t *testing.T, s *Spool) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	require.NoError(t, s.Flush(t.Context()))
	cancel()
	require.NoError(t, <-done)
}

func TestFileSpoolCutsATornTail(t *testing.T) {
	env := newSpoolEnvOf(t, "files", nil)
	dir := env.spool.out.describe()
	want := ids(enqueueRecords(t, env.spool, 10))
	require.NoError(t, env.spool.Close())
	// A crash mid-write leaves half a frame behind the last durable one.
	seg := segments(t, dir)
	require.Len(t, seg, 1)
	f, err := os.OpenFile(seg[0], os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write(appendFrame(nil, 11, []byte(`{"half":`))[:20])
	require.NoError(t, err)
	require.NoError(t, f.Close())

	s := fileSpool(t, dir, env.sink, env)
	t.Cleanup(func() { _ = s.Close() })
	require.Equal(t, 10, s.Pending())
	require.Contains(t, env.logs.String(), "cutting it")
	r := toolRecord(10, "p")
	require.NoError(t, s.Enqueue(t.Context(), r), "appends follow the good frames")
	want = append(want, r.ID)
	drain(t, s)
	require.Equal(t, want, ids(env.sink.records()))
	require.Zero(t, s.Dropped(), "an unacknowledged torn write is not a dropped record")
}

func TestFileSpoolRotatesAndDeletesForwardedSegments(t *testing.T) {
	env := newSpoolEnvOf(t, "files", func(c *SpoolConfig) { c.BatchSize = 5 })
	env.spool.out.(*fileOutbox).segmentMax = 2048
	dir := env.spool.out.describe()
	env.sink.down.Store(true)
	env.run(t)
	want := ids(enqueueRecords(t, env.spool, 60))
	require.Greater(t, len(segments(t, dir)), 3, "small segments rotate")
	env.sink.down.Store(false)
	require.NoError(t, env.spool.Flush(t.Context()))
	require.Equal(t, want, ids(env.sink.records()))
	require.Empty(t, segments(t, dir), "forwarded segments are deleted")

	// Sequences carry on after a reopen with nothing pending.
	require.NoError(t, env.spool.Close())
	s := fileSpool(t, dir, env.sink, env)
	t.Cleanup(func() { _ = s.Close() })
	require.Zero(t, s.Pending())
	r := toolRecord(60, "p")
	require.NoError(t, s.Enqueue(t.Context(), r))
	seg := segments(t, dir)
	require.Len(t, seg, 1)
	require.Equal(t, segmentName(61), filepath.Base(seg[0]))
}

// TestFileSpoolReportsRecordsLostToDamage damages a segment in the middle: the records
// after the damage in that segment cannot be read, and the trail says how many.
func TestFileSpoolReportsRecordsLostToDamage(t *testing.T) {
	env := newSpoolEnvOf(t, "files", nil)
	env.spool.out.(*fileOutbox).segmentMax = 1024
	dir := env.spool.out.describe()
	enqueueRecords(t, env.spool, 30)
	require.NoError(t, env.spool.Close())
	seg := segments(t, dir)
	require.GreaterOrEqual(t, len(seg), 3)
	// Flip one byte in the body of the second segment's second frame.
	data, err := os.ReadFile(seg[1])
	require.NoError(t, err)
	_, _, first, ok := parseFrame(data)
	require.True(t, ok)
	data[first+frameHeaderSize+5] ^= 0xff
	require.NoError(t, os.WriteFile(seg[1], data, 0o600))
	inSeg := 0
	for off := 0; off < len(data); inSeg++ {
		off += frameHeaderSize + int(binary.BigEndian.Uint32(data[off:]))
	}
	lost := inSeg - 1

	s := fileSpool(t, dir, env.sink, env)
	t.Cleanup(func() { _ = s.Close() })
	require.Contains(t, env.logs.String(), "lost to damage")
	drain(t, s)
	got := env.sink.records()
	require.Len(t, got, 30-lost+1)
	report := got[len(got)-1]
	require.Equal(t, ActionAuditRecordsDropped, report.Admin.Action)
	var change map[string]any
	require.NoError(t, json.Unmarshal(report.Admin.Change, &change))
	require.EqualValues(t, lost, change["dropped"])
}

// TestFileSpoolCountsRecordsLostInItsLastSegment: damage in the only segment, with intact
// frames after it, is not a torn write: the cut records are counted and reported, and the
// segment is kept aside for recovery; a second open counts nothing again.
func TestFileSpoolCountsRecordsLostInItsLastSegment(t *testing.T) {
	env := newSpoolEnvOf(t, "files", nil)
	dir := env.spool.out.describe()
	all := enqueueRecords(t, env.spool, 10)
	require.NoError(t, env.spool.Close())
	seg := segments(t, dir)
	require.Len(t, seg, 1)
	data, err := os.ReadFile(seg[0])
	require.NoError(t, err)
	off := 0
	for range 2 { // skip two intact frames, then flip a byte in the third's body
		_, _, n, ok := parseFrame(data[off:])
		require.True(t, ok)
		off += n
	}
	data[off+frameHeaderSize+3] ^= 0xff
	require.NoError(t, os.WriteFile(seg[0], data, 0o600))

	s := fileSpool(t, dir, env.sink, env)
	require.Contains(t, env.logs.String(), "lost to damage")
	aside, err := filepath.Glob(seg[0] + ".damaged-*")
	require.NoError(t, err)
	require.Len(t, aside, 1, "the damaged segment is kept for recovery by hand")
	kept, err := os.ReadFile(aside[0])
	require.NoError(t, err)
	require.Equal(t, data, kept)
	drain(t, s)
	got := env.sink.records()
	require.Equal(t, ids(all[:2]), ids(got[:2]))
	report := got[len(got)-1]
	require.Equal(t, ActionAuditRecordsDropped, report.Admin.Action)
	var change map[string]any
	require.NoError(t, json.Unmarshal(report.Admin.Change, &change))
	require.EqualValues(t, 8, change["dropped"])
	require.NoError(t, s.Close())

	// The cut segment is whole now: a second open finds nothing more to count.
	s = fileSpool(t, dir, env.sink, env)
	t.Cleanup(func() { _ = s.Close() })
	drain(t, s)
	require.Len(t, env.sink.records(), len(got), "no second report")
}

func TestFileSpoolRefusesAForeignFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.seg"), []byte("x"), 0o600))
	_, err := NewSpool(SpoolConfig{Dir: dir, Sink: newFakeSink(), Producer: "pool"})
	require.ErrorContains(t, err, "notes.seg is not a spool segment: move it out")

	// dropped is synced and counts what the trail must report: damage there stops the start.
	dir = t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, droppedFile), []byte("abc"), 0o600))
	_, err = NewSpool(SpoolConfig{Dir: dir, Sink: newFakeSink(), Producer: "pool"})
	require.ErrorContains(t, err, "(3 bytes, want 8)")
}

// TestFileSpoolStartsOverFromATornAckedCounter: acked is written without a sync, so a crash
// may leave it torn; the spool forwards its segments again and the log keeps one of each.
func TestFileSpoolStartsOverFromATornAckedCounter(t *testing.T) {
	env := newSpoolEnvOf(t, "files", nil)
	dir := env.spool.out.describe()
	want := ids(enqueueRecords(t, env.spool, 3))
	require.NoError(t, env.spool.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, ackedFile), nil, 0o600))

	s := fileSpool(t, dir, env.sink, env)
	t.Cleanup(func() { _ = s.Close() })
	require.Contains(t, env.logs.String(), "acked counter is damaged")
	drain(t, s)
	require.Equal(t, want, ids(env.sink.records()))
}

// TestFileSpoolAdoptsABboltOutbox: records left in a bbolt outbox by an earlier version are
// forwarded from the files, in order, with the dropped count reported, and leave the bucket.
func TestFileSpoolAdoptsABboltOutbox(t *testing.T) {
	old := newSpoolEnvOf(t, "bbolt", func(c *SpoolConfig) { c.MaxPending = 3; c.OnFull = ContinueAndAlarm })
	var want []string
	for i := range 5 {
		r := toolRecord(i, "p")
		require.NoError(t, old.spool.Enqueue(t.Context(), r))
		if i < 3 {
			want = append(want, r.ID)
		}
	}
	env := newSpoolEnvOf(t, "files", nil)
	n, err := env.spool.Adopt(old.db, "audit_outbox")
	require.NoError(t, err)
	require.Equal(t, 4, n, "three records and the report of two dropped")
	require.Equal(t, 4, env.spool.Pending())
	left, err := old.spool.out.count()
	require.NoError(t, err)
	require.Zero(t, left)
	n, err = env.spool.Adopt(old.db, "audit_outbox")
	require.NoError(t, err)
	require.Zero(t, n, "adopting twice moves nothing")

	env.run(t)
	require.NoError(t, env.spool.Flush(t.Context()))
	got := env.sink.records()
	require.Len(t, got, 4)
	require.Equal(t, want, ids(got[:3]))
	require.Equal(t, ActionAuditRecordsDropped, got[3].Admin.Action)
	require.JSONEq(t, `{"dropped":2,"limit":100000}`, string(got[3].Admin.Change))
}

// TestFileSpoolFailsClosedWhenAWriteCannotBeUndone: after a write fails and the tail cannot
// be cut back, nothing more is spooled (no second segment for the same sequences), and the
// next start reads the spool as it was.
func TestFileSpoolFailsClosedWhenAWriteCannotBeUndone(t *testing.T) {
	env := newSpoolEnvOf(t, "files", nil)
	dir := env.spool.out.describe()
	first := toolRecord(0, "p")
	require.NoError(t, env.spool.Enqueue(t.Context(), first))
	o := env.spool.out.(*fileOutbox)
	o.wmu.Lock()
	ro, err := os.Open(o.f.Name()) // read-only: writes and truncation both fail
	require.NoError(t, err)
	_ = o.f.Close()
	o.f = ro
	o.wmu.Unlock()

	require.Error(t, env.spool.Enqueue(t.Context(), toolRecord(1, "p")))
	err = env.spool.Enqueue(t.Context(), toolRecord(2, "p"))
	require.ErrorContains(t, err, "nothing more is spooled until the pool restarts")
	require.Len(t, segments(t, dir), 1, "no second segment for the same sequences")
	require.NoError(t, env.spool.Close())

	s := fileSpool(t, dir, env.sink, env)
	t.Cleanup(func() { _ = s.Close() })
	third := toolRecord(3, "p")
	require.NoError(t, s.Enqueue(t.Context(), third))
	drain(t, s)
	require.Equal(t, []string{first.ID, third.ID}, ids(env.sink.records()))
}

// A commit overwrites zeros written ahead of it rather than growing the file or writing into
// allocated-but-unwritten space: its fdatasync then flushes data alone, without a journal
// commit of the file system.
func TestFileSpoolFillsZerosAheadOfItsFrames(t *testing.T) {
	env := newSpoolEnvOf(t, "files", nil)
	dir := env.spool.out.describe()
	enqueueRecords(t, env.spool, 1)
	seg := segments(t, dir)
	require.Len(t, seg, 1)
	framed := env.spool.out.(*fileOutbox).segs[0].size
	data, err := os.ReadFile(seg[0])
	require.NoError(t, err)
	require.Equal(t, framed+zeroAhead, int64(len(data)), "the first commit fills zeroAhead bytes past its frame")
	require.Equal(t, make([]byte, zeroAhead), data[framed:])

	enqueueRecords(t, env.spool, 50)
	info, err := os.Stat(seg[0])
	require.NoError(t, err)
	require.Equal(t, int64(len(data)), info.Size(), "the commits after it overwrite zeros: the file does not grow")

	require.NoError(t, env.spool.Close())
	s := fileSpool(t, dir, env.sink, env)
	t.Cleanup(func() { _ = s.Close() })
	require.Equal(t, 51, s.Pending(), "zeros ahead of the frames are not damage")
	require.NotContains(t, env.logs.String(), "cutting it")
}

// TestFileOutboxHandsBackRecentRecordsFromMemory: the records a commit was given come back to
// the forwarder as they were handed over, in order, without being read back and decoded; a
// frame committed without its record (adopted, a report of dropped records) and records let go
// past the bound come from the segment; a forwarded and deleted record is let go.
func TestFileOutboxHandsBackRecentRecordsFromMemory(t *testing.T) {
	o, err := openFileOutbox(t.TempDir(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.close() })
	admit := func(int) error { return nil }
	add := func(withRecs bool, bodies ...string) []*Record {
		var bs [][]byte
		var recs []*Record
		for _, b := range bodies {
			bs = append(bs, []byte(b))
			recs = append(recs, &Record{ID: b})
		}
		if !withRecs {
			recs = nil
		}
		_, err := o.add(bs, recs, admit)
		require.NoError(t, err)
		return recs
	}
	read := func(after uint64) []outboxEntry {
		var key []byte
		if after > 0 {
			key = seqKey(after)
		}
		got, err := o.read(key, 100, 1<<30)
		require.NoError(t, err)
		return got
	}
	fromMemory := func(e outboxEntry) bool { return e.rec != nil }

	first := add(true, "a", "b", "c")
	got := read(0)
	require.Len(t, got, 3)
	for i, e := range got {
		require.Same(t, first[i], e.rec, "handed back as handed over")
		require.Equal(t, first[i].ID, string(e.body))
	}
	add(false, "adopted")
	more := add(true, "d", "e")
	got = read(3)
	require.Len(t, got, 1)
	require.False(t, fromMemory(got[0]), "a frame committed without its record is read from the segment")
	require.Equal(t, "adopted", string(got[0].body))
	got = read(4)
	require.Len(t, got, 2)
	require.Same(t, more[0], got[0].rec)
	require.Same(t, more[1], got[1].rec)

	// Forwarded and deleted: let go.
	_, _, err = o.remove(seqKey(5), 0, func(uint64, int) ([]byte, error) { return nil, nil })
	require.NoError(t, err)
	require.Len(t, o.recent, 1)
	require.Same(t, more[1], read(0)[0].rec)

	// Past the bound the oldest are let go, and read back from the segment.
	big := string(make([]byte, recentMaxBytes/2+1))
	add(true, big, big, "f")
	got = read(5)
	require.Len(t, got, 2, "the segment is read up to what memory holds")
	require.False(t, fromMemory(got[0]) || fromMemory(got[1]), "let go past the bound")
	got = read(7)
	require.Len(t, got, 2)
	require.True(t, fromMemory(got[0]) && fromMemory(got[1]))
	require.Equal(t, "f", string(got[1].body))
	require.LessOrEqual(t, o.recentBytes, recentMaxBytes)
}
