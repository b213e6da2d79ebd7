package pool

import (
	"context"
	"time"

	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// RunStore keeps the run records: the pool's bbolt file (store.Store, one host) or etcd
// (store.Etcd, shared by every pool host). Both pass one table of behaviours
// (services/pool/internal/store/runs_test.go).
type RunStore interface {
	// CreateRun stores a new run; an id its tenant has taken is store.ErrExists.
	CreateRun(ctx context.Context, r store.Run) error
	// PutRun records a run's new state for the host that owns it (r.Host); a run another host
	// owns, or that ended, is store.ErrNotOwner.
	PutRun(ctx context.Context, r store.Run) error
	// UpdateRun changes a run in one transaction; mutate may run more than once.
	UpdateRun(ctx context.Context, tenant, id string, mutate func(*store.Run) error) (store.Run, error)
	GetRun(ctx context.Context, tenant, id string) (store.Run, error)
	// ActiveRuns lists the running and paused runs host owns.
	ActiveRuns(ctx context.Context, host string) ([]store.Run, error)
}

// TokenStore keeps the MCP front door's agent tokens (hashed): the pool's bbolt file, or etcd
// with several pool hosts, so that every host's front door knows every token.
type TokenStore interface {
	PutAgentToken(ctx context.Context, t store.AgentToken) error
	AgentTokenByHash(ctx context.Context, hash string) (store.AgentToken, error)
	RunAgentTokens(ctx context.Context, tenant, run string) ([]store.AgentToken, error)
	DeleteAgentTokens(ctx context.Context, tenant, run string, ids ...string) ([]store.AgentToken, error)
	ExpiredAgentTokens(ctx context.Context, now time.Time, limit int) ([]store.AgentToken, error)
}

var (
	_ RunStore   = (*store.Store)(nil)
	_ RunStore   = (*store.Etcd)(nil)
	_ TokenStore = (*store.Store)(nil)
	_ TokenStore = (*store.Etcd)(nil)
)
