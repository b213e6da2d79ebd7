package spawner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// DockerAPI is the part of the Engine API the spawner uses.
type DockerAPI interface {
	ImageInspect(ctx context.Context, image string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ContainerCreate(ctx context.Context, opts client.ContainerCreateOptions) (client.ContainerCreateResult, error)
	ContainerAttach(ctx context.Context, id string, opts client.ContainerAttachOptions) (client.ContainerAttachResult, error)
	ContainerStart(ctx context.Context, id string, opts client.ContainerStartOptions) (client.ContainerStartResult, error)
	ContainerWait(ctx context.Context, id string, opts client.ContainerWaitOptions) client.ContainerWaitResult
	ContainerRemove(ctx context.Context, id string, opts client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
	ContainerList(ctx context.Context, opts client.ContainerListOptions) (client.ContainerListResult, error)
	Events(ctx context.Context, opts client.EventsListOptions) client.EventsResult
	Info(ctx context.Context, opts client.InfoOptions) (client.SystemInfoResult, error)
}

var _ DockerAPI = (*client.Client)(nil)

// Bounds of engine calls made while tearing down: they run even when the
// caller's context is done, so they carry their own.
const (
	removeTimeout = 10 * time.Second
	eventsTimeout = 3 * time.Second
	sweepTimeout  = 30 * time.Second
)

// Docker is the back end of stdio servers in the isolation image: each server runs in a
// container of the operator's digest-pinned image under a fixed, hardened profile that
// nothing in a registration can change, on the OCI runtime the operator chose.
type Docker struct {
	cfg    Config
	ref    ImageRef
	log    *slog.Logger
	api    DockerAPI
	closer io.Closer // the client NewDocker created, if any

	mu  sync.Mutex
	img *resolvedImage
	// held are the names of the containers this instance's sessions hold, each reserved
	// before its create is sent and dropped once it is removed or failed to be; leftover
	// says why a container no longer held may still be there (reconcile.go).
	held     map[string]struct{}
	leftover map[string]string
	// told are the containers the reconcile has logged at warn (one it leaves alone as not the
	// pool's, one whose removal the engine refused), so each is said once while it is listed.
	told map[string]bool
	// The reconcile: every is its interval, kick brings it forward after a failed engine
	// call; it runs from the first Preflight that finds the image usable until Close.
	every         time.Duration
	kick          chan struct{}
	closed        bool
	stopReconcile context.CancelFunc
	reconcileDone chan struct{}
	reconciled    atomic.Int64
}

var _ Backend = (*Docker)(nil)

type resolvedImage struct {
	id      string
	envKeys []string
}

// NewDocker validates cfg (a pinned Image, a PoolID, the limits) and returns the back end. It
// uses cfg.Docker as the engine client, or creates one from the environment (closed by
// Close). It does not contact the engine; Preflight does.
func NewDocker(cfg Config) (*Docker, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	if cfg.Image == "" {
		return nil, fmt.Errorf("spawner: the Docker back end needs an isolation image (%s)", IsolationImageEnv)
	}
	ref, err := ParseImageRef(cfg.Image)
	if err != nil {
		return nil, err
	}
	d := &Docker{cfg: cfg, ref: ref, log: cfg.Logger, api: cfg.Docker,
		held: map[string]struct{}{}, leftover: map[string]string{}, every: reconcileInterval, kick: make(chan struct{}, 1)}
	if d.api == nil {
		c, err := client.New(client.FromEnv)
		if err != nil {
			return nil, fmt.Errorf("spawner: configure the Docker client: %w", err)
		}
		d.api, d.closer = c, c
	}
	return d, nil
}

// Name is "docker".
func (d *Docker) Name() string { return "docker" }

// Serves stdio servers.
func (d *Docker) Serves(transport string) bool { return transport == TransportStdio }

// Preflight checks that the engine has the configured runtime and the isolation image and
// that the image can be used, and removes every container an earlier instance of this pool
// left behind. It is safe to run again while sessions are open. From the first that finds the
// image usable until Close, the back end reconciles: it removes every container of this
// instance that no session holds (reconcile.go).
func (d *Docker) Preflight(ctx context.Context) (Report, error) {
	rep := Report{Isolation: d.Name(), ImageRef: d.ref.Ref}
	runtime, err := d.checkRuntime(ctx)
	if err != nil {
		return rep, err
	}
	rep.Runtime = runtime
	img, err := d.inspectImage(ctx)
	if err != nil {
		return rep, err
	}
	rep.ImageID, rep.ImageEnvKeys = img.id, img.envKeys
	d.startReconcile()
	n, err := d.sweep(ctx, sweepOthers)
	rep.Swept = n
	var refused *removalsFailed
	if errors.As(err, &refused) {
		// The engine answered, and would not remove some: failing the start for them would
		// only start the pool again, and again, over the same containers (a unit that
		// restarts on failure never serves). The next start's sweep asks again.
		d.log.Warn("spawner: some containers an earlier instance of this pool left could not be removed; the pool starts all the same, and its next start tries again: remove them yourself if they stay",
			"containers", refused.n, "err", refused.err)
		return rep, nil
	}
	return rep, err
}

// removalsFailed is a sweep's error when its list was read but some removals failed.
type removalsFailed struct {
	n   int
	err error
}

func (e *removalsFailed) Error() string { return e.err.Error() }
func (e *removalsFailed) Unwrap() error { return e.err }

// sweepParallel bounds the removals a sweep has in flight: a thousand leftovers are removed in
// one sweep, without one engine call at a time adding up past any bound.
const sweepParallel = 8

// Sweep force-removes every container labelled with this PoolID, this instance's included.
func (d *Docker) Sweep(ctx context.Context) (int, error) { return d.sweep(ctx, sweepAll) }

// Close removes any container of this instance that is still left and closes an engine
// client NewDocker created.
func (d *Docker) Close(ctx context.Context) error {
	d.endReconcile()
	_, err := d.sweep(context.WithoutCancel(ctx), sweepOwn)
	if d.closer != nil {
		err = errors.Join(err, d.closer.Close())
	}
	return err
}

// checkRuntime makes sure the engine has the OCI runtime containers are to run on, and returns
// its name: the configured one (RuntimeEnv), or the engine's default.
func (d *Docker) checkRuntime(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.StartTimeout)
	defer cancel()
	res, err := d.api.Info(ctx, client.InfoOptions{})
	if err != nil {
		if ctx.Err() != nil {
			return "", newError(ClassSpawnFailed, "the Docker engine did not answer within %s", d.cfg.StartTimeout)
		}
		return "", newError(ClassSpawnFailed, "ask the Docker engine for its runtimes: %s", clip(err.Error(), 300))
	}
	want := d.cfg.Runtime
	if want == "" {
		return res.Info.DefaultRuntime, nil
	}
	if _, ok := res.Info.Runtimes[want]; !ok {
		have := slices.Sorted(maps.Keys(res.Info.Runtimes))
		return "", newError(ClassRuntimeMissing, "the Docker engine has no runtime %q (it has: %s): install it and register it with the engine (daemon.json \"runtimes\"), or unset %s to run on the engine's default, %s",
			want, strings.Join(have, ", "), RuntimeEnv, res.Info.DefaultRuntime)
	}
	return want, nil
}

// inspectImage resolves the configured reference to an image ID and checks
// that the image can be used; the result is cached for spawns.
func (d *Docker) inspectImage(ctx context.Context) (*resolvedImage, error) {
	ref := d.ref.Ref
	ctx, cancel := context.WithTimeout(ctx, d.cfg.StartTimeout)
	defer cancel()
	res, err := d.api.ImageInspect(ctx, ref)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			if strings.Contains(ref, "@") {
				// The pool never pulls: what runs is exactly what the operator put in the engine.
				return nil, newError(ClassImageMissing, "the isolation image %s is not in the engine: pull it on this host first (docker pull %s); the pool never pulls", ref, ref)
			}
			return nil, newError(ClassImageMissing, "the isolation image %s is not in the engine: build it with `ringfence image build` or load it, then use the reference it prints", ref)
		}
		if ctx.Err() != nil {
			return nil, newError(ClassSpawnFailed, "the Docker engine did not answer an image inspect within %s", d.cfg.StartTimeout)
		}
		return nil, newError(ClassSpawnFailed, "inspect the isolation image %s: %s", ref, clip(err.Error(), 300))
	}
	if d.ref.ID != "" && res.ID != d.ref.ID {
		return nil, newError(ClassImageRejected, "the engine resolved %s to a different image (%s)", ref, res.ID)
	}
	img := &resolvedImage{id: res.ID}
	if cfg := res.Config; cfg != nil {
		if len(cfg.Volumes) > 0 {
			vols := make([]string, 0, len(cfg.Volumes))
			for v := range cfg.Volumes {
				vols = append(vols, v)
			}
			slices.Sort(vols)
			return nil, newError(ClassImageRejected, "the isolation image %s declares VOLUME %s: the engine would give every container a writable volume outside the read-only root; rebuild it without VOLUME", ref, strings.Join(vols, ", "))
		}
		for _, kv := range cfg.Env {
			k, _, _ := strings.Cut(kv, "=")
			img.envKeys = append(img.envKeys, k)
		}
		slices.Sort(img.envKeys)
	}
	d.mu.Lock()
	d.img = img
	d.mu.Unlock()
	return img, nil
}

func (d *Docker) image(ctx context.Context) (*resolvedImage, error) {
	d.mu.Lock()
	img := d.img
	d.mu.Unlock()
	if img != nil {
		return img, nil
	}
	return d.inspectImage(ctx)
}

// sweepScope says which of this pool's containers a sweep removes.
type sweepScope int

const (
	// sweepOthers: those of earlier instances (Preflight; safe while this
	// instance has sessions open).
	sweepOthers sweepScope = iota
	// sweepOwn: this instance's (Router.Close, after its sessions closed).
	sweepOwn
	// sweepAll: every container labelled with the PoolID.
	sweepAll
)

// sweep force-removes this pool's containers in scope.
func (d *Docker) sweep(parent context.Context, scope sweepScope) (int, error) {
	ctx, cancel := context.WithTimeout(parent, sweepTimeout)
	defer cancel()
	f := client.Filters{}
	f.Add("label", LabelManaged+"=true", LabelPool+"="+d.cfg.PoolID)
	if scope == sweepOwn {
		f.Add("label", LabelInstance+"="+d.cfg.InstanceID)
	}
	list, err := d.api.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return 0, fmt.Errorf("spawner: list this pool's containers: %w", err)
	}
	var (
		mu      sync.Mutex
		removed int
		errs    []error
		wg      sync.WaitGroup
		slots   = make(chan struct{}, sweepParallel)
	)
	for _, c := range list.Items {
		if scope == sweepOthers && c.Labels[LabelInstance] == d.cfg.InstanceID {
			continue
		}
		if !namedByThePool(c.Names) {
			d.log.Warn(notOurs, "container", shortID(c.ID), "name", containerName(c.Names))
			continue
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			// Each removal has its own bound, past the list's: what the list found is removed
			// however many there are.
			rctx, cancel := context.WithTimeout(parent, removeTimeout)
			defer cancel()
			byUs, err := d.remove(rctx, c.ID)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if byUs {
				removed++
				d.log.Info("spawner: removed a container of this pool",
					"container", shortID(c.ID), "server", c.Labels[LabelServer], "instance", c.Labels[LabelInstance])
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return removed, &removalsFailed{n: len(errs), err: errors.Join(errs...)}
	}
	return removed, nil
}

// waitGone polls until the container no longer exists or ctx ends.
// remove force-removes a container and returns once it is gone; byUs says whether this call
// removed it. One already gone, or that the engine is removing already (AutoRemove after its
// stdin closed), is waited for rather than reported as a failure.
func (d *Docker) remove(ctx context.Context, id string) (byUs bool, err error) {
	_, err = d.api.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true})
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err):
		return false, nil
	case cerrdefs.IsConflict(err) || strings.Contains(err.Error(), "already in progress"):
		if !d.waitGone(ctx, id) {
			return false, fmt.Errorf("spawner: container %s is still being removed: %w", shortID(id), ctx.Err())
		}
		return false, nil
	default:
		return false, fmt.Errorf("spawner: remove container %s: %w", shortID(id), err)
	}
}

func (d *Docker) waitGone(ctx context.Context, id string) bool {
	f := client.Filters{}
	f.Add("id", id)
	for {
		if list, err := d.api.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f}); err == nil && len(list.Items) == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

var nameUnsafe = regexp.MustCompile(`[^a-zA-Z0-9_.-]`)

// Spawn starts the server in a container of the isolation image and connects over its
// attached stdio.
func (d *Docker) Spawn(ctx context.Context, spec *Spec, kit *Kit) (*Session, error) {
	cfg := &d.cfg
	env, err := checkEnv(spec.Env, cfg.AllowedEnvKeys)
	if err != nil {
		return nil, err
	}
	img, err := d.image(ctx)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		LabelManaged:  "true",
		LabelPool:     cfg.PoolID,
		LabelInstance: cfg.InstanceID,
		LabelServer:   spec.ServerRef,
		LabelPurpose:  spec.Purpose,
		LabelRun:      spec.RunID,
	}
	cc, hc := containerShape(cfg, img.id, spec, env, labels)
	c := &dockerServer{
		d:       d,
		name:    containerPrefix + nameUnsafe.ReplaceAllString(spec.ServerRef, "_") + "-" + randomID(),
		command: spec.Command,
		st:      kit.NewStdio(spec),
		secrets: secretsOf(spec),
		goneCh:  make(chan struct{}),
		exited:  make(chan struct{}),
	}

	// A caller that already gave up starts nothing.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("spawner: create the container: %w", err)
	}
	engineCtx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	c.created = time.Now()
	// Held before the engine can list it, so the reconcile never removes it while its create
	// is in flight.
	d.hold(c.name)
	// The create is not cut short by the caller: an abandoned request can still land in the
	// engine after any removal sent on its behalf, leaving a container that was never started
	// (which AutoRemove never removes). It ends with the engine's answer, or StartTimeout.
	createCtx, cancelCreate := context.WithTimeout(context.WithoutCancel(ctx), cfg.StartTimeout)
	created, err := d.api.ContainerCreate(createCtx, client.ContainerCreateOptions{Name: c.name, Config: cc, HostConfig: hc})
	cancelCreate()
	if err != nil {
		// The create may have landed even though its answer did not (StartTimeout), or land
		// later still: the reconcile removes what removeByName cannot.
		c.removeByName()
		d.unhold(c.name, leftCreateFailed)
		return nil, c.engineError(ctx, "create the container", err)
	}
	c.id = created.ID
	if err := ctx.Err(); err != nil {
		_ = c.forceRemove() // logged there; the reconcile removes what it could not
		d.unhold(c.name, c.leftWhy)
		return nil, fmt.Errorf("spawner: create the container: %w", err)
	}

	att, err := d.api.ContainerAttach(engineCtx, c.id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		_ = c.forceRemove() // logged there; the reconcile removes what it could not
		d.unhold(c.name, c.leftWhy)
		return nil, c.engineError(ctx, "attach to the container", err)
	}
	c.att = att.HijackedResponse

	// The wait is registered before the start so that no exit can be missed;
	// "removed" returns once AutoRemove (or a forced removal) is done.
	bg, stopWait := context.WithCancel(context.Background())
	c.stopWait = stopWait
	wait := d.api.ContainerWait(bg, c.id, client.ContainerWaitOptions{Condition: container.WaitConditionRemoved})
	go c.awaitExit(wait)

	c.copyDone = make(chan struct{})
	go c.copyOutput()

	if _, err := d.api.ContainerStart(engineCtx, c.id, client.ContainerStartOptions{}); err != nil {
		// A container that never started is not removed by AutoRemove.
		_ = c.forceRemove()
		c.release(nil)
		return nil, c.engineError(ctx, "start the container", err)
	}
	return kit.ConnectStdio(ctx, spec, c, c.st, stdinWriter{conn: c.att.Conn, closer: &c.att, timeout: stdinWriteTimeout})
}

// dockerServer is one running container.
type dockerServer struct {
	d       *Docker
	id      string
	name    string
	command string
	created time.Time
	st      *Stdio
	secrets []string

	att      client.HijackedResponse
	copyDone chan struct{}

	goneCh   chan struct{}
	goneOnce sync.Once
	stopWait context.CancelFunc
	exited   chan struct{}
	exitCode int64
	exitErr  error
	removed  bool
	// leftWhy is set when a forced removal failed: the reconcile removes the container.
	leftWhy string
}

// stdinWriter is the container's stdin; closing it half-closes the attach
// connection, which the engine passes on as EOF (StdinOnce). Each write must finish
// within timeout: a server that stops reading its stdin would otherwise block the
// session's writes, and with them its calls and its close, past every call timeout.
type stdinWriter struct {
	conn    net.Conn
	closer  interface{ CloseWrite() error }
	timeout time.Duration
}

// stdinWriteTimeout bounds one write to a server's stdin: generous (the default call
// timeout), since only a server that stops reading for that long meets it.
const stdinWriteTimeout = 30 * time.Second

func (w stdinWriter) Write(p []byte) (int, error) {
	_ = w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
	n, err := w.conn.Write(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("the server has not read its stdin for %s: %w", w.timeout, err)
	}
	return n, err
}

func (w stdinWriter) Close() error { return w.closer.CloseWrite() }

func (c *dockerServer) copyOutput() {
	defer close(c.copyDone)
	_, err := stdcopy.StdCopy(c.st.Stdout(), c.st.Stderr(), c.att.Reader)
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	c.st.EndStdout(err)
	c.markGone()
}

// awaitExit records the exit status. It does not decide that the server is
// gone: the end of its output stream does, so that a failed wait request
// cannot end a healthy session.
func (c *dockerServer) awaitExit(w client.ContainerWaitResult) {
	defer close(c.exited)
	select {
	case res := <-w.Result:
		c.exitCode = res.StatusCode
		c.removed = true
	case err := <-w.Error:
		c.exitErr = err
	}
}

func (c *dockerServer) markGone()               { c.goneOnce.Do(func() { close(c.goneCh) }) }
func (c *dockerServer) Gone() <-chan struct{}   { return c.goneCh }
func (c *dockerServer) hasExited() bool         { return isClosed(c.exited) && c.exitErr == nil }
func (c *dockerServer) ExitStatus() (int, bool) { return int(c.exitCode), c.hasExited() }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// WaitExited waits up to d for the exit status.
func (c *dockerServer) WaitExited(ctx context.Context, d time.Duration) bool {
	c.waitExitedFor(ctx, d)
	return c.hasExited()
}

// waitExitedFor waits until the container's wait ends (c.exited), d passes or ctx ends.
func (c *dockerServer) waitExitedFor(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-t.C:
	case <-ctx.Done():
	}
}

func (c *dockerServer) Death(ctx context.Context) *Error {
	return c.st.Death(ctx, c)
}

// DescribeExit says how the container ended, asking the engine whether the
// kernel's OOM killer was involved.
func (c *dockerServer) DescribeExit(ctx context.Context) string {
	code := c.exitCode
	if c.oomKilled(ctx) {
		return fmt.Sprintf("killed: memory limit (%d MiB) reached", c.d.cfg.MemoryBytes>>20)
	}
	if code > 128 && code < 128+65 {
		return fmt.Sprintf("killed by signal %d", code-128)
	}
	return fmt.Sprintf("exited with status %d", code)
}

// eventsWindow is the span of the engine's events (unix seconds, by its wall clock) that covers
// a container's life: created is when it was created by the wall clock then, age how long ago
// by the monotonic clock, now the wall clock now. It starts at the earlier of its creation by
// either reckoning, so a wall clock set back during the container's life (events stamped on
// the new clock) leaves its events inside, as does one set forward.
func eventsWindow(created time.Time, age time.Duration, now time.Time) (since, until string) {
	start := min(created.Unix(), now.Add(-age).Unix()) - 60
	return strconv.FormatInt(start, 10), strconv.FormatInt(now.Unix()+1, 10)
}

// oomKilled looks for the engine's "oom" event of this container. The
// container is already removed (AutoRemove), so inspecting State.OOMKilled is
// not possible; the engine keeps recent events.
func (c *dockerServer) oomKilled(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, eventsTimeout)
	defer cancel()
	f := client.Filters{}
	f.Add("type", string(events.ContainerEventType))
	f.Add("container", c.id)
	f.Add("event", string(events.ActionOOM))
	since, until := eventsWindow(c.created.Round(0), time.Since(c.created), time.Now())
	res := c.d.api.Events(ctx, client.EventsListOptions{Since: since, Until: until, Filters: f})
	for {
		select {
		case m, ok := <-res.Messages:
			if !ok {
				return false
			}
			if m.Action == events.ActionOOM && m.Actor.ID == c.id {
				return true
			}
		case err := <-res.Err:
			// No event stream, no answer: the failure stays classed as a crash.
			c.d.log.Debug("spawner: the engine's events could not be read to tell an OOM kill", "container", shortID(c.id), "err", err)
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func (c *dockerServer) Stop(ctx context.Context, cs *mcp.ClientSession) error {
	cfg := &c.d.cfg
	// Gracefully: end the MCP session, which closes stdin; the engine then
	// closes the container's stdin, the server exits and AutoRemove deletes
	// the container.
	var clientDone <-chan struct{}
	if cs != nil {
		clientDone = closeClient(cs, cfg.CloseTimeout)
	} else {
		_ = c.att.CloseWrite()
	}
	graceful := c.waitRemoved(ctx, cfg.CloseTimeout)
	var err error
	if !graceful {
		err = c.forceRemove()
		c.waitRemoved(context.Background(), removeTimeout)
	}
	c.release(clientDone)
	return err
}

// release closes the stream and waits for every goroutine of this container;
// by then the container is removed or the engine refused to remove it, and it is held no
// more (the reconcile removes it if it is still there).
func (c *dockerServer) release(clientDone <-chan struct{}) {
	c.att.Close()
	_ = c.st.Close()
	<-c.copyDone
	c.stopWait()
	<-c.exited
	if clientDone != nil {
		<-clientDone
	}
	c.d.unhold(c.name, c.leftWhy)
}

// waitRemoved waits up to d for the engine to report the container removed.
func (c *dockerServer) waitRemoved(ctx context.Context, d time.Duration) bool {
	c.waitExitedFor(ctx, d)
	return isClosed(c.exited) && c.removed
}

func (c *dockerServer) forceRemove() error {
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	if _, err := c.d.remove(ctx, c.id); err != nil {
		c.leftWhy = leftRemovalFailed
		c.d.log.Error("spawner: could not remove a container; the pool removes it once the engine answers again",
			"container", shortID(c.id), "err", err)
		return err
	}
	return nil
}

func (c *dockerServer) removeByName() {
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	_, _ = c.d.api.ContainerRemove(ctx, c.name, client.ContainerRemoveOptions{Force: true})
}

// engineError classifies a failed engine call made while starting.
func (c *dockerServer) engineError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("spawner: %s: %w", what, ctx.Err())
	}
	msg := clip(redactString(err.Error(), c.secrets), 300)
	switch {
	case cerrdefs.IsNotFound(err) && what == "create the container" && c.imageGone():
		return newError(ClassImageMissing, "the isolation image %s is not in the engine any more: build or load it again", c.d.ref.Ref)
	case what == "start the container" && strings.Contains(msg, "executable file not found"):
		return newError(ClassCommandNotFound, "command %s was not found in the isolation image", clipQuote(c.command))
	case cerrdefs.IsDeadlineExceeded(err) || errors.Is(err, context.DeadlineExceeded):
		return newError(ClassSpawnFailed, "the Docker engine did not %s within %s", what, c.d.cfg.StartTimeout)
	}
	return newError(ClassSpawnFailed, "%s: %s", what, msg)
}

// imageGone reports whether the isolation image is missing from the engine
// (a create can also fail "not found" for a missing network); it drops the
// cached resolution so that the next spawn checks again.
func (c *dockerServer) imageGone() bool {
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	_, err := c.d.api.ImageInspect(ctx, c.d.ref.Ref)
	if !cerrdefs.IsNotFound(err) {
		return false
	}
	c.d.mu.Lock()
	c.d.img = nil
	c.d.mu.Unlock()
	return true
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
