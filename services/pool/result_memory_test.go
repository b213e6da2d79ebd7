package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
)

// TestAResultPastItsCapFailsItsCallAlone: an answer past its registration's max_result_bytes
// (16 MiB by default) fails its call as result_too_large, naming the cap and how to raise it,
// and is not read further; the session stays, and the run's next call on it works.
func TestAResultPastItsCapFailsItsCallAlone(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil, "--runtime-tools")
	h.server("small", func(r *registryv1.CreateServerRequest) { r.MaxResultBytes = 1 << 20 }, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"blob"}}, {"small", "a", []string{"blob"}}}, nil)
	run := h.start("g")
	for _, tc := range []struct {
		tool      string
		over, fit int
		cap       string
	}{
		{"fx__blob", 17_000_000, 16_000_000, "16 MiB"},
		{"small__blob", 2_000_000, 1_000_000, "1 MiB"},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			_, err := h.call(run, "a", tc.tool, map[string]any{"bytes": 10})
			require.NoError(t, err)
			spawned := h.spawned()

			_, err = h.call(run, "a", tc.tool, map[string]any{"bytes": tc.over})
			requireFailed(t, err, failureResultTooLarge)
			require.ErrorContains(t, err, "more than the "+tc.cap+" the registration")
			require.ErrorContains(t, err, "--max-result-bytes")
			require.Equal(t, failureResultTooLarge, h.last().FailureClass)
			require.Equal(t, audit.OutcomeDispatched, h.last().Outcome, "it may have taken effect")

			res, err := h.call(run, "a", tc.tool, map[string]any{"bytes": tc.fit})
			require.NoError(t, err, "the run's next call on the same session works")
			require.Len(t, res.Content[0]["text"], tc.fit)
			require.Equal(t, spawned, h.spawned(), "the session stays")
			require.Zero(t, h.budget.InUse(), "nothing is held once the calls returned")
		})
	}
}

// TestTheResultBudgetAdmitsCalls: a call is dispatched only when the pool's budget for results
// in flight has room for an answer as large as its server's max_result_bytes. While the budget
// is taken, the call waits (up to pool.result_budget_wait) and goes once room is made, or is
// refused before dispatch as limit_exceeded (RESOURCE_EXHAUSTED), naming the setting.
func TestTheResultBudgetAdmitsCalls(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait time.Duration
	}{{"refused", 200 * time.Millisecond}, {"waits", time.Minute}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{resultBudget: 2 << 20, budgetWait: tc.wait})
			h.server("fx", func(r *registryv1.CreateServerRequest) { r.MaxResultBytes = 1 << 20 }, "--runtime-tools")
			h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"blob"}}}, nil)
			run := h.start("g")
			_, err := h.call(run, "a", "fx__blob", map[string]any{"bytes": 10})
			require.NoError(t, err)
			release, err := h.budget.Reserve(h.ctx, 2<<20)
			require.NoError(t, err)
			pendings := len(h.pendings())

			if tc.name == "refused" {
				_, err = h.call(run, "a", "fx__blob", map[string]any{"bytes": 900_000})
				ref := requireRefused(t, err, reasonLimitExceeded)
				require.Contains(t, ref.Problem(), "RINGFENCE_POOL__RESULT_BUDGET")
				require.Equal(t, codes.ResourceExhausted, status.Code(callStatus(h.ctx, h.pool, err)))
				require.Equal(t, audit.OutcomeRefusedBeforeDispatch, h.last().Outcome)
				require.Len(t, h.pendings(), pendings, "nothing was dispatched")
				release()
				_, err = h.call(run, "a", "fx__blob", map[string]any{"bytes": 900_000})
				require.NoError(t, err, "with room made, the next call goes")
				return
			}
			waited := h.budget.Waited()
			done := make(chan error, 1)
			go func() {
				res, err := h.call(run, "a", "fx__blob", map[string]any{"bytes": 900_000})
				if err == nil && len(res.Content[0]["text"].(string)) != 900_000 {
					err = errShort
				}
				done <- err
			}()
			require.Eventually(t, func() bool { return h.budget.Waited() > waited }, time.Minute, 5*time.Millisecond, "the call waits for room")
			require.Len(t, h.pendings(), pendings, "and is not dispatched meanwhile")
			release()
			require.NoError(t, <-done)
			require.LessOrEqual(t, h.budget.Peak(), int64(2<<20))
		})
	}
}

var errShort = errorString("the result came back short")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestAnIdleSessionKeepsNothingOfAPastResult: once a 16 MB result is returned, the pool holds
// none of it: after a collection its heap is back within 2 MiB of what it was before the call,
// with the session still up (it kept some 30 MiB per past result while its run lasted).
func TestAnIdleSessionKeepsNothingOfAPastResult(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"blob"}}}, nil)
	run := h.start("g")
	_, err := h.call(run, "a", "fx__blob", map[string]any{"bytes": 10})
	require.NoError(t, err)
	h.attempts() // let the records of the first call settle
	base := liveHeap()

	res, err := h.call(run, "a", "fx__blob", map[string]any{"bytes": resultBytes})
	require.NoError(t, err)
	require.Len(t, res.Content[0]["text"], resultBytes)
	res = nil
	h.attempts()
	after := liveHeap()
	const bound = 2 << 20
	require.Less(t, int64(after)-int64(base), int64(bound), "the pool keeps %d bytes more than before the result", int64(after)-int64(base))
	require.Zero(t, h.budget.InUse())
	require.Equal(t, float64(1), h.spawned(), "the session is still up")
}
