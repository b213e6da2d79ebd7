package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
)

// Seed 003: "a server is connected only on its first tool call in the turn; that call lists
// the tools again, which keeps the stored listing current, as does a server's
// tools/list_changed notification while the session is open." A user's stored listing of a
// server that signs each user in (what ListAgentTools offers and the not_declared gate reads)
// follows what the server declares to the user, without connecting again (keepListing).

// heardChanges makes the pool tell the returned channel "run/server" whenever it tells a
// run's listeners that a server's tools changed (as the MCP front door hears it).
func (w *oauthWorld) heardChanges() <-chan string {
	heard := make(chan string, 64)
	f := func(_, run, _, ref string) {
		select {
		case heard <- run + "/" + ref:
		default:
		}
	}
	w.pool.onToolsChanged.Store(&f)
	return heard
}

// waitHeard waits until heard says run was told tickets' tools changed.
func (w *oauthWorld) waitHeard(heard <-chan string, run string) {
	w.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case got := <-heard:
			if got == run+"/tickets" {
				return
			}
		case <-timeout:
			w.t.Fatalf("run %s was never told that tickets' tools changed", run)
		}
	}
}

// drain forgets what heard holds.
func drain(heard <-chan string) {
	for {
		select {
		case <-heard:
		default:
			return
		}
	}
}

// TestAToolTheServerStartsDeclaringToAUserJoinsTheirRunsAfterListChanged: Alice connected
// tickets (alpha, whoami); the server then also declares beta to her and tells her run's open
// session tools/list_changed. The notification itself lists nothing (beta stays not_declared);
// the run's next call lists again, and from then on beta is offered and callable in that run,
// in a run of hers already open (whose listeners are told), and in a new one. A listing again
// that finds nothing new writes nothing.
func TestAToolTheServerStartsDeclaringToAUserJoinsTheirRunsAfterListChanged(t *testing.T) {
	w := oauthHarness(t, harnessOpts{driftMaxAge: time.Hour}) // only list_changed makes a session list again
	tenant := auth.DefaultTenant
	w.signIn(tenant, oauthtest.Alice)
	run := w.startAs(tenant, oauthtest.Alice)
	_, err := w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)
	_, hidden := w.listing(tenant, run)
	require.Equal(t, agentsurface.NotDeclared, hidden["tickets__beta"])
	other := w.startAs(tenant, oauthtest.Alice)
	connected, err := w.pool.oauth.OAuthListing(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)

	heard := w.heardChanges()
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	w.waitHeard(heard, run)
	_, hidden = w.listing(tenant, run)
	require.Equal(t, agentsurface.NotDeclared, hidden["tickets__beta"], "the notification itself lists nothing")

	drain(heard)
	w.clock.advance(time.Second)
	_, err = w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)
	for _, r := range []string{run, other} {
		visible, hidden := w.listing(tenant, r)
		require.Equal(t, []string{"tickets__alpha", "tickets__beta", "tickets__whoami"}, visible, "run %s", r)
		require.NotContains(t, hidden, "tickets__beta")
	}
	w.waitHeard(heard, other)
	res, err := w.callAs(tenant, run, "tickets__beta")
	require.NoError(t, err)
	require.Contains(t, resultText(t, res), "beta for ")
	stored, err := w.pool.oauth.OAuthListing(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Equal(t, connected.SignIn, stored.SignIn, "kept under the sign-in settings it was connected with")
	require.Len(t, stored.Tools, 3)
	require.True(t, stored.ListTime.After(connected.ListTime))

	// A new run's session lists the same tools: nothing is written (the listing keeps its
	// time, below).
	w.clock.advance(time.Second)
	fresh := w.startAs(tenant, oauthtest.Alice)
	visible, _ := w.listing(tenant, fresh)
	require.Equal(t, []string{"tickets__alpha", "tickets__beta", "tickets__whoami"}, visible)
	res, err = w.callAs(tenant, fresh, "tickets__beta")
	require.NoError(t, err)
	require.Contains(t, resultText(t, res), "beta for ")

	// The server says its tools changed, but they are the same: the run lists again, and
	// nothing is written.
	drain(heard)
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	w.waitHeard(heard, run)
	w.clock.advance(time.Second)
	listed := w.listings()
	_, err = w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)
	require.Greater(t, w.listings(), listed, "listed again")
	again, err := w.pool.oauth.OAuthListing(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Equal(t, stored, again)
}

// TestAToolTheServerStopsDeclaringToAUserLeavesTheirRuns: Alice connected tickets (alpha,
// whoami) and called alpha; the server then stops declaring alpha to her. Once her run lists
// again (its next call after list_changed), alpha is no longer offered, in that run or a new
// one, and a call to it is refused not_declared before anything is sent.
func TestAToolTheServerStopsDeclaringToAUserLeavesTheirRuns(t *testing.T) {
	w := oauthHarness(t, harnessOpts{driftMaxAge: time.Hour})
	tenant := auth.DefaultTenant
	w.signIn(tenant, oauthtest.Alice)
	run := w.startAs(tenant, oauthtest.Alice)
	_, err := w.callAs(tenant, run, "tickets__alpha")
	require.NoError(t, err)

	heard := w.heardChanges()
	w.mcp.SetTools(oauthtest.Alice)
	w.waitHeard(heard, run)
	_, err = w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)

	for _, r := range []string{run, w.startAs(tenant, oauthtest.Alice)} {
		visible, hidden := w.listing(tenant, r)
		require.Equal(t, []string{"tickets__whoami"}, visible, "run %s", r)
		require.Equal(t, agentsurface.NotDeclared, hidden["tickets__alpha"], "run %s", r)
		_, err = w.callAs(tenant, r, "tickets__alpha")
		requireRefused(t, err, reasonNotDeclared)
	}
	require.Equal(t, 1, w.mcp.Called("alpha"), "only the call before the change reached the server")
}

// TestAUsersNewSessionKeepsTheirListingCurrent: the server declares beta to Alice after she
// connected, while no session of hers is open. Her run's first call to the server starts a
// session, whose listing is stored as hers: beta is then offered and callable in that run and
// in a new one.
func TestAUsersNewSessionKeepsTheirListingCurrent(t *testing.T) {
	w := oauthHarness(t)
	tenant := auth.DefaultTenant
	w.signIn(tenant, oauthtest.Alice)
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	run := w.startAs(tenant, oauthtest.Alice)
	_, hidden := w.listing(tenant, run)
	require.Equal(t, agentsurface.NotDeclared, hidden["tickets__beta"], "as connected")

	_, err := w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)
	for _, r := range []string{run, w.startAs(tenant, oauthtest.Alice)} {
		visible, _ := w.listing(tenant, r)
		require.Equal(t, []string{"tickets__alpha", "tickets__beta", "tickets__whoami"}, visible, "run %s", r)
		res, err := w.callAs(tenant, r, "tickets__beta")
		require.NoError(t, err)
		require.Contains(t, resultText(t, res), "beta for ")
	}
}

// TestAUsersListingIsKeptCurrentForEveryPoolHost: on etcd, the listing a run's session on h1
// took is the one a run of the same user on h2 offers.
func TestAUsersListingIsKeptCurrentForEveryPoolHost(t *testing.T) {
	w, h1, h2 := twoOAuthHosts(t)
	w.signInOn(h1, w.tickets())
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	on2 := w.startOn(h2, oauthtest.Alice)
	require.Equal(t, []string{"tickets__alpha", "tickets__whoami"}, w.toolsOn(h2, on2), "as connected")

	_, err := w.whoamiOn(h1, w.startOn(h1, oauthtest.Alice))
	require.NoError(t, err)
	require.Equal(t, []string{"tickets__alpha", "tickets__beta", "tickets__whoami"}, w.toolsOn(h2, on2))
}
