package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/boltdb"
)

// approvalStory is call callID of tenant's run that asked an approver first: its refusal
// while it waited (attempt 1), the approved execution (attempt 2: its pending record and its
// outcome), and the record of the retry, call retryID, that was handed the outcome.
func approvalStory(tenant, run, callID, retryID string) (waiting audit.Record, rest []audit.Record) {
	tc := func(id string, attempt int32) audit.ToolCallAttempt {
		return audit.ToolCallAttempt{RunID: run, CallID: id, Attempt: attempt, ServerRef: "docs", ToolName: "write_file"}
	}
	w := tc(callID, 1)
	w.Refused(audit.ReasonApprovalRequired)
	w.Approval = &audit.ToolCallApproval{ID: "apr-" + callID, State: audit.ApprovalPending}
	pending := tc(callID, 2)
	pending.Pending()
	pending.Approval = &audit.ToolCallApproval{ID: "apr-" + callID, State: audit.ApprovalApproved, DecidedBy: "key:alice (approver, k1)"}
	pendingRec := audit.NewToolCallRecord("pool", tenant, pending)
	outcome := pending
	outcome.Succeeded()
	outcome.PendingID = pendingRec.ID
	retry := tc(retryID, 1)
	retry.Succeeded()
	retry.PendingID = pendingRec.ID
	retry.Approval = &audit.ToolCallApproval{ID: "apr-" + callID, State: audit.ApprovalDelivered, DecidedBy: "key:alice (approver, k1)",
		DispatchedCallID: callID, DispatchedAttempt: 2}
	return audit.NewToolCallRecord("pool", tenant, w),
		[]audit.Record{pendingRec, audit.NewToolCallRecord("pool", tenant, outcome), audit.NewToolCallRecord("pool", tenant, retry)}
}

// appendFiller appends n tool-call records of other calls, MaxAppendRecords a call.
func appendFiller(t *testing.T, s *Store, tenant, run, prefix string, n int) {
	t.Helper()
	for from := 0; from < n; from += MaxAppendRecords {
		var recs []audit.Record
		for i := from; i < min(from+MaxAppendRecords, n); i++ {
			recs = append(recs, toolRec(call{tenant: tenant, run: run, server: "files", tool: "read_file"}, fmt.Sprintf("%s-%d", prefix, i)))
		}
		appendAll(t, s, recs...)
	}
}

// callLines names records as "call#attempt", with "<dispatched" for a retry's.
func callLines(entries []Entry) []string {
	var out []string
	for _, e := range entries {
		tc := e.Record.ToolCall
		line := fmt.Sprintf("%s#%d", tc.CallID, tc.Attempt)
		if tc.Approval != nil && tc.Approval.DispatchedCallID != "" {
			line += "<" + tc.Approval.DispatchedCallID
		}
		out = append(out, line)
	}
	return out
}

// TestAListOfOneCallIsARangeRead: a call looked up by its id alone on a log longer than the
// scan budget comes back whole in the first page, with no token to page on: its attempts, the
// approved execution, and the retry handed its outcome (found by its dispatched_call_id); asked
// for the retry's id, the retry's own record. With a run as well it is as quick. Without the
// by_call index the first page was empty, with a token, the scan budget spent on other calls.
// A token issued before (the scan's: the last seq it examined) reads on through the index.
func TestAListOfOneCallIsARangeRead(t *testing.T) {
	s, _ := newStore(t)
	waiting, rest := approvalStory("acme", "r1", "c-1", "c-9")
	appendAll(t, s, waiting)
	appendFiller(t, s, "acme", "r1", "other", ScanBudget+500)
	appendAll(t, s, rest...)

	story := []string{"c-1#1", "c-1#2", "c-1#2", "c-9#1<c-1"}
	for _, f := range []Filter{{CallID: "c-1"}, {RunID: "r1", CallID: "c-1"}, {Tenant: "acme", CallID: "c-1"}, {Tenant: "acme", RunID: "r1", CallID: "c-1"}} {
		page, err := s.List(t.Context(), f, 0, "")
		require.NoError(t, err)
		require.Equal(t, story, callLines(page.Entries), "%+v", f)
		require.Empty(t, page.NextPageToken, "%+v", f)
	}
	page, err := s.List(t.Context(), Filter{CallID: "c-9"}, 0, "")
	require.NoError(t, err)
	require.Equal(t, []string{"c-9#1<c-1"}, callLines(page.Entries))
	require.Empty(t, page.NextPageToken)

	// Paging through the index, and a token the scan issued: the last seq it examined.
	f := Filter{CallID: "c-1"}
	page, err = s.List(t.Context(), f, 2, "")
	require.NoError(t, err)
	require.Equal(t, story[:2], callLines(page.Entries))
	require.NotEmpty(t, page.NextPageToken)
	page, err = s.List(t.Context(), f, 2, page.NextPageToken)
	require.NoError(t, err)
	require.Equal(t, story[2:], callLines(page.Entries))
	require.Empty(t, page.NextPageToken)
	page, err = s.List(t.Context(), f, 0, encodePageToken(ScanBudget, f.fingerprint()))
	require.NoError(t, err)
	require.Equal(t, story[1:], callLines(page.Entries))
	_, err = s.List(t.Context(), Filter{CallID: "c-9"}, 0, encodePageToken(ScanBudget, f.fingerprint()))
	require.ErrorIs(t, err, ErrInvalidPageToken, "a token stays tied to its filter")
}

// TestACallOfATenantIsReadApart: call ids are the caller's choice, so two tenants may use the
// same one. Acme's call is read through by_tenant_call: globex's records of the same id (more
// than the scan budget) neither hide it behind empty pages nor make a token that tells acme
// they exist, and acme's own records of other calls are not examined either. Globex reads its
// own, every one.
func TestACallOfATenantIsReadApart(t *testing.T) {
	s, _ := newStore(t)
	s.scanBudget = 20
	for i := range 50 {
		r := toolRec(call{tenant: "globex", run: "g1", server: "files", tool: "read_file"}, "c-1")
		r.ToolCall.Attempt = int32(i + 1)
		appendAll(t, s, r)
	}
	appendFiller(t, s, "acme", "r1", "other", 50)
	waiting, rest := approvalStory("acme", "r1", "c-1", "c-9")
	appendAll(t, s, append([]audit.Record{waiting}, rest...)...)

	for _, f := range []Filter{{Tenant: "acme", CallID: "c-1"}, {Tenant: "acme", RunID: "r1", CallID: "c-1"}} {
		page, err := s.List(t.Context(), f, 0, "")
		require.NoError(t, err)
		require.Equal(t, []string{"c-1#1", "c-1#2", "c-1#2", "c-9#1<c-1"}, callLines(page.Entries), "%+v", f)
		require.Empty(t, page.NextPageToken, "%+v", f)
	}
	page, err := s.List(t.Context(), Filter{Tenant: "acme", CallID: "c-9"}, 0, "")
	require.NoError(t, err)
	require.Equal(t, []string{"c-9#1<c-1"}, callLines(page.Entries))
	require.Empty(t, page.NextPageToken)

	for i := range 30 {
		r := toolRec(call{tenant: "globex", run: "g2", server: "files", tool: "read_file"}, "c-1")
		r.ToolCall.Attempt = int32(i + 1)
		appendAll(t, s, r)
	}
	page, err = s.List(t.Context(), Filter{Tenant: "acme", CallID: "c-1"}, 0, "")
	require.NoError(t, err)
	require.Len(t, page.Entries, 4)
	require.Empty(t, page.NextPageToken, "globex's records after acme's last make no token")

	globex := listAll(t, s, Filter{Tenant: "globex", CallID: "c-1"}, 100)
	require.Len(t, globex, 80)
	for _, r := range globex {
		require.Equal(t, "globex", r.Tenant)
	}
	page, err = s.List(t.Context(), Filter{Tenant: "initech", CallID: "c-1"}, 0, "")
	require.NoError(t, err)
	require.Empty(t, page.Entries)
	require.Empty(t, page.NextPageToken, "a tenant with no such call is told so at once")
}

// byCallEntries counts the by_call and by_tenant_call entries naming seq.
func byCallEntries(t *testing.T, db *bolt.DB, seq uint64) (calls, tenantCalls []string) {
	t.Helper()
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		for _, b := range []struct {
			bucket []byte
			out    *[]string
			ix     int
		}{{bucketByCall, &calls, ixByCall}, {bucketByTenantCall, &tenantCalls, ixByTenantCall}} {
			err := tx.Bucket(b.bucket).ForEach(func(k, _ []byte) error {
				if binary.BigEndian.Uint64(k[len(k)-8:]) == seq {
					*b.out = append(*b.out, keyName(b.ix, k))
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	}))
	return calls, tenantCalls
}

// TestACallIsIndexedByBothItsIDs: the retry handed an approved outcome has an entry under its
// own call id and the dispatched one, a record whose two ids are equal one; Verify names a missing entry under the dispatched
// id, in either index, as it names the others.
func TestACallIsIndexedByBothItsIDs(t *testing.T) {
	s, path := newStore(t)
	waiting, rest := approvalStory("acme", "r1", "c-1", "c-9")
	appendAll(t, s, append([]audit.Record{waiting}, rest...)...) // seqs 1 to 4, the retry last
	same := toolRec(call{tenant: "acme", run: "r2", server: "files", tool: "read_file"}, "c-5")
	same.ToolCall.Approval = &audit.ToolCallApproval{ID: "apr-5", State: audit.ApprovalDelivered, DispatchedCallID: "c-5", DispatchedAttempt: 1}
	appendAll(t, s, same) // seq 5
	requireVerified(t, s, 5)
	calls, tenantCalls := byCallEntries(t, s.db, 4)
	require.ElementsMatch(t, []string{`"c-9"`, `"c-1"`}, calls)
	require.ElementsMatch(t, []string{`"acme" and "c-9"`, `"acme" and "c-1"`}, tenantCalls)
	calls, tenantCalls = byCallEntries(t, s.db, 5)
	require.Equal(t, []string{`"c-5"`}, calls)
	require.Equal(t, []string{`"acme" and "c-5"`}, tenantCalls)
	require.NoError(t, s.Close())

	for _, tc := range []struct {
		bucket, key []byte
		reason      string
	}{
		{bucketByCall, appendCallKey(nil, "c-1", 4), `by_call index lacks this record, so reads for call "c-1" do not show it`},
		{bucketByTenantCall, appendTenantCallKey(nil, "acme", "c-1", 4), `by_tenant_call index lacks this record, so reads for tenant and call "acme" and "c-1" do not show it`},
	} {
		db, err := bolt.Open(path, 0o600, nil)
		require.NoError(t, err)
		require.NoError(t, db.Update(func(tx *bolt.Tx) error { return tx.Bucket(tc.bucket).Delete(tc.key) }))
		require.NoError(t, db.Close())
		res := verifyFile(t, path)
		require.False(t, res.OK)
		require.Equal(t, uint64(4), res.FirstBroken, res.Reason)
		require.Contains(t, res.Reason, tc.reason)
		db, err = bolt.Open(path, 0o600, nil)
		require.NoError(t, err)
		require.NoError(t, db.Update(func(tx *bolt.Tx) error { return tx.Bucket(tc.bucket).Put(tc.key, noValue) }))
		require.NoError(t, db.Close())
		require.True(t, verifyFile(t, path).OK)
	}
}

// TestMigrateIndexesTheCalls: a version 2 file (no by_call, by_tenant_call) opened by this
// binary has its records indexed by call, a few at a time, and only then becomes version 3,
// so a call lists in its first page and the file verifies as one written by version 3. The
// file here is one whose first start was cut short (a version 2 file with some entries in the
// new indexes already): the start runs the step again, harmlessly.
func TestMigrateIndexesTheCalls(t *testing.T) {
	s, path := newStore(t)
	waiting, rest := approvalStory("acme", "r1", "c-1", "c-9")
	appendAll(t, s, waiting)
	appendFiller(t, s, "globex", "g1", "other", 30)
	appendAll(t, s, rest...)
	appendFiller(t, s, "acme", "r1", "late", 5)
	require.NoError(t, s.Close())

	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketByCall, bucketByTenantCall} {
			b := tx.Bucket(name)
			var cut [][]byte
			require.NoError(t, b.ForEach(func(k, _ []byte) error {
				if binary.BigEndian.Uint64(k[len(k)-8:]) > 10 {
					cut = append(cut, k)
				}
				return nil
			}))
			require.NotEmpty(t, cut)
			for _, k := range cut {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte{0, 0, 0, 0, 0, 0, 0, 2})
	}))
	require.NoError(t, db.Close())

	defer func(n int) { migrateChunk = n }(migrateChunk)
	migrateChunk = 7 // 39 records: six transactions, the last one short
	s = openStore(t, path)
	s.scanBudget = 5
	requireVerified(t, s, 39)
	for _, f := range []Filter{{CallID: "c-1"}, {Tenant: "acme", CallID: "c-1"}} {
		page, err := s.List(t.Context(), f, 0, "")
		require.NoError(t, err)
		require.Equal(t, []string{"c-1#1", "c-1#2", "c-1#2", "c-9#1<c-1"}, callLines(page.Entries), "%+v", f)
		require.Empty(t, page.NextPageToken)
	}
	page, err := s.List(t.Context(), Filter{Tenant: "acme", CallID: "late-4"}, 0, "")
	require.NoError(t, err)
	require.Equal(t, []string{"late-4#1"}, callLines(page.Entries))
	require.NoError(t, s.Close())
	requireSchemaVersion(t, path, 3, "version 3 once indexed")
}

// TestACopyIndexesACallByBothItsIDs: Ingest (an instance copying the shared chain) writes
// the by_call and by_tenant_call entries Append writes, the retry's under both its ids, so
// the copy verifies and answers a call filter as the original does.
func TestACopyIndexesACallByBothItsIDs(t *testing.T) {
	src, _ := newStore(t)
	waiting, rest := approvalStory("acme", "r1", "c-1", "c-9")
	appendAll(t, src, append([]audit.Record{waiting}, rest...)...)
	dst, _ := newStore(t)
	require.NoError(t, dst.Ingest(t.Context(), 1, storedValues(t, src, 1, 4)))
	requireVerified(t, dst, 4)
	for _, f := range []Filter{{CallID: "c-1"}, {Tenant: "acme", CallID: "c-1"}} {
		page, err := dst.List(t.Context(), f, 0, "")
		require.NoError(t, err)
		require.Equal(t, []string{"c-1#1", "c-1#2", "c-1#2", "c-9#1<c-1"}, callLines(page.Entries), "%+v", f)
	}
}

// TestAnUpgradeCutShortStaysAtVersion2: an upgrade that stops partway (here at a damaged page
// of the records, met after some chunks were indexed and committed) fails the start naming the
// file, and leaves the file at version 2, which the release before still opens; the entries
// committed so far stay, and a start after the repair would index again from the first record.
func TestAnUpgradeCutShortStaysAtVersion2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	damagedLog(t, path, bucketRecords, true)
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketByCall, bucketByTenantCall} {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte{0, 0, 0, 0, 0, 0, 0, 2})
	}))
	require.NoError(t, db.Close())

	defer func(n int) { migrateChunk = n }(migrateChunk)
	migrateChunk = 50
	_, err = Open(path, Options{})
	var damaged *boltdb.DamagedError
	require.True(t, errors.As(err, &damaged), "%v", err)
	require.ErrorContains(t, err, path+" is damaged (")

	db, err = bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		require.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 2}, tx.Bucket(bucketMeta).Get(keySchemaVersion), "still version 2")
		require.Positive(t, tx.Bucket(bucketByCall).Stats().KeyN, "the chunks before the damage were committed")
		return nil
	}))
}

// TestTheCallIndexesAreLedByTheEpoch: the call indexes' keys begin with the epoch of their
// record's seq, so a commit's entries land in the newest epoch's pages whatever the call ids
// (random ones as the pool's and LLM providers' are): a call "z" recorded first sorts before a
// call "a" recorded an epoch later. A call whose records span epochs is read whole, a page at
// a time, and a tenant's the same.
func TestTheCallIndexesAreLedByTheEpoch(t *testing.T) {
	s, _ := newStore(t)
	c := call{tenant: "acme", run: "r1", server: "files", tool: "read_file"}
	appendAll(t, s, toolRec(c, "z"), toolRec(c, "spans"))
	appendFiller(t, s, "acme", "r1", "filler", 1<<callEpochShift)
	appendAll(t, s, toolRec(c, "a"), toolRec(c, "spans"))
	appendFiller(t, s, "acme", "r1", "filler2", 1<<callEpochShift)
	appendAll(t, s, toolRec(c, "spans"))

	require.NoError(t, s.db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketByCall, bucketByTenantCall} {
			var order []string
			require.NoError(t, tx.Bucket(b).ForEach(func(k, _ []byte) error {
				if name := keyName(indexOf(b), k); strings.HasSuffix(name, `"z"`) || strings.HasSuffix(name, `"a"`) {
					order = append(order, name[len(name)-2:len(name)-1])
				}
				return nil
			}))
			require.Equal(t, []string{"z", "a"}, order, "%s: the epoch before the call id", b)
		}
		return nil
	}))
	for _, f := range []Filter{{CallID: "spans"}, {Tenant: "acme", CallID: "spans"}} {
		var seqs []uint64
		token := ""
		for {
			page, err := s.List(t.Context(), f, 1, token)
			require.NoError(t, err)
			for _, e := range page.Entries {
				seqs = append(seqs, e.Record.Seq)
			}
			if token = page.NextPageToken; token == "" {
				break
			}
		}
		require.Len(t, seqs, 3, "%+v", f)
		require.Equal(t, []uint32{0, 1, 2}, []uint32{callEpoch(seqs[0]), callEpoch(seqs[1]), callEpoch(seqs[2])}, "one in each epoch, in order")
	}
	requireVerified(t, s, 2*(1<<callEpochShift)+5)
}

// indexOf is the checker's position of an index bucket.
func indexOf(bucket []byte) int {
	for ix, b := range indexBuckets {
		if bytes.Equal(b, bucket) {
			return ix
		}
	}
	panic(fmt.Sprintf("no index %s", bucket))
}
