// Package graphpb converts graphs between the domain model and the publisher's protos, for the
// publisher's front end and for services that receive published versions over gRPC.
package graphpb

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
)

// GraphFromProto converts a draft sent by a client. Kinds and payloads must agree; the shape is
// checked by graph.Structure afterwards.
func GraphFromProto(p *publisherv1.Graph) (*graph.Graph, error) {
	if len(p.GetNodes()) > graph.MaxNodes {
		return nil, fielderr.New("draft.nodes", "has %d nodes; at most %d", len(p.GetNodes()), graph.MaxNodes)
	}
	if len(p.GetEdges()) > graph.MaxEdges {
		return nil, fielderr.New("draft.edges", "has %d edges; at most %d", len(p.GetEdges()), graph.MaxEdges)
	}
	g := &graph.Graph{
		ID: p.GetId(), Tenant: p.GetTenant(), CapabilityMode: p.GetCapabilityMode(),
		Nodes: make([]graph.Node, len(p.GetNodes())), Edges: make([]graph.Edge, len(p.GetEdges())),
	}
	for i, pn := range p.GetNodes() {
		n := graph.Node{ID: pn.GetId(), Kind: pn.GetKind()}
		field := fmt.Sprintf("draft.nodes[%d]", i)
		switch d := pn.GetData().(type) {
		case *publisherv1.Node_Agent:
			n.Agent = agentFromProto(d.Agent)
		case *publisherv1.Node_McpTool:
			m, err := mcpToolFromProto(field+".mcp_tool", d.McpTool)
			if err != nil {
				return nil, err
			}
			n.MCPTool = m
		case *publisherv1.Node_Opaque:
			raw, err := structToRaw(field+".opaque", d.Opaque)
			if err != nil {
				return nil, err
			}
			n.Opaque = raw
		}
		// A typed kind without its payload gets an empty one only for agents, which need no
		// fields; an mcp_tool without its payload is reported by the structure check.
		if n.Kind == graph.KindAgent && n.Agent == nil && pn.GetData() == nil {
			n.Agent = &graph.AgentNode{}
		}
		g.Nodes[i] = n
	}
	for i, e := range p.GetEdges() {
		g.Edges[i] = graph.Edge{From: e.GetFrom(), To: e.GetTo(), Kind: e.GetKind()}
	}
	if len(p.GetPolicies()) > graph.MaxPolicies {
		return nil, fielderr.New("draft.policies", "has %d policies; at most %d", len(p.GetPolicies()), graph.MaxPolicies)
	}
	for _, pp := range p.GetPolicies() {
		g.Policies = append(g.Policies, graph.Policy{ID: pp.GetId(), Agents: pp.GetAgents(), Revoke: pp.GetRevoke()})
	}
	return g, nil
}

func agentFromProto(a *publisherv1.AgentNode) *graph.AgentNode {
	out := &graph.AgentNode{CapabilityBindings: a.GetCapabilityBindings(), ToolSettings: settingsFromProto(a)}
	for _, b := range a.GetToolBindings() {
		out.ToolBindings = append(out.ToolBindings, graph.ToolBinding{Name: b.GetName(), NodeID: b.GetNodeId(), Confirmation: b.GetConfirmation()})
	}
	for _, s := range a.GetMcpServers() {
		out.MCPServers = append(out.MCPServers, graph.InlineMCPServer{Name: s.GetName(), Command: s.GetCommand(), Args: s.GetArgs(), Env: s.GetEnv()})
	}
	return out
}

// settingsFromProto reads an agent's tool surface settings; graph.Structure checks them.
func settingsFromProto(a *publisherv1.AgentNode) graph.ToolSettings {
	s := graph.ToolSettings{
		IncludeServers: a.GetIncludeServers(), ExcludeServers: a.GetExcludeServers(),
		IncludeTools: a.GetIncludeTools(), ExcludeTools: a.GetExcludeTools(),
		DeferTools: a.GetDeferTools(), ConfirmationDefault: a.GetConfirmationDefault(),
		ConvertSchemasToStrict: a.GetConvertSchemasToStrict(), SelectedServers: a.GetSelectedServers(),
	}
	for _, m := range a.GetMounts() {
		s.Mounts = append(s.Mounts, graph.Mount{Name: m.GetName(), IncludeTools: m.GetIncludeTools(), ExcludeTools: m.GetExcludeTools(), DeferTools: copyBool(m.DeferTools)})
	}
	if r := a.GetDocumentResolver(); r != nil {
		s.DocumentResolver = &graph.DocumentResolver{Enabled: r.GetEnabled(), ServerNames: r.GetServerNames()}
	}
	return s
}

// copyBool copies an optional bool, so a graph and a message never share one.
func copyBool(p *bool) *bool {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// settingsToProto writes an agent's tool surface settings into a.
func settingsToProto(s *graph.ToolSettings, a *publisherv1.AgentNode) {
	a.IncludeServers, a.ExcludeServers = s.IncludeServers, s.ExcludeServers
	a.IncludeTools, a.ExcludeTools = s.IncludeTools, s.ExcludeTools
	a.DeferTools, a.ConfirmationDefault = s.DeferTools, s.ConfirmationDefault
	a.ConvertSchemasToStrict, a.SelectedServers = s.ConvertSchemasToStrict, s.SelectedServers
	for _, m := range s.Mounts {
		a.Mounts = append(a.Mounts, &publisherv1.Mount{Name: m.Name, IncludeTools: m.IncludeTools, ExcludeTools: m.ExcludeTools, DeferTools: copyBool(m.DeferTools)})
	}
	if r := s.DocumentResolver; r != nil {
		a.DocumentResolver = &publisherv1.DocumentResolver{Enabled: r.Enabled, ServerNames: r.ServerNames}
	}
}

func mcpToolFromProto(field string, m *publisherv1.McpToolNode) (*graph.MCPToolNode, error) {
	out := &graph.MCPToolNode{
		ServerRef: m.GetServerRef(), ToolName: m.GetToolName(), Title: m.GetTitle(), Description: m.GetDescription(),
		SchemaHash: m.GetSchemaHash(), CapabilityBindings: m.GetCapabilityBindings(),
	}
	var err error
	if out.InputSchema, err = structToRaw(field+".input_schema", m.GetInputSchema()); err != nil {
		return nil, err
	}
	if out.OutputSchema, err = structToRaw(field+".output_schema", m.GetOutputSchema()); err != nil {
		return nil, err
	}
	if out.Annotations, err = structToRaw(field+".annotations", m.GetAnnotations()); err != nil {
		return nil, err
	}
	if len(m.GetFlags()) > graph.MaxFlags {
		return nil, fielderr.New(field+".flags", "has %d flags; at most %d", len(m.GetFlags()), graph.MaxFlags)
	}
	if len(m.GetFlags()) > 0 {
		out.Flags = discovery.FindingsFromProto(m.GetFlags())
	}
	return out, nil
}

func structToRaw(field string, s *structpb.Struct) (json.RawMessage, error) {
	if s == nil {
		return nil, nil
	}
	b, err := protojson.Marshal(s)
	if err != nil {
		return nil, fielderr.New(field, "cannot be encoded as JSON: %v", err)
	}
	return b, nil
}

// RawToStruct is a stored JSON object as a Struct (nil for none): a pinned schema or
// annotations, checked to be a JSON object when written.
func RawToStruct(raw json.RawMessage) *structpb.Struct {
	if len(raw) == 0 {
		return nil
	}
	s := &structpb.Struct{}
	if err := protojson.Unmarshal(raw, s); err != nil {
		// Stored payloads are JSON objects (checked on write); anything else is not shown.
		return nil
	}
	return s
}

// GraphToProto renders a graph. With mask, inline servers' env values are replaced by the one
// fixed mask: an env is credentials by convention, and only the pool, which runs them, reads
// them in clear.
func GraphToProto(g *graph.Graph, mask bool) *publisherv1.Graph {
	out := &publisherv1.Graph{
		Id: g.ID, Tenant: g.Tenant, CapabilityMode: g.Mode(), Revision: g.Revision,
		Nodes: make([]*publisherv1.Node, len(g.Nodes)), Edges: make([]*publisherv1.Edge, len(g.Edges)),
	}
	if !g.UpdateTime.IsZero() {
		out.UpdateTime = timestamppb.New(g.UpdateTime)
	}
	for i := range g.Nodes {
		out.Nodes[i] = NodeToProto(&g.Nodes[i], mask)
	}
	for i, e := range g.Edges {
		out.Edges[i] = &publisherv1.Edge{From: e.From, To: e.To, Kind: e.Kind}
	}
	for _, p := range g.Policies {
		out.Policies = append(out.Policies, &publisherv1.Policy{Id: p.ID, Agents: p.Agents, Revoke: p.Revoke})
	}
	return out
}

// NodeToProto renders one node (mask as in GraphToProto).
func NodeToProto(n *graph.Node, mask bool) *publisherv1.Node {
	out := &publisherv1.Node{Id: n.ID, Kind: n.Kind}
	switch {
	case n.Agent != nil:
		a := &publisherv1.AgentNode{CapabilityBindings: n.Agent.CapabilityBindings}
		for _, b := range n.Agent.ToolBindings {
			a.ToolBindings = append(a.ToolBindings, &publisherv1.ToolBinding{Name: b.Name, NodeId: b.NodeID, Confirmation: b.Confirmation})
		}
		settingsToProto(&n.Agent.ToolSettings, a)
		for _, s := range n.Agent.MCPServers {
			env := s.Env
			if mask && len(env) > 0 {
				env = make(map[string]string, len(s.Env))
				for k := range s.Env {
					env[k] = mcpserver.SecretMask
				}
			}
			a.McpServers = append(a.McpServers, &publisherv1.InlineMcpServer{Name: s.Name, Command: s.Command, Args: s.Args, Env: env})
		}
		out.Data = &publisherv1.Node_Agent{Agent: a}
	case n.MCPTool != nil:
		m := n.MCPTool
		out.Data = &publisherv1.Node_McpTool{McpTool: &publisherv1.McpToolNode{
			ServerRef: m.ServerRef, ToolName: m.ToolName, Title: m.Title, Description: m.Description,
			InputSchema: RawToStruct(m.InputSchema), OutputSchema: RawToStruct(m.OutputSchema),
			Annotations: RawToStruct(m.Annotations), SchemaHash: m.SchemaHash,
			CapabilityBindings: m.CapabilityBindings, Flags: discovery.FindingsToProto(m.Flags),
		}}
	case n.Opaque != nil:
		if s := RawToStruct(n.Opaque); s != nil {
			out.Data = &publisherv1.Node_Opaque{Opaque: s}
		}
	}
	return out
}

// VersionToProto renders a published version (mask as in GraphToProto).
func VersionToProto(v *graph.Version, mask bool) *publisherv1.GraphVersion {
	out := &publisherv1.GraphVersion{
		GraphId: v.GraphID, Tenant: v.Tenant, Version: v.Version, PublishedBy: v.PublishedBy,
		Warnings: v.Warnings, PublishTime: timestamppb.New(v.PublishTime),
	}
	if v.Graph != nil {
		out.Graph = GraphToProto(v.Graph, mask)
	}
	return out
}

// VersionFromProto reads a published version sent by the publisher (split deployments).
func VersionFromProto(p *publisherv1.GraphVersion) (*graph.Version, error) {
	v := &graph.Version{
		GraphID: p.GetGraphId(), Tenant: p.GetTenant(), Version: p.GetVersion(),
		PublishedBy: p.GetPublishedBy(), Warnings: p.GetWarnings(), PublishTime: p.GetPublishTime().AsTime(),
	}
	if p.GetGraph() != nil {
		g, err := GraphFromProto(p.GetGraph())
		if err != nil {
			return nil, err
		}
		g.Revision = p.GetGraph().GetRevision()
		if p.GetGraph().GetUpdateTime() != nil {
			g.UpdateTime = p.GetGraph().GetUpdateTime().AsTime()
		}
		v.Graph = g
	}
	return v, nil
}
