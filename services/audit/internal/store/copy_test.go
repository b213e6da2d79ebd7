package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
)

// storedValues reads records from..to of s as stored (hash || body).
func storedValues(t *testing.T, s *Store, from, to uint64) [][]byte {
	t.Helper()
	var out [][]byte
	require.NoError(t, s.db.View(func(tx *bolt.Tx) error {
		for seq := from; seq <= to; seq++ {
			v := tx.Bucket(bucketRecords).Get(seqKey(seq))
			require.NotNil(t, v, "record %d", seq)
			out = append(out, bytes.Clone(v))
		}
		return nil
	}))
	return out
}

// TestIngestCopiesAChain: a copy taken with Ingest, in overlapping pieces, is the original
// record for record: it verifies (chain, head and indexes), filtered reads find the same
// records, and a producer's resend to the copy is answered with the original seqs.
func TestIngestCopiesAChain(t *testing.T) {
	src, _ := newStore(t)
	var recs []audit.Record
	for i := range 30 {
		if i%3 == 0 {
			recs = append(recs, adminRec("acme", fmt.Sprint("create_", i)))
		} else {
			recs = append(recs, toolRec(call{tenant: "acme", run: fmt.Sprint("run-", i%2), server: "docs", tool: "search"}, fmt.Sprint("call-", i)))
		}
	}
	for _, r := range recs {
		appendAll(t, src, r)
	}
	vals := storedValues(t, src, 1, 30)

	dst, _ := newStore(t)
	ctx := t.Context()
	require.NoError(t, dst.Ingest(ctx, 1, vals[:12]))
	require.NoError(t, dst.Ingest(ctx, 5, vals[4:20]), "records the copy holds are skipped")
	require.NoError(t, dst.Ingest(ctx, 21, vals[20:]))
	requireVerified(t, dst, 30)
	srcSeq, srcHash := src.Head()
	dstSeq, dstHash := dst.Head()
	require.Equal(t, srcSeq, dstSeq)
	require.Equal(t, srcHash, dstHash)

	for _, f := range []Filter{{RunID: "run-1"}, {Tenant: "acme"}, {Kind: "admin"}} {
		a, err := src.List(ctx, f, 100, "")
		require.NoError(t, err)
		b, err := dst.List(ctx, f, 100, "")
		require.NoError(t, err)
		require.Equal(t, a, b, "filter %+v", f)
	}

	// A resend of records the copy holds is idempotent there too.
	seqs, err := dst.Append(ctx, []audit.Record{recs[7], recs[0]})
	require.NoError(t, err)
	require.Equal(t, []uint64{8, 1}, seqs)
	requireVerified(t, dst, 30)
}

// TestIngestRefusesWhatDoesNotContinueTheCopy: a gap, a body edited in the shared chain and a
// record that differs from the one the copy holds are refused with ErrNotAPrefix, and the
// copy is left as it was.
func TestIngestRefusesWhatDoesNotContinueTheCopy(t *testing.T) {
	src, _ := newStore(t)
	for i := range 6 {
		appendAll(t, src, adminRec("acme", fmt.Sprint("create_", i)))
	}
	vals := storedValues(t, src, 1, 6)
	dst, _ := newStore(t)
	ctx := t.Context()
	require.NoError(t, dst.Ingest(ctx, 1, vals[:3]))

	edited := bytes.Clone(vals[3])
	edited[len(edited)-5] ^= 1
	other, _ := newStore(t)
	appendAll(t, other, adminRec("acme", "elsewhere"))
	forked := storedValues(t, other, 1, 1)

	for name, tc := range map[string]struct {
		first uint64
		vals  [][]byte
	}{
		"a gap":                             {5, vals[4:]},
		"an edited body":                    {4, [][]byte{edited}},
		"another record at a held seq":      {1, forked},
		"a good record, then an edited one": {4, [][]byte{vals[3], bytes.Clone(edited)}},
	} {
		t.Run(name, func(t *testing.T) {
			err := dst.Ingest(ctx, tc.first, tc.vals)
			require.ErrorIs(t, err, ErrNotAPrefix)
			seq, _ := dst.Head()
			require.Equal(t, uint64(3), seq, "nothing of a refused ingest is kept")
		})
	}
	require.NoError(t, dst.Ingest(ctx, 4, vals[3:]))
	requireVerified(t, dst, 6)
}

// fakeChain is a shared chain in memory: what a writer committed, or an error to answer.
type fakeChain struct {
	vals [][]byte
	head Head
	fail error
}

func (c *fakeChain) Commit(_ context.Context, prev Head, vals [][]byte) error {
	if c.fail != nil {
		return c.fail
	}
	if prev != c.head {
		return errors.New("the shared chain moved")
	}
	for _, v := range vals {
		c.vals = append(c.vals, bytes.Clone(v))
	}
	c.head = Head{Seq: prev.Seq + uint64(len(vals)), Hash: [32]byte(vals[len(vals)-1][:hashLen])}
	return nil
}

// TestAppendExtendsTheSharedChainFirst: with a Chain, every commit's new records go to it
// first, exactly as stored, from the file's head; when it fails the file keeps nothing of
// the commit and the callers get its error, and the next append goes on from the same head.
func TestAppendExtendsTheSharedChainFirst(t *testing.T) {
	chain := &fakeChain{head: Head{Hash: Genesis}}
	s, err := Open(filepath.Join(t.TempDir(), "audit.db"), Options{Chain: chain})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	appendAll(t, s, adminRec("acme", "one"), adminRec("acme", "two"))
	require.Equal(t, storedValues(t, s, 1, 2), chain.vals)

	refused := errors.New("not the writer")
	chain.fail = refused
	_, err = s.Append(t.Context(), []audit.Record{adminRec("acme", "three")})
	require.ErrorIs(t, err, refused)
	seq, _ := s.Head()
	require.Equal(t, uint64(2), seq)

	chain.fail = nil
	require.Equal(t, []uint64{3}, appendAll(t, s, adminRec("acme", "three")))
	require.Equal(t, storedValues(t, s, 1, 3), chain.vals)
	requireVerified(t, s, 3)
}
