package spawner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
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
}

var _ DockerAPI = (*client.Client)(nil)

// Bounds of engine calls made while tearing down: they run even when the
// caller's context is done, so they carry their own.
const (
	removeTimeout = 10 * time.Second
	eventsTimeout = 3 * time.Second
	sweepTimeout  = 30 * time.Second
)

type dockerBackend struct {
	r      *Router
	api    DockerAPI
	closer io.Closer // the client New created, if any

	mu  sync.Mutex
	img *resolvedImage
}

type resolvedImage struct {
	id      string
	envKeys []string
}

func newDockerBackend(r *Router) (*dockerBackend, error) {
	d := &dockerBackend{r: r, api: r.cfg.Docker}
	if d.api == nil {
		c, err := client.New(client.FromEnv)
		if err != nil {
			return nil, fmt.Errorf("spawner: configure the Docker client: %w", err)
		}
		d.api, d.closer = c, c
	}
	return d, nil
}

func (d *dockerBackend) close() error {
	if d.closer != nil {
		return d.closer.Close()
	}
	return nil
}

// inspectImage resolves the configured reference to an image ID and checks
// that the image can be used; the result is cached for spawns.
func (d *dockerBackend) inspectImage(ctx context.Context) (*resolvedImage, error) {
	ref := d.r.image.Ref
	ctx, cancel := context.WithTimeout(ctx, d.r.cfg.StartTimeout)
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
			return nil, newError(ClassSpawnFailed, "the Docker engine did not answer an image inspect within %s", d.r.cfg.StartTimeout)
		}
		return nil, newError(ClassSpawnFailed, "inspect the isolation image %s: %s", ref, clip(err.Error(), 300))
	}
	if d.r.image.ID != "" && res.ID != d.r.image.ID {
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

func (d *dockerBackend) image(ctx context.Context) (*resolvedImage, error) {
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
func (d *dockerBackend) sweep(ctx context.Context, scope sweepScope) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, sweepTimeout)
	defer cancel()
	f := client.Filters{}
	f.Add("label", LabelManaged+"=true", LabelPool+"="+d.r.cfg.PoolID)
	if scope == sweepOwn {
		f.Add("label", LabelInstance+"="+d.r.cfg.InstanceID)
	}
	list, err := d.api.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return 0, fmt.Errorf("spawner: list this pool's containers: %w", err)
	}
	removed := 0
	var errs []error
	for _, c := range list.Items {
		if scope == sweepOthers && c.Labels[LabelInstance] == d.r.cfg.InstanceID {
			continue
		}
		byUs, err := d.remove(ctx, c.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if byUs {
			removed++
			d.r.log.Info("spawner: removed a container of this pool",
				"container", shortID(c.ID), "server", c.Labels[LabelServer], "instance", c.Labels[LabelInstance])
		}
	}
	return removed, errors.Join(errs...)
}

// waitGone polls until the container no longer exists or ctx ends.
// remove force-removes a container and returns once it is gone; byUs says whether this call
// removed it. One already gone, or that the engine is removing already (AutoRemove after its
// stdin closed), is waited for rather than reported as a failure.
func (d *dockerBackend) remove(ctx context.Context, id string) (byUs bool, err error) {
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

func (d *dockerBackend) waitGone(ctx context.Context, id string) bool {
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

func (d *dockerBackend) spawn(ctx context.Context, spec *Spec) (*Session, error) {
	cfg := &d.r.cfg
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
	secrets := secretsOf(spec)
	c := &dockerServer{
		d:       d,
		name:    "ringfence-" + nameUnsafe.ReplaceAllString(spec.ServerRef, "_") + "-" + randomID(),
		command: spec.Command,
		tail:    newTail(cfg.StderrTailBytes, secrets),
		secrets: secrets,
		goneCh:  make(chan struct{}),
		exited:  make(chan struct{}),
	}

	engineCtx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	c.created = time.Now()
	created, err := d.api.ContainerCreate(engineCtx, client.ContainerCreateOptions{Name: c.name, Config: cc, HostConfig: hc})
	if err != nil {
		// The create may have landed even though its answer did not.
		c.removeByName()
		return nil, c.engineError(ctx, "create the container", err)
	}
	c.id = created.ID

	att, err := d.api.ContainerAttach(engineCtx, c.id, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		c.forceRemove()
		return nil, c.engineError(ctx, "attach to the container", err)
	}
	c.att = att.HijackedResponse

	// The wait is registered before the start so that no exit can be missed;
	// "removed" returns once AutoRemove (or a forced removal) is done.
	bg, stopWait := context.WithCancel(context.Background())
	c.stopWait = stopWait
	wait := d.api.ContainerWait(bg, c.id, client.ContainerWaitOptions{Condition: container.WaitConditionRemoved})
	go c.awaitExit(wait)

	pr, pw := io.Pipe()
	c.stdout = pr
	c.filter = newStdoutFilter(pw, c.tail, cfg.MaxMessageBytes)
	c.copyDone = make(chan struct{})
	go c.copyOutput()

	if _, err := d.api.ContainerStart(engineCtx, c.id, client.ContainerStartOptions{}); err != nil {
		// A container that never started is not removed by AutoRemove.
		_ = c.forceRemove()
		c.release(nil)
		return nil, c.engineError(ctx, "start the container", err)
	}

	transport := &mcp.IOTransport{Reader: pr, Writer: stdinWriter{conn: c.att.Conn, closer: &c.att, timeout: stdinWriteTimeout}, MaxLineLength: cfg.MaxMessageBytes}
	guard := newTrafficGuard()
	cs, err := connect(ctx, spec, transport, guard)
	if err != nil {
		e := handshakeError(ctx, err, c, c.filter, c.tail, spec)
		c.stop(context.WithoutCancel(ctx), nil)
		return nil, e
	}
	return newSession(d.r, spec, c, cs, guard, c.tail), nil
}

// dockerServer is one running container.
type dockerServer struct {
	d       *dockerBackend
	id      string
	name    string
	command string
	created time.Time
	tail    *tail
	secrets []string

	att      client.HijackedResponse
	stdout   *io.PipeReader
	filter   *stdoutFilter
	copyDone chan struct{}

	goneCh   chan struct{}
	goneOnce sync.Once
	stopWait context.CancelFunc
	exited   chan struct{}
	exitCode int64
	exitErr  error
	removed  bool
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
	_, err := stdcopy.StdCopy(c.filter, c.tail, c.att.Reader)
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	c.filter.finish(err)
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
func (c *dockerServer) gone() <-chan struct{}   { return c.goneCh }
func (c *dockerServer) hasExited() bool         { return isClosed(c.exited) && c.exitErr == nil }
func (c *dockerServer) exitStatus() (int, bool) { return int(c.exitCode), c.hasExited() }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitExited waits up to d for the exit status.
func (c *dockerServer) waitExited(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-t.C:
	case <-ctx.Done():
	}
	return c.hasExited()
}

func (c *dockerServer) death(ctx context.Context) *Error {
	return deathError(ctx, c, c.filter, c.d.r.cfg.MaxMessageBytes)
}

// describeExit says how the container ended, asking the engine whether the
// kernel's OOM killer was involved.
func (c *dockerServer) describeExit(ctx context.Context) string {
	code := c.exitCode
	if c.oomKilled(ctx) {
		return fmt.Sprintf("killed: memory limit (%d MiB) reached", c.d.r.cfg.MemoryBytes>>20)
	}
	if code > 128 && code < 128+65 {
		return fmt.Sprintf("killed by signal %d", code-128)
	}
	return fmt.Sprintf("exited with status %d", code)
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
	res := c.d.api.Events(ctx, client.EventsListOptions{
		Since:   strconv.FormatInt(c.created.Add(-time.Minute).Unix(), 10),
		Until:   strconv.FormatInt(time.Now().Unix()+1, 10),
		Filters: f,
	})
	for {
		select {
		case m, ok := <-res.Messages:
			if !ok {
				return false
			}
			if m.Action == events.ActionOOM && m.Actor.ID == c.id {
				return true
			}
		case <-res.Err:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func (c *dockerServer) stop(ctx context.Context, cs *mcp.ClientSession) error {
	cfg := &c.d.r.cfg
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
// by then the container is removed or the engine refused to remove it.
func (c *dockerServer) release(clientDone <-chan struct{}) {
	c.att.Close()
	_ = c.stdout.Close()
	<-c.copyDone
	c.stopWait()
	<-c.exited
	if clientDone != nil {
		<-clientDone
	}
}

// waitRemoved waits up to d for the engine to report the container removed.
func (c *dockerServer) waitRemoved(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-t.C:
	case <-ctx.Done():
	}
	return isClosed(c.exited) && c.removed
}

func (c *dockerServer) forceRemove() error {
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	if _, err := c.d.remove(ctx, c.id); err != nil {
		c.d.r.log.Error("spawner: could not remove a container; the pool's next sweep removes it",
			"container", shortID(c.id), "error", err)
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
		return newError(ClassImageMissing, "the isolation image %s is not in the engine any more: build or load it again", c.d.r.image.Ref)
	case what == "start the container" && strings.Contains(msg, "executable file not found"):
		return newError(ClassCommandNotFound, "command %s was not found in the isolation image", clipQuote(c.command))
	case cerrdefs.IsDeadlineExceeded(err) || errors.Is(err, context.DeadlineExceeded):
		return newError(ClassSpawnFailed, "the Docker engine did not %s within %s", what, c.d.r.cfg.StartTimeout)
	}
	return newError(ClassSpawnFailed, "%s: %s", what, msg)
}

// imageGone reports whether the isolation image is missing from the engine
// (a create can also fail "not found" for a missing network); it drops the
// cached resolution so that the next spawn checks again.
func (c *dockerServer) imageGone() bool {
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	_, err := c.d.api.ImageInspect(ctx, c.d.r.image.Ref)
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
