package pool

import (
	"fmt"
	"strings"

	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
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

// The inline gates are in pipeline.go: gateInlineAllowed, the agent floor and the arguments'
// form before anything starts (inlineGates), then checkInlineLive on the live listing: the
// tool is listed and readable, the declaration screen passes its live declaration, its live
// schemas compile and the arguments match the live input schema.

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

// inlineRegistration is what the spawner starts for an inline server: the graph's own
// definition, under the inline ref, isolated as every stdio server is.
func inlineRegistration(inline *graph.InlineMCPServer) *mcpserver.Resolved {
	return &mcpserver.Resolved{Registration: mcpserver.Registration{
		Ref: inlineSpawnRef, Transport: mcpserver.TransportStdio,
		Command: inline.Command, Args: inline.Args, Env: inline.Env,
	}}
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
