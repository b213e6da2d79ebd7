package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
)

// TestAgentTokenLifetimeAcrossClockSteps: a token lives the lifetime it was minted with by the
// monotonic clock, whatever the wall clock does: a step back does not lengthen it, while
// running or across a restart, nor does minting it while the clock ran a year ahead; a step
// forward (or a host that slept) ends it at its stored expiry.
func TestAgentTokenLifetimeAcrossClockSteps(t *testing.T) {
	c := newClock()
	h := deskHarness(t, c.opts(), nil)
	run := h.start("g")
	mint := func() string {
		t.Helper()
		_, secret, err := h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "a", time.Hour)
		require.NoError(t, err)
		return secret
	}
	authn := func(secret string) error {
		_, err := h.pool.AuthenticateAgentToken(h.ctx, secret)
		return err
	}

	// Set back while running.
	secret := mint()
	c.advance(30 * time.Minute)
	c.step(-3 * time.Hour)
	require.NoError(t, authn(secret))
	c.advance(31 * time.Minute)
	require.ErrorIs(t, authn(secret), errTokenExpired, "an hour has passed since it was minted")
	h.pool.dropExpiredTokens(h.ctx, c.Now())
	require.ErrorIs(t, authn(secret), errTokenExpired, "still stored (its wall-clock expiry is hours away), still refused")
	listed, err := h.pool.ListAgentTokens(h.ctx, auth.DefaultTenant, run)
	require.NoError(t, err)
	require.Empty(t, listed, "nor listed, nor counted toward the run's tokens")

	// Minted while the clock ran a year ahead; the clock is set right, the pool restarts.
	c.step(365 * 24 * time.Hour)
	ahead := mint()
	c.advance(10 * time.Minute)
	c.step(-365 * 24 * time.Hour)
	h.reopen()
	require.NoError(t, authn(ahead))
	c.advance(time.Hour)
	require.ErrorIs(t, authn(ahead), errTokenExpired, "a restart judges it by the lifetime it was minted with")

	// Set forward: the stored expiry has passed.
	forward := mint()
	c.step(2 * time.Hour)
	require.ErrorIs(t, authn(forward), errTokenExpired)
	c.step(-2 * time.Hour)
	require.NoError(t, authn(forward), "stepped back within its life: valid again, for what is left of it")
	c.advance(time.Hour)
	require.ErrorIs(t, authn(forward), errTokenExpired)
}

// TestApprovalLifetimeAcrossClockSteps: a pending approval, and an approved call's outcome
// kept for its retry, live pool.approval_timeout by the monotonic clock: a clock set back
// keeps neither longer (a waiting run takes no other call), while running or across a
// restart; a clock set forward past the stored expiry ends them.
func TestApprovalLifetimeAcrossClockSteps(t *testing.T) {
	c := newClock()
	o := c.opts()
	o.approvalTimeout = time.Hour
	h := deskHarness(t, o, askNonReadOnly)
	run := h.start("g")
	ask := func(text string) string {
		t.Helper()
		_, err := h.call(run, "a", "fx__echo", map[string]any{"text": text})
		return requireRefused(t, err, reasonApprovalRequired).ApprovalID
	}
	state := func(id string) (string, bool) {
		t.Helper()
		r, err := h.pool.lookup(h.ctx, run, "")
		require.NoError(t, err)
		h.pool.expireApprovals(h.ctx, r)
		list, err := h.pool.ListApprovals(h.ctx, run, "")
		require.NoError(t, err)
		for _, a := range list {
			if a.ID == id {
				return a.State, a.ResultWaiting
			}
		}
		t.Fatalf("approval %s is gone", id)
		return "", false
	}

	// Set back while running.
	id := ask("back")
	c.step(-3 * time.Hour)
	c.advance(59 * time.Minute)
	st, _ := state(id)
	require.Equal(t, approvalPending, st)
	c.advance(2 * time.Minute)
	st, _ = state(id)
	require.Equal(t, approvalExpired, st, "an hour has passed since it was asked for")

	// Set back, then a restart.
	id = ask("restart")
	c.advance(30 * time.Minute)
	c.step(-3 * time.Hour)
	h.reopen()
	st, _ = state(id)
	require.Equal(t, approvalPending, st)
	c.advance(61 * time.Minute)
	st, _ = state(id)
	require.Equal(t, approvalExpired, st, "a restart gives it no more than pool.approval_timeout")

	// An approved call's outcome waits an hour for its retry, not an hour and the step.
	id = ask("kept")
	_, _, err := h.pool.ApproveCall(h.ctx, run, "", id, "key:ops")
	require.NoError(t, err)
	c.step(-3 * time.Hour)
	c.advance(30 * time.Minute)
	_, waiting := state(id)
	require.True(t, waiting)
	c.advance(31 * time.Minute)
	_, waiting = state(id)
	require.False(t, waiting, "the outcome nobody took was dropped")

	// Set forward past the stored expiry.
	id = ask("forward")
	c.step(2 * time.Hour)
	st, _ = state(id)
	require.Equal(t, approvalExpired, st)
}

// TestDriftListingAgeAcrossClockSteps: the live listing the drift check compares with the pins
// is taken again once it is older than drift_max_age by either clock: a clock set back does
// not keep an old listing fresh (the check would go on trusting it for as long as the step).
func TestDriftListingAgeAcrossClockSteps(t *testing.T) {
	c := newClock()
	o := c.opts()
	o.driftMaxAge = time.Minute
	h := deskHarness(t, o, nil)
	run := h.start("g")
	call := func() {
		t.Helper()
		_, err := h.call(run, "a", "fx__peek", map[string]any{"text": "x"})
		require.NoError(t, err)
	}
	call()
	listed := h.listings()
	call()
	require.Equal(t, listed, h.listings(), "fresh: not listed again")

	c.step(-time.Hour)
	c.advance(2 * time.Minute)
	call()
	require.Equal(t, listed+1, h.listings(), "two minutes old by the monotonic clock, an hour younger by the wall clock")
	call()
	require.Equal(t, listed+1, h.listings())

	c.step(time.Hour)
	call()
	require.Equal(t, listed+2, h.listings(), "an hour old by the wall clock")
}

// TestUserTokenRefreshAcrossClockSteps: a user's token is refreshed once its life (5 minutes at
// the example server) is over by the monotonic clock, though a clock set back an hour says it
// has most of an hour to go, while running and across a restart: kept in use, the expired token
// would be refused by the server, and the refusal drops the user's sign-in.
func TestUserTokenRefreshAcrossClockSteps(t *testing.T) {
	w, run, sent := aliceCalled(t, "tickets__whoami")
	refreshes := func() int {
		n := 0
		for _, g := range w.as.Grants("/oauth/token") {
			if g == "refresh_token" {
				n++
			}
		}
		return n
	}
	call := func(run string) {
		t.Helper()
		res, err := w.callAs(auth.DefaultTenant, run, "tickets__whoami")
		require.NoError(t, err)
		require.Equal(t, "whoami for "+oauthtest.Alice, resultText(t, res))
	}

	w.clock.step(-time.Hour)
	w.clock.advance(3 * time.Minute)
	call(run)
	require.Zero(t, refreshes(), "not due yet")
	w.clock.advance(2 * time.Minute)
	call(run)
	require.Equal(t, 1, refreshes(), "due by the monotonic clock")
	now := w.mcp.Tokens(oauthtest.Alice)
	require.NotEqual(t, sent[len(sent)-1], now[len(now)-1], "the run's fresh session carries the new token")

	// A restarted pool first sees the token an hour before its expiry by the wall clock, and
	// gives it no more than the span it was issued with from then.
	w.clock.step(-time.Hour)
	w.reopen()
	run = w.startAs(auth.DefaultTenant, oauthtest.Alice)
	call(run)
	require.Equal(t, 1, refreshes())
	w.clock.advance(5 * time.Minute)
	call(run)
	require.Equal(t, 2, refreshes())
}

// TestSignInLinkAcrossClockSteps: a sign-in's link is good for oauth.state_ttl from when the
// pool began it by the monotonic clock: a wall clock set back an hour meanwhile, which says the
// link has most of an hour to go, does not keep it good; within its life it is taken.
func TestSignInLinkAcrossClockSteps(t *testing.T) {
	w := oauthHarness(t)
	begin := func(user string) string {
		c, err := w.pool.ConnectServer(w.ctx, auth.DefaultTenant, user, "tickets")
		require.NoError(t, err)
		require.Equal(t, ConnectSignInRequired, c.State)
		return c.AuthorizationURL
	}

	q := callbackQuery(t, w.as.SignIn(t, begin(oauthtest.Alice), oauthtest.Alice))
	w.clock.step(-time.Hour)
	w.clock.advance(DefaultOAuthStateTTL + time.Second)
	_, err := w.pool.CompleteSignIn(w.ctx, q)
	require.ErrorIs(t, err, errBadCallback)
	require.Contains(t, err.Error(), "expired")
	require.Empty(t, w.as.Grants("/oauth/token"), "nothing was exchanged")

	q = callbackQuery(t, w.as.SignIn(t, begin(oauthtest.Alice), oauthtest.Alice))
	w.clock.step(-time.Hour)
	w.clock.advance(DefaultOAuthStateTTL - time.Second)
	done, err := w.pool.CompleteSignIn(w.ctx, q)
	require.NoError(t, err)
	require.NoError(t, done.ConnectErr)
}
