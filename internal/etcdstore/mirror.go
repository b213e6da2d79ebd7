package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	rpctypes "go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// SyncTimeout bounds how long a read waits for its mirror to be confirmed current.
const SyncTimeout = 5 * time.Second

// ErrUnavailable wraps every failure to reach etcd, so a service answers UNAVAILABLE (try
// again) rather than INTERNAL.
var ErrUnavailable = errors.New("etcdstore: etcd cannot be reached")

// unavailableHint says what an operator checks when etcd does not answer.
const unavailableHint = "check that a quorum of the etcd members in store.etcd_endpoints runs and is reachable from this host, then try again"

// Unavailable wraps err (an etcd client error) in ErrUnavailable, naming what failed and what
// to check; a canceled context, and an error that already is ErrUnavailable, pass as they are.
func Unavailable(what string, err error) error {
	switch {
	case err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable):
		return err
	case errors.Is(err, context.DeadlineExceeded):
		// etcd did not answer in time: the caller's own deadline may be far off, so this is
		// not its deadline passing.
		return fmt.Errorf("%w: %s: no answer within %s (%v): %s", ErrUnavailable, what, RequestTimeout, err, unavailableHint)
	}
	return fmt.Errorf("%w: %s: %w: %s", ErrUnavailable, what, err, unavailableHint)
}

// MirrorConfig describes what a Mirror keeps and where it hands it.
type MirrorConfig struct {
	// Prefix is the range mirrored: every key that starts with it.
	Prefix string
	// Reset replaces everything held with kvs, the whole range at one revision (at start, and
	// after the watch fell behind a compaction).
	Reset func(kvs []*mvccpb.KeyValue)
	// Apply applies events in revision order. Reset and Apply are called from one goroutine.
	Apply  func(evs []*clientv3.Event)
	Logger *slog.Logger
}

// Mirror keeps a range of keys in memory, fed by a watch, so reads cost no round trip for the
// data. Its reads are linearizable: Sync learns etcd's current revision (one linearizable
// read, shared by every caller waiting at that moment) and waits until the watch has delivered
// everything up to it, so a read after Sync sees every write acknowledged before Sync began,
// by any replica. When etcd cannot confirm that within SyncTimeout, Sync fails rather than let
// a read answer from what may be stale: a revoked key or a narrowed grant is never honoured
// from memory.
type Mirror struct {
	cli     *clientv3.Client
	watcher clientv3.Watcher
	cfg     MirrorConfig
	log     *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	applied int64         // every event up to this revision is applied
	changed chan struct{} // closed and replaced when applied advances
	lastAsk time.Time     // the last progress request
	probeMu sync.Mutex
	next    *probe // the probe callers join; it starts after they joined
	probing bool
}

type probe struct {
	done chan struct{}
	rev  int64
	err  error
}

// StartMirror loads the range, hands it to cfg.Reset and follows it until Close.
func StartMirror(ctx context.Context, cli *clientv3.Client, cfg MirrorConfig) (*Mirror, error) {
	m := &Mirror{cli: cli, watcher: clientv3.NewWatcher(cli), cfg: cfg, log: cfg.Logger, changed: make(chan struct{}), done: make(chan struct{})}
	if m.log == nil {
		m.log = slog.Default()
	}
	lctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	kvs, rev, err := List(lctx, cli, cfg.Prefix)
	if err != nil {
		_ = m.watcher.Close()
		return nil, Unavailable("load "+cfg.Prefix, err)
	}
	cfg.Reset(kvs)
	m.applied = rev
	m.ctx, m.cancel = context.WithCancel(context.Background())
	go m.run()
	return m, nil
}

// Close stops following the range.
func (m *Mirror) Close() error {
	m.cancel()
	err := m.watcher.Close()
	<-m.done
	return err
}

// Sync returns once everything committed before it was called is applied.
func (m *Mirror) Sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, SyncTimeout)
	defer cancel()
	rev, err := m.current(ctx)
	if err != nil {
		return Unavailable("read the current revision", err)
	}
	return m.WaitFor(ctx, rev)
}

// WaitFor returns once everything up to revision rev is applied (a writer waits for its own
// commit before it answers, so its next read here sees the write).
func (m *Mirror) WaitFor(ctx context.Context, rev int64) error {
	for {
		m.mu.Lock()
		applied, changed := m.applied, m.changed
		ask := applied < rev && time.Since(m.lastAsk) >= 5*time.Millisecond
		if ask {
			m.lastAsk = time.Now()
		}
		m.mu.Unlock()
		if applied >= rev {
			return nil
		}
		if ask {
			// The watch delivers events of this range only: when the revision moved on by
			// writes elsewhere, a progress notification says the range is current up to it.
			go func() { _ = m.watcher.RequestProgress(clientv3.WithRequireLeader(m.ctx)) }()
		}
		t := time.NewTimer(20 * time.Millisecond) // ask again if that notification was lost
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return Unavailable(fmt.Sprintf("wait for %s to reach revision %d (at %d)", m.cfg.Prefix, rev, applied), ctx.Err())
		}
		t.Stop()
	}
}

// Applied is the revision everything is applied up to.
func (m *Mirror) Applied() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.applied
}

// current returns etcd's current revision from a linearizable read that started after the
// call: callers arriving while one read is in flight share the next one.
func (m *Mirror) current(ctx context.Context) (int64, error) {
	m.probeMu.Lock()
	if m.next == nil {
		m.next = &probe{done: make(chan struct{})}
	}
	p := m.next
	if !m.probing {
		m.probing = true
		go m.probeLoop()
	}
	m.probeMu.Unlock()
	select {
	case <-p.done:
		return p.rev, p.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (m *Mirror) probeLoop() {
	for {
		m.probeMu.Lock()
		p := m.next
		m.next = nil
		if p == nil {
			m.probing = false
			m.probeMu.Unlock()
			return
		}
		m.probeMu.Unlock()
		ctx, cancel := context.WithTimeout(m.ctx, SyncTimeout)
		resp, err := m.cli.Get(ctx, m.cfg.Prefix, clientv3.WithCountOnly())
		cancel()
		if err == nil {
			p.rev = resp.Header.Revision
		}
		p.err = err
		close(p.done)
	}
}

func (m *Mirror) advance(rev int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rev <= m.applied {
		return
	}
	m.applied = rev
	close(m.changed)
	m.changed = make(chan struct{})
}

// run follows the range until Close. A watch that ends (a member lost its leader or went
// away) is opened again from the next revision on any member; one that fell behind a
// compaction reloads the range.
func (m *Mirror) run() {
	defer close(m.done)
	failures := 0
	for m.ctx.Err() == nil {
		from := m.Applied() + 1
		// RequireLeader: a member cut off from the others ends the watch instead of keeping it
		// open and silent, and the next one is opened on a member with a quorum.
		wch := m.watcher.Watch(clientv3.WithRequireLeader(m.ctx), m.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
		for wresp := range wch {
			if err := wresp.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) || wresp.CompactRevision != 0 {
					m.reload()
				} else if m.ctx.Err() == nil {
					m.log.Warn("etcdstore: watch ended; opening it again", "prefix", m.cfg.Prefix, "err", err)
				}
				break
			}
			failures = 0
			if wresp.IsProgressNotify() {
				m.advance(wresp.Header.Revision)
				continue
			}
			if len(wresp.Events) > 0 {
				m.cfg.Apply(wresp.Events)
				m.advance(wresp.Events[len(wresp.Events)-1].Kv.ModRevision)
			}
		}
		if m.ctx.Err() != nil {
			return
		}
		failures++
		t := time.NewTimer(min(time.Duration(failures)*50*time.Millisecond, time.Second))
		select {
		case <-m.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// reload replaces the mirror's content after the watch fell behind a compaction.
func (m *Mirror) reload() {
	for m.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(m.ctx, RequestTimeout)
		kvs, rev, err := List(ctx, m.cli, m.cfg.Prefix)
		cancel()
		if err == nil {
			m.cfg.Reset(kvs)
			m.advance(rev)
			m.log.Warn("etcdstore: the watch fell behind a compaction; reloaded the range", "prefix", m.cfg.Prefix, "revision", rev)
			return
		}
		m.log.Warn("etcdstore: reload after a compaction failed; retrying", "prefix", m.cfg.Prefix, "err", err)
		select {
		case <-m.ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// listPage bounds one read of List.
const listPage = 1000

// List reads every key that starts with prefix at one revision, in pages, and returns them in
// key order with that revision. The whole listing is bounded by RequestTimeout, and a failure
// is ErrUnavailable naming the prefix.
func List(ctx context.Context, cli *clientv3.Client, prefix string) ([]*mvccpb.KeyValue, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	end := RangeEnd(prefix)
	key := prefix
	var out []*mvccpb.KeyValue
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := cli.Get(ctx, key, opts...)
		if err != nil {
			return nil, 0, Unavailable("list "+prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		out = append(out, resp.Kvs...)
		if !resp.More || len(resp.Kvs) == 0 {
			return out, rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
