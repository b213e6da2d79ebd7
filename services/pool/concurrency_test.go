package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/mcpserver"
)

// TestAnEndedRunsIDCannotBeTakenOver: an ended run lives in the store only; a StartRun that
// reuses its id is refused, and nothing can act on the new run before the store refused it:
// the stored run keeps its state, and the run count is right.
func TestAnEndedRunsIDCannotBeTakenOver(t *testing.T) {
	h := newHarness(t, harnessOpts{maxRuns: 2})
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	run := h.start("g")
	_, err := h.pool.EndRun(h.ctx, run, "", StateCompleted, "test")
	require.NoError(t, err)

	for range 5 {
		done := make(chan error, 1)
		go func() {
			_, err := h.pool.StartRun(h.ctx, auth.DefaultTenant, "g", 0, run)
			done <- err
		}()
	poke:
		for {
			select {
			case err := <-done:
				require.ErrorIs(t, err, errRunExists)
				break poke
			default:
				_, _ = h.pool.PauseRun(h.ctx, run, auth.DefaultTenant)
				_, _ = h.pool.EndRun(h.ctx, run, auth.DefaultTenant, StateFailed, "takeover")
			}
		}
	}
	got, err := h.pool.GetRun(h.ctx, run, "")
	require.NoError(t, err)
	require.Equal(t, auth.DefaultTenant, got.Run.Tenant)
	require.Equal(t, StateCompleted, got.Run.State)
	require.Equal(t, "test", got.Run.EndReason)

	// The count is what it should be: two runs start (max_runs 2), a third does not.
	h.start("g")
	h.start("g")
	_, err = h.pool.StartRun(h.ctx, auth.DefaultTenant, "g", 0, "")
	require.ErrorIs(t, err, errTooManyRuns)
}

// TestCallersOfOneFailedSpawnEachGetTheirOwnRefusal: callers waiting on one spawn that fails
// share its failure, but each refusal names the caller's own call.
func TestCallersOfOneFailedSpawnEachGetTheirOwnRefusal(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	_, err := h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "no-such-command", Grants: []string{"process_spawn", "external_api_call"}})
	require.NoError(t, err)
	run := h.start("g")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			id := fmt.Sprintf("call-mine-%d", i)
			_, err := h.pool.CallTool(h.ctx, CallRequest{RunID: run, Tenant: auth.DefaultTenant, Agent: "a", Tool: "fx__echo", CallID: id, Arguments: json.RawMessage(`{"text":"x"}`)})
			var ref *RefusedError
			if !errors.As(err, &ref) {
				t.Errorf("call %d: want a refusal, got %v", i, err)
				return
			}
			if ref.CallID != id {
				t.Errorf("call %d's refusal names %s", i, ref.CallID)
			}
		})
	}
	wg.Wait()
}

// TestACallerNeedNotWaitOutAnotherSpawn: the first call of a run starts the spawn but waits for
// it with its own context, like every other caller: one that gives up returns at once while
// the spawn goes on for the others. Ending the run gives the spawn up.
func TestACallerNeedNotWaitOutAnotherSpawn(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	_, err := h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture", Args: []string{"--never-answer"},
		Grants: []string{"process_spawn", "external_api_call"}, ClientSessionTimeout: durationpb.New(time.Minute)})
	require.NoError(t, err)
	run := h.start("g")

	ctx, cancel := context.WithTimeout(h.ctx, 200*time.Millisecond)
	defer cancel()
	_, err = h.pool.CallTool(ctx, CallRequest{RunID: run, Tenant: auth.DefaultTenant, Agent: "a", Tool: "fx__echo", Arguments: json.RawMessage(`{"text":"x"}`)})
	require.Error(t, err)
	r, err := h.pool.lookup(h.ctx, run, "")
	require.NoError(t, err)
	r.mu.Lock()
	sess := r.sessions["fx"]
	r.mu.Unlock()
	require.NotNil(t, sess, "the spawn goes on without its first caller")
	require.False(t, sess.isReady(), "the caller returned before the spawn (bounded by a minute) finished")

	// Ending the run gives the spawn up rather than wait out the minute; nothing is left
	// running (the harness checks for containers at the end).
	_, err = h.pool.EndRun(h.ctx, run, "", StateCompleted, "test")
	require.NoError(t, err)
	require.True(t, sess.isReady())
	require.ErrorIs(t, sess.err, errRunNotRunning)
	require.Zero(t, h.pool.liveSessions.Load())
}

// TestTheReaperNeverEndsARunMidCall: a call longer than the idle timeout keeps its run, and
// the idle clock starts again when the call ends (it ran from the call's start, so a run was
// ended just after its long call returned, and a spawn longer than the timeout could lose the
// run before its next call).
func TestTheReaperNeverEndsARunMidCall(t *testing.T) {
	const idle = 2 * time.Second
	h := newHarness(t, harnessOpts{idle: idle})
	h.server("fx", nil, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"sleep", "echo"}}}, nil)
	run := h.start("g")
	_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "warm"})
	require.NoError(t, err)
	_, err = h.call(run, "a", "fx__sleep", map[string]any{"ms": 3 * idle.Milliseconds() / 2})
	require.NoError(t, err, "the run was not ended under its call")
	ended := func() bool {
		info, err := h.pool.GetRun(h.ctx, run, "")
		return err != nil || info.Run.State != StateRunning
	}
	require.Never(t, ended, idle/2, 20*time.Millisecond, "idle is counted from the end of the last call")
	h.reaped(run) // and then the run is reaped
}

// TestCloseRefusesNewCallsAndWaitsForThoseInProgress: a call in progress when the pool closes
// ends (its session stops) and is recorded; a call after that is refused as shutting_down.
func TestCloseRefusesNewCallsAndWaitsForThoseInProgress(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"sleep"}}}, nil)
	run := h.start("g")
	done := make(chan error, 1)
	go func() {
		_, err := h.call(run, "a", "fx__sleep", map[string]any{"ms": 60000})
		done <- err
	}()
	require.Eventually(t, func() bool { return len(h.pendings()) == 1 }, 30*time.Second, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- h.pool.Close(ctx) }()
	require.Error(t, <-done, "the call in progress ends as its session stops")
	require.NoError(t, <-closed)
	_, err := h.call(run, "a", "fx__sleep", map[string]any{"ms": 1})
	requireRefused(t, err, reasonShuttingDown)
}

// TestADeadServerGivesBackItsSessionPlace: a server that dies on its own frees its place under
// pool.max_sessions at once, not when its run next calls it or ends, so other runs on the host
// are not refused meanwhile; its run's next call still gets a fresh session.
func TestADeadServerGivesBackItsSessionPlace(t *testing.T) {
	h := newHarness(t, harnessOpts{maxSessions: 1})
	h.server("fx", nil, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"crash", "echo"}}}, nil)
	a, b := h.start("g"), h.start("g")
	_, err := h.call(a, "a", "fx__crash", map[string]any{})
	requireFailed(t, err, failureCrashed)
	require.Eventually(t, func() bool { return h.pool.liveSessions.Load() == 0 }, 20*time.Second, 20*time.Millisecond,
		"the crashed server's place is given back")
	info, err := h.pool.GetRun(h.ctx, a, "")
	require.NoError(t, err)
	require.Empty(t, info.Sessions, "the dead session is forgotten")
	stopped := h.stopped()

	_, err = h.call(b, "a", "fx__echo", map[string]any{"text": "b"})
	require.NoError(t, err, "another run gets the place")
	_, err = h.pool.EndRun(h.ctx, b, "", StateCompleted, "test")
	require.NoError(t, err)
	require.Equal(t, stopped+1, h.stopped(), "each session is stopped once")

	before := h.spawned()
	res, err := h.call(a, "a", "fx__echo", map[string]any{"text": "again"})
	require.NoError(t, err)
	require.Equal(t, "again", res.Content[0]["text"])
	require.Equal(t, before+1, h.spawned(), "the crashed run's next call gets a fresh session")
	require.Equal(t, int64(1), h.pool.liveSessions.Load())
}

// heldRegistry, once armed, holds the next ServerPolicy (gate 2) or ResolveRegistration (the
// spawn) it is asked for until release is closed, whatever the caller's context says.
type heldRegistry struct {
	Registry
	resolve bool // hold ResolveRegistration rather than ServerPolicy
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g *heldRegistry) hold() {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.release
	}
}

func (g *heldRegistry) ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error) {
	if !g.resolve {
		g.hold()
	}
	return g.Registry.ServerPolicy(ctx, ref)
}

func (g *heldRegistry) ResolveRegistration(ctx context.Context, ref string) (*mcpserver.Resolved, error) {
	if g.resolve {
		g.hold()
	}
	return g.Registry.ResolveRegistration(ctx, ref)
}

// TestACallInProgressWhenCloseBeginsStartsNoServer: a call already counted in progress when
// Close begins, waiting on the registry at gate 2 or for the registration its spawn needs, is
// refused as shutting_down, and recorded so: no server is started during shutdown.
func TestACallInProgressWhenCloseBeginsStartsNoServer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		resolve bool
	}{{"waiting at gate 2", false}, {"waiting for its spawn", true}} {
		t.Run(tc.name, func(t *testing.T) {
			held := &heldRegistry{resolve: tc.resolve, entered: make(chan struct{}), release: make(chan struct{})}
			h := newHarness(t, harnessOpts{registry: func(r Registry) Registry { held.Registry = r; return held }})
			h.server("fx", nil)
			h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
			run := h.start("g")
			held.armed.Store(true) // after the import, which resolved the registration too
			done := make(chan error, 1)
			go func() {
				_, err := h.pool.CallTool(h.ctx, CallRequest{RunID: run, Agent: "a", Tool: "fx__echo", CallID: "call-held", Arguments: json.RawMessage(`{"text":"x"}`)})
				done <- err
			}()
			<-held.entered
			closed := make(chan error, 1)
			go func() { closed <- h.pool.Close(context.Background()) }()
			require.Eventually(t, h.pool.inflight.closed, 10*time.Second, 5*time.Millisecond)
			close(held.release)

			requireRefused(t, <-done, reasonShuttingDown)
			require.NoError(t, <-closed)
			require.Zero(t, h.spawned(), "no server was started after Close began")
			require.Zero(t, poolContainers(t, h.poolID))
			var reasons []string
			for _, rec := range h.audit.Records() {
				if a := rec.ToolCall; a != nil && a.CallID == "call-held" {
					require.Equal(t, audit.OutcomeRefusedBeforeDispatch, a.Outcome)
					reasons = append(reasons, a.Reason)
				}
			}
			require.Equal(t, []string{reasonShuttingDown}, reasons, "the refusal is on record")
		})
	}
}
