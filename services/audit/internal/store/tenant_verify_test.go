package store

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// tamper rewrites one byte of record seq's body in the closed file at path.
func tamper(t *testing.T, path string, seq uint64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		v := bytes.Clone(b.Get(seqKey(seq)))
		i := bytes.Index(v, []byte(`"producer":"`)) + len(`"producer":"`)
		v[i] ^= 0x20 // "pool" becomes "Pool"
		return b.Put(seqKey(seq), v)
	}))
	require.NoError(t, db.Close())
}

// tenantsLog writes acme, globex, acme, globex, acme (seqs 1 to 5) and returns the store.
func tenantsLog(t *testing.T) (*Store, string, []Entry) {
	t.Helper()
	s, path := newStore(t)
	for i, tenant := range []string{"acme", "globex", "acme", "globex", "acme"} {
		appendAll(t, s, toolRec(call{tenant: tenant, run: "r", server: "s", tool: "x"}, string(rune('a'+i))))
	}
	page, err := s.List(t.Context(), Filter{}, 10, "")
	require.NoError(t, err)
	return s, path, page.Entries
}

func verifyFor(t *testing.T, s *Store, tenant string, anchor Anchor) VerifyResult {
	t.Helper()
	res, err := s.Verify(t.Context(), nil)
	require.NoError(t, err)
	got, err := s.CheckTenant(res, tenant, anchor)
	require.NoError(t, err)
	return got
}

// TestATenantsVerifyReportsItsOwnRecords: the chain spans tenants and is walked whole; the
// answer counts the tenant's records, names its last one as the head, and takes only its own
// records as anchors.
func TestATenantsVerifyReportsItsOwnRecords(t *testing.T) {
	s, _, entries := tenantsLog(t)
	acme := verifyFor(t, s, "acme", Anchor{})
	require.Equal(t, VerifyResult{OK: true, Checked: 3, HeadSeq: 5, HeadHash: entries[4].Hash}, acme)
	globex := verifyFor(t, s, "globex", Anchor{})
	require.Equal(t, VerifyResult{OK: true, Checked: 2, HeadSeq: 4, HeadHash: entries[3].Hash}, globex)
	none := verifyFor(t, s, "initech", Anchor{})
	require.Equal(t, VerifyResult{OK: true, HeadHash: Genesis}, none, "a tenant with no records")

	require.True(t, verifyFor(t, s, "acme", Anchor{Seq: 3, Hash: entries[2].Hash}).OK, "its own record as anchor")
	wrong := verifyFor(t, s, "acme", Anchor{Seq: 3, Hash: entries[1].Hash})
	require.False(t, wrong.OK)
	require.Equal(t, uint64(3), wrong.FirstBroken)
	require.Equal(t, uint64(1), wrong.Checked)
	foreign := verifyFor(t, s, "acme", Anchor{Seq: 2, Hash: entries[1].Hash})
	require.False(t, foreign.OK, "another tenant's record is no anchor of acme's")
	require.Equal(t, reasonAnchorNotTenant, foreign.Reason)
}

// TestATenantsVerifyOfABrokenChain: a break at another tenant's record fails the tenant's
// answer from its next record on, without naming the other tenant's record; a break at its
// own record is named with the walk's reason; a break after its last record still fails.
func TestATenantsVerifyOfABrokenChain(t *testing.T) {
	s, path, entries := tenantsLog(t)
	require.NoError(t, s.Close())
	tamper(t, path, 4) // globex's second record
	s = openStore(t, path)

	acme := verifyFor(t, s, "acme", Anchor{})
	require.False(t, acme.OK)
	require.Equal(t, uint64(5), acme.FirstBroken, "acme's first record past the break")
	require.Equal(t, reasonBrokenBeforeTenant, acme.Reason)
	require.Equal(t, uint64(2), acme.Checked)
	require.Equal(t, uint64(3), acme.HeadSeq)
	require.Equal(t, entries[2].Hash, acme.HeadHash)

	globex := verifyFor(t, s, "globex", Anchor{})
	require.False(t, globex.OK)
	require.Equal(t, uint64(4), globex.FirstBroken)
	require.Contains(t, globex.Reason, "hash mismatch")
	require.Equal(t, uint64(1), globex.Checked)

	s2, path2 := newStore(t)
	appendAll(t, s2, toolRec(call{tenant: "acme", run: "r", server: "s", tool: "x"}, "a"),
		toolRec(call{tenant: "globex", run: "r", server: "s", tool: "x"}, "b"))
	require.NoError(t, s2.Close())
	tamper(t, path2, 2)
	s2 = openStore(t, path2)
	after := verifyFor(t, s2, "acme", Anchor{})
	require.False(t, after.OK, "a record of acme's cut from the end would look like this")
	require.Zero(t, after.FirstBroken)
	require.Equal(t, reasonBrokenAfterTenant, after.Reason)
	require.Equal(t, uint64(1), after.Checked)
}
