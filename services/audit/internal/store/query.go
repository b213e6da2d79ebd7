package store

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/ident"
)

// ErrInvalidFilter means a filter named an unknown kind or outcome, a call id no call can
// have, or a time range no record can fall in. It reaches callers as
// the status message, hence the service's prefix.
var ErrInvalidFilter = errors.New("audit: invalid filter")

// Paging limits.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
	// ScanBudget bounds the records one List call examines. A selective filter over a
	// long log returns a short (even empty) page with a next token rather than scanning
	// without bound under one read transaction.
	ScanBudget = 10_000
	// watchChunk bounds the records a watcher reads per transaction and holds in memory.
	watchChunk = 256
)

// Filter selects records. Empty fields match everything. RunID, ServerRef, ToolName,
// Outcome and CallID match tool-call records only. Since is inclusive, Until exclusive; both
// compare the producer's record time.
type Filter struct {
	Tenant    string
	RunID     string
	ServerRef string
	ToolName  string
	Outcome   string
	Kind      audit.Kind
	Since     time.Time
	Until     time.Time
	// CallID matches the call's own records (tool_call.call_id) and the record of a retry
	// that was handed its approved outcome (tool_call.approval.dispatched_call_id): what
	// happened to the call, including who got its result. Omitted from the fingerprint
	// when empty, so page tokens issued before the field existed still hold.
	CallID string `json:",omitempty"`
}

// Validate reports whether the filter's kind and outcome are ones records can have, and its
// time range one they can fall in.
func (f Filter) Validate() error {
	switch f.Kind {
	case "", audit.KindAdmin, audit.KindToolCall:
	default:
		return fmt.Errorf("%w: kind %.32q is not one of %s, %s", ErrInvalidFilter, string(f.Kind), audit.KindAdmin, audit.KindToolCall)
	}
	switch f.Outcome {
	case "", audit.OutcomeRefusedBeforeDispatch, audit.OutcomeDispatched:
	default:
		return fmt.Errorf("%w: outcome %.32q is not one of %s, %s", ErrInvalidFilter, f.Outcome, audit.OutcomeRefusedBeforeDispatch, audit.OutcomeDispatched)
	}
	// A call id the pool would refuse names no call: refused, as an empty answer would say
	// the call left no record.
	if f.CallID != "" {
		if p := ident.CallID.Problem(f.CallID); p != "" {
			return fmt.Errorf("%w: call_id %s", ErrInvalidFilter, p)
		}
	}
	// Refused rather than answered empty: an empty answer would read as "nothing happened".
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return fmt.Errorf("%w: until (%s) is not after since (%s): since is inclusive and until exclusive, so no record could match; swap them", ErrInvalidFilter,
			f.Until.UTC().Format(time.RFC3339Nano), f.Since.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

func (f Filter) empty() bool { return f == Filter{} }

// Matches reports whether r passes the filter (Watch applies it per record).
func (f Filter) Matches(r *audit.Record) bool { return f.match(r) }

func (f Filter) match(r *audit.Record) bool {
	if f.Tenant != "" && r.Tenant != f.Tenant {
		return false
	}
	if f.Kind != "" && r.Kind != f.Kind {
		return false
	}
	if !f.Since.IsZero() && r.Time.Before(f.Since) {
		return false
	}
	if !f.Until.IsZero() && !r.Time.Before(f.Until) {
		return false
	}
	if f.RunID == "" && f.ServerRef == "" && f.ToolName == "" && f.Outcome == "" && f.CallID == "" {
		return true
	}
	tc := r.ToolCall
	return tc != nil &&
		(f.RunID == "" || tc.RunID == f.RunID) &&
		(f.ServerRef == "" || tc.ServerRef == f.ServerRef) &&
		(f.ToolName == "" || tc.ToolName == f.ToolName) &&
		(f.Outcome == "" || tc.Outcome == f.Outcome) &&
		(f.CallID == "" || tc.CallID == f.CallID || tc.Approval != nil && tc.Approval.DispatchedCallID == f.CallID)
}

// fingerprint ties a page token to the filter it was made for.
func (f Filter) fingerprint() [8]byte {
	f.Since, f.Until = f.Since.UTC(), f.Until.UTC()
	js, _ := json.Marshal(f)
	sum := sha256.Sum256(js)
	return [8]byte(sum[:8])
}

// scanner walks candidate records in seq order: through the by_tenant_call, by_call,
// by_tenant_run, by_run or by_tenant index when the filter names a call, run or tenant, else
// through the records themselves. A run or call of a tenant is read through by_tenant_run or
// by_tenant_call, never by_run or by_call: another tenant's run or call of the same id must
// not spend the budget nor make a page token. Every index yields a superset of the matches
// in seq order, so a page token (the last seq examined) reads on through whichever index the
// filter chooses, and tokens issued before by_call existed still hold.
type scanner struct {
	f      Filter
	index  []byte // index bucket, or nil for the records bucket
	prefix []byte
	// epochs says the index's keys are led by their record's epoch (the call indexes): a
	// range is read one epoch at a time, the prefix after each epoch.
	epochs  bool
	needles [][]byte
	decode  bool
}

func newScanner(f Filter, wantEntries bool) *scanner {
	sc := &scanner{f: f, decode: wantEntries || !f.empty()}
	switch {
	// A call id before a run: a call's records are a handful (its attempts, the approved
	// execution, the retry handed its outcome) where a run's are every call it made.
	case f.CallID != "" && f.Tenant != "":
		sc.index, sc.prefix, sc.epochs = bucketByTenantCall, tenantRunPrefix(f.Tenant, f.CallID), true
	case f.CallID != "":
		sc.index, sc.prefix, sc.epochs = bucketByCall, indexPrefix(f.CallID), true
	case f.RunID != "" && f.Tenant != "":
		sc.index, sc.prefix = bucketByTenantRun, tenantRunPrefix(f.Tenant, f.RunID)
	case f.RunID != "":
		sc.index, sc.prefix = bucketByRun, indexPrefix(f.RunID)
	case f.Tenant != "":
		sc.index, sc.prefix = bucketByTenant, indexPrefix(f.Tenant)
	}
	// A body holds each field as the encoder wrote it, so a field's encoded form must
	// occur in the body for the record to match: a cheap test before decoding.
	add := func(field, v string) {
		if v != "" {
			js, _ := json.Marshal(v)
			sc.needles = append(sc.needles, append([]byte(`"`+field+`":`), js...))
		}
	}
	add("tenant", f.Tenant)
	add("run_id", f.RunID)
	add("server_ref", f.ServerRef)
	add("tool_name", f.ToolName)
	add("outcome", f.Outcome)
	add("kind", string(f.Kind))
	if f.CallID != "" {
		// Without its opening quote the needle is in "call_id":… and in
		// "dispatched_call_id":… alike; match decides which.
		js, _ := json.Marshal(f.CallID)
		sc.needles = append(sc.needles, append([]byte(`call_id":`), js...))
	}
	return sc
}

// scan visits matching records with after < seq <= upto, examining at most budget
// candidates. visit returns false to stop. scan returns the last seq examined and
// whether candidates may remain.
func (sc *scanner) scan(tx *bolt.Tx, after, upto uint64, budget int, visit func(seq uint64, value []byte, e *Entry) bool) (last uint64, more bool, err error) {
	records := tx.Bucket(bucketRecords)
	var c *bolt.Cursor
	var k, v []byte
	// prefix is what the index's keys in range begin with: sc.prefix, after the epoch
	// being read when the keys have one.
	prefix := sc.prefix
	epoch, lastEpoch := callEpoch(after+1), callEpoch(upto)
	if sc.epochs {
		prefix = append(binary.BigEndian.AppendUint32(nil, epoch), sc.prefix...)
		// No epoch past the last record's has entries (upto may be unbounded).
		lastEpoch = epoch
		if last, _ := records.Cursor().Last(); len(last) == 8 {
			lastEpoch = max(epoch, callEpoch(min(upto, binary.BigEndian.Uint64(last))))
		}
	}
	if sc.index == nil {
		c = records.Cursor()
		k, v = c.Seek(seqKey(after + 1))
	} else {
		c = tx.Bucket(sc.index).Cursor()
		k, _ = c.Seek(append(bytes.Clone(prefix), seqKey(after+1)...))
	}
	// candidate returns the seq and value under the cursor, or ok false past the range.
	candidate := func() (uint64, []byte, bool) {
		// Past an epoch's range, the next epoch's (every epoch up to upto's: a seek each).
		for sc.epochs && !(bytes.HasPrefix(k, prefix) && len(k) == len(prefix)+8) && epoch < lastEpoch {
			epoch++
			binary.BigEndian.PutUint32(prefix, epoch)
			k, _ = c.Seek(prefix)
		}
		if k == nil {
			return 0, nil, false
		}
		var seq uint64
		if sc.index == nil {
			if len(k) != 8 {
				return 0, nil, false
			}
			seq = binary.BigEndian.Uint64(k)
		} else {
			if !bytes.HasPrefix(k, prefix) || len(k) != len(prefix)+8 {
				return 0, nil, false
			}
			seq = binary.BigEndian.Uint64(k[len(prefix):])
			v = records.Get(seqKey(seq))
		}
		if seq > upto {
			return 0, nil, false
		}
		return seq, v, true
	}
	advance := func() {
		if sc.index == nil {
			k, v = c.Next()
		} else {
			k, _ = c.Next()
		}
	}
	last = after
	for examined := 0; ; examined++ {
		seq, val, ok := candidate()
		if !ok {
			return last, false, nil
		}
		if examined == budget {
			return last, true, nil
		}
		last = seq
		if val == nil {
			return last, false, fmt.Errorf("audit: index names record %d, which is missing", seq)
		}
		if !sc.mayMatch(val[min(hashLen, len(val)):]) {
			advance()
			continue
		}
		var e *Entry
		if sc.decode {
			d, err := decodeEntry(seqKey(seq), val)
			if err != nil {
				return last, false, err
			}
			if !sc.f.match(&d.Record) {
				advance()
				continue
			}
			e = &d
		}
		advance()
		if !visit(seq, val, e) {
			_, _, ok := candidate()
			return last, ok, nil
		}
	}
}

func (sc *scanner) mayMatch(body []byte) bool {
	for _, n := range sc.needles {
		if !bytes.Contains(body, n) {
			return false
		}
	}
	return true
}

// Page is one page of List.
type Page struct {
	Entries []Entry
	// NextPageToken is empty when the log held no further candidates at the time.
	NextPageToken string
}

// List returns records matching f in seq order, at most pageSize (0 means
// DefaultPageSize; larger than MaxPageSize is capped). A page may be shorter than
// pageSize, even empty, while NextPageToken is set: each call examines at most
// ScanBudget records. pageToken must come from a List with the same filter.
func (s *Store) List(ctx context.Context, f Filter, pageSize int, pageToken string) (Page, error) {
	if err := f.Validate(); err != nil {
		return Page{}, err
	}
	if pageSize <= 0 {
		pageSize = DefaultPageSize
	}
	pageSize = min(pageSize, MaxPageSize)
	fp := f.fingerprint()
	after, err := decodePageToken(pageToken, fp)
	if err != nil {
		return Page{}, err
	}
	if err := ctx.Err(); err != nil {
		return Page{}, err
	}
	var page Page
	var last uint64
	var more bool
	err = s.db.View(func(tx *bolt.Tx) error {
		var err error
		last, more, err = newScanner(f, true).scan(tx, after, math.MaxUint64, s.scanBudget, func(_ uint64, _ []byte, e *Entry) bool {
			page.Entries = append(page.Entries, *e)
			return len(page.Entries) < pageSize
		})
		return err
	})
	if err != nil {
		return Page{}, fmt.Errorf("audit: list: %w", err)
	}
	if more {
		page.NextPageToken = encodePageToken(last, fp)
	}
	return page, nil
}

const pageTokenVersion = 1

func encodePageToken(after uint64, fp [8]byte) string {
	b := make([]byte, 0, 17)
	b = append(b, pageTokenVersion)
	b = binary.BigEndian.AppendUint64(b, after)
	b = append(b, fp[:]...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(tok string, fp [8]byte) (uint64, error) {
	if tok == "" {
		return 0, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) != 17 || b[0] != pageTokenVersion {
		return 0, fmt.Errorf("%w: start again without it", ErrInvalidPageToken)
	}
	if [8]byte(b[9:]) != fp {
		return 0, fmt.Errorf("%w (it was issued for a different filter): start again without it, or with the filter it was issued for", ErrInvalidPageToken)
	}
	return binary.BigEndian.Uint64(b[1:9]), nil
}

// Watch yields every record with seq >= fromSeq (0 means from the start), then follows
// new appends until ctx ends or the store closes, when it yields the error once and
// stops. A watcher holds at most one chunk of records in memory and reads everything
// from the file, so a slow watcher only falls behind; it never blocks appends and never
// misses a record. The writer just wakes waiting watchers after each commit.
func (s *Store) Watch(ctx context.Context, fromSeq uint64) iter.Seq2[Entry, error] {
	return func(yield func(Entry, error) bool) {
		next := max(fromSeq, 1)
		var chunk []Entry
		for {
			s.headMu.Lock()
			head, changed := s.headSeq, s.changed
			s.headMu.Unlock()
			if next > head {
				select {
				case <-changed:
					continue
				case <-ctx.Done():
					yield(Entry{}, ctx.Err())
					return
				case <-s.done:
					yield(Entry{}, ErrClosed)
					return
				}
			}
			chunk = chunk[:0]
			err := s.db.View(func(tx *bolt.Tx) error {
				c := tx.Bucket(bucketRecords).Cursor()
				for k, v := c.Seek(seqKey(next)); k != nil && len(chunk) < watchChunk; k, v = c.Next() {
					if len(k) != 8 || binary.BigEndian.Uint64(k) > head {
						break
					}
					e, err := decodeEntry(k, v)
					if err != nil {
						return err
					}
					chunk = append(chunk, e)
				}
				return nil
			})
			if err != nil {
				if errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
					err = ErrClosed
				}
				yield(Entry{}, fmt.Errorf("audit: watch: %w", err))
				return
			}
			if len(chunk) == 0 {
				// The head says records exist that the file lacks: damage, not a race.
				yield(Entry{}, fmt.Errorf("audit: watch: record %d is missing", next))
				return
			}
			for _, e := range chunk {
				if !yield(e, nil) {
					return
				}
			}
			next = chunk[len(chunk)-1].Record.Seq + 1
		}
	}
}

// exportChunk bounds the records Export reads per transaction.
const exportChunk = 1024

// Export writes records matching f, up to the head when Export starts, as JSON lines
// `{"hash":"<hex>","record":<body>}`: the body byte for byte as hashed, so VerifyExport
// (or any SHA-256 tool) can check the chain away from this service. It returns the
// number of records written.
func (s *Store) Export(ctx context.Context, w io.Writer, f Filter) (uint64, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	upto, _ := s.Head()
	bw := bufio.NewWriterSize(w, 64<<10)
	sc := newScanner(f, false)
	var (
		n     uint64
		after uint64
		buf   bytes.Buffer
	)
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		buf.Reset()
		var more bool
		count := 0
		err := s.db.View(func(tx *bolt.Tx) error {
			var err error
			after, more, err = sc.scan(tx, after, upto, exportChunk*8, func(_ uint64, v []byte, _ *Entry) bool {
				buf.WriteString(`{"hash":"`)
				var hx [2 * hashLen]byte
				hex.Encode(hx[:], v[:hashLen])
				buf.Write(hx[:])
				buf.WriteString(`","record":`)
				buf.Write(v[hashLen:])
				buf.WriteString("}\n")
				count++
				return count < exportChunk
			})
			return err
		})
		if err != nil {
			return n, fmt.Errorf("audit: export: %w", err)
		}
		if _, err := bw.Write(buf.Bytes()); err != nil {
			return n, fmt.Errorf("audit: export: write: %w", err)
		}
		n += uint64(count)
		if !more {
			break
		}
	}
	if err := bw.Flush(); err != nil {
		return n, fmt.Errorf("audit: export: write: %w", err)
	}
	return n, nil
}
