package pool

import (
	"errors"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/mcpserver"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
)

// stepUpURL is the authorization URL the answer to a call the server refused for want of scope
// carries, and the scope it asks for.
func stepUpURL(t *testing.T, err error) (authURL, scope string) {
	t.Helper()
	requireFailed(t, err, failureSignInRequired)
	var si *signInError
	require.ErrorAs(t, err, &si, "the answer carries a new sign-in: %v", err)
	u, perr := url.Parse(si.url)
	require.NoError(t, perr)
	return si.url, u.Query().Get("scope")
}

// TestScopeChallengeAsksForTheWiderScope: a server that needs a scope for one tool refuses its
// call with 403 insufficient_scope, and the tool does not run; the pool answers the call as
// sign_in_required (a dispatched failure: the attempt was on record before it was sent), with
// a new authorization URL for the sign-in's scopes and the challenge's, and the user's other
// tools go on with the token they have (on a fresh session). After the user signs in, the run's
// next call runs on a fresh session with the new token. A scope the authorization server does
// not grant (the real server drops scopes it does not know) is asked for once: the next
// challenge for it is answered without another sign-in, saying why.
func TestScopeChallengeAsksForTheWiderScope(t *testing.T) {
	w, run, first := aliceCalled(t, "tickets__alpha")
	tenant := auth.DefaultTenant

	w.mcp.RequireScope("alpha", "profile")
	_, err := w.callAs(tenant, run, "tickets__alpha")
	authURL, scope := stepUpURL(t, err)
	require.Equal(t, "openid offline_access profile", scope, "the sign-in's scopes and the challenge's")
	require.Contains(t, err.Error(), "refused the user's token for want of scope profile")
	require.Equal(t, 1, w.mcp.Called("alpha"), "the refused call did not run")
	attempts := w.attempts()
	last := attempts[len(attempts)-1]
	require.Equal(t, audit.OutcomeDispatched, last.Outcome)
	require.Equal(t, audit.ResultFailed, last.Result)
	require.Equal(t, failureSignInRequired, last.FailureClass)

	// Until the user signs in, the tools the token suffices for go on.
	res, err := w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)
	require.Equal(t, "whoami for "+oauthtest.Alice, resultText(t, res))

	done, err := w.pool.CompleteSignIn(w.ctx, callbackQuery(t, w.as.SignIn(t, authURL, oauthtest.Alice)))
	require.NoError(t, err)
	require.NoError(t, done.ConnectErr)
	res, err = w.callAs(tenant, run, "tickets__alpha")
	require.NoError(t, err)
	require.Equal(t, "alpha for "+oauthtest.Alice, resultText(t, res))
	now := w.mcp.Tokens(oauthtest.Alice)
	require.NotContains(t, first, now[len(now)-1], "the call carried the new token")

	// A scope the authorization server never grants: asked for once, then refused.
	w.mcp.RequireScope("alpha", "tickets.admin")
	_, err = w.callAs(tenant, run, "tickets__alpha")
	authURL, scope = stepUpURL(t, err)
	require.Equal(t, "openid offline_access profile tickets.admin", scope)
	_, err = w.pool.CompleteSignIn(w.ctx, callbackQuery(t, w.as.SignIn(t, authURL, oauthtest.Alice)))
	require.NoError(t, err)
	_, err = w.callAs(tenant, run, "tickets__alpha")
	requireFailed(t, err, failureSignInRequired)
	var si *signInError
	require.False(t, errors.As(err, &si), "no new sign-in for a scope asked for already: %v", err)
	require.ErrorIs(t, err, errScopeNotGranted)
	require.ErrorContains(t, err, "for want of scope tickets.admin, which the user's sign-in asked for already")
	require.Equal(t, 2, w.mcp.Called("alpha"))
}

// TestStepUpScopes: the scopes a sign-in for a scope challenge asks for, and when it is not
// begun.
func TestStepUpScopes(t *testing.T) {
	base := []string{"openid", "tickets.read"}
	for _, tc := range []struct {
		name             string
		asked, challenge []string
		want             []string
		refused          string
	}{
		{"the union, the sign-in's first", []string{"openid", "tickets.read"}, []string{"tickets.write"}, []string{"openid", "tickets.read", "tickets.write"}, ""},
		{"a challenge that covers them stands as given", []string{"tickets.read"}, []string{"tickets.write", "tickets.read"}, []string{"tickets.write", "tickets.read"}, ""},
		{"a token that does not say: the base", nil, []string{"tickets.write"}, []string{"openid", "tickets.read", "tickets.write"}, ""},
		{"asked for already", []string{"openid", "tickets.write"}, []string{"tickets.write"}, nil, "asked for already"},
		{"no scope named", base, nil, nil, "named no scope"},
		{"too many", base, manyScopes(mcpserver.MaxScopes), nil, "more than 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := stepUp{asked: tc.asked, challenge: tc.challenge}
			got, err := up.scopes("tickets", base)
			if tc.refused != "" {
				require.ErrorIs(t, err, errScopeNotGranted)
				require.ErrorContains(t, err, tc.refused)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func manyScopes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "s" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	return out
}

// TestScopeChallengeToAListing: a server that needs a scope to list its tools refuses the
// listing of a run's session (the drift check before a call) and of a connect: the call is
// refused before dispatch as sign_in_required, and ConnectServer answers, each with the URL of
// a sign-in for the wider scope; no log line holds it. After the user signs in, the run's next
// call lists and runs with the new token.
func TestScopeChallengeToAListing(t *testing.T) {
	logs := &rftestutil.SyncBuffer{}
	w := oauthHarness(t, harnessOpts{logTo: logs})
	tenant := auth.DefaultTenant
	w.signIn(tenant, oauthtest.Alice)
	run := w.startAs(tenant, oauthtest.Alice)
	_, err := w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)

	w.mcp.RequireListScope("email")
	_, err = w.callAs(tenant, run, "tickets__whoami")
	requireSignInForScope(t, err, logs, "openid offline_access email")

	c, err := w.pool.ConnectServer(w.ctx, tenant, oauthtest.Alice, "tickets")
	require.NoError(t, err)
	require.Equal(t, ConnectSignInRequired, c.State)
	u, err := url.Parse(c.AuthorizationURL)
	require.NoError(t, err)
	require.Equal(t, "openid offline_access email", u.Query().Get("scope"))

	done, err := w.pool.CompleteSignIn(w.ctx, callbackQuery(t, w.as.SignIn(t, c.AuthorizationURL, oauthtest.Alice)))
	require.NoError(t, err)
	require.NoError(t, done.ConnectErr)
	res, err := w.callAs(tenant, run, "tickets__whoami")
	require.NoError(t, err)
	require.Equal(t, "whoami for "+oauthtest.Alice, resultText(t, res))
}

// requireSignInForScope holds that err refuses a call as sign_in_required with the URL of a
// sign-in for scope, which no line of logs holds.
func requireSignInForScope(t *testing.T, err error, logs *rftestutil.SyncBuffer, scope string) {
	t.Helper()
	ref := requireRefused(t, err, reasonSignInRequired)
	var si *signInError
	require.ErrorAs(t, ref, &si)
	u, err := url.Parse(si.url)
	require.NoError(t, err)
	require.Equal(t, scope, u.Query().Get("scope"))
	require.NotContains(t, logs.String(), u.Query().Get("state"))
}
