package spawner

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/moby/moby/client"
)

// The Docker back end reconciles the engine with what it holds while it runs: a container of
// this instance that no session holds (its removal failed, or a create whose answer was lost
// left it) is removed without waiting for the pool's next start or stop.
const (
	// reconcileInterval is how often it looks when nothing failed.
	reconcileInterval = 30 * time.Second
	// reconcileRetry is how soon it looks again after an engine call failed, until a look
	// succeeds: what the outage left is removed within it of the engine's return.
	reconcileRetry = 2 * time.Second
)

// Why a container this instance no longer holds is there, as the removal's log line says.
const (
	leftRemovalFailed = "its removal failed"
	leftCreateFailed  = "its create failed or its answer was lost"
	leftUnknown       = "no session or warm container of this instance holds it"
)

// containerPrefix heads the name of every container the pool makes:
// ringfence-<server ref, with what a name may not hold as _>-<16 hex digits>.
const containerPrefix = "ringfence-"

// poolName is the whole of such a name.
var poolName = regexp.MustCompile(`^` + containerPrefix + `[a-zA-Z0-9_.-]*-[0-9a-f]{16}$`)

// notOurs is the warning of a container that carries the pool's labels and a name the pool
// never gives: made by someone else (labels are anyone's to set), it is never removed.
const notOurs = "spawner: a container carries this pool's labels but a name the pool never gives it (ringfence-<server>-<16 hex digits>): it is not the pool's and is left alone; remove it, or its labels, yourself if it is not wanted"

// namedByThePool says whether a listed container's name is one the pool gives.
func namedByThePool(names []string) bool { return poolName.MatchString(containerName(names)) }

// hold reserves a container's name before its create is sent. The reconcile removes only
// containers whose names are not held, so one being created right now (its create call in
// flight, or its answer not yet read) is never removed: its name is held before the engine can
// list it. A name is exact and known up front, unlike a grace period measured from the
// container's Created time, which would leave a lost create's container for the whole grace
// and would still race a create slower than the grace (StartTimeout is 30 s by default).
func (d *Docker) hold(name string) {
	d.mu.Lock()
	if d.held == nil {
		d.held = map[string]struct{}{}
	}
	d.held[name] = struct{}{}
	d.mu.Unlock()
}

// unhold drops a name once no session holds its container: the container is removed, or
// failed to be, for which why says what happened ("" when it went as it should). A removal
// that failed, or a create that failed (which may have landed), brings the reconcile forward.
func (d *Docker) unhold(name, why string) {
	d.mu.Lock()
	delete(d.held, name)
	if why != "" {
		if d.leftover == nil {
			d.leftover = map[string]string{}
		}
		d.leftover[name] = why
	}
	d.mu.Unlock()
	if why != "" {
		d.engineFailed()
	}
}

// engineFailed has the reconcile look again within reconcileRetry, and so on until a look
// succeeds.
func (d *Docker) engineFailed() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// startReconcile starts the reconcile once, unless the back end is closed.
func (d *Docker) startReconcile() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.stopReconcile != nil {
		return
	}
	if d.every <= 0 {
		d.every = reconcileInterval
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.stopReconcile = cancel
	d.reconcileDone = make(chan struct{})
	go d.reconcileLoop(ctx, d.reconcileDone)
}

// endReconcile stops the reconcile and waits for it; no reconcile starts after it.
func (d *Docker) endReconcile() {
	d.mu.Lock()
	d.closed = true
	stop, done := d.stopReconcile, d.reconcileDone
	d.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

func (d *Docker) reconcileLoop(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	due := time.Now().Add(d.every)
	t := time.NewTimer(d.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.kick:
			// The engine just failed a call: it is likely down now, so the look waits a little
			// (and failures kept coming do not put it off further).
			if soon := time.Now().Add(reconcileRetry); soon.Before(due) {
				due = soon
				t.Reset(reconcileRetry)
			}
			continue
		case <-t.C:
		}
		next := d.every
		if err := d.reconcile(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			d.log.Debug("spawner: could not reconcile this instance's containers with the engine; trying again", "err", err, "in", reconcileRetry)
			next = reconcileRetry
		}
		due = time.Now().Add(next)
		t.Reset(next)
	}
}

// reconcile lists this instance's containers and removes every one no session holds, of those
// the pool named: a container someone else labelled as this instance's is left alone. It
// answers an error only when the engine could not be reached (the loop looks again within
// reconcileRetry); a removal the engine refused waits for the next look.
func (d *Docker) reconcile(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, sweepTimeout)
	defer cancel()
	f := client.Filters{}
	f.Add("label", LabelManaged+"=true", LabelPool+"="+d.cfg.PoolID, LabelInstance+"="+d.cfg.InstanceID)
	list, err := d.api.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return fmt.Errorf("spawner: list this instance's containers: %w", err)
	}
	listed := make(map[string]bool, len(list.Items))
	ids := make(map[string]bool, len(list.Items))
	var errs []error
	for _, c := range list.Items {
		name := containerName(c.Names)
		listed[name] = true
		ids[c.ID] = true
		if !namedByThePool(c.Names) {
			if d.tell(c.ID) {
				d.log.Warn(notOurs, "container", shortID(c.ID), "name", name)
			}
			continue
		}
		d.mu.Lock()
		_, held := d.held[name]
		why := d.leftover[name]
		d.mu.Unlock()
		if held {
			continue
		}
		if why == "" {
			why = leftUnknown
		}
		// Each removal has a bound of its own: one the engine never finishes (a container
		// stuck being removed) does not use up the look for the others.
		rctx, cancel := context.WithTimeout(ctx, removeTimeout)
		byUs, err := d.remove(rctx, c.ID)
		cancel()
		if err != nil {
			if client.IsErrConnectionFailed(err) || ctx.Err() != nil {
				errs = append(errs, err) // the engine is away: look again soon
				continue
			}
			// The engine answered and refused: looking again sooner than the interval would
			// only ask it again, for ever. It is tried at each look, and said once.
			if d.tell(c.ID) {
				d.log.Warn("spawner: the engine refused to remove a container this pool no longer holds; the pool asks again at each look: remove it yourself if it stays",
					"container", shortID(c.ID), "name", name, "reason", why, "every", d.every, "err", err)
			}
			continue
		}
		if byUs {
			d.reconciled.Add(1)
			d.log.Info("spawner: removed a container this pool no longer holds",
				"container", shortID(c.ID), "server", c.Labels[LabelServer], "reason", why)
		}
	}
	// What is no longer listed needs no reason kept; what failed to be removed keeps its own.
	d.mu.Lock()
	for name := range d.leftover {
		if !listed[name] {
			delete(d.leftover, name)
		}
	}
	for id := range d.told {
		if !ids[id] {
			delete(d.told, id)
		}
	}
	d.mu.Unlock()
	return errors.Join(errs...)
}

// tell says whether the container's warning is yet to be logged, and marks it logged.
func (d *Docker) tell(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.told[id] {
		return false
	}
	if d.told == nil {
		d.told = map[string]bool{}
	}
	d.told[id] = true
	return true
}

// Reconciled is how many containers the reconcile removed since the back end started.
func (d *Docker) Reconciled() int64 { return d.reconciled.Load() }

// containerName is a listed container's name, without the engine's leading slash.
func containerName(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return strings.TrimPrefix(names[0], "/")
}
