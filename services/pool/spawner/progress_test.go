package spawner

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
)

// TestProgressReachesItsCallerAlone: a call made with a progress receiver gets the server's
// reports of that call, with the session's own token on the wire (never the caller's) and the
// session's secrets masked in their text; a concurrent call without one gets none, and a
// report for a token no call holds is dropped.
func TestProgressReachesItsCallerAlone(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs, func(c *Config) { c.AllowedEnvKeys = []string{"APP_TOKEN"} })
	spec := hostSpec(fixture, "--runtime-tools")
	spec.Env = map[string]string{"APP_TOKEN": "progress-secret-77"}
	s := spawn(t, r, spec)

	var mu sync.Mutex
	var got []Progress
	ctx := WithProgress(t.Context(), func(p Progress) {
		mu.Lock()
		got = append(got, p)
		mu.Unlock()
	})
	params := &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": 3, "message": "step progress-secret-77"}}
	params.SetProgressToken("the-callers-own-token")
	var other *mcp.CallToolResult
	var wg sync.WaitGroup
	wg.Go(func() {
		var err error
		other, err = s.CallTool(context.Background(), &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": 5}})
		require.NoError(t, err)
	})
	res, err := s.CallTool(ctx, params)
	require.NoError(t, err)
	wg.Wait()

	token := res.Content[0].(*mcp.TextContent).Text
	require.Regexp(t, `^rf-progress-\d+$`, token, "the server saw the session's token, not the caller's")
	require.Equal(t, "<nil>", other.Content[0].(*mcp.TextContent).Text, "a call without a receiver sends no token")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 3, "every report of the call, after the call returned")
	for i, p := range got {
		require.Equal(t, Progress{Progress: float64(i + 1), Total: 3, Message: fmt.Sprintf("step ******** %d", i+1)}, p)
	}

	// A report naming a token no call holds goes nowhere.
	s.guard.progress.deliver(&mcp.ProgressNotificationParams{ProgressToken: token, Progress: 9})
	require.Len(t, got, 3)
}

// TestAProgressRelayDropsWhatItsReceiverIsNotReadyFor: while the receiver is busy, reports
// beyond progressQueue are dropped rather than queued, Deliver never waits, and the ones that
// get through keep their order; Close hands over what was queued.
func TestAProgressRelayDropsWhatItsReceiverIsNotReadyFor(t *testing.T) {
	release := make(chan struct{})
	var got []float64
	relay := NewProgressRelay(func(p Progress) {
		<-release
		got = append(got, p.Progress)
	})
	delivered := make(chan struct{})
	go func() {
		defer close(delivered)
		for i := 1; i <= 100*progressQueue; i++ {
			relay.Deliver(Progress{Progress: float64(i)})
		}
	}()
	select {
	case <-delivered:
	case <-time.After(30 * time.Second):
		t.Fatal("Deliver waited for a busy receiver")
	}
	close(release)
	relay.Close()
	require.NotEmpty(t, got)
	require.LessOrEqual(t, len(got), progressQueue+1, "the queue, and the one report the receiver held")
	require.True(t, slices.IsSorted(got), "%v", got)
}
