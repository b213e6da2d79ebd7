package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
)

func newMCPImportCmd(g *globals) *cobra.Command {
	var gt graphTarget
	var server, agent string
	var tools []string
	var user string
	cmd := &cobra.Command{
		Use:   "mcp-import --server REF --graph G --agent A [--tool T ...]",
		Short: "Import a registered server's tools into a graph's draft, pinned (needs workflow:write)",
		Long: `mcp-import starts the registered server once in isolation, takes its tool list, stops it,
and writes into the draft, for each tool: one mcp_tool node with the raw declaration and its
schema_hash (the pin), a tool edge from the agent, a binding the model calls it by
(<server>__<tool>), and process_spawn and external_api_call in the node's capability bindings,
which are also added to the agent's bindings when it lacks them. Without --tool every tool the
server offers (after its tool filter) is imported.

The import writes a graph that would publish, or nothing. It refuses an unregistered server,
grants that do not cover process_spawn and external_api_call (grants: [] is the default: an
operator adds them), a missing graph or agent, a tool the server does not offer, and any
declaration the screen cannot represent safely. Heuristic screen flags are reported and stored
on the node. Re-importing updates nodes in place: the output says, per tool, added, updated
(old and new hash) or unchanged.

A server that signs each user in (docs/oauth.md) is listed as one user sees it: --user names a
user who has connected it (ringfence servers connect), and the key needs run:execute too.`,
		Example: `  ringfence mcp-import --server docs-search --graph support-triage --agent researcher \
      --tool read_file --tool list_directory`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.publisher(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			stop := g.waitNote("%s to start and list its tools", server)
			resp, err := client.ImportTools(ctx, &publisherv1.ImportToolsRequest{
				Tenant: gt.tenant, GraphId: gt.graph, ServerRef: server, Agent: agent, Tools: tools, User: user,
			})
			stop()
			if err != nil {
				return g.violationsOr(err)
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp)
			}
			return printImport(g, gt.graph, server, agent, resp)
		},
	}
	gt.register(cmd)
	cmd.Flags().StringVar(&server, "server", "", "registered server ref (required)")
	cmd.Flags().StringVar(&agent, "agent", "", "agent node that binds the tools (required)")
	cmd.Flags().StringArrayVar(&tools, "tool", nil, "a tool to import (repeatable; default: every tool the server offers)")
	cmd.Flags().StringVar(&user, "user", "", "for a server that signs each user in: the connected user whose listing is imported")
	_ = cmd.MarkFlagRequired("server")
	_ = cmd.MarkFlagRequired("agent")
	return cmd
}

func printImport(g *globals, graphID, server, agent string, resp *publisherv1.ImportToolsResponse) error {
	t := newTable(g.stdout, "TOOL", "NODE", "OUTCOME", "SCHEMA HASH", "FLAGS")
	for _, tl := range resp.GetTools() {
		hash := tl.GetNewHash()
		if tl.GetOutcome() == "updated" {
			hash = tl.GetOldHash() + " -> " + tl.GetNewHash()
		}
		t.row(tl.GetToolName(), tl.GetNodeId(), tl.GetOutcome(), hash, fmt.Sprint(len(tl.GetFlags())))
	}
	if err := t.flush(); err != nil {
		return err
	}
	for _, tl := range resp.GetTools() {
		for _, f := range tl.GetFlags() {
			writef(g.stdout, "flag: %s: %s at %s: %s\n", tl.GetToolName(), f.GetCode(), f.GetLocation(), f.GetMessage())
		}
	}
	if added := resp.GetAgentCapabilitiesAdded(); len(added) > 0 {
		writef(g.stdout, "added to agent %s's capability_bindings: %s\n", agent, strings.Join(added, ", "))
	}
	_, err := linef(g.stdout, "imported %d tool(s) of %s into the draft of %s (revision %d)\n", len(resp.GetTools()), server, graphID, resp.GetDraftRevision())
	return err
}
