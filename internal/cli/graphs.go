package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
)

// maxGraphFile bounds the file `graphs edit` reads (the server takes at most 4 MiB a request).
const maxGraphFile = 8 << 20

// graphTarget is the --graph/--tenant pair every graph command takes.
type graphTarget struct {
	graph  string
	tenant string
}

func (gt *graphTarget) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&gt.graph, "graph", "", "graph id (required)")
	cmd.Flags().StringVar(&gt.tenant, "tenant", "", "tenant that owns the graph (default: the key's tenant, else \"default\")")
	_ = cmd.MarkFlagRequired("graph")
}

// publisher is a PublisherService client and a request context.
func (g *globals) publisher(parent context.Context) (publisherv1.PublisherServiceClient, context.Context, context.CancelFunc, error) {
	conn, ctx, cancel, err := g.connect(parent)
	if err != nil {
		return nil, nil, nil, err
	}
	return publisherv1.NewPublisherServiceClient(conn), ctx, cancel, nil
}

func newGraphsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "graphs",
		Aliases: []string{"graph"},
		Short:   "Author agent graphs: drafts, validation, publish, versions (needs workflow:write)",
	}
	cmd.AddCommand(newGraphsCreateCmd(g), newGraphsShowCmd(g), newGraphsEditCmd(g), newGraphsValidateCmd(g),
		newGraphsPublishCmd(g), newGraphsVersionsCmd(g), newGraphsListCmd(g), newGraphsDeleteCmd(g), newGraphsBindCmd(g),
		newGraphsSettingsCmd(g), newGraphsMountCmd(g), newGraphsConfirmCmd(g))
	return cmd
}

func newGraphsCreateCmd(g *globals) *cobra.Command {
	var gt graphTarget
	var agents []string
	var mode string
	cmd := &cobra.Command{
		Use:     "create --graph G [--agent A ...]",
		Short:   "Create a graph with an empty draft, optionally with agent nodes",
		Example: `  ringfence graphs create --graph support-triage --agent researcher`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.publisher(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.CreateGraph(ctx, &publisherv1.CreateGraphRequest{Tenant: gt.tenant, GraphId: gt.graph, Agents: agents, CapabilityMode: mode})
			if err != nil {
				return err
			}
			return g.printGraph(resp.GetDraft())
		},
	}
	gt.register(cmd)
	cmd.Flags().StringArrayVar(&agents, "agent", nil, "an agent node to create (repeatable)")
	cmd.Flags().StringVar(&mode, "mode", "", "capability mode: enforce (default) or advisory")
	return cmd
}

func newGraphsShowCmd(g *globals) *cobra.Command {
	var gt graphTarget
	var version int64
	cmd := &cobra.Command{
		Use:   "show --graph G [--version N]",
		Short: "Show a graph's draft, or a published version (-o json prints what graphs edit reads)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.publisher(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			if cmd.Flags().Changed("version") {
				resp, err := client.GetVersion(ctx, &publisherv1.GetVersionRequest{Tenant: gt.tenant, GraphId: gt.graph, Version: version})
				if err != nil {
					return err
				}
				if g.output == "json" {
					return printJSON(g.stdout, resp.GetVersion())
				}
				v := resp.GetVersion()
				if err := kv(g.stdout, "version", fmt.Sprint(v.GetVersion()), "published", ts(v.GetPublishTime()), "published by", v.GetPublishedBy()); err != nil {
					return err
				}
				for _, w := range v.GetWarnings() {
					writef(g.stdout, "warning: %s\n", w)
				}
				return g.printGraph(v.GetGraph())
			}
			resp, err := client.GetDraft(ctx, &publisherv1.GetDraftRequest{Tenant: gt.tenant, GraphId: gt.graph})
			if err != nil {
				return err
			}
			return g.printGraph(resp.GetDraft())
		},
	}
	gt.register(cmd)
	cmd.Flags().Int64Var(&version, "version", 0, "a published version (0: the latest)")
	return cmd
}

func newGraphsEditCmd(g *globals) *cobra.Command {
	var gt graphTarget
	var file string
	var force bool
	cmd := &cobra.Command{
		Use:   "edit --graph G --file F",
		Short: "Replace the draft with the graph in a JSON file, if nobody changed it since you read it",
		Long: `edit replaces the draft with the graph in F (- reads stdin), in the JSON that
"ringfence graphs show --graph G -o json" prints. The file's revision must still be the
draft's: a concurrent change is refused (ABORTED) rather than overwritten, unless --force
says to replace the draft whatever changed since. Inline env values
shown as ******** keep their stored values. Pinned declarations cannot be edited by hand:
re-import the tool instead.`,
		Example: `  ringfence graphs show --graph support-triage -o json > g.json
  $EDITOR g.json
  ringfence graphs edit --graph support-triage --file g.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usagef("--file is required (- reads stdin)")
			}
			raw, err := g.readFile(file)
			if err != nil {
				return err
			}
			draft := &publisherv1.Graph{}
			if err := (protojson.UnmarshalOptions{}).Unmarshal(raw, draft); err != nil {
				return usagef("%s is not a graph in JSON (as ringfence graphs show -o json prints it): %v", file, err)
			}
			if draft.GetRevision() == 0 && !force {
				return usagef("%s has no revision, so a concurrent change could be overwritten: start from ringfence graphs show --graph %s -o json, or pass --force", file, gt.graph)
			}
			if force {
				// Revision 0 skips the server's check: --force replaces the draft whatever
				// changed since the file's revision, as it says.
				draft.Revision = 0
			}
			client, ctx, cancel, err := g.publisher(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{Tenant: gt.tenant, GraphId: gt.graph, Draft: draft})
			if err != nil {
				return err
			}
			return g.printGraph(resp.GetDraft())
		},
	}
	gt.register(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "JSON file with the new draft (- for stdin)")
	cmd.Flags().BoolVar(&force, "force", false, "replace the draft even if it changed since the file's revision, or the file carries none")
	return cmd
}

func newGraphsBindCmd(g *globals) *cobra.Command {
	var gt graphTarget
	var agent string
	var caps []string
	cmd := &cobra.Command{
		Use:     "bind --graph G --agent A --capability C [--capability C ...]",
		Short:   "Add capabilities to an agent's bindings in the draft (what it holds; globs allowed)",
		Example: `  ringfence graphs bind --graph support-triage --agent researcher --capability 'docs.read:/handbook/**'`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.ctx(cmd.Context())
			defer cancel()
			draft, _, err := g.editAgent(ctx, gt, agent, func(a *publisherv1.AgentNode) error {
				for _, c := range caps {
					if !slices.Contains(a.CapabilityBindings, c) {
						a.CapabilityBindings = append(a.CapabilityBindings, c)
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			return g.printGraph(draft)
		},
	}
	gt.register(cmd)
	cmd.Flags().StringVar(&agent, "agent", "", "the agent node")
	cmd.Flags().StringArrayVar(&caps, "capability", nil, "a capability to add, e.g. fs.read:/srv/** (repeatable)")
	_ = cmd.MarkFlagRequired("agent")
	_ = cmd.MarkFlagRequired("capability")
	return cmd
}

func (g *globals) readFile(name string) ([]byte, error) {
	var r io.Reader
	if name == "-" {
		r = g.stdin
	} else {
		f, err := openInput(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	raw, err := io.ReadAll(io.LimitReader(r, maxGraphFile+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > maxGraphFile {
		return nil, usagef("%s is larger than %d bytes", name, maxGraphFile)
	}
	return raw, nil
}

func newGraphsValidateCmd(g *globals) *cobra.Command {
	var gt graphTarget
	cmd := &cobra.Command{
		Use:   "validate --graph G",
		Short: "Dry-run publish: list every violation (exit status 1 when there are any)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.publisher(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.ValidateDraft(ctx, &publisherv1.ValidateDraftRequest{Tenant: gt.tenant, GraphId: gt.graph})
			if err != nil {
				return err
			}
			if g.output == "json" {
				if err := printJSON(g.stdout, resp); err != nil {
					return err
				}
			} else {
				printWarnings(g.stdout, resp.GetWarnings())
				if resp.GetOk() {
					writef(g.stdout, "graph %s would publish\n", gt.graph)
				} else {
					printViolations(g.stdout, resp.GetViolations())
				}
			}
			if !resp.GetOk() {
				return &exitError{code: ExitFailure}
			}
			return nil
		},
	}
	gt.register(cmd)
	return cmd
}

func newGraphsPublishCmd(g *globals) *cobra.Command {
	var gt graphTarget
	cmd := &cobra.Command{
		Use:   "publish --graph G",
		Short: "Validate the draft and store it as the next immutable version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.publisher(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.Publish(ctx, &publisherv1.PublishRequest{Tenant: gt.tenant, GraphId: gt.graph})
			if err != nil {
				return g.violationsOr(err)
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp)
			}
			printWarnings(g.stdout, resp.GetWarnings())
			_, err = linef(g.stdout, "published %s version %d\n", gt.graph, resp.GetVersion())
			return err
		},
	}
	gt.register(cmd)
	return cmd
}

// violationsOr prints the violations of a refused publish or import (as JSON with -o json)
// and ends with exit status 1; other errors pass through.
func (g *globals) violationsOr(err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return err
	}
	for _, d := range st.Details() {
		pv, ok := d.(*publisherv1.PublishViolations)
		if !ok {
			continue
		}
		if g.output == "json" {
			if perr := printJSON(g.stdout, pv); perr != nil {
				return perr
			}
		} else {
			printViolations(g.stdout, pv.GetViolations())
		}
		// The list is printed: keep the message's head ("graph "g" cannot be published").
		msg := strings.TrimPrefix(st.Message(), "publisher: ")
		if i := strings.Index(msg, " violation(s)"); i > 0 {
			if j := strings.LastIndex(msg[:i], ": "); j > 0 {
				msg = msg[:j]
			}
		}
		return &exitError{code: ExitFailure, msg: "ringfence: " + oneLine(msg)}
	}
	return err
}

func printWarnings(w io.Writer, warnings []string) {
	for _, warn := range warnings {
		writef(w, "warning: %s\n", warn)
	}
}

// printViolations lists each violation with its subject, the capabilities at issue and the
// message that names the fix.
func printViolations(w io.Writer, vs []*publisherv1.Violation) {
	writef(w, "%d violation(s):\n", len(vs))
	for _, v := range vs {
		var subject []string
		if v.GetNodeId() != "" {
			subject = append(subject, "node "+v.GetNodeId())
		}
		if v.GetAgentId() != "" && v.GetAgentId() != v.GetNodeId() {
			subject = append(subject, "agent "+v.GetAgentId())
		}
		if v.GetServerRef() != "" {
			subject = append(subject, "server "+v.GetServerRef())
		}
		if len(v.GetMissing()) > 0 {
			subject = append(subject, "missing "+strings.Join(v.GetMissing(), ","))
		}
		if len(v.GetExcess()) > 0 {
			subject = append(subject, "excess "+strings.Join(v.GetExcess(), ","))
		}
		writef(w, "  [%s] %s\n      %s\n", v.GetRule(), strings.Join(subject, ", "), v.GetMessage())
	}
}

func newGraphsVersionsCmd(g *globals) *cobra.Command {
	var gt graphTarget
	cmd := &cobra.Command{
		Use:   "versions --graph G",
		Short: "List a graph's published versions, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.dial()
			if err != nil {
				return err
			}
			client := publisherv1.NewPublisherServiceClient(conn)
			versions, err := listAll(g, cmd.Context(), func(ctx context.Context, token string) ([]*publisherv1.GraphVersion, string, error) {
				resp, err := client.ListVersions(ctx, &publisherv1.ListVersionsRequest{Tenant: gt.tenant, GraphId: gt.graph, PageSize: listPageSize, PageToken: token})
				return resp.GetVersions(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			all := &publisherv1.ListVersionsResponse{Versions: versions}
			if g.output == "json" {
				return printJSON(g.stdout, all)
			}
			t := newTable(g.stdout, "VERSION", "PUBLISHED", "BY", "WARNINGS")
			for _, v := range all.GetVersions() {
				t.row(fmt.Sprint(v.GetVersion()), ts(v.GetPublishTime()), v.GetPublishedBy(), fmt.Sprint(len(v.GetWarnings())))
			}
			return t.flush()
		},
	}
	gt.register(cmd)
	return cmd
}

func newGraphsListCmd(g *globals) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's graphs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.dial()
			if err != nil {
				return err
			}
			client := publisherv1.NewPublisherServiceClient(conn)
			graphs, err := listAll(g, cmd.Context(), func(ctx context.Context, token string) ([]*publisherv1.GraphSummary, string, error) {
				resp, err := client.ListGraphs(ctx, &publisherv1.ListGraphsRequest{Tenant: tenant, PageSize: listPageSize, PageToken: token})
				return resp.GetGraphs(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			all := &publisherv1.ListGraphsResponse{Graphs: graphs}
			if g.output == "json" {
				return printJSON(g.stdout, all)
			}
			t := newTable(g.stdout, "GRAPH", "TENANT", "NODES", "DRAFT REVISION", "LATEST VERSION", "UPDATED")
			for _, s := range all.GetGraphs() {
				latest := "-"
				if s.GetLatestVersion() > 0 {
					latest = fmt.Sprint(s.GetLatestVersion())
				}
				t.row(s.GetId(), s.GetTenant(), fmt.Sprint(s.GetNodeCount()), fmt.Sprint(s.GetDraftRevision()), latest, ts(s.GetUpdateTime()))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant (default: the key's tenant, else \"default\")")
	return cmd
}

func newGraphsDeleteCmd(g *globals) *cobra.Command {
	var gt graphTarget
	cmd := &cobra.Command{
		Use:     "delete --graph G",
		Aliases: []string{"rm", "remove"},
		Short:   "Delete a graph with its draft and versions (needs workflow:admin); its version numbers are never reused",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.publisher(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			if _, err := client.DeleteGraph(ctx, &publisherv1.DeleteGraphRequest{Tenant: gt.tenant, GraphId: gt.graph}); err != nil {
				return err
			}
			if g.output == "json" {
				return printFields(g.stdout, "deleted", gt.graph)
			}
			_, err = linef(g.stdout, "deleted %s\n", gt.graph)
			return err
		},
	}
	gt.register(cmd)
	return cmd
}

// printGraph shows a graph: its header, then nodes, edges and policies.
func (g *globals) printGraph(gr *publisherv1.Graph) error {
	if g.output == "json" {
		return printJSON(g.stdout, gr)
	}
	if err := kv(g.stdout,
		"graph", gr.GetId(),
		"tenant", gr.GetTenant(),
		"capability mode", gr.GetCapabilityMode(),
		"revision", fmt.Sprint(gr.GetRevision()),
		"updated", ts(gr.GetUpdateTime()),
	); err != nil {
		return err
	}
	fmt.Fprintln(g.stdout)
	t := newTable(g.stdout, "NODE", "KIND", "DETAIL")
	for _, n := range gr.GetNodes() {
		var detail string
		switch {
		case n.GetAgent() != nil:
			a := n.GetAgent()
			var tools []string
			for _, b := range a.GetToolBindings() {
				if b.GetName() == b.GetNodeId() {
					tools = append(tools, b.GetName())
				} else {
					tools = append(tools, b.GetName()+"->"+b.GetNodeId())
				}
			}
			detail = "holds " + orDash(strings.Join(a.GetCapabilityBindings(), ",")) + "; tools " + orDash(strings.Join(tools, ","))
			if len(a.GetMcpServers()) > 0 {
				detail += fmt.Sprintf("; %d inline server(s)", len(a.GetMcpServers()))
			}
			if hasToolSettings(a) {
				detail += "; tool settings (graphs settings --agent " + n.GetId() + ")"
			}
		case n.GetMcpTool() != nil:
			m := n.GetMcpTool()
			detail = fmt.Sprintf("%s/%s %s; declares %s", m.GetServerRef(), m.GetToolName(), orDash(shortHash(m.GetSchemaHash())), orDash(strings.Join(m.GetCapabilityBindings(), ",")))
			if len(m.GetFlags()) > 0 {
				var fl []string
				for _, f := range m.GetFlags() {
					fl = append(fl, f.GetCode())
				}
				detail += "; flags " + strings.Join(fl, ",")
			}
		}
		t.row(n.GetId(), n.GetKind(), detail)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if len(gr.GetEdges()) > 0 {
		fmt.Fprintln(g.stdout)
		t = newTable(g.stdout, "FROM", "TO", "EDGE")
		for _, e := range gr.GetEdges() {
			t.row(e.GetFrom(), e.GetTo(), e.GetKind())
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if len(gr.GetPolicies()) > 0 {
		fmt.Fprintln(g.stdout)
		t = newTable(g.stdout, "POLICY", "AGENTS", "REVOKES")
		for _, p := range gr.GetPolicies() {
			agents := strings.Join(p.GetAgents(), ",")
			if agents == "" {
				agents = "(all)"
			}
			t.row(p.GetId(), agents, strings.Join(p.GetRevoke(), ","))
		}
		return t.flush()
	}
	return nil
}

// shortHash abbreviates a pin for tables; -o json shows it whole.
func shortHash(h string) string {
	if len(h) > 22 {
		return h[:22] + "…"
	}
	return h
}
