package pool

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate/capability"
)

// The deprecated inline path: servers written onto an agent node (AgentNode.MCPServers), with
// the binary, argv and env the author chose. The pool runs them only under
// dev.allow_inline_mcp_servers, which production refuses at start. Be exact about what such a
// call does not have: no registry row, so no ceiling, no tool filter and no argument-scoped
// permissions; and no pin, because the tools are discovered at run time. What remains is the
// isolation the pool gives every stdio server, the live input and output schemas, the
// sanitization, and the audit record, which says all of this in its advisory.

// reasonInlineServers refuses a call to an inline server on a pool that does not run them.
const reasonInlineServers = graph.RuleInlineMCPServers

// inlineAdvisory is recorded on every dispatched or refused inline call.
const inlineAdvisory = reasonInlineServers + ": an inline server has no registry row, so no ceiling, tool filter or argument-scoped permission applied, and its tool was discovered at run time, so nothing was pinned"

// inlineSpawnRef is the spawner's server ref (container label and name) for inline servers.
const inlineSpawnRef = "inline"

// inlineTool finds the inline server a binding-less tool name calls: "<server>__<tool>". When
// server names overlap ("a" and "a__b"), the longest matching name wins.
func inlineTool(agent *graph.AgentNode, name string) (*graph.InlineMCPServer, string, bool) {
	var best *graph.InlineMCPServer
	for i := range agent.MCPServers {
		s := &agent.MCPServers[i]
		prefix := s.Name + "__"
		if len(name) > len(prefix) && strings.HasPrefix(name, prefix) && (best == nil || len(s.Name) > len(best.Name)) {
			best = s
		}
	}
	if best == nil {
		return nil, "", false
	}
	return best, name[len(best.Name)+2:], true
}

// inlineRef names an inline server in the run's sessions and in the audit log. It cannot
// collide with a registered ref, which has no ':' or '/'.
func inlineRef(agent, server string) string { return "inline:" + agent + "/" + server }

// callInline is callTool for an inline server. Its gates, in order: the flag, the agent floor
// (which needs no registration), the arguments' form, isolation, spawn and handshake, the tool
// in the live listing, the declaration screen on its live declaration, its live schemas
// compile, and the arguments against the live input schema.
func (s *Service) callInline(ctx context.Context, r *run, req CallRequest, inline *graph.InlineMCPServer, toolName string, att *audit.ToolCallAttempt, argsCanonical *[]byte, intent func() error) (*CallResult, error) {
	ref := inlineRef(req.Agent, inline.Name)
	att.ServerRef, att.ToolName = ref, toolName
	att.Advisory = append(att.Advisory, inlineAdvisory)
	if !s.cfg.AllowInlineMCPServers {
		return nil, refusal(reasonInlineServers, fmt.Errorf("agent %q calls %q on its inline server %q, and this pool runs inline mcp_servers only with dev.allow_inline_mcp_servers (refused in production): register the server, run `ringfence mcp-import`, publish, and delete the inline entry", req.Agent, toolName, inline.Name))
	}
	// An inline tool declares nothing, but reaching its server spawns a process that calls
	// out all the same: the agent must hold the floor.
	node := &graph.Node{ID: ref, MCPTool: &graph.MCPToolNode{ServerRef: ref, ToolName: toolName, CapabilityBindings: capability.Floor}}
	if err := s.agentFloor(r, req.Agent, node, att); err != nil {
		return nil, err
	}
	args, canonical, err := decodeArguments(req.Arguments)
	if err != nil {
		return nil, err
	}
	*argsCanonical = canonical

	reg := &mcpserver.Resolved{Registration: mcpserver.Registration{
		Ref: inlineSpawnRef, Transport: mcpserver.TransportStdio,
		Command: inline.Command, Args: inline.Args, Env: inline.Env,
	}}
	sess, err := s.session(ctx, r, ref, reg)
	if err != nil {
		return nil, sessionRefusal(err)
	}
	tool, err := s.liveTool(ctx, sess, ref, toolName)
	if err != nil {
		return nil, err
	}
	att.LiveHash = tool.SchemaHash
	if err := s.checkSchemas(tool, sess.sess.SafeText, fixServer); err != nil {
		return nil, err
	}
	// No registration, so no strict_inputs: the live schema as the server wrote it.
	if err := s.validateInput(tool, *argsCanonical, false); err != nil {
		return nil, err
	}
	if err := intent(); err != nil {
		return nil, err
	}
	return s.dispatchInRun(ctx, sess, tool, args, req.CallID, att.Attempt)
}

// liveTool returns an inline session's current declaration of a tool in the form the gates and
// dispatch read, re-listing first as drift checks do.
func (s *Service) liveTool(ctx context.Context, sess *session, ref, name string) (*graph.MCPToolNode, error) {
	sess.listMu.Lock()
	defer sess.listMu.Unlock()
	if err := s.refreshListing(ctx, sess); err != nil {
		return nil, err
	}
	t, ok := sess.liveTools[name]
	if !ok {
		// The names are the server's own text.
		listed := sess.sess.SafeText(clipList(slices.Sorted(maps.Keys(sess.liveTools))))
		return nil, refusal(reasonUnknownTool, fmt.Errorf("the inline server %s lists no tool %q; it lists %s", ref, name, listed))
	}
	hash := sess.live[name]
	if strings.HasPrefix(hash, unhashable) {
		return nil, refusal(reasonUnknownTool, fmt.Errorf("the inline server %s declares tool %q in a form that cannot be read (%s)", ref, name, hash))
	}
	if err := screenRefusal(ref, t, sess.listingFindings, sess.sess.SafeText); err != nil {
		return nil, err
	}
	return &graph.MCPToolNode{ServerRef: ref, ToolName: name, SchemaHash: hash, InputSchema: t.InputSchema, OutputSchema: t.OutputSchema}, nil
}

// clipList shows at most ten names.
func clipList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	if len(names) > 10 {
		return strings.Join(names[:10], ", ") + fmt.Sprintf(" and %d more", len(names)-10)
	}
	return strings.Join(names, ", ")
}
