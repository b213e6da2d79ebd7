package cli

import (
	"encoding/json"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spf13/cobra"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
)

// newRunsApprovalsCmd lists a run's approvals.
func newRunsApprovalsCmd(g *globals) *cobra.Command {
	var runID, tenant string
	cmd := &cobra.Command{
		Use:   "approvals --run ID",
		Short: "List a run's calls that ask a person first: the one it waits for, and those decided (needs run:approve)",
		Long: `approvals lists the calls of a run that asked a person first: the one the run waits for
(it takes no other call until it is decided), then the decided ones, newest first, each with
the arguments as the agent wrote them. Decide the pending one with runs approve or runs deny.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.ListApprovals(ctx, &poolv1.ListApprovalsRequest{RunId: runID, Tenant: tenant})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp)
			}
			if len(resp.GetApprovals()) == 0 {
				_, err := linef(g.stdout, "no call of run %s asked for approval\n", runID)
				return err
			}
			t := newTable(g.stdout, "APPROVAL", "STATE", "AGENT", "TOOL", "REQUESTED", "DECIDED", "BY", "ARGUMENTS")
			for _, a := range resp.GetApprovals() {
				args, _ := json.Marshal(a.GetArguments().AsMap())
				t.row(a.GetApprovalId(), approvalState(a), a.GetAgent(), a.GetTool(), ts(a.GetRequestTime()), ts(a.GetDecideTime()), orDash(a.GetDecidedBy()), truncate(string(args), 60))
			}
			if err := t.flush(); err != nil {
				return err
			}
			for _, a := range resp.GetApprovals() {
				if a.GetState() == "pending" {
					writef(g.stdout, "\napproval %s expires at %s: ringfence runs approve --run %s%s --approval %s (or runs deny)\n",
						a.GetApprovalId(), ts(a.GetExpireTime()), runID, tenantArg(tenant), a.GetApprovalId())
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&runID, "run", "", "run id")
	cmd.Flags().StringVar(&tenant, "tenant", "", tenantUsage)
	_ = cmd.MarkFlagRequired("run")
	return cmd
}

// approvalState is an approval's state, with what waits for the caller's retry.
func approvalState(a *poolv1.Approval) string {
	if a.GetResultWaiting() {
		return a.GetState() + " (result waits for the retry)"
	}
	return a.GetState()
}

// newRunsDecideCmd builds runs approve and runs deny.
func newRunsDecideCmd(g *globals, verb string) *cobra.Command {
	var runID, tenant, id, reason string
	short := map[string]string{
		"approve": "Approve a call that waits for a person: every gate runs again, the call is dispatched and its result printed (needs run:approve); exit 3 when a gate refuses it now, 4 when it failed after dispatch",
		"deny":    "Deny a call that waits for a person: it is recorded as refused (denied_by_approver) and the run takes calls again (needs run:approve)",
	}[verb]
	cmd := &cobra.Command{
		Use:   verb + " --run ID --approval ID",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			if verb == "deny" {
				resp, err := client.DenyCall(ctx, &poolv1.DenyCallRequest{RunId: runID, Tenant: tenant, ApprovalId: id, Reason: reason})
				if err != nil {
					return err
				}
				return g.printApproval(resp.GetApproval())
			}
			stop := g.waitNote("the approved call of %s", id)
			resp, err := client.ApproveCall(ctx, &poolv1.ApproveCallRequest{RunId: runID, Tenant: tenant, ApprovalId: id})
			stop()
			if status.Code(err) == codes.DeadlineExceeded && len(status.Convert(err).Details()) == 0 && !neverSent(status.Convert(err)) {
				return &exitError{code: ExitFailed, msg: sprintLine("no answer within --timeout %s: the approved call may have been dispatched and taken effect; ringfence runs approvals --run %s%s shows what became of it",
					g.timeout.String(), runID, tenantArg(tenant))}
			}
			if err != nil {
				// A gate that refuses the call now, or a failure after dispatch, answers as
				// a call does.
				return g.callError(err, &poolv1.CallToolRequest{RunId: runID, Tenant: tenant})
			}
			if g.output != "json" {
				writef(g.stdout, "approved %s: agent %s's call to %s (by %s at %s)\n", resp.GetApproval().GetApprovalId(), resp.GetApproval().GetAgent(),
					resp.GetApproval().GetTool(), resp.GetApproval().GetDecidedBy(), ts(resp.GetApproval().GetDecideTime()))
			}
			return g.printCallResult(resp.GetCall())
		},
	}
	cmd.Flags().StringVar(&runID, "run", "", "run id")
	cmd.Flags().StringVar(&id, "approval", "", "the approval's id (runs approvals lists them)")
	cmd.Flags().StringVar(&tenant, "tenant", "", tenantUsage)
	if verb == "deny" {
		cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the refusal (at most 512 bytes)")
	}
	_ = cmd.MarkFlagRequired("run")
	_ = cmd.MarkFlagRequired("approval")
	return cmd
}

// printApproval shows one approval.
func (g *globals) printApproval(a *poolv1.Approval) error {
	if g.output == "json" {
		return printJSON(g.stdout, a)
	}
	args, _ := json.Marshal(a.GetArguments().AsMap())
	return kv(g.stdout,
		"approval", a.GetApprovalId(),
		"state", approvalState(a),
		"run", a.GetRunId(),
		"agent", a.GetAgent(),
		"tool", a.GetTool(),
		"arguments", string(args),
		"requested", ts(a.GetRequestTime()),
		"decided", ts(a.GetDecideTime()),
		"by", orDash(a.GetDecidedBy()),
		"note", orDash(a.GetNote()),
	)
}
