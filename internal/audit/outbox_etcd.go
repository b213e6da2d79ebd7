package audit

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/etcdstore"
)

// EtcdOutbox keeps a spool's outbox in etcd, under Prefix, for a producer whose state lives
// there: a change and its record commit in one etcd transaction (EtcdRecorder). Every replica
// of the producer shares the outbox: each forwards what it finds, so a record whose replica
// died before forwarding it is forwarded by another (the log keeps one of each).
type EtcdOutbox struct {
	Client *clientv3.Client
	// Prefix holds records/<random id> (a record's body) and dropped/<random id> (a count of
	// records dropped under ContinueAndAlarm, as a decimal).
	Prefix string
}

// outboxes counts the outboxes cfg names; a spool takes exactly one.
func outboxes(cfg SpoolConfig) int {
	n := 0
	if cfg.DB != nil && cfg.Bucket != "" {
		n++
	}
	if cfg.Dir != "" {
		n++
	}
	if cfg.Etcd != nil {
		n++
	}
	return n
}

// etcdOpsPerTxn keeps a transaction under etcd's default limit of 128 operations.
const etcdOpsPerTxn = 100

// etcdOutboxTimeout bounds one request of the outbox.
const etcdOutboxTimeout = 10 * time.Second

// etcdOrphanCheck is how often a replica looks for records no forwarder was woken for
// (another replica wrote them and died, or its forwarder is down).
var etcdOrphanCheck = 5 * time.Second

// etcdOutbox implements outbox. Records are ordered by the revision that created them, which
// is the order their transactions committed in across every replica; an entry's key is that
// revision (8 bytes big-endian). Records created by one transaction share a revision and are
// read and removed together.
type etcdOutbox struct {
	cli     *clientv3.Client
	records string
	dropped string

	stop context.CancelFunc
	done chan struct{}
}

func openEtcdOutbox(cfg *EtcdOutbox, wake func()) (*etcdOutbox, error) {
	if cfg.Client == nil || cfg.Prefix == "" {
		return nil, errors.New("audit: an etcd outbox needs a client and a prefix")
	}
	o := &etcdOutbox{cli: cfg.Client, records: cfg.Prefix + "records/", dropped: cfg.Prefix + "dropped/", done: make(chan struct{})}
	var ctx context.Context
	ctx, o.stop = context.WithCancel(context.Background())
	go o.watchOrphans(ctx, wake)
	return o, nil
}

func (o *etcdOutbox) describe() string { return o.records }

func (o *etcdOutbox) close() error {
	o.stop()
	<-o.done
	return nil
}

func (o *etcdOutbox) watchOrphans(ctx context.Context, wake func()) {
	defer close(o.done)
	t := time.NewTicker(etcdOrphanCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n, err := o.countCtx(ctx); err == nil && n > 0 {
				wake()
			}
		}
	}
}

func (o *etcdOutbox) count() (int, error) {
	return o.countCtx(context.Background())
}

func (o *etcdOutbox) countCtx(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdOutboxTimeout)
	defer cancel()
	resp, err := o.cli.Get(ctx, o.records, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, etcdstore.Unavailable("audit: count the etcd outbox", err)
	}
	return int(resp.Count), nil
}

func randomKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// txnKeys names the records of one transaction: a random part of its own and their order in
// it, so that sorting one revision's records by key keeps the order they were written in.
type txnKeys struct {
	id string
	n  int
}

func (k *txnKeys) next() string {
	if k.id == "" {
		k.id = randomKey()
	}
	k.n++
	return fmt.Sprintf("%s-%04d", k.id, k.n)
}

// op is what writing one body (or counting it as dropped) adds to a transaction.
func (o *etcdOutbox) op(keys *txnKeys, body []byte, admit func(int) error, pending int) (clientv3.Op, bool, error) {
	switch err := admit(pending); {
	case errors.Is(err, errDropRecord):
		return clientv3.OpPut(o.dropped+randomKey(), "1"), true, nil
	case err != nil:
		return clientv3.Op{}, false, err
	}
	return clientv3.OpPut(o.records+keys.next(), string(body)), false, nil
}

// add writes bodies in transactions of up to etcdOpsPerTxn records each, in order. The bound
// is checked against a count read just before: replicas writing at the same moment may pass
// it by as many records as they write together. It ignores recs: records also enter inside
// producers' transactions (EtcdRecorder), on any replica, so every one is read back from etcd.
func (o *etcdOutbox) add(bodies [][]byte, _ []*Record, admit func(int) error) ([]error, error) {
	errs := make([]error, len(bodies))
	pending, err := o.count()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdOutboxTimeout)
	defer cancel()
	var ops []clientv3.Op
	keys := &txnKeys{}
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		_, err := o.cli.Txn(ctx).Then(ops...).Commit()
		ops, keys = ops[:0], &txnKeys{}
		return err
	}
	for i, body := range bodies {
		op, dropped, err := o.op(keys, body, admit, pending)
		switch {
		case dropped:
			errs[i] = errDropRecord
		case err != nil:
			errs[i] = err
			continue
		default:
			pending++
		}
		if ops = append(ops, op); len(ops) == etcdOpsPerTxn {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return errs, nil
}

func revKey(rev int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(rev)) }

// read returns the records created after revision after, oldest first. Keys and creation
// revisions come from etcd's index alone (a keys-only read sorted by creation, cheap however
// many records wait), then the bodies of the chosen ones. A revision's records are returned
// all or none, so the next read's "after" never splits them: a page that ends inside one is
// cut before it, or completed when it is the only one.
func (o *etcdOutbox) read(after []byte, n, maxBytes int) ([]outboxEntry, error) {
	ctx, cancel := context.WithTimeout(context.Background(), etcdOutboxTimeout)
	defer cancel()
	from := int64(1)
	if after != nil {
		from = int64(readUint64(after)) + 1
	}
	resp, err := o.cli.Get(ctx, o.records, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithMinCreateRev(from), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(n)))
	if err != nil {
		return nil, etcdstore.Unavailable("audit: read the etcd outbox", err)
	}
	kvs := resp.Kvs
	if resp.More && len(kvs) > 0 {
		last := kvs[len(kvs)-1].CreateRevision
		cut := len(kvs)
		for cut > 0 && kvs[cut-1].CreateRevision == last {
			cut--
		}
		if cut > 0 {
			kvs = kvs[:cut]
		} else {
			group, err := o.cli.Get(ctx, o.records, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
				clientv3.WithMinCreateRev(last), clientv3.WithMaxCreateRev(last))
			if err != nil {
				return nil, etcdstore.Unavailable("audit: read the etcd outbox", err)
			}
			kvs = group.Kvs
		}
	}
	// etcd gives one transaction's records one revision; their keys (txnKeys) keep the order
	// the transaction wrote them in.
	slices.SortStableFunc(kvs, func(a, b *mvccpb.KeyValue) int {
		if c := cmp.Compare(a.CreateRevision, b.CreateRevision); c != 0 {
			return c
		}
		return slices.Compare(a.Key, b.Key)
	})
	bodies, err := o.values(ctx, kvs)
	if err != nil {
		return nil, err
	}
	var out []outboxEntry
	size := 0
	for i := 0; i < len(kvs); {
		// Whole revisions only, and at least one.
		j, groupSize := i, 0
		for ; j < len(kvs) && kvs[j].CreateRevision == kvs[i].CreateRevision; j++ {
			groupSize += len(bodies[j])
		}
		if len(out) > 0 && size+groupSize > maxBytes {
			break
		}
		size += groupSize
		for k := i; k < j; k++ {
			// A record gone meanwhile was forwarded and removed by another replica.
			if bodies[k] != nil {
				out = append(out, outboxEntry{key: revKey(kvs[k].CreateRevision), body: bodies[k]})
			}
		}
		i = j
	}
	if len(out) == 0 && len(kvs) > 0 {
		// Every record read was removed meanwhile: step past them.
		return o.read(revKey(kvs[len(kvs)-1].CreateRevision), n, maxBytes)
	}
	return out, nil
}

// values reads the bodies of kvs (nil for one deleted since), in read-only transactions.
func (o *etcdOutbox) values(ctx context.Context, kvs []*mvccpb.KeyValue) ([][]byte, error) {
	out := make([][]byte, len(kvs))
	for start := 0; start < len(kvs); start += etcdOpsPerTxn {
		end := min(start+etcdOpsPerTxn, len(kvs))
		ops := make([]clientv3.Op, 0, end-start)
		for _, kv := range kvs[start:end] {
			ops = append(ops, clientv3.OpGet(string(kv.Key)))
		}
		resp, err := o.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, etcdstore.Unavailable("audit: read the etcd outbox", err)
		}
		for i, r := range resp.Responses {
			if got := r.GetResponseRange().GetKvs(); len(got) == 1 {
				out[start+i] = got[0].Value
			}
		}
	}
	return out, nil
}

// remove deletes the records created up to revision through, every one of which a read
// returned (records committed later have later revisions), and reports the dropped count.
func (o *etcdOutbox) remove(through []byte, corrupt uint64, report func(uint64, int) ([]byte, error)) (int, uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), etcdOutboxTimeout)
	defer cancel()
	resp, err := o.cli.Get(ctx, o.records, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(int64(readUint64(through))))
	if err != nil {
		return 0, 0, etcdstore.Unavailable("audit: remove forwarded records", err)
	}
	removed := 0
	for start := 0; start < len(resp.Kvs); start += etcdOpsPerTxn {
		var ops []clientv3.Op
		for _, kv := range resp.Kvs[start:min(start+etcdOpsPerTxn, len(resp.Kvs))] {
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		}
		txn, err := o.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return removed, 0, etcdstore.Unavailable("audit: remove forwarded records", err)
		}
		for _, r := range txn.Responses {
			removed += int(r.GetResponseDeleteRange().GetDeleted())
		}
	}
	if corrupt > 0 {
		if _, err := o.cli.Put(ctx, o.dropped+randomKey(), strconv.FormatUint(corrupt, 10)); err != nil {
			return removed, 0, etcdstore.Unavailable("audit: count dropped records", err)
		}
	}
	reported, err := o.report(ctx, report)
	return removed, reported, err
}

// report appends the report of the dropped records counted so far and deletes their counts,
// in one transaction that fails if another replica reported any of them first.
func (o *etcdOutbox) report(ctx context.Context, report func(uint64, int) ([]byte, error)) (uint64, error) {
	resp, err := o.cli.Get(ctx, o.dropped, clientv3.WithPrefix(), clientv3.WithLimit(etcdOpsPerTxn/2))
	if err != nil || len(resp.Kvs) == 0 {
		return 0, err
	}
	var dropped uint64
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, kv := range resp.Kvs {
		n, _ := strconv.ParseUint(string(kv.Value), 10, 64)
		dropped += n
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
		ops = append(ops, clientv3.OpDelete(string(kv.Key)))
	}
	pending, err := o.countCtx(ctx)
	if err != nil {
		return 0, err
	}
	body, err := report(dropped, pending)
	if err != nil || body == nil {
		return 0, err
	}
	txn, err := o.cli.Txn(ctx).If(cmps...).Then(append(ops, clientv3.OpPut(o.records+(&txnKeys{}).next(), string(body)))...).Commit()
	if err != nil {
		return 0, etcdstore.Unavailable("audit: report dropped records", err)
	}
	if !txn.Succeeded {
		return 0, nil
	}
	return dropped, nil
}

// EtcdRecorder gathers the audit records of one etcd transaction of the producer: Ops go into
// the transaction that makes the change, and Committed is called once it committed.
type EtcdRecorder struct {
	spool *Spool
	out   *etcdOutbox
	ctx   context.Context

	mu      sync.Mutex
	keys    txnKeys
	ops     []clientv3.Op
	commits []func()
}

// EtcdRecorder returns a recorder for one transaction attempt (a retried transaction takes a
// fresh one). Only a spool whose outbox is in etcd has one.
func (s *Spool) EtcdRecorder(ctx context.Context) (*EtcdRecorder, error) {
	eo, ok := s.out.(*etcdOutbox)
	if !ok {
		return nil, errors.New("audit: this spool's outbox is not in etcd")
	}
	return &EtcdRecorder{spool: s, out: eo, ctx: ctx}, nil
}

// Record adds rec to the transaction: it commits if and only if the change does. It returns
// an error wrapping ErrInvalidRecord for a malformed record and ErrSpoolFull when the outbox is
// full under FailClosed; the producer must then not commit.
func (r *EtcdRecorder) Record(rec Record) error {
	body, err := encodeRecord(&rec)
	if err != nil {
		return err
	}
	pending, err := r.out.countCtx(r.ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	op, dropped, err := r.out.op(&r.keys, body, r.spool.admit, pending)
	if err != nil {
		return err
	}
	r.ops = append(r.ops, op)
	if dropped {
		r.commits = append(r.commits, r.spool.noteDropped)
	} else {
		r.commits = append(r.commits, r.spool.noteEnqueued)
	}
	return nil
}

// Ops are the operations to add to the transaction.
func (r *EtcdRecorder) Ops() []clientv3.Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// Committed tells the spool the transaction committed: the forwarder wakes for the records.
func (r *EtcdRecorder) Committed() {
	r.mu.Lock()
	commits := r.commits
	r.commits = nil
	r.mu.Unlock()
	for _, c := range commits {
		c()
	}
}
