package pool

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
)

// TestAgentTokenLifecycle: a token is minted for an agent of a running run, authenticates
// until it is revoked, expires, or its run ends (which drops it), and is its tenant's alone;
// the audit log names it by its id, never by its secret.
func TestAgentTokenLifecycle(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, nil)
	run := h.start("g")

	tok, secret, err := h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "a", 0)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(secret, agentTokenPrefix))
	require.Equal(t, DefaultAgentTokenTTL, tok.ExpireTime.Sub(tok.CreateTime), "the default lifetime")
	require.Equal(t, "key:key_test", tok.CreatedBy)

	got, err := h.pool.AuthenticateAgentToken(h.ctx, secret)
	require.NoError(t, err)
	require.Equal(t, AgentToken{ID: tok.ID, Tenant: auth.DefaultTenant, RunID: run, Agent: "a", CreateTime: tok.CreateTime, ExpireTime: tok.ExpireTime, CreatedBy: tok.CreatedBy}, *got)

	// Wrong tokens: another secret, a truncated one, one that is not an agent token.
	for _, wrong := range []string{newAgentTokenSecret(), secret[:len(secret)-1], "Bearer " + secret, "", strings.Repeat("x", 4096)} {
		_, err := h.pool.AuthenticateAgentToken(h.ctx, wrong)
		require.Error(t, err, "%.20q", wrong)
	}

	// Bounds on minting.
	_, _, err = h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "nobody", 0)
	require.ErrorIs(t, err, errUnknownAgent)
	_, _, err = h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "a", 25*time.Hour)
	require.ErrorContains(t, err, "frontdoor.token_max_ttl")
	_, _, err = h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "a", time.Second)
	require.ErrorContains(t, err, "from 1m")
	short, _, err := h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "a", 2*time.Minute)
	require.NoError(t, err)
	require.Equal(t, 2*time.Minute, short.ExpireTime.Sub(short.CreateTime))

	// Another tenant sees neither the run nor its tokens.
	acme := auth.WithTenancy(auth.WithPrincipal(t.Context(), auth.Principal{KeyID: "key_acme", Role: auth.RoleRunner, Permissions: []auth.Permission{auth.RunExecute}, Tenant: "acme"}), auth.Tenancy{Tenant: "acme"})
	_, err = h.pool.ListAgentTokens(acme, "acme", run)
	require.ErrorIs(t, err, errRunNotFound)
	_, err = h.pool.RevokeAgentToken(acme, "acme", run, tok.ID)
	require.ErrorIs(t, err, errRunNotFound)
	_, _, err = h.pool.CreateAgentToken(acme, "acme", run, "a", 0)
	require.ErrorIs(t, err, errRunNotFound)

	list, err := h.pool.ListAgentTokens(h.ctx, auth.DefaultTenant, run)
	require.NoError(t, err)
	require.Len(t, list, 2)

	// Expiry: the record says it expired (the store is rewritten as time would leave it).
	rec, err := h.pool.store.AgentTokenByHash(h.ctx, hashAgentToken(secret))
	require.NoError(t, err)
	rec.ExpireTime = time.Now().Add(-time.Second)
	require.NoError(t, h.pool.store.PutAgentToken(h.ctx, rec))
	_, err = h.pool.AuthenticateAgentToken(h.ctx, secret)
	require.ErrorIs(t, err, errTokenExpired)
	h.pool.dropExpiredTokens(h.ctx, time.Now())
	_, err = h.pool.AuthenticateAgentToken(h.ctx, secret)
	require.ErrorIs(t, err, errTokenInvalid, "the sweep dropped it")

	// Revocation.
	third, thirdSecret, err := h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "a", 0)
	require.NoError(t, err)
	_, err = h.pool.RevokeAgentToken(h.ctx, auth.DefaultTenant, run, third.ID)
	require.NoError(t, err)
	_, err = h.pool.AuthenticateAgentToken(h.ctx, thirdSecret)
	require.ErrorIs(t, err, errTokenInvalid)
	_, err = h.pool.RevokeAgentToken(h.ctx, auth.DefaultTenant, run, third.ID)
	require.ErrorIs(t, err, errTokenNotFound)

	// The run ends: its tokens die with it.
	_, shortSecret, err := h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "a", 0)
	require.NoError(t, err)
	_, err = h.pool.EndRun(h.ctx, run, "", StateCompleted, "done")
	require.NoError(t, err)
	_, err = h.pool.AuthenticateAgentToken(h.ctx, shortSecret)
	require.ErrorIs(t, err, errTokenInvalid)
	list, err = h.pool.ListAgentTokens(h.ctx, auth.DefaultTenant, run)
	require.NoError(t, err)
	require.Empty(t, list, "ending the run dropped them")
	_, _, err = h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "a", 0)
	require.ErrorIs(t, err, errRunEnded)

	// The audit log names each token by its id and holds no secret.
	h.attempts() // flushes the spool
	var created, revoked []string
	for _, r := range h.audit.Records() {
		for _, s := range []string{secret, thirdSecret, shortSecret} {
			require.NotContains(t, string(mustJSON(t, r)), s, "no record holds a token's secret")
		}
		if r.Kind != audit.KindAdmin || r.Admin.ResourceType != resourceAgentToken {
			continue
		}
		switch r.Admin.Action {
		case actionAgentTokenCreate:
			created = append(created, r.Admin.ResourceID)
		case actionAgentTokenRevoke:
			revoked = append(revoked, r.Admin.ResourceID)
		}
	}
	require.Len(t, created, 4)
	require.Equal(t, []string{third.ID}, revoked)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
