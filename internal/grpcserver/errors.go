package grpcserver

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringfence/ringfence/internal/fielderr"
)

// ErrorTable maps a service's domain errors to gRPC codes: each service declares one.
type ErrorTable struct {
	// Service prefixes generic messages, e.g. "registry".
	Service string
	// Codes maps sentinel errors (matched with errors.Is) to codes. The error's own message,
	// which the service writes for a person to act on, becomes the status message.
	Codes map[error]codes.Code
	// Logger receives the detail of errors no entry matches.
	Logger *slog.Logger
}

// Status converts err into a gRPC status error. Status errors and context errors pass through,
// field errors become INVALID_ARGUMENT with a BadRequest detail, table entries their code, and
// anything else INTERNAL with a generic message (the detail goes to the log, never the caller).
func (t ErrorTable) Status(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, t.Service+": request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, t.Service+": deadline exceeded")
	}
	if fe, ok := fielderr.As(err); ok {
		st := status.New(codes.InvalidArgument, t.Service+": invalid "+fe.Error())
		if withDetail, derr := st.WithDetails(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: fe.Field, Description: fe.Problem}},
		}); derr == nil {
			st = withDetail
		}
		return st.Err()
	}
	for sentinel, code := range t.Codes {
		if errors.Is(err, sentinel) {
			return status.Error(code, err.Error())
		}
	}
	logger := t.Logger
	if logger == nil {
		logger = slog.Default()
	}
	rid := RequestID(ctx)
	logger.ErrorContext(ctx, "internal error", "service", t.Service, "request_id", rid, "err", err)
	return status.Errorf(codes.Internal, "%s: internal error (request id %s); the server log has the detail", t.Service, rid)
}
