package publisher

import (
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/publisher/internal/store"
)

// restoreMaskedEnv puts back the stored value of every inline env value a client sent as the
// mask (it read the draft, which never shows them). A masked value with nothing stored behind
// it is refused rather than stored as the mask.
func restoreMaskedEnv(next, cur *graph.Graph) error {
	for i := range next.Nodes {
		n := &next.Nodes[i]
		if n.Agent == nil {
			continue
		}
		for j := range n.Agent.MCPServers {
			s := &n.Agent.MCPServers[j]
			restored := make(map[string]string, len(s.Env))
			for k, v := range s.Env {
				if v != mcpserver.SecretMask {
					restored[k] = v
					continue
				}
				stored, ok := storedEnv(cur, n.ID, s.Name, k)
				if !ok {
					return fielderr.New(fmt.Sprintf("draft.nodes[%d].agent.mcp_servers[%d].env.%s", i, j, k),
						"is the mask %q, and no value is stored for it: send the value itself", mcpserver.SecretMask)
				}
				restored[k] = stored
			}
			if len(s.Env) > 0 {
				s.Env = restored
			}
		}
	}
	return nil
}

func storedEnv(g *graph.Graph, nodeID, server, key string) (string, bool) {
	if g == nil {
		return "", false
	}
	a, ok := g.Agent(nodeID)
	if !ok {
		return "", false
	}
	for _, s := range a.MCPServers {
		if s.Name == server {
			v, ok := s.Env[key]
			return v, ok
		}
	}
	return "", false
}

func summaryToProto(s store.Summary) *publisherv1.GraphSummary {
	return &publisherv1.GraphSummary{
		Id: s.ID, Tenant: s.Tenant, DraftRevision: s.DraftRevision, LatestVersion: s.LatestVersion,
		NodeCount: int32(s.NodeCount), UpdateTime: timestamppb.New(s.UpdateTime),
	}
}

func violationsToProto(vs []graph.Violation) []*publisherv1.Violation {
	out := make([]*publisherv1.Violation, len(vs))
	for i, v := range vs {
		out[i] = &publisherv1.Violation{
			Rule: v.Rule, NodeId: v.NodeID, AgentId: v.AgentID, ServerRef: v.ServerRef,
			Missing: v.Missing, Excess: v.Excess, Message: v.Message,
		}
	}
	return out
}
