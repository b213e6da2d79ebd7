package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
)

func openStore(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(path, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newStore(t testing.TB) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.db")
	return openStore(t, path), path
}

type call struct {
	tenant, run, server, tool string
	refused                   string // refusal reason, or "" for dispatched
	failed                    string // failure class for a failed dispatch
}

func toolRec(c call, callID string) audit.Record {
	tc := audit.ToolCallAttempt{
		RunID: c.run, GraphID: "graph-1", GraphVersion: 2, AgentNode: "agent", ToolNode: "node-" + c.tool,
		ServerRef: c.server, ToolName: c.tool, CallID: callID, Attempt: 1,
		PinnedHash: "sha256:1111", ArgsDigest: "sha256:2222", ArgsSize: 120, ResultDigest: "sha256:3333", ResultSize: 900,
		LatencyMicros: 1500,
	}
	switch {
	case c.refused != "":
		tc.Refused(c.refused)
	case c.failed != "":
		tc.Failed(c.failed)
	default:
		tc.Succeeded()
	}
	return audit.NewToolCallRecord("pool", c.tenant, tc)
}

func adminRec(tenant, action string) audit.Record {
	return audit.NewAdminRecord("registry", tenant, audit.AdminEvent{
		ActorKeyID: "key-1", ActorRole: "admin", Action: action, ResourceType: "mcp_server", ResourceID: "files",
		Change: json.RawMessage(`{"env":{"TOKEN":"` + audit.SecretMask + `"}}`),
	})
}

func appendAll(t testing.TB, s *Store, recs ...audit.Record) []uint64 {
	t.Helper()
	seqs, err := s.Append(context.Background(), recs)
	require.NoError(t, err)
	return seqs
}

func requireVerified(t testing.TB, s *Store, n uint64) {
	t.Helper()
	res, err := s.Verify(context.Background(), nil)
	require.NoError(t, err)
	require.True(t, res.OK, "verify: %+v", res)
	require.Equal(t, n, res.Checked)
}

func TestAppendAssignsSeqsInOrder(t *testing.T) {
	s, _ := newStore(t)
	seq, h := s.Head()
	require.Zero(t, seq)
	require.Equal(t, Genesis, h)

	c := call{tenant: "t1", run: "r1", server: "files", tool: "read"}
	require.Equal(t, []uint64{1, 2, 3}, appendAll(t, s, toolRec(c, "a"), toolRec(c, "b"), adminRec("", audit.ActionCreate)))
	require.Equal(t, []uint64{4}, appendAll(t, s, toolRec(c, "c")))
	seq, h = s.Head()
	require.Equal(t, uint64(4), seq)
	require.NotEqual(t, Genesis, h)
	requireVerified(t, s, 4)

	page, err := s.List(t.Context(), Filter{}, 0, "")
	require.NoError(t, err)
	require.Len(t, page.Entries, 4)
	for i, e := range page.Entries {
		require.Equal(t, uint64(i+1), e.Record.Seq)
		if i > 0 {
			require.Equal(t, page.Entries[i-1].Hash, e.PrevHash)
		}
	}
	require.Equal(t, Genesis, page.Entries[0].PrevHash)
	require.Equal(t, h, page.Entries[3].Hash)
	require.JSONEq(t, `{"env":{"TOKEN":"`+audit.SecretMask+`"}}`, string(page.Entries[2].Record.Admin.Change))
}

func TestAppendIsIdempotentByID(t *testing.T) {
	c := call{tenant: "t1", run: "r1", server: "files", tool: "read"}
	t.Run("resend in a later call", func(t *testing.T) {
		s, path := newStore(t)
		a, b := toolRec(c, "a"), toolRec(c, "b")
		require.Equal(t, []uint64{1, 2}, appendAll(t, s, a, b))
		require.Equal(t, []uint64{2, 1, 3}, appendAll(t, s, b, a, toolRec(c, "c")))
		require.NoError(t, s.Close())
		// The index is durable: a resend after a restart is still recognised.
		s = openStore(t, path)
		require.Equal(t, []uint64{1}, appendAll(t, s, a))
		seq, _ := s.Head()
		require.Equal(t, uint64(3), seq)
		requireVerified(t, s, 3)
	})
	t.Run("repeat inside one call", func(t *testing.T) {
		s, _ := newStore(t)
		a := toolRec(c, "a")
		require.Equal(t, []uint64{1, 2, 1}, appendAll(t, s, a, toolRec(c, "b"), a))
	})
	t.Run("same id different content is refused whole", func(t *testing.T) {
		s, _ := newStore(t)
		a := toolRec(c, "a")
		appendAll(t, s, a)
		forged := a
		tc := *a.ToolCall
		tc.Failed(audit.FailureToolError)
		forged.ToolCall = &tc
		_, err := s.Append(t.Context(), []audit.Record{toolRec(c, "fresh"), forged})
		require.ErrorIs(t, err, ErrIDConflict)
		seq, _ := s.Head()
		require.Equal(t, uint64(1), seq, "nothing of the refused call is stored")

		other := toolRec(c, "b")
		clash := toolRec(c, "c")
		clash.ID = other.ID
		_, err = s.Append(t.Context(), []audit.Record{other, clash})
		require.ErrorIs(t, err, ErrIDConflict)
	})
	t.Run("concurrent resends store one record", func(t *testing.T) {
		s, _ := newStore(t)
		a := toolRec(c, "a")
		var wg sync.WaitGroup
		seqs := make([]uint64, 32)
		for i := range seqs {
			wg.Go(func() {
				got, err := s.Append(context.Background(), []audit.Record{a})
				if err == nil {
					seqs[i] = got[0]
				}
			})
		}
		wg.Wait()
		for _, q := range seqs {
			require.Equal(t, uint64(1), q)
		}
		seq, _ := s.Head()
		require.Equal(t, uint64(1), seq)
	})
}

func TestAppendRejects(t *testing.T) {
	s, _ := newStore(t)
	c := call{tenant: "t1", run: "r1", server: "files", tool: "read"}
	bad := toolRec(c, "a")
	bad.ToolCall.OperationSupport = "exactly_once"
	_, err := s.Append(t.Context(), []audit.Record{toolRec(c, "ok"), bad})
	require.ErrorIs(t, err, audit.ErrInvalidRecord)
	require.ErrorContains(t, err, "audit: record 1")

	many := make([]audit.Record, MaxAppendRecords+1)
	for i := range many {
		many[i] = toolRec(c, fmt.Sprint(i))
	}
	_, err = s.Append(t.Context(), many)
	require.ErrorIs(t, err, ErrTooManyRecords)
	seq, _ := s.Head()
	require.Zero(t, seq)

	require.NoError(t, s.Close())
	_, err = s.Append(t.Context(), []audit.Record{toolRec(c, "late")})
	require.ErrorIs(t, err, ErrClosed)
}

func TestConcurrentAppendsFormOneChain(t *testing.T) {
	s, path := newStore(t)
	const goroutines, each = 16, 100
	var mu sync.Mutex
	got := make(map[uint64]string)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				r := toolRec(call{tenant: "t", run: fmt.Sprint("run-", g), server: "s", tool: "x"}, fmt.Sprint(i))
				seqs, err := s.Append(context.Background(), []audit.Record{r})
				if !assertNoError(t, err) {
					return
				}
				mu.Lock()
				got[seqs[0]] = r.ID
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, got, goroutines*each)
	for seq := uint64(1); seq <= goroutines*each; seq++ {
		require.Contains(t, got, seq)
	}
	requireVerified(t, s, goroutines*each)
	require.NoError(t, s.Close())
	s = openStore(t, path)
	appendAll(t, s, adminRec("", audit.ActionUpdate))
	requireVerified(t, s, goroutines*each+1)
}

func assertNoError(t testing.TB, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

// requireSchemaVersion checks the schema version the closed audit file at path is marked with.
func requireSchemaVersion(t *testing.T, path string, want uint64, msg string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		require.Equal(t, binary.BigEndian.AppendUint64(nil, want), tx.Bucket(bucketMeta).Get(keySchemaVersion), msg)
		return nil
	}))
}

func TestMigrate(t *testing.T) {
	s, path := newStore(t)
	require.NoError(t, s.Close())

	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		require.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 3}, tx.Bucket(bucketMeta).Get(keySchemaVersion))
		for _, b := range allBuckets {
			require.NotNil(t, tx.Bucket(b), string(b))
		}
		return nil
	}))
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte{0, 0, 0, 0, 0, 0, 0, 4})
	}))
	require.NoError(t, db.Close())

	_, err = Open(path, Options{})
	require.ErrorContains(t, err, "schema version 4, this binary knows up to 3")
}

// TestMigrateIndexesTheRunsOfTenants: a version 1 file (no by_tenant_run, by_call nor
// by_tenant_call) opened by this binary has its records indexed by tenant and run, a few at a
// time, then by call, so a tenant's run and a call list and verify as in a file written by
// version 3.
func TestMigrateIndexesTheRunsOfTenants(t *testing.T) {
	path, entries := buildLog(t, 40)
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketByTenantRun, bucketByCall, bucketByTenantCall} {
			if err := tx.DeleteBucket(b); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte{0, 0, 0, 0, 0, 0, 0, 1})
	}))
	require.NoError(t, db.Close())

	defer func(n int) { migrateChunk = n }(migrateChunk)
	migrateChunk = 7 // 40 records: six transactions, the last one short
	s := openStore(t, path)
	requireVerified(t, s, uint64(len(entries)))
	var want []string
	for _, e := range entries {
		if e.Record.Tenant == "tenant-b" {
			want = append(want, e.Record.ToolCall.CallID)
		}
	}
	require.Len(t, want, 14)
	require.Equal(t, want, callIDs(listAll(t, s, Filter{Tenant: "tenant-b", RunID: "run-1"}, 5)))
	require.Equal(t, []string{"call-039"}, callIDs(listAll(t, s, Filter{CallID: "call-039"}, 5)))
	require.NoError(t, s.Close())
	requireSchemaVersion(t, path, 3, "version 3 once indexed")
}

// TestOpenRefusesSecondOpener: a second server on the same data directory is told what holds
// the file and what to do, not "timeout".
func TestOpenRefusesSecondOpener(t *testing.T) {
	_, path := newStore(t)
	_, err := Open(path, Options{})
	require.ErrorContains(t, err, "audit.db is locked by another process (a server still running on the same data directory?): stop it, or give this one its own data_dir (RINGFENCE_DATA_DIR)")
}

// listIDs pages through List and returns every call id in order.
func listAll(t *testing.T, s *Store, f Filter, pageSize int) []audit.Record {
	t.Helper()
	var out []audit.Record
	token := ""
	for range 10_000 {
		page, err := s.List(t.Context(), f, pageSize, token)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Entries), max(pageSize, 1))
		for _, e := range page.Entries {
			out = append(out, e.Record)
		}
		if page.NextPageToken == "" {
			return out
		}
		token = page.NextPageToken
	}
	t.Fatal("paging did not end")
	return nil
}

func callIDs(recs []audit.Record) []string {
	var out []string
	for _, r := range recs {
		if r.ToolCall != nil {
			out = append(out, r.ToolCall.CallID)
		} else {
			out = append(out, "admin:"+r.Admin.Action)
		}
	}
	return out
}

func TestListFilters(t *testing.T) {
	s, _ := newStore(t)
	// In the past: the log refuses times far ahead of its clock.
	base := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	recs := []audit.Record{
		toolRec(call{tenant: "acme", run: "r1", server: "files", tool: "read"}, "c1"),
		toolRec(call{tenant: "acme", run: "r1", server: "files", tool: "write", refused: audit.ReasonCeiling}, "c2"),
		toolRec(call{tenant: "acme", run: "r2", server: "web", tool: "fetch", failed: audit.FailureTimeout}, "c3"),
		adminRec("acme", audit.ActionPublish),
		toolRec(call{tenant: "globex", run: "r3", server: "files", tool: "read"}, "c4"),
		adminRec("", audit.ActionKeyCreate),
		toolRec(call{tenant: "globex", run: "r1", server: "files", tool: "read", refused: audit.ReasonSchemaDrift}, "c5"),
		// A tenant name that is a prefix of another must not leak into its index range.
		toolRec(call{tenant: "acm", run: "r", server: "files", tool: "read"}, "c6"),
	}
	for i := range recs {
		recs[i].Time = base.Add(time.Duration(i) * time.Minute)
	}
	appendAll(t, s, recs...)

	tests := []struct {
		name string
		f    Filter
		want []string
	}{
		{"all", Filter{}, []string{"c1", "c2", "c3", "admin:publish", "c4", "admin:key_create", "c5", "c6"}},
		{"tenant", Filter{Tenant: "acme"}, []string{"c1", "c2", "c3", "admin:publish"}},
		{"short tenant", Filter{Tenant: "acm"}, []string{"c6"}},
		{"run across tenants", Filter{RunID: "r1"}, []string{"c1", "c2", "c5"}},
		{"run in tenant", Filter{Tenant: "globex", RunID: "r1"}, []string{"c5"}},
		{"server", Filter{ServerRef: "files"}, []string{"c1", "c2", "c4", "c5", "c6"}},
		{"tool", Filter{ToolName: "fetch"}, []string{"c3"}},
		{"refused", Filter{Outcome: audit.OutcomeRefusedBeforeDispatch}, []string{"c2", "c5"}},
		{"dispatched in tenant", Filter{Tenant: "acme", Outcome: audit.OutcomeDispatched}, []string{"c1", "c3"}},
		{"admin kind", Filter{Kind: audit.KindAdmin}, []string{"admin:publish", "admin:key_create"}},
		{"time range", Filter{Since: base.Add(2 * time.Minute), Until: base.Add(5 * time.Minute)}, []string{"c3", "admin:publish", "c4"}},
		{"time range other zone", Filter{Since: base.Add(2 * time.Minute).In(time.FixedZone("x", 3600))}, []string{"c3", "admin:publish", "c4", "admin:key_create", "c5", "c6"}},
		{"no match", Filter{Tenant: "acme", ServerRef: "nope"}, nil},
		{"unknown run", Filter{RunID: "zzz"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, size := range []int{1, 2, 100} {
				require.Equal(t, tt.want, callIDs(listAll(t, s, tt.f, size)), "page size %d", size)
			}
		})
	}

	_, err := s.List(t.Context(), Filter{Outcome: "refused"}, 10, "")
	require.ErrorIs(t, err, ErrInvalidFilter)
	require.EqualError(t, err, `audit: invalid filter: outcome "refused" is not one of refused_before_dispatch, dispatched`)
	_, err = s.List(t.Context(), Filter{Kind: "other"}, 10, "")
	require.ErrorIs(t, err, ErrInvalidFilter)
	require.EqualError(t, err, `audit: invalid filter: kind "other" is not one of admin, tool_call`)
}

func TestListPaging(t *testing.T) {
	s, _ := newStore(t)
	var want []string
	var recs []audit.Record
	for i := range 50 {
		r := toolRec(call{tenant: "t", run: "r", server: "s", tool: "x"}, fmt.Sprint(i))
		recs = append(recs, r)
		want = append(want, fmt.Sprint(i))
	}
	appendAll(t, s, recs...)
	require.Equal(t, want, callIDs(listAll(t, s, Filter{}, 7)))

	first, err := s.List(t.Context(), Filter{}, 7, "")
	require.NoError(t, err)
	require.Len(t, first.Entries, 7)
	_, err = s.List(t.Context(), Filter{Tenant: "t"}, 7, first.NextPageToken)
	require.ErrorIs(t, err, ErrInvalidPageToken, "a token only works with its own filter")
	require.ErrorContains(t, err, "issued for a different filter): start again without it, or with the filter it was issued for")
	for _, bad := range []string{"%%%", "AAAA", first.NextPageToken + "A"} {
		_, err = s.List(t.Context(), Filter{}, 7, bad)
		require.ErrorIs(t, err, ErrInvalidPageToken, bad)
		require.ErrorContains(t, err, "audit: page_token is not one this server issued for this filter: start again without it", "the refusal says what to do")
	}

	big, err := s.List(t.Context(), Filter{}, 5000, "")
	require.NoError(t, err)
	require.Len(t, big.Entries, 50)
	require.Empty(t, big.NextPageToken)

	exact, err := s.List(t.Context(), Filter{}, 50, "")
	require.NoError(t, err)
	require.Len(t, exact.Entries, 50)
	require.Empty(t, exact.NextPageToken, "no token when nothing follows")

	// A page picks up records appended after its token was issued.
	appendAll(t, s, toolRec(call{tenant: "t", run: "r", server: "s", tool: "x"}, "late"))
	next, err := s.List(t.Context(), Filter{}, 100, first.NextPageToken)
	require.NoError(t, err)
	require.Len(t, next.Entries, 44)
	require.Equal(t, "late", next.Entries[43].Record.ToolCall.CallID)
}

func TestListScanBudgetKeepsPagesBounded(t *testing.T) {
	s, _ := newStore(t)
	s.scanBudget = 10
	var recs []audit.Record
	for i := range 35 {
		tool := "common"
		if i == 3 || i == 27 {
			tool = "rare"
		}
		recs = append(recs, toolRec(call{tenant: "t", run: "r", server: "s", tool: tool}, fmt.Sprint(i)))
	}
	appendAll(t, s, recs...)

	page, err := s.List(t.Context(), Filter{ToolName: "rare"}, 100, "")
	require.NoError(t, err)
	require.Equal(t, []string{"3"}, callIDs(recordsOf(page)))
	require.NotEmpty(t, page.NextPageToken, "budget spent, more may follow")

	page, err = s.List(t.Context(), Filter{ToolName: "rare"}, 100, page.NextPageToken)
	require.NoError(t, err)
	require.Empty(t, page.Entries, "a page may be empty and still have a successor")
	require.NotEmpty(t, page.NextPageToken)

	require.Equal(t, []string{"3", "27"}, callIDs(listAll(t, s, Filter{ToolName: "rare"}, 100)))
}

func recordsOf(p Page) []audit.Record {
	var out []audit.Record
	for _, e := range p.Entries {
		out = append(out, e.Record)
	}
	return out
}

func TestReopenContinuesChain(t *testing.T) {
	s, path := newStore(t)
	c := call{tenant: "t", run: "r", server: "s", tool: "x"}
	appendAll(t, s, toolRec(c, "1"), toolRec(c, "2"))
	seq, h := s.Head()
	require.NoError(t, s.Close())
	s = openStore(t, path)
	seq2, h2 := s.Head()
	require.Equal(t, seq, seq2)
	require.Equal(t, h, h2)
	require.Equal(t, []uint64{3}, appendAll(t, s, toolRec(c, "3")))
	requireVerified(t, s, 3)
}

func TestSinkAdapter(t *testing.T) {
	s, _ := newStore(t)
	sink := s.Sink()
	r := toolRec(call{tenant: "t", run: "r", server: "s", tool: "x"}, "1")
	require.NoError(t, sink.Append(t.Context(), []audit.Record{r}))
	require.NoError(t, sink.Append(t.Context(), []audit.Record{r}))
	seq, _ := s.Head()
	require.Equal(t, uint64(1), seq)
	require.True(t, slices.Equal([]string{"1"}, callIDs(listAll(t, s, Filter{}, 10))))

	// Another record under a stored ID is refused for good, so a spool quarantines it.
	other := toolRec(call{tenant: "t", run: "r", server: "s", tool: "y"}, "2")
	other.ID = r.ID
	err := sink.Append(t.Context(), []audit.Record{other})
	require.ErrorIs(t, err, audit.ErrRejected)
	require.ErrorIs(t, err, ErrIDConflict)
}

// TestAListOfARunInATenantExaminesThatTenantsRecordsOnly: run ids are chosen per tenant, so
// two tenants may both have a run "nightly". A list of acme's "nightly" examines acme's
// records only: globex's records of its own "nightly" neither spend the scan budget (which
// would answer acme with an empty page and a token holding globex's seq) nor make a token
// after acme's last record (which would tell acme that another tenant has a run so named).
func TestAListOfARunInATenantExaminesThatTenantsRecordsOnly(t *testing.T) {
	s, _ := newStore(t)
	s.scanBudget = 10
	acme := Filter{Tenant: "acme", RunID: "nightly"}

	appendAll(t, s, toolRec(call{tenant: "acme", run: "nightly", server: "s", tool: "x"}, "a1"))
	var theirs []audit.Record
	for i := range 25 {
		theirs = append(theirs, toolRec(call{tenant: "globex", run: "nightly", server: "s", tool: "x"}, fmt.Sprint("g", i)))
	}
	appendAll(t, s, theirs...)
	page, err := s.List(t.Context(), acme, 1, "")
	require.NoError(t, err)
	require.Equal(t, []string{"a1"}, callIDs(recordsOf(page)))
	require.Empty(t, page.NextPageToken, "nothing follows in acme, whatever follows in globex")

	appendAll(t, s, toolRec(call{tenant: "acme", run: "nightly", server: "s", tool: "x"}, "a2"))

	page, err = s.List(t.Context(), acme, 1, "")
	require.NoError(t, err)
	require.Equal(t, []string{"a1"}, callIDs(recordsOf(page)))
	page, err = s.List(t.Context(), acme, 1, page.NextPageToken)
	require.NoError(t, err)
	require.Equal(t, []string{"a2"}, callIDs(recordsOf(page)), "globex's 25 records spent none of the budget of 10")
	require.Empty(t, page.NextPageToken, "globex's records after acme's last make no token")

	require.Len(t, listAll(t, s, Filter{RunID: "nightly"}, 100), 27, "a list of every tenant sees both runs so named")
	require.Len(t, listAll(t, s, Filter{Tenant: "globex", RunID: "nightly"}, 100), 25)
}
