package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/audit"
)

// TestAnEncodedRecordIsStoredAsAppendStoresIt: the audit log stores the body a spool in its
// process encoded (AppendEncoded) byte for byte as it stores the same record handed over as a
// record (Append): the same export, record hashes and head, so the chain is what it was. The
// records cover a time in another zone with nanoseconds, a change whose JSON the encoder
// compacts and escapes (HTML characters, U+2028, unicode, numbers like 1e21), and a receive
// time a producer set, which the log drops from the body.
func TestAnEncodedRecordIsStoredAsAppendStoresIt(t *testing.T) {
	at := time.Now().UTC().Add(time.Hour)
	now := func() time.Time { return at }
	zoned := toolRec(call{tenant: "acme", run: "r1", server: "files", tool: "read"}, "c1")
	zoned.Time = time.Unix(at.Unix()-3600, 123456789).In(time.FixedZone("CET", 3600))
	failed := toolRec(call{tenant: "acme", run: "r1", server: "files", tool: "write", failed: audit.FailureTimeout}, "c2")
	refused := toolRec(call{tenant: "default", run: "r2", server: "web", tool: "get", refused: audit.ReasonCeiling}, "c3")
	admin := adminRec("acme", "update_mcp_server")
	admin.Admin.Change = json.RawMessage("{ \"b\": [1e21, 0.1, 12345678901234567890],\n \"a\": \"<x> & \u2028 é 😀\" }")
	forged := toolRec(call{tenant: "globex", run: "r3", server: "files", tool: "read"}, "c4")
	forged.ReceiveTime = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	recs := []audit.Record{zoned, failed, refused, admin, forged}
	for i := range recs {
		recs[i].Time = recs[i].Time.Add(-time.Duration(len(recs)-i) * time.Minute) // in the log's past
	}

	open := func(name string) *Store {
		s, err := Open(filepath.Join(t.TempDir(), name), Options{Now: now})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	plain, encoded := open("plain.db"), open("encoded.db")
	_, err := plain.Append(t.Context(), recs)
	require.NoError(t, err)
	encs := make([]audit.Encoded, len(recs))
	for i, r := range recs {
		encs[i], err = audit.Encode(r)
		require.NoError(t, err)
		require.NotNil(t, encs[i].Body())
	}
	_, err = encoded.AppendEncoded(t.Context(), encs)
	require.NoError(t, err)

	export := func(s *Store) string {
		var buf bytes.Buffer
		n, err := s.Export(t.Context(), &buf, Filter{})
		require.NoError(t, err)
		require.Equal(t, uint64(len(recs)), n)
		return buf.String()
	}
	want := export(plain)
	require.Equal(t, want, export(encoded), "the stored bodies and their hashes")
	require.NotContains(t, want, "2001-01-01", "a producer's receive time is not stored")
	plainSeq, plainHead := plain.Head()
	encodedSeq, encodedHead := encoded.Head()
	require.Equal(t, plainSeq, encodedSeq)
	require.Equal(t, plainHead, encodedHead)
	res, err := encoded.Verify(t.Context(), nil)
	require.NoError(t, err)
	require.True(t, res.OK, "%+v", res)

	// A resend through either path is the same record: stored once.
	_, err = encoded.Append(t.Context(), recs)
	require.NoError(t, err)
	_, err = plain.AppendEncoded(t.Context(), encs)
	require.NoError(t, err)
	require.Equal(t, want, export(plain))
	require.Equal(t, want, export(encoded))
}

// countingSink is the log's sink, counting the records that reach it with the spool's body.
type countingSink struct {
	s                  *Store
	withBody, withNone atomic.Int32
}

func (c *countingSink) Append(ctx context.Context, recs []audit.Record) error {
	c.withNone.Add(int32(len(recs)))
	_, err := c.s.Append(ctx, recs)
	return err
}

func (c *countingSink) AppendEncoded(ctx context.Context, recs []audit.Encoded) error {
	for _, r := range recs {
		if r.Body() != nil {
			c.withBody.Add(1)
		} else {
			c.withNone.Add(1)
		}
	}
	_, err := c.s.AppendEncoded(ctx, recs)
	return err
}

// TestASpoolHandsTheLogItsEncoding: a spool whose log is in its process hands over the body it
// encoded for each record it took from memory, and none for a record it read back from its
// outbox file (written before a restart), which the log encodes itself; either way the log
// holds what Append of the same records makes of them, byte for byte.
func TestASpoolHandsTheLogItsEncoding(t *testing.T) {
	at := time.Now().UTC().Add(time.Hour)
	now := func() time.Time { return at }
	open := func(name string) *Store {
		s, err := Open(filepath.Join(t.TempDir(), name), Options{Now: now})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	plain, log := open("plain.db"), open("log.db")
	var recs []audit.Record
	for i := range 5 {
		recs = append(recs, toolRec(call{tenant: "acme", run: "r1", server: "files", tool: "read"}, fmt.Sprint("c", i)))
	}
	dir := t.TempDir()

	// Before a restart: two records committed, none forwarded.
	before, err := audit.NewSpool(audit.SpoolConfig{Dir: dir, Sink: &countingSink{s: log}, Producer: "pool"})
	require.NoError(t, err)
	for _, r := range recs[:2] {
		require.NoError(t, before.Enqueue(t.Context(), r))
	}
	require.NoError(t, before.Close())

	sink := &countingSink{s: log}
	spool, err := audit.NewSpool(audit.SpoolConfig{Dir: dir, Sink: sink, Producer: "pool"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- spool.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, spool.Close())
	})
	require.NoError(t, spool.Flush(t.Context()))
	for _, r := range recs[2:] {
		require.NoError(t, spool.Enqueue(t.Context(), r))
	}
	require.NoError(t, spool.Flush(t.Context()))
	require.Equal(t, int32(2), sink.withNone.Load(), "read back from the outbox file: the log encodes them")
	require.Equal(t, int32(3), sink.withBody.Load(), "from memory: the spool's body")

	_, err = plain.Append(t.Context(), recs)
	require.NoError(t, err)
	export := func(s *Store) string {
		var buf bytes.Buffer
		_, err := s.Export(t.Context(), &buf, Filter{})
		require.NoError(t, err)
		return buf.String()
	}
	require.Equal(t, export(plain), export(log))
}

// BenchmarkEncodingAppendEncodedSkips: the validation and encoding of a pool's tool-call
// record that Append does and AppendEncoded, given the spool's body, does not (twice per call:
// the pending record and the outcome).
func BenchmarkEncodingAppendEncodedSkips(b *testing.B) {
	r := toolRec(call{tenant: "acme", run: "run-0123456789abcdef", server: "files", tool: "read"}, "call-0123456789abcdef")
	b.ReportAllocs()
	for b.Loop() {
		if err := r.Validate(); err != nil {
			b.Fatal(err)
		}
		if _, err := json.Marshal(r); err != nil {
			b.Fatal(err)
		}
	}
}
