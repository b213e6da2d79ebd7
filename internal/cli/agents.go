package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/graph"
)

// The agent's tool surface settings in the draft (docs/agents.md): graphs settings, mount and
// confirm each read the draft, change one agent, and write it back with the revision they
// read, so a concurrent edit is refused (ABORTED) rather than overwritten.

// editAgent reads the draft of gt, finds agent, and, when edit is given, applies it and
// replaces the draft. It returns the draft as stored and the agent in it.
func (g *globals) editAgent(ctx context.Context, gt graphTarget, agent string, edit func(a *publisherv1.AgentNode) error) (*publisherv1.Graph, *publisherv1.AgentNode, error) {
	conn, err := g.dial()
	if err != nil {
		return nil, nil, err
	}
	client := publisherv1.NewPublisherServiceClient(conn)
	resp, err := client.GetDraft(ctx, &publisherv1.GetDraftRequest{Tenant: gt.tenant, GraphId: gt.graph})
	if err != nil {
		return nil, nil, err
	}
	draft := resp.GetDraft()
	found, err := draftAgent(draft, gt.graph, agent)
	if err != nil || edit == nil {
		return draft, found, err
	}
	if err := edit(found); err != nil {
		return nil, nil, err
	}
	out, err := client.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{Tenant: gt.tenant, GraphId: gt.graph, Draft: draft})
	if err != nil {
		return nil, nil, err
	}
	stored, err := draftAgent(out.GetDraft(), gt.graph, agent)
	return out.GetDraft(), stored, err
}

// draftAgent finds an agent node of a draft, or says which agents it has.
func draftAgent(draft *publisherv1.Graph, graphID, agent string) (*publisherv1.AgentNode, error) {
	var agents []string
	for _, n := range draft.GetNodes() {
		if n.GetAgent() == nil {
			continue
		}
		if n.GetId() == agent {
			return n.GetAgent(), nil
		}
		agents = append(agents, n.GetId())
	}
	if len(agents) == 0 {
		return nil, usagef("graph %s has no agent node %q in its draft: it has no agents yet (ringfence graphs create --agent, or graphs edit)", graphID, agent)
	}
	return nil, usagef("graph %s has no agent node %q in its draft; its agents: %s", graphID, agent, strings.Join(agents, ", "))
}

// agentTarget is the --graph/--tenant/--agent triple of the settings commands.
type agentTarget struct {
	graphTarget
	agent string
}

func (at *agentTarget) register(cmd *cobra.Command) {
	at.graphTarget.register(cmd)
	cmd.Flags().StringVar(&at.agent, "agent", "", "the agent node (required)")
	_ = cmd.MarkFlagRequired("agent")
}

func newGraphsSettingsCmd(g *globals) *cobra.Command {
	var at agentTarget
	var includeServers, excludeServers, includeTools, excludeTools, selected, documentServers []string
	var deferTools, strict, documents bool
	var confirmation string
	cmd := &cobra.Command{
		Use:   "settings --graph G --agent A [--include-servers S,...] [--exclude-tools T,...] [--defer-tools] ...",
		Short: "Show an agent's tool surface settings in the draft, or change them with flags",
		Long: `settings shows what the agent's model will see of its tools: the provider filters
(include_servers, exclude_servers, include_tools, exclude_tools), deferral, the confirmation
default, strict schemas, the default server selection, the document resolver, each mount
and each binding's confirmation rule, with their defaults filled in.

With flags it changes the draft first. A list flag replaces the whole list (comma-separated
or repeated; an empty value clears it): servers are refs, tools their namespaced names
<server>__<tool>. Excludes always win over includes, and an include list, once set, hides
everything not on it. Publish to make the change reach runs.`,
		Example: `  ringfence graphs settings --graph support-triage --agent researcher
  ringfence graphs settings --graph support-triage --agent researcher --exclude-tools tickets__delete_ticket --defer-tools --confirmation-default non_read_only
  ringfence graphs settings --graph support-triage --agent researcher --include-servers ''`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			changed := func(name string) bool { return cmd.Flags().Changed(name) }
			if changed("confirmation-default") {
				if err := graph.ValidateConfirmationDefault("--confirmation-default", confirmation); err != nil {
					return usagef("%v", err)
				}
			}
			var edit func(a *publisherv1.AgentNode) error
			if slices.ContainsFunc([]string{"include-servers", "exclude-servers", "include-tools", "exclude-tools", "selected-servers",
				"defer-tools", "confirmation-default", "strict-schemas", "document-resolver", "document-servers"}, changed) {
				edit = func(a *publisherv1.AgentNode) error {
					set := func(flag string, dst *[]string, v []string) {
						if changed(flag) {
							*dst = nonEmpty(v)
						}
					}
					set("include-servers", &a.IncludeServers, includeServers)
					set("exclude-servers", &a.ExcludeServers, excludeServers)
					set("include-tools", &a.IncludeTools, includeTools)
					set("exclude-tools", &a.ExcludeTools, excludeTools)
					set("selected-servers", &a.SelectedServers, selected)
					if changed("defer-tools") {
						a.DeferTools = deferTools
					}
					if changed("confirmation-default") {
						a.ConfirmationDefault = confirmation
					}
					if changed("strict-schemas") {
						a.ConvertSchemasToStrict = strict
					}
					if changed("document-resolver") || changed("document-servers") {
						if a.DocumentResolver == nil {
							a.DocumentResolver = &publisherv1.DocumentResolver{}
						}
						if changed("document-resolver") {
							a.DocumentResolver.Enabled = documents
						}
						set("document-servers", &a.DocumentResolver.ServerNames, documentServers)
					}
					return nil
				}
			}
			ctx, cancel := g.ctx(cmd.Context())
			defer cancel()
			draft, a, err := g.editAgent(ctx, at.graphTarget, at.agent, edit)
			if err != nil {
				return err
			}
			return g.printAgentSettings(draft, at.agent, a)
		},
	}
	at.register(cmd)
	f := cmd.Flags()
	f.StringSliceVar(&includeServers, "include-servers", nil, "the only servers whose tools the agent sees (refs; empty clears)")
	f.StringSliceVar(&excludeServers, "exclude-servers", nil, "servers whose tools the agent never sees; wins over --include-servers")
	f.StringSliceVar(&includeTools, "include-tools", nil, "the only tools the agent sees (<server>__<tool>; empty clears)")
	f.StringSliceVar(&excludeTools, "exclude-tools", nil, "tools the agent never sees (<server>__<tool>); wins over --include-tools")
	f.StringSliceVar(&selected, "selected-servers", nil, "the servers a run selects when StartRun names none (only narrows; empty clears)")
	f.BoolVar(&deferTools, "defer-tools", false, "load the servers' tools on demand through tool_search (--defer-tools=false turns it off)")
	f.StringVar(&confirmation, "confirmation-default", "", "which tools ask the user first where no rule decides: none, non_read_only or all")
	f.BoolVar(&strict, "strict-schemas", false, "show the model strict input schemas: convert_schemas_to_strict (--strict-schemas=false turns it off)")
	f.BoolVar(&documents, "document-resolver", false, "replace my-documents://<id> arguments with the document's content (--document-resolver=false turns it off)")
	f.StringSliceVar(&documentServers, "document-servers", nil, "the servers whose calls may receive document content (refs; empty clears)")
	return cmd
}

func newGraphsMountCmd(g *globals) *cobra.Command {
	var at agentTarget
	var server string
	var include, exclude []string
	var deferTools, remove bool
	cmd := &cobra.Command{
		Use:   "mount --graph G --agent A --server S [--include-tool T]... [--exclude-tool T]... [--defer-tools=true|false]",
		Short: "Narrow one server for one agent in the draft: its own tool names, and deferral for that server",
		Long: `mount sets the agent's mount of server S, the last filter level: --include-tool
and --exclude-tool take the server's own tool names (read_file, not docs__read_file) and
each replaces its list when given (an empty value clears it); an exclude wins.
--defer-tools overrides the agent's defer_tools for this server; --remove deletes the mount,
so the server follows the agent's settings again.`,
		Example: `  ringfence graphs mount --graph support-triage --agent researcher --server tickets --include-tool search_tickets --include-tool get_ticket
  ringfence graphs mount --graph support-triage --agent researcher --server docs --defer-tools=false`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			changed := cmd.Flags().Changed
			if remove && (changed("include-tool") || changed("exclude-tool") || changed("defer-tools")) {
				return usagef("--remove deletes the mount of %s: give it alone", server)
			}
			ctx, cancel := g.ctx(cmd.Context())
			defer cancel()
			draft, a, err := g.editAgent(ctx, at.graphTarget, at.agent, func(a *publisherv1.AgentNode) error {
				i := slices.IndexFunc(a.GetMounts(), func(m *publisherv1.Mount) bool { return m.GetName() == server })
				if remove {
					if i < 0 {
						return usagef("agent %s has no mount of server %s", at.agent, server)
					}
					a.Mounts = slices.Delete(a.Mounts, i, i+1)
					return nil
				}
				if i < 0 {
					a.Mounts = append(a.Mounts, &publisherv1.Mount{Name: server})
					i = len(a.Mounts) - 1
				}
				m := a.Mounts[i]
				if changed("include-tool") {
					m.IncludeTools = nonEmpty(include)
				}
				if changed("exclude-tool") {
					m.ExcludeTools = nonEmpty(exclude)
				}
				if changed("defer-tools") {
					m.DeferTools = proto.Bool(deferTools)
				}
				return nil
			})
			if err != nil {
				return err
			}
			return g.printAgentSettings(draft, at.agent, a)
		},
	}
	at.register(cmd)
	cmd.Flags().StringVar(&server, "server", "", "the server ref (required)")
	cmd.Flags().StringArrayVar(&include, "include-tool", nil, "a tool of the server the agent sees, by the server's own name (repeatable)")
	cmd.Flags().StringArrayVar(&exclude, "exclude-tool", nil, "a tool of the server the agent never sees (repeatable)")
	cmd.Flags().BoolVar(&deferTools, "defer-tools", false, "load this server's tools on demand (true) or list them (false), whatever the agent's defer_tools")
	cmd.Flags().BoolVar(&remove, "remove", false, "delete the agent's mount of the server")
	_ = cmd.MarkFlagRequired("server")
	return cmd
}

// Confirmation rules graphs confirm takes; ruleDefault removes the binding's rule.
const ruleDefault = "default"

func newGraphsConfirmCmd(g *globals) *cobra.Command {
	var at agentTarget
	var tool, rule string
	cmd := &cobra.Command{
		Use:   "confirm --graph G --agent A --tool NAME --rule always|never|default",
		Short: "Set whether calls to one of an agent's tools ask the user first, over its confirmation_default",
		Long: `confirm sets the rule of the agent's binding NAME (the name the model calls, e.g.
tickets__delete_ticket): always asks the user before every call, never does not, and
default removes the rule so the agent's confirmation_default decides.`,
		Example: `  ringfence graphs confirm --graph support-triage --agent researcher --tool tickets__delete_ticket --rule always`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rule != ruleDefault {
				if err := graph.ValidateConfirmationRule("--rule", rule); err != nil || rule == "" {
					return usagef("--rule must be always, never or default, not %q", rule)
				}
			}
			ctx, cancel := g.ctx(cmd.Context())
			defer cancel()
			draft, a, err := g.editAgent(ctx, at.graphTarget, at.agent, func(a *publisherv1.AgentNode) error {
				var names []string
				for _, b := range a.GetToolBindings() {
					if b.GetName() == tool {
						b.Confirmation = rule
						if rule == ruleDefault {
							b.Confirmation = ""
						}
						return nil
					}
					names = append(names, b.GetName())
				}
				return usagef("agent %s binds no tool named %q; it binds: %s", at.agent, tool, orDash(strings.Join(names, ", ")))
			})
			if err != nil {
				return err
			}
			return g.printAgentSettings(draft, at.agent, a)
		},
	}
	at.register(cmd)
	cmd.Flags().StringVar(&tool, "tool", "", "the binding name the model calls the tool by (required)")
	cmd.Flags().StringVar(&rule, "rule", "", "always, never, or default (required)")
	_ = cmd.MarkFlagRequired("tool")
	_ = cmd.MarkFlagRequired("rule")
	return cmd
}

// hasToolSettings reports whether an agent sets any tool surface setting or binding rule.
func hasToolSettings(a *publisherv1.AgentNode) bool {
	if len(a.GetIncludeServers())+len(a.GetExcludeServers())+len(a.GetIncludeTools())+len(a.GetExcludeTools())+
		len(a.GetSelectedServers())+len(a.GetMounts()) > 0 || a.GetDeferTools() || a.GetConvertSchemasToStrict() ||
		a.GetConfirmationDefault() != "" || a.GetDocumentResolver() != nil {
		return true
	}
	return slices.ContainsFunc(a.GetToolBindings(), func(b *publisherv1.ToolBinding) bool { return b.GetConfirmation() != "" })
}

// nonEmpty drops empty values, so `--include-servers ”` clears a list.
func nonEmpty(v []string) []string {
	var out []string
	for _, s := range v {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// printAgentSettings shows an agent's tool surface settings with their defaults filled in:
// a table for people, or, with -o json, the graph, agent, revision and the settings in the
// draft's own JSON names.
func (g *globals) printAgentSettings(draft *publisherv1.Graph, agent string, a *publisherv1.AgentNode) error {
	eff := proto.Clone(a).(*publisherv1.AgentNode)
	eff.CapabilityBindings, eff.McpServers = nil, nil
	if eff.ConfirmationDefault == "" {
		eff.ConfirmationDefault = graph.ConfirmNone
	}
	if eff.DocumentResolver == nil {
		eff.DocumentResolver = &publisherv1.DocumentResolver{}
	}
	if g.output == "json" {
		raw, err := jsonOut.Marshal(eff)
		if err != nil {
			return err
		}
		var settings map[string]any
		if err := json.Unmarshal(raw, &settings); err != nil {
			return err
		}
		// What the agent holds and its inline servers are no settings of its tool surface.
		delete(settings, "capability_bindings")
		delete(settings, "mcp_servers")
		out, err := json.MarshalIndent(map[string]any{"graph": draft.GetId(), "agent": agent, "revision": draft.GetRevision(), "settings": settings}, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(g.stdout, "%s\n", out)
		return err
	}
	list := func(v []string, none string) string {
		if len(v) == 0 {
			return none
		}
		return oneLine(strings.Join(v, ", "))
	}
	documents := "off"
	if eff.GetDocumentResolver().GetEnabled() {
		documents = "on, for " + list(eff.GetDocumentResolver().GetServerNames(), "no server")
	}
	if err := kv(g.stdout,
		"graph", fmt.Sprintf("%s (draft revision %d)", draft.GetId(), draft.GetRevision()),
		"agent", agent,
		"include_servers", list(eff.GetIncludeServers(), "- (every server)"),
		"exclude_servers", list(eff.GetExcludeServers(), "-"),
		"include_tools", list(eff.GetIncludeTools(), "- (every tool)"),
		"exclude_tools", list(eff.GetExcludeTools(), "-"),
		"selected_servers", list(eff.GetSelectedServers(), "- (a run's own selection, else no narrowing)"),
		"defer_tools", fmt.Sprint(eff.GetDeferTools()),
		"confirmation_default", oneLine(eff.GetConfirmationDefault()),
		"convert_schemas_to_strict", fmt.Sprint(eff.GetConvertSchemasToStrict()),
		"document_resolver", documents,
	); err != nil {
		return err
	}
	if len(eff.GetMounts()) > 0 {
		fmt.Fprintln(g.stdout)
		t := newTable(g.stdout, "MOUNT", "INCLUDE_TOOLS", "EXCLUDE_TOOLS", "DEFER_TOOLS")
		for _, m := range eff.GetMounts() {
			deferred := "(the agent's)"
			if m.DeferTools != nil {
				deferred = fmt.Sprint(m.GetDeferTools())
			}
			t.row(m.GetName(), list(m.GetIncludeTools(), "-"), list(m.GetExcludeTools(), "-"), deferred)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	var rules [][2]string
	for _, b := range eff.GetToolBindings() {
		if b.GetConfirmation() != "" {
			rules = append(rules, [2]string{b.GetName(), b.GetConfirmation()})
		}
	}
	if len(rules) > 0 {
		fmt.Fprintln(g.stdout)
		t := newTable(g.stdout, "TOOL", "CONFIRMATION")
		for _, r := range rules {
			t.row(r[0], r[1])
		}
		return t.flush()
	}
	return nil
}
