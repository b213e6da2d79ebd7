package publisher

import (
	"context"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/services/publisher/internal/store"
)

// Store is where the publisher keeps tenants' graphs: one bbolt file (store.Bolt, the
// embedded default) or etcd shared by every replica (store.Etcd), chosen by Config. Both make
// a write durable before it returns and run its hook in its transaction (the audit record
// commits with the change or not at all), never overwrite a published version nor reuse its
// number, and answer every read with what the last acknowledged write left, on any replica.
// Graphs returned by reads are shared: never modify them.
type Store interface {
	CreateGraph(ctx context.Context, g *graph.Graph, hook store.Hook) error
	Draft(ctx context.Context, tenant, id string) (*graph.Graph, error)
	// UpdateDraft edits the stored draft with mutate; mutate and hook may run more than once
	// when another replica changed the draft first, so they must not keep state between calls.
	UpdateDraft(ctx context.Context, tenant, id string, mutate func(cur *graph.Graph) error, hook store.Hook) (*graph.Graph, error)
	// Publish stores v as the next version if the draft is still at draftRevision.
	Publish(ctx context.Context, tenant, id string, draftRevision int64, v *graph.Version, hook store.Hook) (int64, error)
	Version(ctx context.Context, tenant, id string, n int64) (*graph.Version, error)
	ListVersions(ctx context.Context, tenant, id, pageToken string, limit int) ([]graph.Version, string, error)
	ListGraphs(ctx context.Context, tenant, pageToken string, limit int) ([]store.Summary, string, error)
	// Published lists every graph of every tenant with a published version.
	Published(ctx context.Context) ([]store.Summary, error)
	DeleteGraph(ctx context.Context, tenant, id string, hook store.Hook) error

	// Spool is the audit spool whose outbox lives beside the data.
	Spool() *audit.Spool
	Close() error
}

var (
	_ Store = (*store.Bolt)(nil)
	_ Store = (*store.Etcd)(nil)
)
