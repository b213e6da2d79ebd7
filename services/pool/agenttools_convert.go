package pool

import (
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/graph/graphpb"
)

// listingToProto renders an agent's listing.
func listingToProto(l *agentsurface.Listing) *poolv1.ListAgentToolsResponse {
	out := &poolv1.ListAgentToolsResponse{SelectedServers: l.Selected}
	for i := range l.Tools {
		t := &l.Tools[i]
		out.Tools = append(out.Tools, &poolv1.AgentTool{
			Name: t.Name, Kind: t.Kind, ServerRef: t.ServerRef, ToolName: t.ToolName, Title: t.Title, Description: t.Description,
			InputSchema: graphpb.RawToStruct(t.InputSchema), OutputSchema: graphpb.RawToStruct(t.OutputSchema), Annotations: graphpb.RawToStruct(t.Annotations),
			RequiresConfirmation: t.RequiresConfirmation, Strict: t.Strict, Loaded: t.Loaded,
		})
	}
	for _, d := range l.Deferred {
		out.DeferredServers = append(out.DeferredServers, &poolv1.DeferredServer{ServerRef: d.Ref, Description: d.Description, UnloadedTools: int32(d.Unloaded)})
	}
	for _, h := range l.Hidden {
		out.Hidden = append(out.Hidden, &poolv1.HiddenTool{
			Name: h.Tool.Name, ServerRef: h.Tool.ServerRef, ToolName: h.Tool.ToolName,
			Reason: string(h.Decision.Outcome), Level: string(h.Decision.Level), Message: h.Decision.Message,
		})
	}
	return out
}
