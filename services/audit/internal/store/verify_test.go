package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
)

// buildLog appends n tool-call records with call ids call-000… in several commits and
// returns the store's path after closing it, with every entry as stored.
func buildLog(t *testing.T, n int) (string, []Entry) {
	t.Helper()
	s, path := newStore(t)
	for start := 0; start < n; start += 17 {
		var batch []audit.Record
		for i := start; i < min(start+17, n); i++ {
			tenant := "tenant-a"
			if i%3 == 0 {
				tenant = "tenant-b"
			}
			batch = append(batch, toolRec(call{tenant: tenant, run: "run-1", server: "files", tool: "read_file"}, fmt.Sprintf("call-%03d", i)))
		}
		appendAll(t, s, batch...)
	}
	page, err := s.List(t.Context(), Filter{}, MaxPageSize, "")
	require.NoError(t, err)
	require.Len(t, page.Entries, n)
	require.NoError(t, s.Close())
	return path, page.Entries
}

// flipAll flips one bit in the byte at offset off of every occurrence of needle in the
// file. bbolt copies pages on write, so stale copies may sit in free pages; flipping
// them too changes nothing live, and exactly one live record contains the needle.
func flipAll(t *testing.T, path string, needle []byte, off int) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	found := 0
	for i := 0; ; {
		j := bytes.Index(data[i:], needle)
		if j < 0 {
			break
		}
		data[i+j+off] ^= 0x01
		found++
		i += j + len(needle)
	}
	require.NotZero(t, found, "needle not in file")
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

func verifyFile(t *testing.T, path string) VerifyResult {
	t.Helper()
	s := openStore(t, path)
	res, err := s.Verify(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	return res
}

func TestVerifyNamesTheRecordWhoseByteChanged(t *testing.T) {
	tests := []struct {
		name   string
		needle func(entries []Entry) ([]byte, int)
		want   uint64
	}{
		{
			name: "byte in a body",
			needle: func([]Entry) ([]byte, int) {
				return []byte(`"call_id":"call-042"`), len(`"call_id":"call-0`)
			},
			want: 43,
		},
		{
			name: "byte in the first body",
			needle: func([]Entry) ([]byte, int) {
				return []byte(`"call_id":"call-000"`), len(`"call_id":"ca`)
			},
			want: 1,
		},
		{
			name: "byte in the last body",
			needle: func([]Entry) ([]byte, int) {
				return []byte(`"call_id":"call-099"`), len(`"call_id":"call-09`)
			},
			want: 100,
		},
		{
			name: "byte in a stored hash",
			needle: func(entries []Entry) ([]byte, int) {
				return entries[69].Hash[:], 5
			},
			want: 70,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, entries := buildLog(t, 100)
			require.True(t, verifyFile(t, path).OK)
			needle, off := tt.needle(entries)
			flipAll(t, path, needle, off)
			res := verifyFile(t, path)
			require.False(t, res.OK)
			require.Equal(t, tt.want, res.FirstBroken, res.Reason)
			require.Equal(t, tt.want-1, res.Checked)
			require.Contains(t, res.Reason, "hash mismatch")
		})
	}
}

// TestVerifyDetectsEditsThroughBbolt plays an attacker who edits the file with bbolt
// itself, keeping its structure valid.
func TestVerifyDetectsEditsThroughBbolt(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(tx *bolt.Tx, entries []Entry) error
		want   uint64
		reason string
	}{
		{
			name:   "delete a record",
			edit:   func(tx *bolt.Tx, _ []Entry) error { return tx.Bucket(bucketRecords).Delete(seqKey(43)) },
			want:   43,
			reason: "record missing",
		},
		{
			name:   "truncate the tail",
			edit:   func(tx *bolt.Tx, _ []Entry) error { return tx.Bucket(bucketRecords).Delete(seqKey(100)) },
			want:   100,
			reason: "log ends at seq 99",
		},
		{
			name: "rewrite a record and its own hash",
			edit: func(tx *bolt.Tx, entries []Entry) error {
				b := tx.Bucket(bucketRecords)
				v := b.Get(seqKey(43))
				body := bytes.Replace(v[hashLen:], []byte(`"read_file"`), []byte(`"list_dirs"`), 1)
				h := newChainer().next(&entries[41].Hash, body)
				return b.Put(seqKey(43), append(h[:], body...))
			},
			// Record 43 is self-consistent now; its successor no longer chains to it.
			want:   44,
			reason: "does not name its seq and the previous hash",
		},
		{
			name: "delete a run's index entry",
			edit: func(tx *bolt.Tx, _ []Entry) error {
				return tx.Bucket(bucketByRun).Delete(appendIndexKey(nil, "run-1", 43))
			},
			want:   43,
			reason: `by_run index lacks this record, so reads for run "run-1" do not show it`,
		},
		{
			name: "delete a tenant's run's index entry",
			edit: func(tx *bolt.Tx, _ []Entry) error {
				return tx.Bucket(bucketByTenantRun).Delete(appendTenantRunKey(nil, "tenant-b", "run-1", 43))
			},
			want:   43,
			reason: `by_tenant_run index lacks this record, so reads for tenant and run "tenant-b" and "run-1" do not show it`,
		},
		{
			name: "delete a call's index entry",
			edit: func(tx *bolt.Tx, _ []Entry) error {
				return tx.Bucket(bucketByCall).Delete(appendCallKey(nil, "call-042", 43))
			},
			want:   43,
			reason: `by_call index lacks this record, so reads for call "call-042" do not show it`,
		},
		{
			name: "delete a tenant's call's index entry",
			edit: func(tx *bolt.Tx, _ []Entry) error {
				return tx.Bucket(bucketByTenantCall).Delete(appendTenantCallKey(nil, "tenant-b", "call-042", 43))
			},
			want:   43,
			reason: `by_tenant_call index lacks this record, so reads for tenant and call "tenant-b" and "call-042" do not show it`,
		},
		{
			// Record 2 is call-001: the planted entry would show it as call-007's.
			name: "plant a call index entry",
			edit: func(tx *bolt.Tx, _ []Entry) error {
				return tx.Bucket(bucketByCall).Put(appendCallKey(nil, "call-007", 2), noValue)
			},
			want:   2,
			reason: "by_call index holds 101 entries where its records require 100; the first unaccounted for names record 2",
		},
		{
			name: "delete a tenant's index entry",
			edit: func(tx *bolt.Tx, _ []Entry) error {
				return tx.Bucket(bucketByTenant).Delete(appendIndexKey(nil, "tenant-a", 42))
			},
			want:   42,
			reason: `by_tenant index lacks this record, so reads for tenant "tenant-a" do not show it`,
		},
		{
			name: "delete an id's index entry",
			edit: func(tx *bolt.Tx, entries []Entry) error {
				return tx.Bucket(bucketByID).Delete([]byte(entries[9].Record.ID))
			},
			want:   10,
			reason: "by_id index lacks record id",
		},
		{
			name: "point an id at another record",
			edit: func(tx *bolt.Tx, entries []Entry) error {
				b := tx.Bucket(bucketByID)
				v := bytes.Clone(b.Get([]byte(entries[9].Record.ID)))
				binary.BigEndian.PutUint64(v, 11)
				return b.Put([]byte(entries[9].Record.ID), v)
			},
			want:   10,
			reason: "does not name this record",
		},
		{
			name: "change the digest an id's entry kept",
			edit: func(tx *bolt.Tx, entries []Entry) error {
				b := tx.Bucket(bucketByID)
				v := bytes.Clone(b.Get([]byte(entries[9].Record.ID)))
				v[len(v)-1] ^= 1
				return b.Put([]byte(entries[9].Record.ID), v)
			},
			want:   10,
			reason: "does not match the digest its by_id entry kept",
		},
		{
			// Record 2 belongs to tenant-a: the planted entry would show it to tenant-b's
			// reads if they trusted the index.
			name: "plant a tenant index entry",
			edit: func(tx *bolt.Tx, _ []Entry) error {
				return tx.Bucket(bucketByTenant).Put(appendIndexKey(nil, "tenant-b", 2), noValue)
			},
			want:   2,
			reason: "by_tenant index holds 101 entries where its records require 100; the first unaccounted for names record 2",
		},
		{
			name: "plant a run index entry past the head",
			edit: func(tx *bolt.Tx, _ []Entry) error {
				return tx.Bucket(bucketByRun).Put(appendIndexKey(nil, "run-1", 500), noValue)
			},
			want:   500,
			reason: "by_run index names record 500, past the head",
		},
		{
			name: "plant a record past the head",
			edit: func(tx *bolt.Tx, entries []Entry) error {
				body := buildBody(nil, 101, &entries[99].Hash, time.Unix(0, 0), []byte(`{"id":"planted"}`))
				h := newChainer().next(&entries[99].Hash, body)
				return tx.Bucket(bucketRecords).Put(seqKey(101), append(h[:], body...))
			},
			want:   101,
			reason: "past the head",
		},
		{
			name: "change the head",
			edit: func(tx *bolt.Tx, entries []Entry) error {
				h := entries[98].Hash
				return tx.Bucket(bucketMeta).Put(keyHead, append(seqKey(100), h[:]...))
			},
			want:   100,
			reason: "head hash",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, entries := buildLog(t, 100)
			db, err := bolt.Open(path, 0o600, nil)
			require.NoError(t, err)
			require.NoError(t, db.Update(func(tx *bolt.Tx) error { return tt.edit(tx, entries) }))
			require.NoError(t, db.Close())
			res := verifyFile(t, path)
			require.False(t, res.OK)
			require.Equal(t, tt.want, res.FirstBroken, res.Reason)
			require.Contains(t, res.Reason, tt.reason)
		})
	}
}

func TestVerifyEmptyAndProgress(t *testing.T) {
	s, _ := newStore(t)
	requireVerified(t, s, 0)

	var recs []audit.Record
	for i := range 1000 {
		recs = append(recs, toolRec(call{tenant: "t", run: "r", server: "s", tool: "x"}, fmt.Sprint(i)))
	}
	for i := 0; i < len(recs); i += MaxAppendRecords / 2 {
		appendAll(t, s, recs[i:min(i+MaxAppendRecords/2, len(recs))]...)
	}
	var calls []uint64
	res, err := s.Verify(t.Context(), func(done uint64) { calls = append(calls, done) })
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Equal(t, []uint64{1000}, calls)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = s.Verify(ctx, nil)
	require.ErrorIs(t, err, context.Canceled)
}

func TestExportRoundTrip(t *testing.T) {
	path, entries := buildLog(t, 100)
	s := openStore(t, path)

	var buf bytes.Buffer
	n, err := s.Export(t.Context(), &buf, Filter{})
	require.NoError(t, err)
	require.Equal(t, uint64(100), n)
	exported := buf.String()
	lines := strings.Split(strings.TrimSuffix(exported, "\n"), "\n")
	require.Len(t, lines, 100)
	for i, line := range lines {
		var l exportLine
		require.NoError(t, json.Unmarshal([]byte(line), &l))
		var b storedBody
		require.NoError(t, json.Unmarshal(l.Record, &b))
		require.Equal(t, entries[i].Record.ID, b.ID)
		require.Equal(t, uint64(i+1), b.Seq)
		require.Equal(t, fmt.Sprintf("%x", entries[i].Hash), l.Hash)
		require.Equal(t, audit.OperationSupportAtLeastOnce, b.ToolCall.OperationSupport)
	}

	res, err := VerifyExport(strings.NewReader(exported), true)
	require.NoError(t, err)
	require.True(t, res.OK, "%+v", res)
	require.Equal(t, uint64(100), res.Checked)

	t.Run("changed line", func(t *testing.T) {
		tampered := strings.Replace(exported, `"call_id":"call-009"`, `"call_id":"call-900"`, 1)
		res, err := VerifyExport(strings.NewReader(tampered), true)
		require.NoError(t, err)
		require.False(t, res.OK)
		require.Equal(t, uint64(10), res.FirstBroken)
	})
	t.Run("removed line", func(t *testing.T) {
		removed := strings.Join(append(append([]string{}, lines[:19]...), lines[20:]...), "\n") + "\n"
		res, err := VerifyExport(strings.NewReader(removed), true)
		require.NoError(t, err)
		require.False(t, res.OK)
		require.Equal(t, uint64(20), res.FirstBroken)
	})
	t.Run("filtered export verifies record by record", func(t *testing.T) {
		var fb bytes.Buffer
		n, err := s.Export(t.Context(), &fb, Filter{Tenant: "tenant-b"})
		require.NoError(t, err)
		require.Equal(t, uint64(34), n)
		res, err := VerifyExport(bytes.NewReader(fb.Bytes()), false)
		require.NoError(t, err)
		require.True(t, res.OK, "%+v", res)
		res, err = VerifyExport(bytes.NewReader(fb.Bytes()), true)
		require.NoError(t, err)
		require.False(t, res.OK, "a filtered export is not complete")
		sc := bufio.NewScanner(&fb)
		for sc.Scan() {
			require.Contains(t, sc.Text(), `"tenant":"tenant-b"`)
		}
	})
	t.Run("garbage", func(t *testing.T) {
		res, err := VerifyExport(strings.NewReader("not json\n"), false)
		require.NoError(t, err)
		require.False(t, res.OK)
	})
}

// TestAnAnchorCatchesWhatTheChainAloneCannot: records cut from the end with the head rewritten
// to match verify clean, but not through the head kept from before; nor does a chain that no
// longer holds the anchor's hash at its sequence.
func TestAnAnchorCatchesWhatTheChainAloneCannot(t *testing.T) {
	path, entries := buildLog(t, 5)
	last := entries[len(entries)-1]
	anchor := Anchor{Seq: last.Record.Seq, Hash: last.Hash}
	s := openStore(t, path)
	res, err := s.VerifyThrough(t.Context(), nil, anchor)
	require.NoError(t, err)
	require.True(t, res.OK, res.Reason)
	res, err = s.VerifyThrough(t.Context(), nil, Anchor{Seq: 3, Hash: entries[2].Hash})
	require.NoError(t, err)
	require.True(t, res.OK, "an anchor inside the log passes")
	require.NoError(t, s.Close())

	// Cut the last record and its index entries, and point the head at the one before:
	// no hashing needed.
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		seq := last.Record.Seq
		for _, del := range []struct{ bucket, key []byte }{
			{bucketRecords, seqKey(seq)},
			{bucketByID, []byte(last.Record.ID)},
			{bucketByTenant, appendIndexKey(nil, last.Record.Tenant, seq)},
			{bucketByRun, appendIndexKey(nil, last.Record.ToolCall.RunID, seq)},
			{bucketByTenantRun, appendTenantRunKey(nil, last.Record.Tenant, last.Record.ToolCall.RunID, seq)},
			{bucketByCall, appendCallKey(nil, last.Record.ToolCall.CallID, seq)},
			{bucketByTenantCall, appendTenantCallKey(nil, last.Record.Tenant, last.Record.ToolCall.CallID, seq)},
		} {
			if err := tx.Bucket(del.bucket).Delete(del.key); err != nil {
				return err
			}
		}
		prev := entries[len(entries)-2]
		head := append(seqKey(prev.Record.Seq), prev.Hash[:]...)
		return tx.Bucket(bucketMeta).Put(keyHead, head)
	}))
	require.NoError(t, db.Close())

	require.True(t, verifyFile(t, path).OK, "the chain alone cannot tell")
	s = openStore(t, path)
	defer s.Close()
	res, err = s.VerifyThrough(t.Context(), nil, anchor)
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Contains(t, res.Reason, "records were removed from its end")
	res, err = s.VerifyThrough(t.Context(), nil, Anchor{Seq: 3, Hash: entries[3].Hash})
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Equal(t, uint64(3), res.FirstBroken)
	require.Contains(t, res.Reason, "does not pass through the anchor")
}
