package tests

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/internal/testutil"
)

// TestRepeatedSIGKILLUnderLoad kills ringfenced with SIGKILL at random moments ten times while
// three runs call tools, restarting it each time on the same data directory. Afterwards every
// call that was answered has its pending record in the audit log, in the order its run made
// the calls; the chain verifies; the runs are still running and callable, each with at most
// its one session; and once they end no container of the pool is left. Skipped under -short
// (about a minute).
func TestRepeatedSIGKILLUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a soak of ten kills; runs without -short")
	}
	d, cli, poolID := runsDaemon(t)
	conn, err := grpc.NewClient(d.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	client := poolv1.NewPoolServiceClient(conn)
	ctx := testutil.WithKey(t.Context(), adminKey)
	args, err := structpb.NewStruct(map[string]any{"text": "ping"})
	require.NoError(t, err)

	const runs = 3
	ids := make([]string, runs)
	for i := range ids {
		r, err := client.StartRun(ctx, &poolv1.StartRunRequest{GraphId: "demo"})
		require.NoError(t, err)
		ids[i] = r.GetRun().GetRunId()
	}
	var (
		mu       sync.Mutex
		answered = map[string][]string{} // by run, in the order made
		wg       sync.WaitGroup
	)
	stop := make(chan struct{})
	for _, run := range ids {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("%s-%05d", run, i)
				res, err := client.CallTool(ctx, &poolv1.CallToolRequest{RunId: run, Agent: "researcher", Tool: "fx__echo", Arguments: args, CallId: id})
				if err == nil && res.GetResult() == "succeeded" {
					mu.Lock()
					answered[run] = append(answered[run], id)
					mu.Unlock()
				} else if err != nil {
					time.Sleep(20 * time.Millisecond) // the server is down: try again soon
				}
			}
		})
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range answered {
			n += len(a)
		}
		return n
	}
	for range 10 {
		// Let some calls through, then kill at a random moment among them.
		n := count()
		require.Eventually(t, func() bool { return count() >= n+5 }, 60*time.Second, 5*time.Millisecond, "calls are answered after a restart")
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
		d.kill()
		d.start()
	}
	n := count()
	require.Eventually(t, func() bool { return count() >= n+5 }, 60*time.Second, 5*time.Millisecond, "calls are answered after the last restart")
	close(stop)
	wg.Wait()

	// Every answered call's pending record is in the log, in the order of its run's calls.
	auditClient := auditv1.NewAuditServiceClient(conn)
	seqs := map[string]uint64{}
	require.Eventually(t, func() bool {
		for _, run := range ids {
			byCall, err := callsOnRecord(ctx, auditClient, run)
			if err != nil {
				return false
			}
			for id, e := range byCall {
				seqs[id] = e.pending
			}
		}
		for _, calls := range answered {
			for _, id := range calls {
				if seqs[id] == 0 {
					return false
				}
			}
		}
		return true
	}, 30*time.Second, 250*time.Millisecond, "every one of %d answered calls has its pending record", count())
	for run, calls := range answered {
		for i := 1; i < len(calls); i++ {
			require.Less(t, seqs[calls[i-1]], seqs[calls[i]], "run %s's calls are on record in order", run)
		}
	}
	r := cli("audit", "verify")
	require.Equal(t, 0, r.Code, "%s%s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stdout, "ok:")

	// The runs survived every kill: running, callable, with at most their one session, and
	// no container of a killed process is left beside them. (Not checked: `runs show`'s call
	// count, which is stored only when a run pauses or ends, so a kill takes it back to then;
	// the audit log above is the record of calls.)
	for _, run := range ids {
		show := cli("runs", "show", "--run", run)
		require.Equal(t, 0, show.Code, show.Stderr)
		require.Contains(t, show.Stdout, "running")
	}
	require.Eventually(t, func() bool { return len(poolContainers(t, poolID)) <= runs }, 30*time.Second, 100*time.Millisecond,
		"the orphan sweep removed the containers of the killed processes")
	for _, run := range ids {
		r := cli("runs", "call", "--run", run, "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"after the kills"}`)
		require.Equal(t, 0, r.Code, r.Stderr)
		require.Contains(t, r.Stdout, "after the kills")
		require.Equal(t, 0, cli("runs", "end", "--run", run).Code)
	}
	requireNoContainers(t, poolID)
	require.NotContains(t, d.Logs.String(), "panic")
}
