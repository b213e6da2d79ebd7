package pool

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/documents"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/ident"
)

// Server is the gRPC front end of the pool.
type Server struct {
	poolv1.UnsafePoolServiceServer
	svc *Service
}

var _ poolv1.PoolServiceServer = (*Server)(nil)

// NewServer wraps the service for gRPC.
func NewServer(svc *Service) *Server { return &Server{svc: svc} }

// runTenant is the tenant a run request acts in, as the server's interceptor resolved it
// (auth.TenantFrom): a key bound to a tenant acts for its own, others for the one they name or
// "default". A run id is unique within its tenant. A call without one is refused.
func runTenant(ctx context.Context) (string, error) {
	tenant, err := auth.TenantFrom(ctx)
	if err != nil {
		return "", err
	}
	if err := graph.ValidateTenant(tenant); err != nil {
		return "", err
	}
	return tenant, nil
}

// StartRun implements PoolService.
func (g *Server) StartRun(ctx context.Context, req *poolv1.StartRunRequest) (*poolv1.StartRunResponse, error) {
	tenant, err := runTenant(ctx)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	if err := graph.ValidateGraphID("graph_id", req.GetGraphId()); err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	if req.GetVersion() < 0 {
		return nil, g.svc.errors.Status(ctx, fieldError("version", "must not be negative (0 means the latest)"))
	}
	info, err := g.svc.StartRunFor(ctx, RunStart{Tenant: tenant, GraphID: req.GetGraphId(), Version: req.GetVersion(), RunID: req.GetRunId(),
		User: req.GetUser(), Selected: req.GetSelectedServers()})
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_StartRun_FullMethodName, req, &poolv1.StartRunResponse{})
	}
	return &poolv1.StartRunResponse{Run: runToProto(info), IgnoredServers: info.IgnoredServers}, nil
}

// forwardOr answers a request whose handling failed with err: one about a run another pool host
// owns (or that placement sent to one) is forwarded there and answered with the owner's
// response; any other error becomes its status.
func forwardOr[R proto.Message](ctx context.Context, g *Server, err error, method string, req proto.Message, resp R) (R, error) {
	var zero R
	var e *elsewhereError
	if !errors.As(err, &e) || g.svc.hosts == nil {
		return zero, g.svc.errors.Status(ctx, err)
	}
	if err := g.svc.forward(ctx, e, method, req, resp); err != nil {
		return zero, err
	}
	return resp, nil
}

// runRequest is what every request about one run carries (its tenant is resolved by the
// interceptor).
type runRequest interface {
	GetRunId() string
}

// namedRun checks a run request's id and resolves its tenant.
func namedRun(ctx context.Context, req runRequest) (id, tenant string, err error) {
	if err := validateRunID(req.GetRunId()); err != nil {
		return "", "", err
	}
	tenant, err = runTenant(ctx)
	return req.GetRunId(), tenant, err
}

// GetRun implements PoolService.
func (g *Server) GetRun(ctx context.Context, req *poolv1.GetRunRequest) (*poolv1.GetRunResponse, error) {
	id, tenant, err := namedRun(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	info, err := g.svc.GetRun(ctx, id, tenant)
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_GetRun_FullMethodName, req, &poolv1.GetRunResponse{})
	}
	return &poolv1.GetRunResponse{Run: runToProto(info)}, nil
}

// PauseRun implements PoolService.
func (g *Server) PauseRun(ctx context.Context, req *poolv1.PauseRunRequest) (*poolv1.PauseRunResponse, error) {
	id, tenant, err := namedRun(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	info, err := g.svc.PauseRun(ctx, id, tenant)
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_PauseRun_FullMethodName, req, &poolv1.PauseRunResponse{})
	}
	return &poolv1.PauseRunResponse{Run: runToProto(info)}, nil
}

// ResumeRun implements PoolService.
func (g *Server) ResumeRun(ctx context.Context, req *poolv1.ResumeRunRequest) (*poolv1.ResumeRunResponse, error) {
	id, tenant, err := namedRun(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	info, err := g.svc.ResumeRun(ctx, id, tenant)
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_ResumeRun_FullMethodName, req, &poolv1.ResumeRunResponse{})
	}
	return &poolv1.ResumeRunResponse{Run: runToProto(info)}, nil
}

// EndRun implements PoolService.
func (g *Server) EndRun(ctx context.Context, req *poolv1.EndRunRequest) (*poolv1.EndRunResponse, error) {
	id, tenant, err := namedRun(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	p, err := auth.PrincipalFrom(ctx)
	if err != nil {
		return nil, err
	}
	info, err := g.svc.EndRun(ctx, id, tenant, req.GetStatus(), "ended by "+p.Actor())
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_EndRun_FullMethodName, req, &poolv1.EndRunResponse{})
	}
	return &poolv1.EndRunResponse{Run: runToProto(info)}, nil
}

// CallTool implements PoolService.
func (g *Server) CallTool(ctx context.Context, req *poolv1.CallToolRequest) (*poolv1.CallToolResponse, error) {
	ctx = inGRPCHandler(ctx) // it forwards the request it received itself (forwardOr)
	call, err := callRequestFromProto(req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	if call.Tenant, err = runTenant(ctx); err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	if p, _ := auth.FromContext(ctx); p.AgentToken != "" {
		call.AgentTokenID = p.AgentToken // a front door's call, forwarded by another pool host
	}
	res, err := g.svc.CallTool(ctx, call)
	if errors.Is(err, errRunElsewhere) {
		return forwardOr(ctx, g, err, poolv1.PoolService_CallTool_FullMethodName, req, &poolv1.CallToolResponse{})
	}
	if err != nil {
		return nil, callStatus(ctx, g.svc, err)
	}
	return callToProto(res), nil
}

// callToProto renders a dispatched call's result.
func callToProto(res *CallResult) *poolv1.CallToolResponse {
	out := &poolv1.CallToolResponse{
		CallId: res.CallID, Attempt: res.Attempt, Outcome: "dispatched", Result: res.Result,
		FailureClass: res.FailureClass, IsError: res.IsError, Advisory: res.Advisory,
		ServerRef: res.ServerRef, ToolName: res.ToolName, LatencyMicros: res.Latency.Microseconds(), ApprovalId: res.ApprovalID,
		DispatchedCallId: res.DispatchedCallID, DispatchedAttempt: res.DispatchedAttempt,
		ResultDigest: res.ResultDigest, ResultSize: res.ResultSize,
	}
	out.Content, out.StructuredContent = resultToProto(res)
	return out
}

// ListAgentTools implements PoolService.
func (g *Server) ListAgentTools(ctx context.Context, req *poolv1.ListAgentToolsRequest) (*poolv1.ListAgentToolsResponse, error) {
	ctx = inGRPCHandler(ctx) // it forwards the request it received itself (forwardOr)
	id, tenant, err := namedRun(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	if err := graph.ValidateNodeID("agent", req.GetAgent()); err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	l, err := g.svc.ListAgentTools(ctx, id, tenant, req.GetAgent())
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_ListAgentTools_FullMethodName, req, &poolv1.ListAgentToolsResponse{})
	}
	return listingToProto(l), nil
}

// callRequestFromProto reads a call and checks its fields before any gate. A field an audit
// record cannot hold would leave the attempt unrecorded, so a request carrying one is refused
// here, naming the field and its limit; such a malformed request is not an attempt on record.
func callRequestFromProto(req *poolv1.CallToolRequest) (CallRequest, error) {
	if err := validateRunID(req.GetRunId()); err != nil {
		return CallRequest{}, err
	}
	// An agent is a graph node: a name that is not a node id names no agent of any graph.
	if err := graph.ValidateNodeID("agent", req.GetAgent()); err != nil {
		return CallRequest{}, err
	}
	if req.GetTool() == "" {
		return CallRequest{}, fieldError("tool", "is required: the name the agent offers its model, <server>__<tool> (ListAgentTools, ringfence runs tools, lists them)")
	}
	if err := boundedField("tool", req.GetTool(), true); err != nil {
		return CallRequest{}, err
	}
	if req.GetCallId() != "" {
		if err := ident.CallID.Check("call_id", req.GetCallId()); err != nil {
			return CallRequest{}, err
		}
	}
	call := CallRequest{RunID: req.GetRunId(), Agent: req.GetAgent(), Tool: req.GetTool(), CallID: req.GetCallId()}
	if req.GetArguments() != nil {
		args, err := structArguments(req.GetArguments())
		if err != nil {
			return CallRequest{}, fieldError("arguments", "cannot be encoded as JSON")
		}
		call.decoded = args
	}
	return call, nil
}

// errNotJSON is structArguments' answer for what protojson cannot encode.
var errNotJSON = errors.New("not representable as JSON")

// structArguments is a call's arguments as the gRPC front receives them, a protobuf Struct,
// as the JSON object decodeArguments reads from the Struct's JSON (protojson), without
// encoding and decoding that JSON: objects map[string]any, lists []any, numbers float64 (a
// Struct's numbers are doubles, and a double's JSON decodes to the same double), strings,
// bools and nil. What protojson refuses to encode is refused here too: a number that is NaN
// or infinite, a value of no kind, text that is not UTF-8.
func structArguments(st *structpb.Struct) (map[string]any, error) {
	out := make(map[string]any, len(st.GetFields()))
	for k, v := range st.GetFields() {
		if !utf8.ValidString(k) {
			return nil, errNotJSON
		}
		x, err := valueArgument(v)
		if err != nil {
			return nil, err
		}
		out[k] = x
	}
	return out, nil
}

func valueArgument(v *structpb.Value) (any, error) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		return nil, nil
	case *structpb.Value_NumberValue:
		if math.IsNaN(k.NumberValue) || math.IsInf(k.NumberValue, 0) {
			return nil, errNotJSON
		}
		return k.NumberValue, nil
	case *structpb.Value_StringValue:
		if !utf8.ValidString(k.StringValue) {
			return nil, errNotJSON
		}
		return k.StringValue, nil
	case *structpb.Value_BoolValue:
		return k.BoolValue, nil
	case *structpb.Value_StructValue:
		return structArguments(k.StructValue)
	case *structpb.Value_ListValue:
		list := make([]any, len(k.ListValue.GetValues()))
		for i, e := range k.ListValue.GetValues() {
			x, err := valueArgument(e)
			if err != nil {
				return nil, err
			}
			list[i] = x
		}
		return list, nil
	}
	return nil, errNotJSON
}

// validateRunID checks a run id as StartRun makes them: ident.Run.
func validateRunID(id string) error {
	if id == "" {
		return fieldError("run_id", "is required: StartRun answers it (ringfence runs start prints it)")
	}
	return ident.Run.Check("run_id", id)
}

// boundedField checks a free-form field that lands in an audit record.
func boundedField(field, v string, required bool) error {
	if problem := audit.FieldProblem(v, required); problem != "" {
		return fieldError(field, "%s", problem)
	}
	return nil
}

// refusalCodes maps each refusal reason to the code a client branches on.
var refusalCodes = map[string]codes.Code{
	reasonUnknownRun:          codes.NotFound,
	reasonUnknownAgent:        codes.NotFound,
	reasonUnknownTool:         codes.NotFound,
	reasonUnknownServer:       codes.FailedPrecondition,
	reasonRunNotRunning:       codes.FailedPrecondition,
	reasonCapability:          codes.PermissionDenied,
	reasonCeiling:             codes.PermissionDenied,
	reasonAgentFloor:          codes.PermissionDenied,
	reasonArgumentScope:       codes.PermissionDenied,
	reasonInvalidInput:        codes.InvalidArgument,
	reasonIsolationRequired:   codes.FailedPrecondition,
	reasonSpawnFailed:         codes.Unavailable,
	reasonHandshakeFailed:     codes.Unavailable,
	reasonSchemaDrift:         codes.FailedPrecondition,
	reasonLimitExceeded:       codes.ResourceExhausted,
	reasonAuditUnavailable:    codes.Unavailable,
	reasonRegistryUnavailable: codes.Unavailable,
	reasonUnusableSchema:      codes.FailedPrecondition,
	reasonDeclarationScreen:   codes.FailedPrecondition,
	reasonCanceled:            codes.Canceled,
	reasonShuttingDown:        codes.Unavailable,
	reasonFilteredOut:         codes.PermissionDenied,
	reasonNotLoaded:           codes.FailedPrecondition,
	reasonSignInRequired:      codes.FailedPrecondition,
	reasonNotDeclared:         codes.PermissionDenied,
	reasonApprovalRequired:    codes.FailedPrecondition,
	reasonApprovalPending:     codes.FailedPrecondition,
	reasonDeniedByApprover:    codes.PermissionDenied,
	reasonApprovalExpired:     codes.FailedPrecondition,
	reasonDocumentUnavailable: codes.FailedPrecondition,
}

// callStatus renders a refused or failed call with its detail, which names the attempt as
// its audit record does.
func callStatus(ctx context.Context, svc *Service, err error) error {
	var ref *RefusedError
	var fail *FailedError
	switch {
	case errors.As(err, &ref):
		code, ok := refusalCodes[ref.Reason]
		if !ok {
			code = codes.FailedPrecondition
		}
		detail := &poolv1.CallRefusal{
			CallId: ref.CallID, Attempt: ref.Attempt, Reason: ref.Reason, Message: ref.Problem(),
			PinnedHash: ref.Pinned, LiveHash: ref.Live, Missing: ref.Missing,
			ApprovalId: ref.ApprovalID, ArgsDigest: ref.ArgsDigest, Level: ref.Level,
		}
		if ref.Server != nil {
			detail.ServerFailure = &typesv1.ServerFailure{Class: ref.Server.Class, Message: ref.Server.Message, StderrTail: discovery.VisibleTail(ctx, ref.Server.StderrTail)}
		}
		return withDetail(code, ref.Error(), detail)
	case errors.As(err, &fail):
		code := codes.Unknown
		switch fail.Class {
		case failureTimeout:
			code = codes.DeadlineExceeded
		case failureCanceled:
			code = codes.Canceled
		}
		return withDetail(code, fail.Error(), &poolv1.CallFailure{CallId: fail.CallID, Attempt: fail.Attempt, FailureClass: fail.Class, Message: fail.Problem(),
			MayHaveTakenEffect: true, JsonrpcError: rpcErrorToProto(fail)})
	}
	return svc.errors.Status(ctx, err)
}

// rpcErrorToProto is the server's JSON-RPC error a failed call carries (the spawner made it
// safe: its message is in the failure's, its data kept only where it names required
// capabilities), or nil.
func rpcErrorToProto(fail *FailedError) *poolv1.JsonRpcError {
	var rpcErr *jsonrpc.Error
	if !errors.As(fail, &rpcErr) {
		return nil
	}
	out := &poolv1.JsonRpcError{Code: rpcErr.Code}
	var data any
	if len(rpcErr.Data) > 0 && json.Unmarshal(rpcErr.Data, &data) == nil {
		out.Data, _ = structpb.NewValue(data)
	}
	return out
}

func withDetail(code codes.Code, msg string, detail protoadapt.MessageV1) error {
	st := status.New(code, msg)
	if d, err := st.WithDetails(detail); err == nil {
		st = d
	}
	return st.Err()
}

func runToProto(info *RunInfo) *poolv1.Run {
	r := info.Run
	out := &poolv1.Run{
		RunId: r.ID, Tenant: r.Tenant, GraphId: r.GraphID, Version: r.Version, State: r.State,
		StartTime: timestamppb.New(r.StartTime), LastActivityTime: timestamppb.New(info.LastActivity),
		Calls: info.Calls, EndReason: r.EndReason, SelectedServers: r.SelectedServers, PendingApprovalId: info.PendingApproval,
		Host: r.Host, HostLost: r.HostLost, User: r.User,
	}
	if !r.EndTime.IsZero() {
		out.EndTime = timestamppb.New(r.EndTime)
	}
	for _, s := range info.Sessions {
		ps := &poolv1.Session{ServerRef: s.ServerRef, StartTime: timestamppb.New(s.StartTime), Calls: s.Calls}
		if !s.ListedAt.IsZero() {
			ps.ListedTime = timestamppb.New(s.ListedAt)
		}
		out.Sessions = append(out.Sessions, ps)
	}
	return out
}

// approvalRequest is what every request about one approval carries.
type approvalRequest interface {
	runRequest
	GetApprovalId() string
}

// namedApproval checks an approval request's ids and resolves its tenant.
func namedApproval(ctx context.Context, req approvalRequest) (runID, tenant, id string, err error) {
	if runID, tenant, err = namedRun(ctx, req); err != nil {
		return "", "", "", err
	}
	if req.GetApprovalId() == "" {
		return "", "", "", fieldError("approval_id", "is required: ListApprovals (ringfence runs approvals --run RUN) lists the run's approvals")
	}
	if err := ident.Approval.Check("approval_id", req.GetApprovalId()); err != nil {
		return "", "", "", err
	}
	return runID, tenant, req.GetApprovalId(), nil
}

// ListApprovals implements PoolService.
func (g *Server) ListApprovals(ctx context.Context, req *poolv1.ListApprovalsRequest) (*poolv1.ListApprovalsResponse, error) {
	id, tenant, err := namedRun(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	list, err := g.svc.ListApprovals(ctx, id, tenant)
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_ListApprovals_FullMethodName, req, &poolv1.ListApprovalsResponse{})
	}
	out := &poolv1.ListApprovalsResponse{}
	for i := range list {
		out.Approvals = append(out.Approvals, approvalToProto(&list[i]))
	}
	return out, nil
}

// ApproveCall implements PoolService.
func (g *Server) ApproveCall(ctx context.Context, req *poolv1.ApproveCallRequest) (*poolv1.ApproveCallResponse, error) {
	ctx = inGRPCHandler(ctx) // it forwards the request it received itself (forwardOr)
	runID, tenant, id, err := namedApproval(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	p, err := auth.PrincipalFrom(ctx)
	if err != nil {
		return nil, err
	}
	a, res, err := g.svc.ApproveCall(ctx, runID, tenant, id, g.svc.approver(ctx, p, tenant, runID))
	if err != nil {
		if a == nil {
			return forwardOr(ctx, g, err, poolv1.PoolService_ApproveCall_FullMethodName, req, &poolv1.ApproveCallResponse{})
		}
		return nil, callStatus(ctx, g.svc, err)
	}
	return &poolv1.ApproveCallResponse{Approval: approvalToProto(a), Call: callToProto(res)}, nil
}

// DenyCall implements PoolService.
func (g *Server) DenyCall(ctx context.Context, req *poolv1.DenyCallRequest) (*poolv1.DenyCallResponse, error) {
	ctx = inGRPCHandler(ctx) // it forwards the request it received itself (forwardOr)
	runID, tenant, id, err := namedApproval(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	if err := boundedField("reason", req.GetReason(), false); err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	p, err := auth.PrincipalFrom(ctx)
	if err != nil {
		return nil, err
	}
	a, err := g.svc.DenyCall(ctx, runID, tenant, id, g.svc.approver(ctx, p, tenant, runID), req.GetReason())
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_DenyCall_FullMethodName, req, &poolv1.DenyCallResponse{})
	}
	return &poolv1.DenyCallResponse{Approval: approvalToProto(a)}, nil
}

func approvalToProto(a *Approval) *poolv1.Approval {
	out := &poolv1.Approval{
		ApprovalId: a.ID, RunId: a.RunID, Tenant: a.Tenant, Agent: a.Agent, Tool: a.Tool, ServerRef: a.ServerRef, ToolName: a.ToolName,
		ArgsDigest: a.ArgsDigest, CallId: a.CallID, State: a.State, RequestTime: timestamppb.New(a.RequestTime),
		ExpireTime: timestamppb.New(a.ExpireTime), DecidedBy: a.DecidedBy, Note: a.Note, ResultWaiting: a.ResultWaiting,
	}
	if !a.DecideTime.IsZero() {
		out.DecideTime = timestamppb.New(a.DecideTime)
	}
	var args structpb.Struct
	if len(a.Arguments) > 0 && protojson.Unmarshal(a.Arguments, &args) == nil {
		out.Arguments = &args
	}
	return out
}

// chunkBytes is the size of a document's content in each message of GetDocument.
const chunkBytes = 1 << 20

// PutDocument implements PoolService: the first message names the document; the content is
// the messages' chunks together, read no further than documents.max_bytes.
func (g *Server) PutDocument(stream poolv1.PoolService_PutDocumentServer) error {
	ctx := stream.Context()
	var first *poolv1.PutDocumentRequest
	var content []byte
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if first == nil {
			first = msg
			ctx = stream.Context() // the interceptor resolved the tenant from the first message
		}
		if int64(len(content)+len(msg.GetContent())) > g.svc.cfg.DocumentMaxBytes {
			return g.svc.errors.Status(ctx, fieldError("content", "is more than %d bytes; a document is at most that (documents.max_bytes)", g.svc.cfg.DocumentMaxBytes))
		}
		content = append(content, msg.GetContent()...)
	}
	if first == nil {
		return g.svc.errors.Status(ctx, fieldError("content", "is empty: a document has content"))
	}
	tenant, err := runTenant(ctx)
	if err != nil {
		return g.svc.errors.Status(ctx, err)
	}
	d, err := g.svc.PutDocument(ctx, tenant, first.GetName(), first.GetMediaType(), content)
	if err != nil {
		return g.svc.errors.Status(ctx, err)
	}
	return stream.SendAndClose(&poolv1.PutDocumentResponse{Document: documentToProto(d)})
}

// GetDocument implements PoolService.
func (g *Server) GetDocument(req *poolv1.GetDocumentRequest, stream poolv1.PoolService_GetDocumentServer) error {
	ctx := stream.Context()
	tenant, id, err := namedDocument(ctx, req)
	if err != nil {
		return g.svc.errors.Status(ctx, err)
	}
	d, content, err := g.svc.GetDocument(ctx, tenant, id)
	if err != nil {
		return g.svc.errors.Status(ctx, err)
	}
	first := &poolv1.GetDocumentResponse{Document: documentToProto(d)}
	for {
		n := min(len(content), chunkBytes)
		first.Content, content = content[:n], content[n:]
		if err := stream.Send(first); err != nil {
			return err
		}
		if len(content) == 0 {
			return nil
		}
		first = &poolv1.GetDocumentResponse{}
	}
}

// DeleteDocument implements PoolService.
func (g *Server) DeleteDocument(ctx context.Context, req *poolv1.DeleteDocumentRequest) (*poolv1.DeleteDocumentResponse, error) {
	tenant, id, err := namedDocument(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	if err := g.svc.DeleteDocument(ctx, tenant, id); err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	return &poolv1.DeleteDocumentResponse{}, nil
}

// namedDocument checks a document request's id and resolves its tenant.
func namedDocument(ctx context.Context, req interface{ GetDocumentId() string }) (tenant, id string, err error) {
	if req.GetDocumentId() == "" {
		return "", "", fieldError("document_id", "is required: PutDocument answers it (ringfence documents put prints it)")
	}
	if err := documents.CheckID("document_id", req.GetDocumentId()); err != nil {
		return "", "", err
	}
	tenant, err = runTenant(ctx)
	return tenant, req.GetDocumentId(), err
}

func documentToProto(d *Document) *poolv1.Document {
	return &poolv1.Document{DocumentId: d.ID, Tenant: d.Tenant, Name: d.Name, MediaType: d.MediaType, Size: d.Size, Sha256: d.SHA256, CreateTime: timestamppb.New(d.CreateTime)}
}

// CreateAgentToken implements PoolService.
func (g *Server) CreateAgentToken(ctx context.Context, req *poolv1.CreateAgentTokenRequest) (*poolv1.CreateAgentTokenResponse, error) {
	id, tenant, err := namedRun(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	if err := graph.ValidateNodeID("agent", req.GetAgent()); err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	var ttl time.Duration
	if req.GetTtl() != nil {
		if err := req.GetTtl().CheckValid(); err != nil {
			return nil, g.svc.errors.Status(ctx, fieldError("ttl", "is not a duration: %v", err))
		}
		if ttl = req.GetTtl().AsDuration(); ttl <= 0 {
			return nil, g.svc.errors.Status(ctx, fieldError("ttl", "must be positive (or unset for frontdoor.token_ttl)"))
		}
	}
	t, secret, err := g.svc.CreateAgentToken(ctx, tenant, id, req.GetAgent(), ttl)
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_CreateAgentToken_FullMethodName, req, &poolv1.CreateAgentTokenResponse{})
	}
	return &poolv1.CreateAgentTokenResponse{Token: tokenToProto(t), Secret: secret, Url: g.svc.FrontDoorURL()}, nil
}

// ListAgentTokens implements PoolService.
func (g *Server) ListAgentTokens(ctx context.Context, req *poolv1.ListAgentTokensRequest) (*poolv1.ListAgentTokensResponse, error) {
	id, tenant, err := namedRun(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	list, err := g.svc.ListAgentTokens(ctx, tenant, id)
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_ListAgentTokens_FullMethodName, req, &poolv1.ListAgentTokensResponse{})
	}
	out := &poolv1.ListAgentTokensResponse{}
	for i := range list {
		out.Tokens = append(out.Tokens, tokenToProto(&list[i]))
	}
	return out, nil
}

// RevokeAgentToken implements PoolService.
func (g *Server) RevokeAgentToken(ctx context.Context, req *poolv1.RevokeAgentTokenRequest) (*poolv1.RevokeAgentTokenResponse, error) {
	id, tenant, err := namedRun(ctx, req)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	if req.GetTokenId() == "" {
		return nil, g.svc.errors.Status(ctx, fieldError("token_id", "is required: ListAgentTokens lists the run's tokens"))
	}
	if err := ident.AgentToken.Check("token_id", req.GetTokenId()); err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	t, err := g.svc.RevokeAgentToken(ctx, tenant, id, req.GetTokenId())
	if err != nil {
		return forwardOr(ctx, g, err, poolv1.PoolService_RevokeAgentToken_FullMethodName, req, &poolv1.RevokeAgentTokenResponse{})
	}
	return &poolv1.RevokeAgentTokenResponse{Token: tokenToProto(t)}, nil
}

func tokenToProto(t *AgentToken) *poolv1.AgentToken {
	return &poolv1.AgentToken{TokenId: t.ID, RunId: t.RunID, Tenant: t.Tenant, Agent: t.Agent,
		CreateTime: timestamppb.New(t.CreateTime), ExpireTime: timestamppb.New(t.ExpireTime), CreatedBy: t.CreatedBy}
}

// ConnectServer implements PoolService.
func (g *Server) ConnectServer(ctx context.Context, req *poolv1.ConnectServerRequest) (*poolv1.ConnectServerResponse, error) {
	tenant, err := runTenant(ctx)
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	connect := g.svc.ConnectServer
	if req.GetNoNewSignIn() {
		connect = g.svc.ConnectServerIfSignedIn
	}
	c, err := connect(ctx, tenant, req.GetUser(), req.GetRef())
	if err != nil {
		return nil, g.svc.errors.Status(ctx, err)
	}
	out := &poolv1.ConnectServerResponse{State: c.State, AuthorizationUrl: c.AuthorizationURL, Tools: c.Tools}
	if !c.ExpireTime.IsZero() {
		out.ExpireTime = timestamppb.New(c.ExpireTime)
	}
	return out, nil
}
