package registry

import (
	"context"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/registry/internal/store"
)

// Store is where the registry keeps registrations, secrets and API keys: one bbolt file
// (store.Bolt, the embedded default) or etcd shared by every replica (store.Etcd), chosen by
// Config. Both seal secrets at rest, make a write durable before it returns, and run a write's
// hook in its transaction, so the audit record commits with the change or not at all. Reads
// see every write acknowledged before them, on any replica.
type Store interface {
	CreateServer(ctx context.Context, r *mcpserver.Registration, hook store.Hook) error
	// GetServer returns the registration with its env and URL in clear (the pool's resolve).
	GetServer(ctx context.Context, ref string) (*mcpserver.Registration, error)
	// GetServerMasked returns it with env values empty and the URL masked, opening no seal.
	GetServerMasked(ctx context.Context, ref string) (*mcpserver.Registration, error)
	// ServerView returns build's view of the masked registration, built once per revision
	// and shared by readers.
	ServerView(ctx context.Context, ref string, build func(*mcpserver.Registration) any) (any, error)
	ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error)
	WarmTargets(ctx context.Context) ([]mcpserver.WarmTarget, error)
	ListServers(ctx context.Context, pageToken string, limit int) ([]*mcpserver.Registration, string, error)
	// ClosestRef is the registered ref nearest to ref, for a "did you mean", or "".
	ClosestRef(ref string) string
	// UpdateServer replaces a registration with what mutate returns; mutate and hook may run
	// more than once when another replica changed it first, so they must not keep state
	// between calls.
	UpdateServer(ctx context.Context, ref string, mutate func(cur *mcpserver.Registration) (*mcpserver.Registration, error), hook store.UpdateHook) (*mcpserver.Registration, error)
	DeleteServer(ctx context.Context, ref string, hook store.Hook) error

	PutSecret(ctx context.Context, name, value string, hook store.Hook) (store.Secret, error)
	SecretValue(ctx context.Context, name string) (string, error)
	ListSecrets(ctx context.Context) ([]store.Secret, error)
	DeleteSecret(ctx context.Context, name string, hook store.Hook) error

	CreateKey(ctx context.Context, k store.Key, hook store.Hook) error
	KeyByHash(ctx context.Context, hash string) (store.Key, bool, error)
	// HeldKeyByHash returns the key with that hash as this replica holds it, without first
	// confirming that is current (KeyByHash does): for admissions only (auth.Admitting).
	HeldKeyByHash(hash string) (store.Key, bool)
	KeyByID(ctx context.Context, id string) (store.Key, bool, error)
	ListKeys(ctx context.Context) ([]store.Key, error)
	RevokeKey(ctx context.Context, id string, hook store.Hook) (store.Key, error)

	// Spool is the audit spool whose outbox lives beside the data (a bucket of the file, or
	// a prefix in etcd).
	Spool() *audit.Spool
	Close() error
}

var (
	_ Store = (*store.Bolt)(nil)
	_ Store = (*store.Etcd)(nil)
)
