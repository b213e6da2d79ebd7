package pool

import (
	"context"
	"errors"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/discovery"
)

// In-process callers of the pool's Go API (the MCP front door) reach a run on another pool host
// too: ListAgentTools, ApproveCall and DenyCall forward a request for a run this host does not
// own through ForwardRun, as the public API's handlers do, and CallTool through
// ForwardCallTool, which streams the server's progress reports back to the receiver in the
// call's context (spawner.WithProgress) while the call runs; each turns the owner's answer back
// into the Go types. The gRPC handlers forward the request they received as it is (forwardOr),
// so they mark their context and these methods leave it to them.
//
// A server's JSON-RPC error comes back in the failure's detail (CallFailure.jsonrpc_error), so
// the front door answers its client with it as the owner's would.

// grpcHandlerKey marks a request a public gRPC handler serves: it forwards itself.
type grpcHandlerKey struct{}

func inGRPCHandler(ctx context.Context) context.Context {
	return context.WithValue(ctx, grpcHandlerKey{}, true)
}

// elsewhereFor is the host an in-process request belongs on, when err says so and nothing else
// forwards it.
func (s *Service) elsewhereFor(ctx context.Context, err error) *elsewhereError {
	var e *elsewhereError
	if s.hosts == nil || ctx.Value(grpcHandlerKey{}) != nil || !errors.As(err, &e) {
		return nil
	}
	return e
}

// callElsewhere is CallTool on the run's owner; cancelling ctx cancels it there.
func (s *Service) callElsewhere(ctx context.Context, e *elsewhereError, req CallRequest) (*CallResult, error) {
	preq := &poolv1.CallToolRequest{RunId: req.RunID, Tenant: req.Tenant, Agent: req.Agent, Tool: req.Tool, CallId: req.CallID}
	if req.decoded != nil {
		var err error
		if preq.Arguments, err = structpb.NewStruct(req.decoded); err != nil {
			return nil, fieldError("arguments", "must be a JSON object")
		}
	} else if len(req.Arguments) > 0 {
		preq.Arguments = &structpb.Struct{}
		if err := protojson.Unmarshal(req.Arguments, preq.Arguments); err != nil {
			return nil, fieldError("arguments", "must be a JSON object")
		}
	}
	resp, err := s.forwardCall(ctx, e, preq)
	if err != nil {
		return nil, callErrorFromStatus(err)
	}
	return callFromProto(resp), nil
}

// callFromProto is callToProto's inverse.
func callFromProto(resp *poolv1.CallToolResponse) *CallResult {
	out := &CallResult{
		CallID: resp.GetCallId(), Attempt: resp.GetAttempt(), ServerRef: resp.GetServerRef(), ToolName: resp.GetToolName(),
		Result: resp.GetResult(), FailureClass: resp.GetFailureClass(), IsError: resp.GetIsError(), Advisory: resp.GetAdvisory(),
		Latency: time.Duration(resp.GetLatencyMicros()) * time.Microsecond, ApprovalID: resp.GetApprovalId(),
		DispatchedCallID: resp.GetDispatchedCallId(), DispatchedAttempt: resp.GetDispatchedAttempt(),
		ResultDigest: resp.GetResultDigest(), ResultSize: resp.GetResultSize(),
	}
	for _, c := range resp.GetContent() {
		out.Content = append(out.Content, c.AsMap())
	}
	if resp.GetStructuredContent() != nil {
		out.StructuredContent = resp.GetStructuredContent().AsMap()
	}
	return out
}

// callErrorFromStatus turns the owner's refusal or failure of a call (callStatus) back into
// the error CallTool returns; other statuses stay as they are.
func callErrorFromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *poolv1.CallRefusal:
			ref := &RefusedError{CallID: d.GetCallId(), Attempt: d.GetAttempt(), Reason: d.GetReason(), Err: errors.New(d.GetMessage()),
				Pinned: d.GetPinnedHash(), Live: d.GetLiveHash(), Missing: d.GetMissing(), Level: d.GetLevel(),
				ApprovalID: d.GetApprovalId(), ArgsDigest: d.GetArgsDigest()}
			if f := d.GetServerFailure(); f != nil {
				ref.Server = &discovery.Failure{Class: f.GetClass(), Message: f.GetMessage(), StderrTail: f.GetStderrTail()}
			}
			return ref
		case *poolv1.CallFailure:
			fail := &FailedError{CallID: d.GetCallId(), Attempt: d.GetAttempt(), Class: d.GetFailureClass(), Err: errors.New(d.GetMessage())}
			if e := d.GetJsonrpcError(); e != nil {
				fail.Err = &relayedRPCError{msg: d.GetMessage(), rpc: rpcErrorFromProto(e)}
			}
			return fail
		}
	}
	return err
}

// relayedRPCError is the message of a failure the owner sent, over the server's JSON-RPC
// error it carried, so that the front door finds the error (errors.As) as it does locally.
type relayedRPCError struct {
	msg string
	rpc *jsonrpc.Error
}

func (e *relayedRPCError) Error() string { return e.msg }
func (e *relayedRPCError) Unwrap() error { return e.rpc }

// rpcErrorFromProto is rpcErrorToProto's inverse.
func rpcErrorFromProto(e *poolv1.JsonRpcError) *jsonrpc.Error {
	out := &jsonrpc.Error{Code: e.GetCode()}
	if e.GetData() != nil {
		out.Data, _ = protojson.Marshal(e.GetData())
	}
	return out
}

// listElsewhere is ListAgentTools on the run's owner.
func (s *Service) listElsewhere(ctx context.Context, e *elsewhereError, runID, tenant, agent string) (*agentsurface.Listing, error) {
	var resp poolv1.ListAgentToolsResponse
	err := s.forward(ctx, e, poolv1.PoolService_ListAgentTools_FullMethodName, &poolv1.ListAgentToolsRequest{RunId: runID, Tenant: tenant, Agent: agent}, &resp)
	if err != nil {
		return nil, err
	}
	return listingFromProto(&resp), nil
}

// listingFromProto is listingToProto's inverse (a tool's graph node id stays the owner's).
func listingFromProto(resp *poolv1.ListAgentToolsResponse) *agentsurface.Listing {
	out := &agentsurface.Listing{Selected: resp.GetSelectedServers()}
	for _, t := range resp.GetTools() {
		out.Tools = append(out.Tools, agentsurface.Tool{
			Name: t.GetName(), Kind: t.GetKind(), ServerRef: t.GetServerRef(), ToolName: t.GetToolName(), Title: t.GetTitle(), Description: t.GetDescription(),
			InputSchema: structToRaw(t.GetInputSchema()), OutputSchema: structToRaw(t.GetOutputSchema()), Annotations: structToRaw(t.GetAnnotations()),
			RequiresConfirmation: t.GetRequiresConfirmation(), Strict: t.GetStrict(), Loaded: t.GetLoaded(),
		})
	}
	for _, d := range resp.GetDeferredServers() {
		out.Deferred = append(out.Deferred, agentsurface.DeferredServer{Ref: d.GetServerRef(), Description: d.GetDescription(), Unloaded: int(d.GetUnloadedTools())})
	}
	for _, h := range resp.GetHidden() {
		out.Hidden = append(out.Hidden, agentsurface.Hidden{
			Tool:     agentsurface.Tool{Name: h.GetName(), ServerRef: h.GetServerRef(), ToolName: h.GetToolName()},
			Decision: agentsurface.Decision{Outcome: agentsurface.Outcome(h.GetReason()), Level: agentsurface.Level(h.GetLevel()), Message: h.GetMessage()},
		})
	}
	return out
}

// structToRaw is a schema's JSON, nil for none.
func structToRaw(st *structpb.Struct) []byte {
	if st == nil {
		return nil
	}
	b, err := protojson.Marshal(st)
	if err != nil {
		return nil
	}
	return b
}

// approveElsewhere is ApproveCall on the run's owner; the approver is the forwarded caller.
func (s *Service) approveElsewhere(ctx context.Context, e *elsewhereError, runID, tenant, id string) (*Approval, *CallResult, error) {
	var resp poolv1.ApproveCallResponse
	err := s.forward(ctx, e, poolv1.PoolService_ApproveCall_FullMethodName, &poolv1.ApproveCallRequest{RunId: runID, Tenant: tenant, ApprovalId: id}, &resp)
	if err != nil {
		return nil, nil, callErrorFromStatus(err)
	}
	return approvalFromProto(resp.GetApproval()), callFromProto(resp.GetCall()), nil
}

// denyElsewhere is DenyCall on the run's owner; the approver is the forwarded caller.
func (s *Service) denyElsewhere(ctx context.Context, e *elsewhereError, runID, tenant, id, reason string) (*Approval, error) {
	var resp poolv1.DenyCallResponse
	err := s.forward(ctx, e, poolv1.PoolService_DenyCall_FullMethodName, &poolv1.DenyCallRequest{RunId: runID, Tenant: tenant, ApprovalId: id, Reason: reason}, &resp)
	if err != nil {
		return nil, err
	}
	return approvalFromProto(resp.GetApproval()), nil
}

// approvalFromProto is approvalToProto's inverse.
func approvalFromProto(a *poolv1.Approval) *Approval {
	out := &Approval{
		ID: a.GetApprovalId(), RunID: a.GetRunId(), Tenant: a.GetTenant(), Agent: a.GetAgent(), Tool: a.GetTool(), ServerRef: a.GetServerRef(),
		ToolName: a.GetToolName(), CallID: a.GetCallId(), ArgsDigest: a.GetArgsDigest(), State: a.GetState(),
		RequestTime: a.GetRequestTime().AsTime(), ExpireTime: a.GetExpireTime().AsTime(), DecidedBy: a.GetDecidedBy(), Note: a.GetNote(),
		ResultWaiting: a.GetResultWaiting(), Arguments: structToRaw(a.GetArguments()),
	}
	if a.GetDecideTime() != nil {
		out.DecideTime = a.GetDecideTime().AsTime()
	}
	return out
}
