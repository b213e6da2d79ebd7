package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
)

// Exit codes of a tool call, so scripts can tell "nothing happened" from "it may have".
const (
	// ExitRefused: the call was refused before dispatch; nothing reached the server.
	ExitRefused = 3
	// ExitFailed: the call reached the server and failed, or no answer came within --timeout
	// and its outcome is unknown; either way it may have taken effect.
	ExitFailed = 4
	// ExitAwaitingApproval: the call asks a person first and waits for an approver; nothing
	// reached the server yet. The message names the approval and the command that approves it.
	ExitAwaitingApproval = 5
)

func newRunsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "runs",
		Aliases: []string{"run"},
		Short:   "Start runs of published graphs and call their tools (needs run:execute)",
	}
	var graphID, runID, tenant, user string
	var version int64
	var selected []string
	start := &cobra.Command{
		Use:   "start --graph G [--version N] [--run ID] [--user U] [--selected-server S]...",
		Short: "Start a run of a published version (0 or omitted: the latest); prints the run id",
		Long: `start starts a run of a published version; nothing is spawned until a call needs it.

--selected-server names a server the user picked (repeatable): each agent then sees only its
tools of the picked servers it has. It only narrows: a server no agent of the graph uses is
ignored (and named in a warning), and an agent with none of the picked servers keeps its own.

--user names the person the run acts for: servers that sign each user in (registrations with
oauth) get that user's token and no other's (docs/oauth.md); the key asserts it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.StartRun(ctx, &poolv1.StartRunRequest{Tenant: tenant, GraphId: graphID, Version: version, RunId: runID, SelectedServers: selected, User: user})
			if err != nil {
				return err
			}
			if ignored := resp.GetIgnoredServers(); len(ignored) > 0 {
				quoted := make([]string, len(ignored))
				for i, s := range ignored {
					quoted[i] = fmt.Sprintf("%q", s)
				}
				writef(g.stderr, "warning: no agent of graph %s uses %s, so the run ignores it (the selection only narrows)\n", graphID, strings.Join(quoted, ", "))
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp.GetRun())
			}
			_, err = linef(g.stdout, "%s\n", resp.GetRun().GetRunId())
			return err
		},
	}
	start.Flags().StringVar(&graphID, "graph", "", "graph id")
	start.Flags().Int64Var(&version, "version", 0, "published version (0: the latest)")
	start.Flags().StringVar(&runID, "run", "", "run id to use (default: generated)")
	start.Flags().StringVar(&tenant, "tenant", "", tenantUsage)
	start.Flags().StringVar(&user, "user", "", "the user the run acts for: servers that sign each user in get this user's token")
	start.Flags().StringArrayVar(&selected, "selected-server", nil, "a server the user picked; the run's agents see only their tools of picked servers (repeatable; only narrows)")
	_ = start.MarkFlagRequired("graph")

	cmd.AddCommand(start, newRunsCallCmd(g), newRunsToolsCmd(g), runStateCmd(g, "pause"), runStateCmd(g, "resume"), runStateCmd(g, "end"), runStateCmd(g, "show"),
		newRunsApprovalsCmd(g), newRunsDecideCmd(g, "approve"), newRunsDecideCmd(g, "deny"),
		newRunsConnectCmd(g), newRunsDisconnectCmd(g), newRunsConnectionsCmd(g))
	return cmd
}

// runStateCmd builds pause, resume, end and show, which differ only in the RPC.
func runStateCmd(g *globals, verb string) *cobra.Command {
	var runID, tenant, endStatus string
	short := map[string]string{
		"pause":  "Pause a run (e.g. at an approval gate); its sessions stop",
		"resume": "Resume a paused run; it gets fresh sessions",
		"end":    "End a run as completed (or --status failed); its sessions stop",
		"show":   "Show a run and its live sessions",
	}[verb]
	cmd := &cobra.Command{
		Use:   verb + " --run ID",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if verb == "end" && endStatus != "completed" && endStatus != "failed" {
				return usagef("--status must be completed or failed, not %q", endStatus)
			}
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			var run *poolv1.Run
			switch verb {
			case "pause":
				resp, err := client.PauseRun(ctx, &poolv1.PauseRunRequest{RunId: runID, Tenant: tenant})
				if err != nil {
					return err
				}
				run = resp.GetRun()
			case "resume":
				resp, err := client.ResumeRun(ctx, &poolv1.ResumeRunRequest{RunId: runID, Tenant: tenant})
				if err != nil {
					return err
				}
				run = resp.GetRun()
			case "end":
				resp, err := client.EndRun(ctx, &poolv1.EndRunRequest{RunId: runID, Tenant: tenant, Status: endStatus})
				if err != nil {
					return err
				}
				run = resp.GetRun()
			default:
				resp, err := client.GetRun(ctx, &poolv1.GetRunRequest{RunId: runID, Tenant: tenant})
				if err != nil {
					return err
				}
				run = resp.GetRun()
			}
			return g.printRun(run)
		},
	}
	cmd.Flags().StringVar(&runID, "run", "", "run id")
	cmd.Flags().StringVar(&tenant, "tenant", "", tenantUsage)
	_ = cmd.MarkFlagRequired("run")
	if verb == "end" {
		cmd.Flags().StringVar(&endStatus, "status", "completed", "completed or failed")
	}
	return cmd
}

// tenantUsage is the help of every runs command's --tenant: a run id is unique within its tenant.
const tenantUsage = "the run's tenant (default: the key's tenant, else \"default\")"

// tenantArg repeats --tenant in a command the CLI suggests, when the caller gave one.
func tenantArg(tenant string) string {
	if tenant == "" {
		return ""
	}
	return " --tenant " + tenant
}

type callFlags struct {
	agent, tool, args, callID, tenant string
}

func (f *callFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.agent, "agent", "", "the calling agent node's id")
	cmd.Flags().StringVar(&f.tool, "tool", "", "the name the agent binds the tool by (e.g. docs-search__read_file)")
	cmd.Flags().StringVar(&f.args, "args", "{}", "arguments as a JSON object")
	cmd.Flags().StringVar(&f.callID, "call-id", "", "call id, to number retries of the same call (default: generated, and named if the outcome is unknown)")
	cmd.Flags().StringVar(&f.tenant, "tenant", "", tenantUsage)
	_ = cmd.MarkFlagRequired("agent")
	_ = cmd.MarkFlagRequired("tool")
}

func (f *callFlags) request(runID string) (*poolv1.CallToolRequest, error) {
	args, err := parseArgs(f.args)
	if err != nil {
		return nil, err
	}
	callID := f.callID
	if callID == "" {
		// Generated here rather than by the pool, so a call that gets no answer can still be
		// named: it is how the attempt is found in the audit log.
		callID = newID("call-")
	}
	return &poolv1.CallToolRequest{RunId: runID, Tenant: f.tenant, Agent: f.agent, Tool: f.tool, Arguments: args, CallId: callID}, nil
}

func newRunsCallCmd(g *globals) *cobra.Command {
	var f callFlags
	var runID string
	cmd := &cobra.Command{
		Use:   "call --run ID --agent A --tool NAME --args JSON",
		Short: "Call a tool through every gate; exit 3 when refused before dispatch, 4 when it failed after dispatch or got no answer within --timeout, 5 when it waits for an approver",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := f.request(runID)
			if err != nil {
				return err
			}
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			return g.callTool(ctx, client, req)
		},
	}
	cmd.Flags().StringVar(&runID, "run", "", "run id")
	_ = cmd.MarkFlagRequired("run")
	f.register(cmd)
	return cmd
}

// retryArgs is --args as a command to paste would give it again: args single-quoted for a
// POSIX shell, or, for arguments too long or not on one line to repeat, a note to send the same.
func retryArgs(args string) string {
	if len(args) > 512 || strings.ContainsAny(args, "\r\n") {
		return "'...' (the same arguments)"
	}
	return "'" + strings.ReplaceAll(args, "'", `'\''`) + "'"
}

// newCallCmd is the one-shot call: start a run, call once, end the run.
func newCallCmd(g *globals) *cobra.Command {
	var f callFlags
	var graphID string
	var version int64
	cmd := &cobra.Command{
		Use:   "call --graph G --agent A --tool NAME --args JSON",
		Short: "Start a run, call one tool, end the run; exit 3 when refused before dispatch, 4 when it failed after or got no answer within --timeout, 5 when it waits for an approver (the run is kept for it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Bad --args is refused before a run exists: a run started for a call that never
			// happens would stay running until its idle timeout.
			req, err := f.request("")
			if err != nil {
				return err
			}
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			// The run id is chosen here, so a run that does not answer in time can be named.
			runID := newID("run-")
			_, err = client.StartRun(ctx, &poolv1.StartRunRequest{Tenant: f.tenant, GraphId: graphID, Version: version, RunId: runID})
			// Also when no connection was ready (nothing was sent): this names the run either way.
			if status.Code(err) == codes.DeadlineExceeded {
				return fmt.Errorf("no answer within --timeout %s while starting run %s, so no tool was called; if the run did start, end it with: ringfence runs end --run %s%s (it also ends after pool.run_idle_timeout)",
					g.timeout, runID, runID, tenantArg(f.tenant))
			}
			if err != nil {
				return err
			}
			req.RunId = runID
			callErr := g.callTool(ctx, client, req)
			var exit *exitError
			if errors.As(callErr, &exit) && exit.code == ExitAwaitingApproval {
				// Ending the run would expire the approval: it stays for the approver, and
				// a call with the same arguments in it gets the result once approved.
				exit.msg += sprintLine("\nthe run is kept for the approval; once approved, get the result with: ringfence runs call --run %s%s --agent %s --tool %s --args %s, then end it: ringfence runs end --run %s%s",
					runID, tenantArg(f.tenant), f.agent, f.tool, retryArgs(f.args), runID, tenantArg(f.tenant))
				return callErr
			}
			endStatus := "completed"
			if callErr != nil {
				endStatus = "failed"
			}
			// A deadline of its own: the call's may be spent, and a server that did not answer
			// the call may not answer this either.
			endCtx, endCancel := context.WithTimeout(context.WithoutCancel(ctx), g.timeout)
			defer endCancel()
			if _, err := client.EndRun(endCtx, &poolv1.EndRunRequest{RunId: runID, Tenant: f.tenant, Status: endStatus}); err != nil {
				writef(g.stderr, "warning: ending run %s: %s\n", oneLine(runID), oneLine(status.Convert(err).Message()))
			}
			return callErr
		},
	}
	cmd.Flags().StringVar(&graphID, "graph", "", "graph id")
	cmd.Flags().Int64Var(&version, "version", 0, "published version (0: the latest)")
	_ = cmd.MarkFlagRequired("graph")
	f.register(cmd)
	return cmd
}

// newID returns an id in the pool's own format (prefix and 24 hex digits).
func newID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// callTool calls and prints the outcome; refusals and failures become distinct exit codes.
func (g *globals) callTool(ctx context.Context, client poolv1.PoolServiceClient, req *poolv1.CallToolRequest) error {
	stop := g.waitNote("the answer of %s, call %s", req.GetTool(), req.GetCallId())
	resp, err := client.CallTool(ctx, req)
	stop()
	if err != nil {
		return g.callError(err, req)
	}
	return g.printCallResult(resp)
}

// callError turns a call's refusal or failure into its exit status and message; req names the
// call (its run, tenant and call id) in what the message suggests.
func (g *globals) callError(err error, req *poolv1.CallToolRequest) error {
	st := status.Convert(err)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *poolv1.CallRefusal:
			if g.output == "json" {
				_ = printJSON(g.stdout, d)
			}
			if d.GetReason() == "approval_required" && d.GetApprovalId() != "" {
				return &exitError{code: ExitAwaitingApproval, msg: awaitingApproval(req, d)}
			}
			var msg strings.Builder
			fmt.Fprintf(&msg, "refused before dispatch (%s): %s\nnothing reached the server (%s)", oneLine(d.GetReason()), oneLine(d.GetMessage()), onRecord(req, d.GetCallId(), d.GetAttempt()))
			if d.GetServerFailure() != nil {
				fmt.Fprintf(&msg, "\nserver failure: %s\n", oneLine(d.GetServerFailure().GetClass()))
				printTail(&msg, "", d.GetServerFailure().GetStderrTail())
			}
			return &exitError{code: ExitRefused, msg: strings.TrimSuffix(msg.String(), "\n")}
		case *poolv1.CallFailure:
			if g.output == "json" {
				_ = printJSON(g.stdout, d)
			}
			return &exitError{code: ExitFailed, msg: sprintLine("dispatched and failed (%s): %s\nthe call reached the server and may have taken effect (%s)", oneLine(d.GetFailureClass()), oneLine(d.GetMessage()), onRecord(req, d.GetCallId(), d.GetAttempt()))}
		}
	}
	// No answer within the CLI's deadline: the request may have been sent and the call
	// dispatched, so "failed" (or "refused") would be a guess either way. The server keeps
	// the same deadline (gRPC sends it along) and may reset the stream a moment before the
	// CLI's own timer fires: the code, without a pool detail, is what says so, not
	// ctx.Err(). (The pool's own timeouts come with a CallFailure, above.)
	if st.Code() == codes.DeadlineExceeded && !neverSent(st) {
		return &exitError{code: ExitFailed, msg: g.unknownOutcome(req)}
	}
	return err
}

// printCallResult prints a dispatched call's result; a tool's own error is exit 4.
func (g *globals) printCallResult(resp *poolv1.CallToolResponse) error {
	if g.output == "json" {
		if err := printJSON(g.stdout, resp); err != nil {
			return err
		}
	} else {
		if id, dispatched := resp.GetApprovalId(), resp.GetDispatchedCallId(); id != "" && dispatched != "" {
			// The caller's retry did not reach the server: it took the outcome of the call the
			// approver dispatched, so it names no latency of its own, and it names that call,
			// whose audit records say what reached the server, as audit list shows it.
			writef(g.stdout, "approved: the result of approval %s: %s (%s, dispatched as call %s#%d when it was approved: the server was reached once; this retry is call %s attempt %d)\n",
				oneLine(id), oneLine(resp.GetResult()), callTarget(resp), oneLine(dispatched), resp.GetDispatchedAttempt(), oneLine(resp.GetCallId()), resp.GetAttempt())
		} else if id != "" {
			// The approver's answer: this is the call that was dispatched.
			writef(g.stdout, "approved: the result of approval %s: %s (%s, call %s attempt %d; the server was reached once, when it was approved)\n", oneLine(id), oneLine(resp.GetResult()),
				callTarget(resp), oneLine(resp.GetCallId()), resp.GetAttempt())
		} else {
			writef(g.stdout, "dispatched: %s (%s, call %s attempt %d, %s)\n", oneLine(resp.GetResult()), callTarget(resp),
				oneLine(resp.GetCallId()), resp.GetAttempt(), time.Duration(resp.GetLatencyMicros())*time.Microsecond)
		}
		for _, a := range resp.GetAdvisory() {
			writef(g.stdout, "advisory (recorded, not enforced): %s\n", oneLine(a))
		}
		g.printToolResult(resp.GetContent(), resp.GetStructuredContent())
	}
	if resp.GetResult() == "failed" {
		return &exitError{code: ExitFailed, msg: sprintLine("dispatched and failed (%s): the tool reported an error; it may have taken effect", oneLine(resp.GetFailureClass()))}
	}
	return nil
}

// callTarget names what a call reached: server/tool, or a tool of the agent's surface that
// Ringfence answers itself (tool_search), which has no server.
func callTarget(resp *poolv1.CallToolResponse) string {
	if resp.GetServerRef() == "" {
		return oneLine(resp.GetToolName()) + ", answered by Ringfence itself"
	}
	return oneLine(resp.GetServerRef()) + "/" + oneLine(resp.GetToolName())
}

// awaitingApproval says that a call waits for an approver, and the commands that decide it.
func awaitingApproval(req *poolv1.CallToolRequest, d *poolv1.CallRefusal) string {
	run := oneLine(req.GetRunId()) + oneLine(tenantArg(req.GetTenant()))
	id := oneLine(d.GetApprovalId())
	return fmt.Sprintf(`awaiting approval %s: the tool asks a person first, and nothing reached the server yet
arguments: %s (the run takes no other call until it is decided)
approve it (needs run:approve): ringfence runs approve --run %s --approval %s
deny it: ringfence runs deny --run %s --approval %s --reason TEXT
once approved, the same call again (same agent, tool and arguments) gets its result`,
		id, oneLine(d.GetArgsDigest()), run, id, run, id)
}

// onRecord names a call's attempt and where its audit records are: the pool's log line of the
// call names the same call_id and attempt.
func onRecord(req *poolv1.CallToolRequest, callID string, attempt int32) string {
	return fmt.Sprintf("call %s attempt %d; its records: ringfence audit list --run %s%s --call %s",
		oneLine(callID), attempt, oneLine(req.GetRunId()), oneLine(tenantArg(req.GetTenant())), oneLine(callID))
}

// unknownOutcome says what a call that got no answer within --timeout may have done, and how
// to find out.
func (g *globals) unknownOutcome(req *poolv1.CallToolRequest) string {
	return fmt.Sprintf(`the call's outcome is unknown: no answer within --timeout %s
it may have reached the server and taken effect: it is not known to have failed, nor to have been refused
look up call %s before calling again: ringfence audit list --run %s%s --call %s (needs audit:read)
%s
a longer --timeout waits for a slow tool; --call-id %s calls it again as the same call`,
		g.timeout, oneLine(req.GetCallId()), oneLine(req.GetRunId()), oneLine(tenantArg(req.GetTenant())), oneLine(req.GetCallId()), attemptLegend, oneLine(req.GetCallId()))
}

// attemptLegend says how to read an attempt's audit records when its outcome is unknown.
const attemptLegend = `  "refused_before_dispatch": nothing happened
  "dispatched: pending": it reached the server; a second record holds its outcome once the call ends`

// printToolResult prints a tool's result: text content as text, other content as JSON. A
// result with structured content is printed as that JSON instead of its text blocks, which by
// MCP convention carry the same JSON serialized (and, HTML-escaped as every text leaf is,
// would read {&#34;paths&#34;: …}).
func (g *globals) printToolResult(content []*structpb.Struct, structured *structpb.Struct) {
	for _, c := range content {
		if c.GetFields()["type"].GetStringValue() == "text" {
			if structured == nil {
				fmt.Fprintln(g.stdout, c.GetFields()["text"].GetStringValue())
			}
			continue
		}
		printCompactJSON(g.stdout, c.AsMap())
	}
	if structured != nil {
		printCompactJSON(g.stdout, structured.AsMap())
	}
}

// printCompactJSON writes v as one line of JSON, with &, < and > as they are: a URL in a
// result (a connect tool's authorization_url) must stay one the user can copy.
func printCompactJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func (g *globals) pool(parent context.Context) (poolv1.PoolServiceClient, context.Context, context.CancelFunc, error) {
	conn, ctx, cancel, err := g.connect(parent)
	if err != nil {
		return nil, nil, nil, err
	}
	return poolv1.NewPoolServiceClient(conn), ctx, cancel, nil
}

// newRunsToolsCmd lists what an agent of a run offers its model.
func newRunsToolsCmd(g *globals) *cobra.Command {
	var runID, agent, tenant string
	cmd := &cobra.Command{
		Use:   "tools --run ID --agent A",
		Short: "List the tools an agent of a run offers its model now, and why the others are hidden",
		Long: `tools lists exactly the tools a call by the agent may reach, sorted by name: its tools
after the agent's settings, the registrations' tool filters and the run's selected servers,
with each server whose tools load on demand and the tool_search tool that loads them, and
whether a call asks the user first. Hidden tools follow with the filter that hid them.
No server is started. -o json prints the listing as the REST API returns it
(GET /v1/runs/{run_id}/agents/{agent}/tools), schemas included.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.ListAgentTools(ctx, &poolv1.ListAgentToolsRequest{RunId: runID, Agent: agent, Tenant: tenant})
			if err != nil {
				return err
			}
			return g.printAgentTools(resp)
		},
	}
	cmd.Flags().StringVar(&runID, "run", "", "run id")
	cmd.Flags().StringVar(&agent, "agent", "", "the agent node's id")
	cmd.Flags().StringVar(&tenant, "tenant", "", tenantUsage)
	_ = cmd.MarkFlagRequired("run")
	_ = cmd.MarkFlagRequired("agent")
	return cmd
}

// printAgentTools shows a listing: the tools, the deferred servers, the hidden tools. Titles
// and descriptions are the servers' own text, shown terminal-safe (table rows escape control
// characters) and cut to one line.
func (g *globals) printAgentTools(resp *poolv1.ListAgentToolsResponse) error {
	if g.output == "json" {
		return printJSON(g.stdout, resp)
	}
	if sel := resp.GetSelectedServers(); len(sel) > 0 {
		writef(g.stdout, "selected servers: %s\n\n", strings.Join(sel, ", "))
	}
	t := newTable(g.stdout, "TOOL", "SERVER", "CONFIRM", "DESCRIPTION")
	for _, tool := range resp.GetTools() {
		confirm := "-"
		if tool.GetRequiresConfirmation() {
			confirm = "asks first"
		}
		desc := tool.GetTitle()
		if desc == "" {
			desc = tool.GetDescription()
		}
		t.row(tool.GetName(), orDash(tool.GetServerRef()), confirm, truncate(strings.Join(strings.Fields(desc), " "), 72))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if len(resp.GetTools()) == 0 {
		fmt.Fprintln(g.stdout, "(no tool: the agent's model sees none now)")
	}
	if len(resp.GetDeferredServers()) > 0 {
		fmt.Fprintln(g.stdout, "\nservers whose tools load on demand (tool_search finds and loads them):")
		t = newTable(g.stdout, "SERVER", "NOT LOADED", "DESCRIPTION")
		for _, d := range resp.GetDeferredServers() {
			t.row(d.GetServerRef(), fmt.Sprint(d.GetUnloadedTools()), truncate(strings.Join(strings.Fields(d.GetDescription()), " "), 72))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if len(resp.GetHidden()) > 0 {
		fmt.Fprintln(g.stdout, "\nhidden from the model:")
		t = newTable(g.stdout, "TOOL", "REASON", "WHY")
		for _, h := range resp.GetHidden() {
			reason := h.GetReason()
			if h.GetLevel() != "" {
				reason += " (" + h.GetLevel() + ")"
			}
			t.row(h.GetName(), reason, h.GetMessage())
		}
		return t.flush()
	}
	return nil
}

func (g *globals) printRun(r *poolv1.Run) error {
	if g.output == "json" {
		return printJSON(g.stdout, r)
	}
	var sessions []string
	for _, s := range r.GetSessions() {
		sessions = append(sessions, fmt.Sprintf("%s (%d calls)", s.GetServerRef(), s.GetCalls()))
	}
	pairs := []string{
		"run", r.GetRunId(),
		"tenant", r.GetTenant(),
		"graph", fmt.Sprintf("%s v%d", r.GetGraphId(), r.GetVersion()),
		"state", r.GetState(),
		"end reason", orDash(r.GetEndReason()),
		"calls", fmt.Sprint(r.GetCalls()),
		"sessions", orDash(strings.Join(sessions, ", ")),
		"selected servers", orDash(strings.Join(r.GetSelectedServers(), ", ")),
		"waits for approval", orDash(r.GetPendingApprovalId()),
		"started", ts(r.GetStartTime()),
		"last activity", ts(r.GetLastActivityTime()),
	}
	// The user a run acts for (servers that sign each user in), and, with several pool
	// hosts, the one that owns it (or lost it), are shown when there are any.
	if u := r.GetUser(); u != "" {
		pairs = append(pairs, "user", u)
	}
	if h := r.GetHost(); h != "" {
		pairs = append(pairs, "host", h)
	}
	if h := r.GetHostLost(); h != "" {
		if r.GetState() == "failed" {
			h += " (runs resume places the run on a live host)"
		}
		pairs = append(pairs, "host lost", h)
	}
	return kv(g.stdout, pairs...)
}
