package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// tokenStore is what the pool asks of its agent tokens (pool.TokenStore).
type tokenStore interface {
	PutAgentToken(ctx context.Context, t AgentToken) error
	AgentTokenByHash(ctx context.Context, hash string) (AgentToken, error)
	RunAgentTokens(ctx context.Context, tenant, run string) ([]AgentToken, error)
	DeleteAgentTokens(ctx context.Context, tenant, run string, ids ...string) ([]AgentToken, error)
	ExpiredAgentTokens(ctx context.Context, now time.Time, limit int) ([]AgentToken, error)
}

// TestAgentTokenBehaviours: bbolt and etcd keep agent tokens alike: found by hash through any
// handle, listed by run, dropped by id once (whoever drops it), expired ones listed up to a
// bound.
func TestAgentTokenBehaviours(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	for _, b := range runBackends(t, cluster) {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			s, other := b.open(t).(tokenStore), b.open(t).(tokenStore)
			now := time.Now().UTC().Truncate(time.Second)
			tokens := []AgentToken{
				{ID: "t1", Tenant: "acme", RunID: "r1", Agent: "a", Hash: "h1", CreateTime: now, ExpireTime: now.Add(time.Hour), CreatedBy: "key:ci"},
				{ID: "t2", Tenant: "acme", RunID: "r1", Agent: "b", Hash: "h2", CreateTime: now, ExpireTime: now.Add(-time.Minute)},
				{ID: "t3", Tenant: "acme", RunID: "r2", Agent: "a", Hash: "h3", CreateTime: now, ExpireTime: now.Add(-time.Hour)},
			}
			for _, tok := range tokens {
				require.NoError(t, s.PutAgentToken(ctx, tok))
			}
			got, err := other.AgentTokenByHash(ctx, "h1")
			require.NoError(t, err)
			require.Equal(t, tokens[0], got)
			_, err = other.AgentTokenByHash(ctx, "nope")
			require.ErrorIs(t, err, ErrNotFound)

			run1, err := other.RunAgentTokens(ctx, "acme", "r1")
			require.NoError(t, err)
			require.Equal(t, tokens[:2], run1)
			expired, err := other.ExpiredAgentTokens(ctx, now, 10)
			require.NoError(t, err)
			require.ElementsMatch(t, tokens[1:], expired)
			expired, err = other.ExpiredAgentTokens(ctx, now, 1)
			require.NoError(t, err)
			require.Len(t, expired, 1)

			gone, err := s.DeleteAgentTokens(ctx, "acme", "r1", "t1", "unknown")
			require.NoError(t, err)
			require.Equal(t, tokens[:1], gone)
			gone, err = other.DeleteAgentTokens(ctx, "acme", "r1", "t1")
			require.NoError(t, err)
			require.Empty(t, gone, "dropped once")
			_, err = other.AgentTokenByHash(ctx, "h1")
			require.ErrorIs(t, err, ErrNotFound, "its hash goes with it")
			run1, err = s.RunAgentTokens(ctx, "acme", "r1")
			require.NoError(t, err)
			require.Equal(t, tokens[1:2], run1)
		})
	}
}
