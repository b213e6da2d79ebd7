// Package auditpb converts audit records between the domain type and the audit service's
// protos, for the service and for producers that append over gRPC.
package auditpb

import (
	"encoding/json"

	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/fielderr"
)

// RecordToProto renders a record (without its chain position).
func RecordToProto(r audit.Record) *auditv1.Record {
	out := &auditv1.Record{
		Id: r.ID, Seq: r.Seq, Time: timestamppb.New(r.Time), Kind: string(r.Kind), Tenant: r.Tenant, Producer: r.Producer,
	}
	if !r.ReceiveTime.IsZero() {
		out.ReceiveTime = timestamppb.New(r.ReceiveTime)
	}
	switch {
	case r.Admin != nil:
		a := r.Admin
		out.Event = &auditv1.Record_Admin{Admin: &auditv1.AdminEvent{
			ActorKeyId: a.ActorKeyID, ActorKeyName: a.ActorKeyName, ActorRole: a.ActorRole, Action: a.Action,
			ResourceType: a.ResourceType, ResourceId: a.ResourceID, ChangeJson: string(a.Change),
		}}
	case r.ToolCall != nil:
		t := r.ToolCall
		out.Event = &auditv1.Record_ToolCall{ToolCall: &auditv1.ToolCallAttempt{
			RunId: t.RunID, GraphId: t.GraphID, GraphVersion: t.GraphVersion, AgentNode: t.AgentNode,
			ToolNode: t.ToolNode, ServerRef: t.ServerRef, ToolName: t.ToolName, CallId: t.CallID,
			Attempt: t.Attempt, OperationSupport: t.OperationSupport,
			OperationResidualDuplicateRisk: t.OperationResidualDuplicateRisk, Outcome: t.Outcome,
			Reason: t.Reason, Result: t.Result, FailureClass: t.FailureClass, PinnedHash: t.PinnedHash,
			LiveHash: t.LiveHash, ArgsDigest: t.ArgsDigest, ArgsSize: t.ArgsSize, ResultDigest: t.ResultDigest,
			ResultSize: t.ResultSize, LatencyMicros: t.LatencyMicros, Advisory: t.Advisory, PendingId: t.PendingID,
			WarmSession: t.WarmSession, LoadedTools: t.LoadedTools, Approval: approvalToProto(t.Approval), AgentTokenId: t.AgentTokenID,
		}}
	}
	return out
}

func approvalToProto(a *audit.ToolCallApproval) *auditv1.ToolCallApproval {
	if a == nil {
		return nil
	}
	out := &auditv1.ToolCallApproval{ApprovalId: a.ID, State: a.State, DecidedBy: a.DecidedBy, Note: a.Note,
		DispatchedCallId: a.DispatchedCallID, DispatchedAttempt: a.DispatchedAttempt}
	if !a.DecideTime.IsZero() {
		out.DecideTime = timestamppb.New(a.DecideTime)
	}
	return out
}

func approvalFromProto(a *auditv1.ToolCallApproval) *audit.ToolCallApproval {
	if a == nil {
		return nil
	}
	out := &audit.ToolCallApproval{ID: a.GetApprovalId(), State: a.GetState(), DecidedBy: a.GetDecidedBy(), Note: a.GetNote(),
		DispatchedCallID: a.GetDispatchedCallId(), DispatchedAttempt: a.GetDispatchedAttempt()}
	if a.GetDecideTime() != nil {
		out.DecideTime = a.GetDecideTime().AsTime()
	}
	return out
}

// RecordFromProto reads a record a producer sent; audit.Record.Validate (in the store)
// checks it in full. A receive_time sent is ignored: the log stamps its own.
func RecordFromProto(p *auditv1.Record) (audit.Record, error) {
	r := audit.Record{
		ID: p.GetId(), Time: p.GetTime().AsTime(), Kind: audit.Kind(p.GetKind()), Tenant: p.GetTenant(), Producer: p.GetProducer(),
	}
	if p.GetTime() == nil {
		return r, fielderr.New("records.time", "is required")
	}
	switch e := p.GetEvent().(type) {
	case *auditv1.Record_Admin:
		a := e.Admin
		r.Admin = &audit.AdminEvent{
			ActorKeyID: a.GetActorKeyId(), ActorKeyName: a.GetActorKeyName(), ActorRole: a.GetActorRole(), Action: a.GetAction(),
			ResourceType: a.GetResourceType(), ResourceID: a.GetResourceId(),
		}
		if c := a.GetChangeJson(); c != "" {
			if !json.Valid([]byte(c)) {
				return r, fielderr.New("records.admin.change_json", "is not JSON")
			}
			r.Admin.Change = json.RawMessage(c)
		}
	case *auditv1.Record_ToolCall:
		t := e.ToolCall
		r.ToolCall = &audit.ToolCallAttempt{
			RunID: t.GetRunId(), GraphID: t.GetGraphId(), GraphVersion: t.GetGraphVersion(), AgentNode: t.GetAgentNode(),
			ToolNode: t.GetToolNode(), ServerRef: t.GetServerRef(), ToolName: t.GetToolName(), CallID: t.GetCallId(),
			Attempt: t.GetAttempt(), OperationSupport: t.GetOperationSupport(),
			OperationResidualDuplicateRisk: t.GetOperationResidualDuplicateRisk(), Outcome: t.GetOutcome(),
			Reason: t.GetReason(), Result: t.GetResult(), FailureClass: t.GetFailureClass(), PinnedHash: t.GetPinnedHash(),
			LiveHash: t.GetLiveHash(), ArgsDigest: t.GetArgsDigest(), ArgsSize: t.GetArgsSize(), ResultDigest: t.GetResultDigest(),
			ResultSize: t.GetResultSize(), LatencyMicros: t.GetLatencyMicros(), Advisory: t.GetAdvisory(),
			PendingID: t.GetPendingId(), WarmSession: t.GetWarmSession(), LoadedTools: t.GetLoadedTools(), Approval: approvalFromProto(t.GetApproval()), AgentTokenID: t.GetAgentTokenId(),
		}
	}
	return r, nil
}
