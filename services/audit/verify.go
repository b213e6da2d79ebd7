package audit

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ringfence/ringfence/services/audit/internal/store"
)

// verifier shares chain walks between Verify calls. Verify is open to every audit:read key
// and a walk reads the whole log (about 2 s and two cores per million records), so N callers
// must not cost N walks:
//
//   - At most one walk runs at a time. A caller joins the running walk when it started at
//     or past the caller's head; otherwise it waits for the next walk, which every such
//     caller shares and which starts when the running one ends. Each answer covers at least
//     the head its caller saw (VerifyResult.HeadSeq says which).
//   - A finished walk's answer is given again at once while the file is unchanged: same
//     head, and the same device, inode, size, mtime and ctime as when the walk began. Any
//     write to the file, an append of ours or an edit by anything else, changes ctime, which
//     no unprivileged process can set back; a walk's stamp is trusted only when taken at
//     least settle after the file's last change, so a write that lands within the same
//     timestamp tick as the one before still shows.
//   - A new head walks the whole log again. Walking only what is new since the last
//     verified head would trust that the records verified then are unchanged, and an append
//     changes the stamp exactly as an in-place edit does: nothing cheap tells them apart.
//   - Anchors are checked after the walk (store.CheckAnchor), so callers with different
//     anchors share it too.
//
// A walk runs under the verifier's own context: a caller that leaves does not fail the
// others, and the walk stops when every caller waiting for it has left.
type verifier struct {
	store *store.Store
	path  string
	// settle is how long after the file's last change a stamp can tell a later change
	// (coarse timestamps: a clock tick of a few ms on Linux, 1 s or 2 s on some
	// filesystems).
	settle time.Duration
	now    func() time.Time

	mu sync.Mutex
	// running is the walk in progress; next gathers the callers running cannot answer and
	// starts when it ends; last is the last walk that finished without error.
	running, next, last *walk
	// walks counts walks started.
	walks int
	// started, when set (tests), runs on a walk's goroutine before it reads anything.
	started func()

	ctx  context.Context // ends at close
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// walk is one chain walk and the callers waiting for it.
type walk struct {
	// minHead is the head when the walk started: it verifies at least that far.
	minHead uint64
	// stamp is the file's, taken before the walk read anything; trusted says it was taken
	// long enough after the file's last change.
	stamp   fileStamp
	trusted bool

	waiters   int
	abandoned bool // every waiter left and the walk was told to stop
	cancel    context.CancelFunc

	done chan struct{}
	res  store.VerifyResult
	err  error
}

// fileStamp identifies a state of the file: any write changes ctime.
type fileStamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

const defaultSettle = 2 * time.Second

func newVerifier(st *store.Store, path string) *verifier {
	ctx, stop := context.WithCancel(context.Background())
	return &verifier{store: st, path: path, settle: defaultSettle, now: time.Now, ctx: ctx, stop: stop}
}

// verify answers as store.VerifyThrough would, sharing the walk as the type says.
func (v *verifier) verify(ctx context.Context, anchor store.Anchor) (store.VerifyResult, error) {
	head, hash := v.store.Head()
	stamp, _ := v.stamp() // a trusted stamp is a stat that succeeded, never the zero one a failure gives
	v.mu.Lock()
	if l := v.last; l != nil && l.trusted && stamp == l.stamp && l.res.HeadSeq == head && l.res.HeadHash == hash {
		v.mu.Unlock()
		return v.store.CheckAnchor(l.res, anchor)
	}
	w := v.running
	if w == nil || w.abandoned || w.minHead < head {
		if v.next == nil {
			v.next = &walk{done: make(chan struct{})}
		}
		w = v.next
		if v.running == nil {
			v.startNext()
		}
	}
	w.waiters++
	v.mu.Unlock()

	select {
	case <-w.done:
		if w.err != nil {
			return store.VerifyResult{}, w.err
		}
		return v.store.CheckAnchor(w.res, anchor)
	case <-ctx.Done():
		v.mu.Lock()
		if w.waiters--; w.waiters == 0 {
			switch w {
			case v.next:
				v.next = nil
			case v.running:
				w.abandoned = true
				w.cancel()
			}
		}
		v.mu.Unlock()
		return store.VerifyResult{}, ctx.Err()
	}
}

// startNext starts the next walk. v.mu is held.
func (v *verifier) startNext() {
	w := v.next
	v.next, v.running = nil, w
	v.walks++
	// The stamp first: a write after it, even one that lands before the walk reads the
	// head, keeps this walk's answer from being given again.
	w.stamp, w.trusted = v.stamp()
	w.minHead, _ = v.store.Head()
	ctx, cancel := context.WithCancel(v.ctx)
	w.cancel = cancel
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		if v.started != nil {
			v.started()
		}
		res, err := v.store.Verify(ctx, nil)
		cancel()
		v.mu.Lock()
		w.res, w.err = res, err
		v.running = nil
		if err == nil {
			v.last = w
		}
		if v.next != nil {
			v.startNext()
		}
		v.mu.Unlock()
		close(w.done)
	}()
}

// stamp reads the file's stamp, and whether it was taken long enough after the file's last
// change to be trusted; false when the file cannot be read.
func (v *verifier) stamp() (fileStamp, bool) {
	var st unix.Stat_t
	if err := unix.Stat(v.path, &st); err != nil {
		return fileStamp{}, false
	}
	// Dev is not a uint64 on every platform.
	s := fileStamp{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
	return s, v.now().Sub(time.Unix(0, s.ctime)) >= v.settle
}

// close stops the running walk and waits for it.
func (v *verifier) close() {
	v.stop()
	v.wg.Wait()
}
