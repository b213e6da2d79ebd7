package discovery

import (
	"context"
	"encoding/json"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/auth"
)

// ToolToProto renders a discovered tool for any front end.
func ToolToProto(t Tool) *typesv1.ToolDeclaration {
	return &typesv1.ToolDeclaration{
		Name:         t.Name,
		Title:        t.Title,
		Description:  t.Description,
		InputSchema:  rawToStruct(t.InputSchema),
		OutputSchema: rawToStruct(t.OutputSchema),
		Annotations:  rawToStruct(t.Annotations),
		SchemaHash:   t.SchemaHash,
		Findings:     FindingsToProto(t.Findings),
		Excluded:     t.Excluded,
	}
}

// ToolsToProto renders a listing's tools.
func ToolsToProto(tools []Tool) []*typesv1.ToolDeclaration {
	out := make([]*typesv1.ToolDeclaration, len(tools))
	for i, t := range tools {
		out[i] = ToolToProto(t)
	}
	return out
}

// ToolFromProto reads a tool sent by a peer (split deployments).
func ToolFromProto(p *typesv1.ToolDeclaration) Tool {
	return Tool{
		Name:         p.GetName(),
		Title:        p.GetTitle(),
		Description:  p.GetDescription(),
		InputSchema:  structToRaw(p.GetInputSchema()),
		OutputSchema: structToRaw(p.GetOutputSchema()),
		Annotations:  structToRaw(p.GetAnnotations()),
		SchemaHash:   p.GetSchemaHash(),
		Findings:     FindingsFromProto(p.GetFindings()),
		Excluded:     p.GetExcluded(),
	}
}

// FindingsToProto renders screen findings.
func FindingsToProto(fs []Finding) []*typesv1.Finding {
	out := make([]*typesv1.Finding, len(fs))
	for i, f := range fs {
		out[i] = &typesv1.Finding{Code: f.Code, Severity: f.Severity, Location: f.Location, Message: f.Message}
	}
	return out
}

// FindingsFromProto reads screen findings.
func FindingsFromProto(fs []*typesv1.Finding) []Finding {
	out := make([]Finding, len(fs))
	for i, f := range fs {
		out[i] = Finding{Code: f.GetCode(), Severity: f.GetSeverity(), Location: f.GetLocation(), Message: f.GetMessage()}
	}
	return out
}

// rawToStruct shows a JSON object as a Struct; anything else (absent, or not an object, which
// the screen reports as a hard failure) is left unset.
func rawToStruct(raw json.RawMessage) *structpb.Struct {
	if len(raw) == 0 {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil
	}
	return s
}

func structToRaw(s *structpb.Struct) json.RawMessage {
	if s == nil {
		return nil
	}
	b, err := s.MarshalJSON()
	if err != nil {
		return nil
	}
	return b
}

// Statuser is a service's error table.
type Statuser interface {
	Status(context.Context, error) error
}

// Status turns a discovery error into a gRPC status with a ServerFailure detail so callers can
// branch on the class; other errors go through the service's table.
func Status(ctx context.Context, table Statuser, err error) error {
	if errors.Is(err, ErrIsolationRequired) {
		return withFailure(codes.Unavailable, err.Error(), &typesv1.ServerFailure{Class: ClassIsolationRequired, Message: err.Error()})
	}
	f, ok := AsFailure(err)
	if !ok {
		return table.Status(ctx, err)
	}
	code := codes.Unavailable
	switch f.Class {
	case ClassHandshakeTimeout, ClassTimeout:
		code = codes.DeadlineExceeded
	case ClassLimitExceeded:
		code = codes.ResourceExhausted
	case ClassSignInRequired:
		code = codes.FailedPrecondition
	}
	return withFailure(code, "could not list the server's tools: "+f.Error(), &typesv1.ServerFailure{Class: f.Class, Message: f.Message, StderrTail: VisibleTail(ctx, f.StderrTail)})
}

// tailWithheld stands in for a stderr tail the caller may not see.
const tailWithheld = "(withheld: a server's stderr is shown only to keys with mcp:admin; an operator sees it with `ringfence servers tools REF`)"

// VisibleTail is the stderr tail as the caller may see it. A server's stderr is its own text,
// masked only for the forms of its secrets the spawner knows, so only operators (mcp:admin:
// they register servers and their secrets) see it, and peer services, which pass it on to
// their own callers through this same check.
func VisibleTail(ctx context.Context, tail string) string {
	if tail == "" {
		return ""
	}
	p, _ := auth.FromContext(ctx)
	if p.Service != "" || p.Has(auth.MCPAdmin) {
		return tail
	}
	return tailWithheld
}

func withFailure(code codes.Code, msg string, detail *typesv1.ServerFailure) error {
	st := status.New(code, msg)
	if d, err := st.WithDetails(detail); err == nil {
		st = d
	}
	return st.Err()
}

// FromStatus recovers a discovery error from a peer's status (split deployments): the same
// error the peer's service returned in-process.
func FromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if sf, ok := d.(*typesv1.ServerFailure); ok {
			if sf.GetClass() == ClassIsolationRequired {
				return ErrIsolationRequired
			}
			return &Failure{Class: sf.GetClass(), Message: sf.GetMessage(), StderrTail: sf.GetStderrTail()}
		}
	}
	return err
}
