package spawner

import (
	"context"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
	"github.com/stretchr/testify/require"
)

// leakMarkers are frames that only a session's goroutines run.
var leakMarkers = []string{
	"spawner.(*",
	"spawner.closeClient",
	"modelcontextprotocol/go-sdk/",
	"moby/api/pkg/stdcopy",
	"moby/moby/client.(*Client).ContainerWait",
	"moby/moby/client.(*Client).Events",
}

// sessionGoroutines returns the stacks of goroutines that belong to
// sessions, other than the caller's.
func sessionGoroutines() []string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	var leaked []string
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "sessionGoroutines") || strings.Contains(g, "testing.tRunner") && !strings.Contains(g, "created by") {
			continue
		}
		for _, m := range leakMarkers {
			if strings.Contains(g, m) {
				leaked = append(leaked, g)
				break
			}
		}
	}
	return leaked
}

func requireNoSessionGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := sessionGoroutines()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of closed sessions are still running:\n\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClosedSessionsLeaveNoGoroutines runs every back end through success
// and failure paths, closes everything, and then requires that no goroutine
// of a session is left.
func TestClosedSessionsLeaveNoGoroutines(t *testing.T) {
	e := dockerEnv(t)
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	ctx := t.Context()
	requireNoSessionGoroutines(t)

	func() {
		r, err := New(e.config())
		require.NoError(t, err)
		defer func() { require.NoError(t, r.Close(context.Background())) }()
		s, err := r.Spawn(ctx, fixtureSpec())
		require.NoError(t, err)
		_, err = s.ListTools(ctx)
		require.NoError(t, err)
		_, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "x"}})
		require.NoError(t, err)
		require.NoError(t, s.Close(ctx))

		for _, spec := range []Spec{
			withHandshake(fixtureSpec("--never-answer"), time.Second),
			fixtureSpec("--exit-before-handshake"),
			{ServerRef: "x", Transport: TransportStdio, Command: "no-such-command", Purpose: PurposeRun},
		} {
			_, err := r.Spawn(ctx, spec)
			require.Error(t, err)
		}
		crash, err := r.Spawn(ctx, fixtureSpec("--crash-during-list"))
		require.NoError(t, err)
		_, err = crash.ListTools(ctx)
		require.Equal(t, ClassCrashed, ClassOf(err))
		require.NoError(t, crash.Close(ctx))

		// Left open on purpose: Router.Close must stop it.
		_, err = r.Spawn(ctx, fixtureSpec())
		require.NoError(t, err)
	}()

	func() {
		r, err := New(Config{AllowUnisolated: true})
		require.NoError(t, err)
		defer func() { require.NoError(t, r.Close(context.Background())) }()
		s, err := r.Spawn(ctx, hostSpec(fixture))
		require.NoError(t, err)
		_, err = s.ListTools(ctx)
		require.NoError(t, err)
		require.NoError(t, s.Close(ctx))
		_, err = r.Spawn(ctx, withHandshake(hostSpec(fixture, "--never-answer"), time.Second))
		require.Equal(t, ClassHandshakeTimeout, ClassOf(err))
	}()

	for _, sse := range []bool{false, true} {
		func() {
			ts, _ := startRemote(t, sse)
			defer ts.Close()
			r, err := New(Config{RootCAs: trusting(ts)})
			require.NoError(t, err)
			defer func() { require.NoError(t, r.Close(context.Background())) }()
			transport := TransportStreamableHTTP
			if sse {
				transport = TransportSSE
			}
			s, err := r.Spawn(ctx, remoteSpec(transport, ts.URL))
			require.NoError(t, err)
			_, err = s.ListTools(ctx)
			require.NoError(t, err)
			require.NoError(t, s.Close(ctx))
		}()
	}

	requireNoSessionGoroutines(t)
}

// TestLeakCheckSeesAnOpenSession keeps the leak check honest: an open
// session's goroutines must be visible to it.
func TestLeakCheckSeesAnOpenSession(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	r, err := New(Config{AllowUnisolated: true})
	require.NoError(t, err)
	s, err := r.Spawn(t.Context(), hostSpec(fixture))
	require.NoError(t, err)
	require.NotEmpty(t, sessionGoroutines())
	require.NoError(t, r.Close(t.Context()))
	<-s.Done()
	requireNoSessionGoroutines(t)
}
