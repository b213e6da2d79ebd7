package publisher

import (
	"context"

	"github.com/ringfence/ringfence/internal/graph"
)

// StrandedBy names the published graphs, in every tenant, whose latest version's tools of
// server ref declare capabilities grants do not cover: the registry warns with them when an
// update narrows a server's grants (their calls are then refused at run time by the ceiling).
// It is a Go call in ringfenced only: it crosses tenants, and has no RPC.
func (s *Service) StrandedBy(ctx context.Context, ref string, grants []string) ([]graph.Stranded, error) {
	graphs, err := s.store.Published(ctx)
	if err != nil {
		return nil, err
	}
	var out []graph.Stranded
	for _, g := range graphs {
		v, err := s.store.Version(ctx, g.Tenant, g.ID, g.LatestVersion)
		if err != nil {
			return nil, err
		}
		if st, ok := graph.StrandedBy(v, ref, grants); ok {
			out = append(out, st)
		}
	}
	return out, nil
}
