package store

import (
	"bytes"
	"encoding/json"
	"path/filepath"
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
