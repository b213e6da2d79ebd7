package pool

import (
	"context"
	"fmt"
	"maps"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/auth"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
	"github.com/ringfence/ringfence/services/pool/internal/store"
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

// storedNames is the names in user's stored listing of tickets, nil without one (for
// require.Eventually, which must not fail the test from its own goroutine).
func (w *oauthWorld) storedNames(tenant, user string) []string {
	l, err := w.pool.oauth.OAuthListing(w.ctx, tenant, user, "tickets")
	if err != nil {
		return nil
	}
	return slices.Sorted(maps.Keys(l.Tools))
}

// offers is the names agent a of run offers, nil when they cannot be read (for
// require.Eventually).
func (w *oauthWorld) offers(tenant, run string) []string {
	l, err := w.pool.ListAgentTools(w.ctx, run, tenant, "a")
	if err != nil {
		return nil
	}
	var names []string
	for _, t := range l.Tools {
		names = append(names, t.Name)
	}
	return names
}

// listingsInBackground counts the goroutines listing a session's tools in the background
// (listSoon), waiting or listing.
func listingsInBackground() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "pool.(*Service).listInBackground(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestAToolTheServerStartsDeclaringToAUserJoinsTheirRunsAfterListChanged: Alice connected
// tickets (alpha, whoami); the server then also declares beta to her and tells her run's open
// session tools/list_changed. Without any further call, the session lists again soon after in
// the background: beta joins her stored listing, and is offered (and callable) in that run, in a
// run of hers already open (whose listeners are told), and in a new one. A listing again that
// finds nothing new writes nothing.
func TestAToolTheServerStartsDeclaringToAUserJoinsTheirRunsAfterListChanged(t *testing.T) {
	w, run, _ := aliceCalled(t, "tickets__whoami", harnessOpts{driftMaxAge: time.Hour}) // only list_changed makes a session list again
	tenant := auth.DefaultTenant
	_, hidden := w.listing(tenant, run)
	require.Equal(t, agentsurface.NotDeclared, hidden["tickets__beta"])
	other := w.startAs(tenant, oauthtest.Alice)
	connected, err := w.pool.oauth.OAuthListing(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)

	heard := w.heardChanges()
	w.clock.advance(time.Second)
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	all := []string{"tickets__alpha", "tickets__beta", "tickets__whoami"}
	require.Eventually(t, func() bool {
		return slices.Equal(w.storedNames(tenant, oauthtest.Alice), []string{"alpha", "beta", "whoami"})
	}, 30*time.Second, 10*time.Millisecond, "the notification alone keeps the stored listing current")
	for _, r := range []string{run, other} {
		require.Eventually(t, func() bool { return slices.Equal(w.offers(tenant, r), all) }, 30*time.Second, 10*time.Millisecond, "run %s", r)
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
	require.Equal(t, all, visible)
	res, err = w.callAs(tenant, fresh, "tickets__beta")
	require.NoError(t, err)
	require.Contains(t, resultText(t, res), "beta for ")

	// The server says its tools changed, but they are the same: the sessions list again, and
	// nothing is written.
	w.clock.advance(time.Second)
	listed := w.listings()
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	require.Eventually(t, func() bool { return w.listings() >= listed+2 }, 30*time.Second, 10*time.Millisecond, "both open sessions list again")
	require.Eventually(t, func() bool { return listingsInBackground() == 0 }, 30*time.Second, 10*time.Millisecond)
	again, err := w.pool.oauth.OAuthListing(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Equal(t, stored, again)
}

// TestAListChangedStormListsAUsersSessionBoundedAndEndsWithTheLastListing: the server tells
// Alice's open session tools/list_changed 200 times in a row, declaring another tool each
// time, then alpha and beta. The session lists in the background far fewer times than it was
// told (one at a time, at most one a second: listSoonSpacing), and her stored listing, and what
// her run offers, end with the last listing, without a call.
func TestAListChangedStormListsAUsersSessionBoundedAndEndsWithTheLastListing(t *testing.T) {
	w, run, _ := aliceCalled(t, "tickets__whoami", harnessOpts{driftMaxAge: time.Hour})
	tenant := auth.DefaultTenant

	var told atomic.Int64
	f := func(_, r, _, ref string) {
		if r == run && ref == "tickets" {
			told.Add(1)
		}
	}
	w.pool.onToolsChanged.Store(&f)
	const storm = 200
	before, began := w.listings(), time.Now()
	for i := range storm {
		n := told.Load()
		w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: fmt.Sprintf("t%d", i), Description: "T."})
		// Each change is its own notification (the server's SDK merges those 10 ms apart).
		require.Eventually(t, func() bool { return told.Load() > n }, 30*time.Second, time.Millisecond)
	}
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	require.Eventually(t, func() bool {
		return slices.Equal(w.storedNames(tenant, oauthtest.Alice), []string{"alpha", "beta", "whoami"})
	}, 60*time.Second, 10*time.Millisecond, "the storm ends with the last listing")
	relists, took := int(w.listings()-before), time.Since(began)
	t.Logf("%d notifications, %d listings in %s", told.Load(), relists, took)
	require.GreaterOrEqual(t, told.Load(), int64(storm), "the run's listeners heard each notification")
	require.LessOrEqual(t, relists, int(took/listSoonSpacing)+2, "one listing a second at most")
	require.Less(t, relists, storm/10, "far fewer listings than notifications")
	require.Eventually(t, func() bool { return listingsInBackground() == 0 }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"alpha", "beta", "whoami"}, w.storedNames(tenant, oauthtest.Alice))
	visible, _ := w.listing(tenant, run)
	require.Equal(t, []string{"tickets__alpha", "tickets__beta", "tickets__whoami"}, visible)
}

// TestStoppingARunEndsItsSessionsListingInBackground: Alice's open session lists in the
// background after tools/list_changed (beta joins her listing); the server then declares
// gamma too, and the session's next background listing waits out its spacing (stretched to an
// hour) when the run ends. Ending the run ends that goroutine before it returns, and the
// listing is neither taken nor written.
func TestStoppingARunEndsItsSessionsListingInBackground(t *testing.T) {
	spacing := listSoonSpacing
	t.Cleanup(func() { listSoonSpacing = spacing })
	listSoonSpacing = time.Hour
	w, run, _ := aliceCalled(t, "tickets__whoami", harnessOpts{driftMaxAge: time.Hour})
	tenant := auth.DefaultTenant

	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	require.Eventually(t, func() bool {
		return slices.Equal(w.storedNames(tenant, oauthtest.Alice), []string{"alpha", "beta", "whoami"})
	}, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return listingsInBackground() == 0 }, 30*time.Second, 10*time.Millisecond)

	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."}, oauthtest.Tool{Name: "gamma", Description: "Gamma."})
	require.Eventually(t, func() bool { return listingsInBackground() == 1 }, 30*time.Second, time.Millisecond, "a listing waits")
	stored, err := w.pool.oauth.OAuthListing(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	listed := w.listings()

	_, err = w.pool.EndRun(w.ctx, run, tenant, StateCompleted, "done")
	require.NoError(t, err)
	require.Zero(t, listingsInBackground(), "the run's end waited for the session's background listing to end")
	require.Equal(t, listed, w.listings(), "it never listed")
	after, err := w.pool.oauth.OAuthListing(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Equal(t, stored, after, "nor wrote")
}

// TestABackgroundListingUnderAReplacedTokenWritesNothing: Alice's run's session of tickets
// carries her first token; she then signs in again (a second token, whose connection lists
// tickets' tools again). When the server tells the old session tools/list_changed and declares
// beta to her, that session lists in the background, but its listing, taken with a token that
// is no longer hers, never replaces what her newer sign-in listed (keepListing: only while the
// user's stored token is the session's).
func TestABackgroundListingUnderAReplacedTokenWritesNothing(t *testing.T) {
	w, _, first := aliceCalled(t, "tickets__whoami", harnessOpts{driftMaxAge: time.Hour})
	tenant := auth.DefaultTenant

	var si *signInError
	require.ErrorAs(t, w.pool.beginSignIn(w.ctx, tenant, oauthtest.Alice, w.tickets(), "signing in again", nil), &si)
	done, err := w.pool.CompleteSignIn(w.ctx, callbackQuery(t, w.as.SignIn(t, si.url, oauthtest.Alice)))
	require.NoError(t, err)
	require.NoError(t, done.ConnectErr)
	require.Greater(t, len(w.mcp.Tokens(oauthtest.Alice)), len(first), "a second token")
	_, tok, err := w.pool.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.NotContains(t, first, tok.AccessToken, "the stored token is the new one")
	newer, err := w.pool.oauth.OAuthListing(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)

	w.clock.advance(time.Second)
	listed := w.listings()
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	require.Eventually(t, func() bool { return w.listings() > listed }, 30*time.Second, 10*time.Millisecond, "the old session lists in the background")
	require.Eventually(t, func() bool { return listingsInBackground() == 0 }, 30*time.Second, 10*time.Millisecond)
	after, err := w.pool.oauth.OAuthListing(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Equal(t, newer, after, "what the newer sign-in listed stands")
	require.NotContains(t, w.storedNames(tenant, oauthtest.Alice), "beta")
}

// TestAToolTheServerStopsDeclaringToAUserLeavesTheirRuns: Alice connected tickets (alpha,
// whoami) and called alpha; the server then stops declaring alpha to her. Once her run lists
// again (its next call after list_changed), alpha is no longer offered, in that run or a new
// one, and a call to it is refused not_declared before anything is sent.
func TestAToolTheServerStopsDeclaringToAUserLeavesTheirRuns(t *testing.T) {
	w, run, _ := aliceCalled(t, "tickets__alpha", harnessOpts{driftMaxAge: time.Hour})
	tenant := auth.DefaultTenant

	heard := w.heardChanges()
	w.mcp.SetTools(oauthtest.Alice)
	w.waitHeard(heard, run)
	_, err := w.callAs(tenant, run, "tickets__whoami")
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

// TestTheFrontDoorOffersAToolTheServerStartsDeclaringToAUserWithoutACall: an MCP client of
// Alice's run's agent, through the front door, listed tickets' tools; the server then also
// declares beta to her and tells her run's open session tools/list_changed. Without any call,
// the client is told tools/list_changed and its next listing offers beta.
func TestTheFrontDoorOffersAToolTheServerStartsDeclaringToAUserWithoutACall(t *testing.T) {
	w := oauthHarness(t, harnessOpts{driftMaxAge: time.Hour})
	tenant := auth.DefaultTenant
	w.signIn(tenant, oauthtest.Alice)
	run := w.startAs(tenant, oauthtest.Alice)
	fd, err := w.pool.FrontDoor(FrontDoorConfig{ListTTL: time.Hour}) // only a change re-reads the listing
	require.NoError(t, err)
	srv := httptest.NewServer(fd)
	t.Cleanup(srv.Close)
	d := &door{h: w.harness, fd: fd, srv: srv, url: srv.URL + "/mcp", run: run}
	_, secret := d.token(t)
	changed := make(chan struct{}, 64)
	cs := d.connect(t, secret, "2025-11-25", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}})
	_, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "tickets__whoami", Arguments: map[string]any{}})
	require.NoError(t, err)
	list, err := cs.ListTools(t.Context(), nil)
	require.NoError(t, err)
	require.Equal(t, []string{"tickets__alpha", "tickets__whoami"}, toolNamesOf(list.Tools))

	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	require.Eventually(t, func() bool {
		select {
		case <-changed:
		default:
			return false
		}
		list, err := cs.ListTools(t.Context(), nil)
		return err == nil && slices.Equal(toolNamesOf(list.Tools), []string{"tickets__alpha", "tickets__beta", "tickets__whoami"})
	}, 30*time.Second, 10*time.Millisecond, "the client is told, and offered beta")
}

// TestABackgroundListingThatFailsLeavesTheSessionForTheNextCall: the server starts to need a
// scope Alice's token lacks to list its tools, then tells her run's open session
// tools/list_changed. Its listing in the background is refused: that is logged (without the
// URL of the sign-in for the wider scope), her stored listing stays as it was, and the session
// is neither stopped nor marked listed, so the run's next call is answered as without a
// background listing: sign_in_required, with that URL.
func TestABackgroundListingThatFailsLeavesTheSessionForTheNextCall(t *testing.T) {
	w, logs, run, stored := aliceCalledTickets(t)
	tenant := auth.DefaultTenant

	w.mcp.RequireListScope("email")
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	w.requireBackgroundListingFailedAlone(t, logs, run, stored, "a server refused to list its tools again after tools/list_changed")

	_, err := w.callAs(tenant, run, "tickets__whoami")
	requireSignInForScope(t, err, logs, "openid offline_access email")
}

// TestABackgroundListingThatHangsEndsAtTheSessionTimeout: after tools/list_changed the server
// never answers tools/list. The background listing gives up at the registration's
// client_session_timeout, logs why, writes nothing and stops nothing; once the server answers
// again, the run's next call lists, and the user's stored listing gains the new tool.
func TestABackgroundListingThatHangsEndsAtTheSessionTimeout(t *testing.T) {
	w, logs, run, stored := aliceCalledTickets(t)
	tenant := auth.DefaultTenant

	release := w.mcp.HoldLists()
	defer release()
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	w.requireBackgroundListingFailedAlone(t, logs, run, stored, "a server's tools could not be listed again after tools/list_changed")
	require.Contains(t, logs.String(), errRelistTimeout.Error(), "the log says the listing outlived client_session_timeout")

	release()
	_, err := w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)
	require.Contains(t, w.storedNames(tenant, oauthtest.Alice), "beta", "the call listed, and the listing was kept")
}

// TestABackgroundListingRefusedForScopeBeginsNoSignIn: the server starts to need a scope to
// list its tools and tells Alice's two runs' open sessions tools/list_changed. A call of one
// run answers sign_in_required with the URL of the sign-in for the wider scope, and Alice signs
// in there; before her browser comes back, the server tells the other run's session
// tools/list_changed again. That session's listing in the background is refused for want of
// the scope too, but it begins no sign-in (nobody would be given its URL, and one authorization
// URL is good at a time): Alice's sign-in completes, under the wider scope.
func TestABackgroundListingRefusedForScopeBeginsNoSignIn(t *testing.T) {
	logs := &rftestutil.SyncBuffer{}
	w, run, _ := aliceCalled(t, "tickets__whoami", harnessOpts{driftMaxAge: time.Hour, logTo: logs})
	tenant := auth.DefaultTenant
	other := w.startAs(tenant, oauthtest.Alice)
	_, err := w.callAs(tenant, other, "tickets__whoami")
	require.NoError(t, err)

	const refused = "a server refused to list its tools again after tools/list_changed"
	w.mcp.RequireListScope("email")
	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "beta", Description: "Beta."})
	require.Eventually(t, func() bool { return strings.Count(logs.String(), refused) == 2 }, 30*time.Second, 10*time.Millisecond, "both sessions' background listings are refused")
	require.Eventually(t, func() bool { return listingsInBackground() == 0 }, 30*time.Second, 10*time.Millisecond)

	_, err = w.callAs(tenant, run, "tickets__whoami")
	requireSignInForScope(t, err, logs, "openid offline_access email")
	var si *signInError
	require.ErrorAs(t, err, &si)
	back := w.as.SignIn(t, si.url, oauthtest.Alice)

	w.mcp.SetTools(oauthtest.Alice, oauthtest.Tool{Name: "alpha", Description: "Alpha."}, oauthtest.Tool{Name: "gamma", Description: "Gamma."})
	require.Eventually(t, func() bool { return strings.Count(logs.String(), refused) == 3 }, 30*time.Second, 10*time.Millisecond, "the other run's session's background listing is refused again")
	require.Eventually(t, func() bool { return listingsInBackground() == 0 }, 30*time.Second, 10*time.Millisecond)

	done, err := w.pool.CompleteSignIn(w.ctx, callbackQuery(t, back))
	require.NoError(t, err, "the URL Alice was given is still good")
	require.NoError(t, done.ConnectErr)
	_, tok, err := w.pool.readToken(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Contains(t, tok.Scopes, "email")
}

// aliceCalledTickets is the opening of the tests of a background listing that fails: Alice
// signed in to tickets, her run called it (so its session is open), and her stored listing
// then; the pool logs to logs.
func aliceCalledTickets(t *testing.T) (w *oauthWorld, logs *rftestutil.SyncBuffer, run string, stored store.Listing) {
	logs = &rftestutil.SyncBuffer{}
	w, run, _ = aliceCalled(t, "tickets__whoami", harnessOpts{driftMaxAge: time.Hour, logTo: logs})
	stored, err := w.pool.oauth.OAuthListing(w.ctx, auth.DefaultTenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	return w, logs, run, stored
}

// requireBackgroundListingFailedAlone waits until the pool logged logged and its background
// listing ended, then holds that the failure touched nothing: run's session of tickets is
// still marked changed (its next call lists again), not stopped, and Alice's stored listing
// is still stored.
func (w *oauthWorld) requireBackgroundListingFailedAlone(t *testing.T, logs *rftestutil.SyncBuffer, run string, stored store.Listing, logged string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), logged) }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return listingsInBackground() == 0 }, 30*time.Second, 10*time.Millisecond)
	w.pool.runs.mu.Lock()
	r := w.pool.runs.byKey[runKey{auth.DefaultTenant, run}]
	w.pool.runs.mu.Unlock()
	r.mu.Lock()
	sess := r.sessions["tickets"]
	r.mu.Unlock()
	require.NotNil(t, sess)
	require.True(t, sess.stale.Load(), "still marked changed: the run's next call lists again")
	require.False(t, sess.stopped.Load(), "the background listing stops nothing")
	after, err := w.pool.oauth.OAuthListing(w.ctx, auth.DefaultTenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Equal(t, stored, after)
}
