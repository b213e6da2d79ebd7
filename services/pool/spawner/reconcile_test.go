package spawner

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

// lockedBuffer is a log destination the reconcile's goroutine and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestTheReconcileRemovesWhatNoSessionHolds: while the Docker back end runs, a container with
// this instance's labels that no session holds (as a create whose answer was lost leaves it)
// is removed without a restart of the pool, and logged; the containers of live sessions, and
// of sessions being started while it looks, are left alone.
func TestTheReconcileRemovesWhatNoSessionHolds(t *testing.T) {
	e := dockerEnv(t)
	ctx := t.Context()
	logs := &lockedBuffer{}
	r := e.router(func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	d := r.backends[0].(*Docker)
	d.every = 20 * time.Millisecond // it looks all the time: a create in flight must survive it
	_, err := r.Preflight(ctx)
	require.NoError(t, err)

	live := spawn(t, r, fixtureSpec())
	t.Cleanup(func() { _ = live.Close(context.Background()) })
	held := e.containers()
	require.Len(t, held, 1)
	lost := e.createLost(t, r.cfg.InstanceID)
	other := e.createLabelled(t, "another-instance")

	require.Eventually(t, func() bool { return !slices.Contains(e.containers(), lost) },
		30*time.Second, 50*time.Millisecond, "the container no session holds is removed")
	require.EqualValues(t, 1, r.Reconciled(), "counted")
	require.Contains(t, logs.String(), `msg="spawner: removed a container this pool no longer holds" container=`+shortID(lost)+" server=orphan")

	// Sessions started while it looks every 20 ms all start and answer.
	var wg sync.WaitGroup
	more := make([]*Session, 3)
	errs := make([]error, 3)
	for i := range more {
		wg.Go(func() { more[i], errs[i] = r.Spawn(ctx, fixtureSpec()) })
	}
	wg.Wait()
	for i, s := range more {
		require.NoError(t, errs[i])
		_, err := s.ListTools(ctx)
		require.NoError(t, err, "a session started while the reconcile ran keeps its container")
		require.NoError(t, s.Close(ctx))
	}
	_, err = live.ListTools(ctx)
	require.NoError(t, err, "the live session keeps its container")
	require.ElementsMatch(t, append(held, other), e.containers(), "another instance's container is left to that instance")
	require.NoError(t, live.Close(ctx))
	require.NoError(t, r.Close(ctx))
}

// createLost creates, and does not start, a container labelled as instance's: what a create
// whose answer was lost leaves in the engine.
func (e *env) createLost(t *testing.T, instance string) string {
	t.Helper()
	return e.createNamed(t, containerPrefix+"orphan-"+randomID(), instance)
}

// createNamed creates, and does not start, a container named name with instance's labels.
func (e *env) createNamed(t *testing.T, name, instance string) string {
	t.Helper()
	res, err := e.docker.ContainerCreate(t.Context(), client.ContainerCreateOptions{
		Name: name,
		Config: &container.Config{
			Image: e.image, User: "65534:65534", Entrypoint: []string{"mcpfixture", "--idle"},
			Labels: map[string]string{LabelManaged: "true", LabelPool: e.poolID, LabelInstance: instance, LabelServer: "orphan"},
		},
		HostConfig: &container.HostConfig{NetworkMode: "none", ReadonlyRootfs: true, CapDrop: []string{"ALL"}},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = e.docker.ContainerRemove(context.Background(), res.ID, client.ContainerRemoveOptions{Force: true})
	})
	return res.ID
}

// refusingEngine is the engine, but for the removal of one container, which it refuses as an
// engine does that cannot unmount its file system; it counts the removals it refused.
type refusingEngine struct {
	DockerAPI
	mu       sync.Mutex
	refuse   string
	refusals int
}

func (e *refusingEngine) ContainerRemove(ctx context.Context, id string, opts client.ContainerRemoveOptions) (client.ContainerRemoveResult, error) {
	e.mu.Lock()
	if id == e.refuse {
		e.refusals++
		e.mu.Unlock()
		return client.ContainerRemoveResult{}, errors.New("Error response from daemon: unable to remove filesystem for " + id + ": unlinkat /var/lib/docker/containers/" + id + "/mounts/shm: device or resource busy")
	}
	e.mu.Unlock()
	return e.DockerAPI.ContainerRemove(ctx, id, opts)
}

func (e *refusingEngine) set(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.refuse = id
}

func (e *refusingEngine) refused() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.refusals
}

// TestTheReconcileLeavesWhatIsNotThePoolsAndDoesNotSpin: labels are anyone's to set, so a
// container that carries this instance's labels under a name the pool never gives is left
// alone, by the reconcile and by Close's sweep, and said once; a leftover the engine refuses
// to remove is asked for once a look, said once, and is no engine outage: the look answers no
// error, so the next waits for the interval rather than come again within reconcileRetry, for
// ever. The other leftovers are removed all the same.
func TestTheReconcileLeavesWhatIsNotThePoolsAndDoesNotSpin(t *testing.T) {
	e := dockerEnv(t)
	ctx := t.Context()
	eng := &refusingEngine{DockerAPI: e.docker}
	logs := &lockedBuffer{}
	r := e.router(func(c *Config) { c.Docker = eng; c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	d := r.backends[0].(*Docker)
	d.every = time.Hour // the test looks itself
	_, err := r.Preflight(ctx)
	require.NoError(t, err)

	foreign := e.createNamed(t, "someones-database", r.cfg.InstanceID)
	lookalike := e.createNamed(t, containerPrefix+"fixture-notours", r.cfg.InstanceID)
	stuck := e.createLost(t, r.cfg.InstanceID)
	eng.set(stuck)
	lost := e.createLost(t, r.cfg.InstanceID)

	for range 3 {
		require.NoError(t, d.reconcile(ctx), "a refused removal is no engine outage")
	}
	left := e.containers()
	require.Contains(t, left, foreign, "a container the pool did not name is never removed")
	require.Contains(t, left, lookalike, "nor one whose name only begins as the pool's")
	require.Contains(t, left, stuck)
	require.NotContains(t, left, lost, "the other leftovers are removed all the same")
	require.Equal(t, 3, eng.refused(), "the refused removal is asked for once a look")
	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "the engine refused to remove a container"), out)
	require.Contains(t, out, "container="+shortID(stuck))
	require.Equal(t, 2, strings.Count(out, "a name the pool never gives it"), out)
	require.Contains(t, out, "name=someones-database")

	eng.set("")
	require.NoError(t, r.Close(ctx))
	require.ElementsMatch(t, []string{foreign, lookalike}, e.containers(), "Close's sweep leaves them too")
}

// TestAStartIsNotRefusedForALeftoverTheEngineWillNotRemove: a container an earlier instance of
// the pool left that the engine refuses to remove does not stop the start (a unit restarting
// on failure would start it again and again over the same container, never serving): it is
// said at warn, the other leftovers are removed, all in the one sweep, and the next start asks
// again.
func TestAStartIsNotRefusedForALeftoverTheEngineWillNotRemove(t *testing.T) {
	e := dockerEnv(t)
	ctx := t.Context()
	eng := &refusingEngine{DockerAPI: e.docker}
	logs := &lockedBuffer{}
	stuck := e.createLost(t, "earlier-instance")
	for range 20 {
		e.createLost(t, "earlier-instance")
	}
	eng.set(stuck)
	r := e.router(func(c *Config) { c.Docker = eng; c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	rep, err := r.Preflight(ctx)
	require.NoError(t, err, "the start goes on")
	require.Equal(t, 20, rep.Swept)
	require.Equal(t, []string{stuck}, e.containers(), "every other leftover is removed in the one sweep")
	require.Contains(t, logs.String(), "level=WARN msg=\"spawner: some containers an earlier instance of this pool left could not be removed")
	require.Contains(t, logs.String(), "containers=1")

	eng.set("")
	rep, err = e.router().Preflight(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Swept, "the next start asks again")
	require.Empty(t, e.containers())
}
