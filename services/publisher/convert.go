package publisher

import (
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
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
			if !mcpserver.HasMask(s.Env) {
				continue
			}
			env, err := mcpserver.RestoreMasked(fmt.Sprintf("draft.nodes[%d].agent.mcp_servers[%d].env", i, j),
				s.Env, storedEnv(cur, n.ID, s.Name))
			if err != nil {
				return err
			}
			s.Env = env
		}
	}
	return nil
}

// inlineEnvs is every inline server's env of g as it is now, to put back with setInlineEnvs:
// restoreMaskedEnv replaces masks in place, and an edit that runs again on a newer draft (the
// store retries when another replica wrote first) must restore them from that draft.
func inlineEnvs(g *graph.Graph) map[[2]int]map[string]string {
	out := map[[2]int]map[string]string{}
	for i := range g.Nodes {
		if a := g.Nodes[i].Agent; a != nil {
			for j := range a.MCPServers {
				out[[2]int{i, j}] = a.MCPServers[j].Env
			}
		}
	}
	return out
}

func setInlineEnvs(g *graph.Graph, envs map[[2]int]map[string]string) {
	for ij, env := range envs {
		g.Nodes[ij[0]].Agent.MCPServers[ij[1]].Env = env
	}
}

// storedEnv is the stored inline env of an agent node's server, nil when there is none.
func storedEnv(g *graph.Graph, nodeID, server string) map[string]string {
	if g == nil {
		return nil
	}
	a, ok := g.Agent(nodeID)
	if !ok {
		return nil
	}
	for _, s := range a.MCPServers {
		if s.Name == server {
			return s.Env
		}
	}
	return nil
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
