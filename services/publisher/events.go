package publisher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/graph/graphpb"
	"github.com/ringfence/ringfence/services/publisher/internal/store"
)

const resourceGraph = "graph"

// maxListedNodes bounds the node ids one admin event names (an audit record holds at most
// 64 KiB); the counts stay exact.
const maxListedNodes = 200

// maxListedTools bounds the tools one import event details (each carries its pins).
const maxListedTools = 100

// event returns a store hook that writes the admin event for a change into the audit outbox
// in the change's own transaction. change is built by the caller from data without secrets
// (inline env values appear only masked).
func (s *Service) event(ctx context.Context, tenant, action, graphID string, change any) store.Hook {
	p, _ := auth.FromContext(ctx)
	actorID, actorName, role := p.AuditActor()
	var raw json.RawMessage
	var err error
	if change != nil {
		if raw, err = json.Marshal(change); err == nil {
			// The lists above are capped, but a change must fit a record whatever it holds.
			raw, err = audit.BoundChange(raw)
		}
	}
	return func(r audit.Recorder) error {
		if err != nil {
			return err
		}
		return r.Record(audit.NewAdminRecord("publisher", tenant, audit.AdminEvent{
			ActorKeyID: actorID, ActorKeyName: actorName, ActorRole: role, Action: action,
			ResourceType: resourceGraph, ResourceID: graphID, Change: raw,
		}))
	}
}

// nodeDigests maps each node to a digest of its JSON, to describe a draft change as which
// nodes were added, removed or changed. The JSON is not masked: a change of an inline
// server's env value alone must show (the digests stay in memory; the record names ids).
func nodeDigests(g *graph.Graph) map[string]string {
	out := make(map[string]string, len(g.Nodes))
	for i := range g.Nodes {
		b, _ := protojson.Marshal(graphpb.NodeToProto(&g.Nodes[i], false))
		sum := sha256.Sum256(b)
		out[g.Nodes[i].ID] = hex.EncodeToString(sum[:8])
	}
	return out
}

// draftChange describes a draft edit: revisions, counts, and the nodes it touched.
func draftChange(before, after *graph.Graph) map[string]any {
	b, a := nodeDigests(before), nodeDigests(after)
	var added, removed, changed []string
	for id, d := range a {
		if old, ok := b[id]; !ok {
			added = append(added, id)
		} else if old != d {
			changed = append(changed, id)
		}
	}
	for id := range b {
		if _, ok := a[id]; !ok {
			removed = append(removed, id)
		}
	}
	return map[string]any{
		"previous_revision": before.Revision,
		"nodes":             len(after.Nodes),
		"edges":             len(after.Edges),
		"policies":          len(after.Policies),
		"capability_mode":   after.Mode(),
		"nodes_added":       bounded(added),
		"nodes_removed":     bounded(removed),
		"nodes_changed":     bounded(changed),
		"nodes_added_count": len(added), "nodes_removed_count": len(removed), "nodes_changed_count": len(changed),
	}
}

func bounded(ids []string) []string {
	sort.Strings(ids)
	if len(ids) > maxListedNodes {
		return ids[:maxListedNodes]
	}
	return ids
}

// importChange describes an import: the server, the agent, and per tool its outcome and pins.
func importChange(req ImportRequest, res *ImportResult) map[string]any {
	tools := make([]map[string]any, 0, min(len(res.Tools), maxListedTools))
	for i, t := range res.Tools {
		if i == maxListedTools {
			break
		}
		entry := map[string]any{"tool": t.ToolName, "node_id": t.NodeID, "outcome": t.Outcome, "new_hash": t.NewHash}
		if t.OldHash != "" && t.OldHash != t.NewHash {
			entry["old_hash"] = t.OldHash
		}
		if len(t.Flags) > 0 {
			codes := make([]string, 0, len(t.Flags))
			for _, f := range t.Flags {
				codes = append(codes, f.Code)
			}
			entry["flags"] = codes
		}
		tools = append(tools, entry)
	}
	return map[string]any{
		"server_ref": req.ServerRef, "agent": req.Agent, "tools": tools, "tool_count": len(res.Tools),
		"agent_capabilities_added": res.AgentCapabilitiesAdded,
	}
}
