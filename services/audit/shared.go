package audit

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/services/audit/internal/store"
)

// DefaultLeaseTTL is how long, with store.backend=etcd, a leader that stopped answering (a crash, a partition) keeps
// the chain before a standby may take it: the lease of its election key.
const DefaultLeaseTTL = 5 * time.Second

// Bounds of one append transaction: etcd refuses transactions of more than 128 operations
// (--max-txn-ops) or 1.5 MiB (--max-request-bytes) by default. A commit larger than this
// is several transactions, each fenced.
const (
	maxTxnRecords = 120
	maxTxnBytes   = 1 << 20
)

// followPage is how many records a copy takes from etcd per read.
const followPage = 512

// ErrNotLeader means this instance does not write the chain now: another does, or none
// while an election runs. Producers append to the leader (NotLeader names it).
var ErrNotLeader = errors.New("audit: this instance is a standby and does not write the audit log")

// ErrFenced means an append transaction found the leader's key or the chain's head not as
// the writer knew them: it was deposed, or its copy is behind the chain in etcd. Nothing
// of that transaction was written.
var ErrFenced = errors.New("audit: the audit log in etcd moved on without this writer (it lost the leadership, or its copy is catching up); nothing was appended")

// sharedConfig says where the shared chain lives and who this instance is.
type sharedConfig struct {
	Client *clientv3.Client
	// Root is store.etcd_prefix; the chain lives under <Root>/audit/.
	Root string
	// Name is this instance as others name it when it leads (its host and internal address).
	Name string
	// LeaseTTL is DefaultLeaseTTL when 0.
	LeaseTTL time.Duration
	Logger   *slog.Logger
}

// sharedLog shares the audit log's hash chain between several audit instances
// through etcd (store.backend=etcd), so that the log survives the loss of an instance.
//
// The chain lives in etcd, under <root>/audit/: chain/<seq, 16 hex digits> holds each
// record as the bbolt log stores it (hash || body), and head holds the last seq and hash.
// One instance at a time writes it: the leader, elected with etcd's concurrency.Election
// (a key under leader/ tied to the instance's lease; the oldest key leads). Every append
// is a transaction that compares the leader's key (its creation revision: a deposed
// leader's key is gone, and a new one has another) and the head the writer extends, so a
// writer that lost its lease, or was paused while another took over, cannot add a
// record: its transaction fails and its callers are told nothing was appended.
//
// Each instance keeps a copy of the chain in its own bbolt file (audit.db), which serves
// its reads: List, Watch, Export and Verify run on the copy as they do without etcd.
// The leader writes etcd first and its copy after (store.Chain); every instance follows
// etcd's head and copies what is new (store.Ingest), checking that each record chains
// from the one before. So a copy is always a prefix of the chain in etcd, and appends stay
// idempotent by record ID through the copy's by_id index: a new leader first brings its
// copy up to etcd's head, and only then appends.
//
// It is this instance's part in the shared chain: store.Chain for its writer, the election,
// and the copy's follower.
type sharedLog struct {
	cli   *clientv3.Client
	space etcdstore.Space
	name  string
	ttl   time.Duration
	log   *slog.Logger
	store *store.Store

	mu        sync.Mutex
	leading   bool
	leaderKey string
	leaderRev int64
	// stepDown ends the current term (set while leading).
	stepDown context.CancelFunc

	stop context.CancelFunc
	wg   sync.WaitGroup
}

var _ store.Chain = (*sharedLog)(nil)

// newSharedLog prepares the instance's part; Start begins it once the copy is open.
func newSharedLog(cfg sharedConfig) *sharedLog {
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &sharedLog{cli: cfg.Client, space: etcdstore.NewSpace(cfg.Root, "audit"), name: cfg.Name, ttl: cfg.LeaseTTL, log: cfg.Logger}
}

// Start follows the chain into st and campaigns to write it, until Close.
func (l *sharedLog) Start(st *store.Store) {
	l.store = st
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	l.wg.Add(2)
	go func() { defer l.wg.Done(); l.follow(ctx) }()
	go func() { defer l.wg.Done(); l.campaign(ctx) }()
}

// Close resigns the leadership, if held, and stops following. Appends after it fail.
func (l *sharedLog) Close() {
	if l.stop != nil {
		l.stop()
		l.wg.Wait()
	}
}

// Leading reports whether this instance writes the chain now.
func (l *sharedLog) Leading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading
}

// Name is this instance's name, as Leader gives it when it leads.
func (l *sharedLog) Name() string { return l.name }

// Key is the election key of this instance's current term, or "" when it does not lead.
func (l *sharedLog) Key() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leading {
		return ""
	}
	return l.leaderKey
}

// Leader names the instance that writes the chain now, as it named itself, or "" while
// none does.
func (l *sharedLog) Leader(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdstore.RequestTimeout)
	defer cancel()
	resp, err := l.cli.Get(ctx, l.space.Prefix("leader"), clientv3.WithFirstCreate()...)
	if err != nil {
		return "", etcdstore.Unavailable("read the audit leader", err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// CatchUp waits until the copy holds every record the chain in etcd held when CatchUp
// was called: a read on any instance then answers with everything acknowledged before it.
func (l *sharedLog) CatchUp(ctx context.Context) error {
	head, err := l.head(ctx)
	if err != nil {
		return err
	}
	return l.await(ctx, head.Seq)
}

// await waits until the copy reaches seq.
func (l *sharedLog) await(ctx context.Context, seq uint64) error {
	if have, _ := l.store.Head(); have >= seq {
		return nil
	}
	for _, err := range l.store.Watch(ctx, seq) {
		return err // the first record yielded is seq itself
	}
	return nil
}

func (l *sharedLog) headKey() string { return l.space.Key("head") }
func (l *sharedLog) recordKey(seq uint64) string {
	return l.space.Key("chain", fmt.Sprintf("%016x", seq))
}

// head reads the chain's head in etcd (0 and Genesis while it is empty).
func (l *sharedLog) head(ctx context.Context) (store.Head, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdstore.RequestTimeout)
	defer cancel()
	resp, err := l.cli.Get(clientv3.WithRequireLeader(ctx), l.headKey())
	if err != nil {
		return store.Head{}, etcdstore.Unavailable("read the audit log's head", err)
	}
	if len(resp.Kvs) == 0 {
		return store.Head{Hash: store.Genesis}, nil
	}
	return decodeHead(resp.Kvs[0].Value)
}

func encodeHead(h store.Head) string {
	return string(append(binary.BigEndian.AppendUint64(nil, h.Seq), h.Hash[:]...))
}

func decodeHead(v []byte) (store.Head, error) {
	if len(v) != 8+32 {
		return store.Head{}, fmt.Errorf("audit: the audit log's head in etcd is %d bytes, not 40: it was written by something else", len(v))
	}
	return store.Head{Seq: binary.BigEndian.Uint64(v), Hash: [32]byte(v[8:])}, nil
}

// Commit implements store.Chain: vals extend the chain from prev in transactions that
// each hold only while this instance's election key is the one that won and the head is
// where the previous one left it.
func (l *sharedLog) Commit(ctx context.Context, prev store.Head, vals [][]byte) error {
	l.mu.Lock()
	leading, key, rev := l.leading, l.leaderKey, l.leaderRev
	l.mu.Unlock()
	if !leading {
		return ErrNotLeader
	}
	ctx, cancel := context.WithTimeout(ctx, etcdstore.RequestTimeout)
	defer cancel()
	ctx = clientv3.WithRequireLeader(ctx)
	for len(vals) > 0 {
		n, size := 0, 0
		for n < len(vals) && n < maxTxnRecords && (n == 0 || size+len(vals[n]) <= maxTxnBytes) {
			size += len(vals[n])
			n++
		}
		next := store.Head{Seq: prev.Seq + uint64(n), Hash: [32]byte(vals[n-1][:32])}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", rev)}
		if prev.Seq == 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(l.headKey()), "=", 0))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.Value(l.headKey()), "=", encodeHead(prev)))
		}
		ops := make([]clientv3.Op, 0, n+1)
		for i, v := range vals[:n] {
			ops = append(ops, clientv3.OpPut(l.recordKey(prev.Seq+uint64(i)+1), string(v)))
		}
		ops = append(ops, clientv3.OpPut(l.headKey(), encodeHead(next)))
		resp, err := l.cli.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return etcdstore.Unavailable("append to the audit log in etcd", err)
		}
		if !resp.Succeeded {
			// Without its key this instance was deposed (its lease lapsed, or an operator
			// deleted the key): it stops writing and campaigns again. With it, its copy is
			// behind the chain, and the follower brings it up.
			if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != rev {
				l.depose(key)
			}
			return ErrFenced
		}
		prev, vals = next, vals[n:]
	}
	return nil
}

// follow copies what the chain in etcd holds beyond the copy, then waits for its head to
// move, until ctx ends.
func (l *sharedLog) follow(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		if err := l.followOnce(ctx); err != nil && ctx.Err() == nil {
			// A copy that does not continue is logged at error each time: it needs a person.
			level := slog.LevelWarn
			if errors.Is(err, store.ErrNotAPrefix) {
				level = slog.LevelError
			}
			if failures++; failures == 1 || failures%30 == 0 || level == slog.LevelError {
				l.log.Log(ctx, level, "audit: copying the audit log from etcd", "err", err, "failures", failures)
			}
			sleep(ctx, min(time.Duration(failures)*200*time.Millisecond, 2*time.Second))
			continue
		}
		failures = 0
	}
}

// followOnce copies one page of new records, or waits for the head to move past what it
// read.
func (l *sharedLog) followOnce(ctx context.Context) error {
	seq, _ := l.store.Head()
	rctx, cancel := context.WithTimeout(ctx, etcdstore.RequestTimeout)
	resp, err := l.cli.Get(clientv3.WithRequireLeader(rctx), l.recordKey(seq+1),
		clientv3.WithRange(etcdstore.RangeEnd(l.space.Prefix("chain"))), clientv3.WithLimit(followPage))
	cancel()
	if err != nil {
		return etcdstore.Unavailable("read the audit log in etcd", err)
	}
	if len(resp.Kvs) > 0 {
		first, err := strconv.ParseUint(string(resp.Kvs[0].Key[len(l.space.Prefix("chain")):]), 16, 64)
		if err != nil {
			return fmt.Errorf("%w: key %q is not a record's", store.ErrNotAPrefix, resp.Kvs[0].Key)
		}
		vals := make([][]byte, len(resp.Kvs))
		for i, kv := range resp.Kvs {
			vals[i] = kv.Value
		}
		return l.store.Ingest(ctx, first, vals)
	}
	// Nothing past the copy as of that read: wait for a write to the head after it. A
	// watch that ends for any reason (compaction, a member lost) reads again.
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	select {
	case <-l.cli.Watch(wctx, l.headKey(), clientv3.WithRev(resp.Header.Revision+1)):
	case <-ctx.Done():
	}
	return nil
}

// campaign runs elections until ctx ends: it waits to be elected, brings the copy up to
// the chain's head, writes while its lease lasts, and campaigns again when it lapses.
func (l *sharedLog) campaign(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		if err := l.leadOnce(ctx); err != nil && ctx.Err() == nil {
			if failures++; failures == 1 || failures%30 == 0 {
				l.log.Warn("audit: campaigning to write the audit log", "err", err, "failures", failures)
			}
			sleep(ctx, min(time.Duration(failures)*200*time.Millisecond, 2*time.Second))
			continue
		}
		failures = 0
	}
}

func (l *sharedLog) leadOnce(ctx context.Context) error {
	sess, err := concurrency.NewSession(l.cli, concurrency.WithTTL(int(l.ttl.Seconds())), concurrency.WithContext(ctx))
	if err != nil {
		return etcdstore.Unavailable("open an election lease", err)
	}
	defer func() { _ = sess.Close() }() // revokes the lease: a standby takes over at once
	// A lease that lapses while waiting ends the wait: its key is gone.
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-sess.Done():
			stop()
		case <-cctx.Done():
		}
	}()
	e := concurrency.NewElection(sess, l.space.Key("leader"))
	if err := e.Campaign(cctx, l.name); err != nil {
		return fmt.Errorf("audit: campaign: %w", err)
	}
	// Elected. The copy first: appends are idempotent through it, so it must hold every
	// record the chain does before this instance decides what is new.
	head, err := l.head(cctx)
	if err == nil {
		if have, _ := l.store.Head(); have > head.Seq {
			err = fmt.Errorf("%w: this copy ends at record %d, past the chain in etcd (%d): was etcd restored from an older snapshot? this instance will not write until they agree", store.ErrNotAPrefix, have, head.Seq)
		} else {
			err = l.await(cctx, head.Seq)
		}
	}
	if err != nil {
		l.resign(e)
		return err
	}
	l.mu.Lock()
	l.leading, l.leaderKey, l.leaderRev, l.stepDown = true, e.Key(), e.Rev(), stop
	l.mu.Unlock()
	l.log.Info("audit: this instance writes the audit log", "name", l.name, "head", head.Seq)
	<-cctx.Done()
	l.mu.Lock()
	l.leading = false
	l.mu.Unlock()
	if ctx.Err() == nil {
		l.log.Warn("audit: this instance lost its election key (its lease lapsed, or the key was removed) and no longer writes the audit log; campaigning again", "name", l.name)
	}
	l.resign(e)
	return nil
}

// depose ends the term of key, if it is the current one.
func (l *sharedLog) depose(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leading && l.leaderKey == key {
		l.leading = false
		l.stepDown()
	}
}

func (l *sharedLog) resign(e *concurrency.Election) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = e.Resign(ctx) // the lease's end removes the key anyway
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
