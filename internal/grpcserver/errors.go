package grpcserver

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"path/filepath"
	"syscall"

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
	// Fields names the request field an INVALID_ARGUMENT sentinel of Codes is about
	// (page_token, filter): its status then carries a BadRequest detail naming it, as a field
	// error's does, so a client finds the field in the same place whatever refused it.
	Fields map[error]string
	// Logger receives the detail of errors no entry matches.
	Logger *slog.Logger
}

// MergeCodes is one table of the entries of tables: a service's own, and those of the shared
// packages whose errors it passes on (etcdstore.ErrorCodes).
func MergeCodes(tables ...map[error]codes.Code) map[error]codes.Code {
	out := map[error]codes.Code{}
	for _, t := range tables {
		maps.Copy(out, t)
	}
	return out
}

// Status converts err into a gRPC status error. Status errors and context errors pass through,
// field errors become INVALID_ARGUMENT with a BadRequest detail, table entries their code, a
// full disk UNAVAILABLE naming the file, and anything else INTERNAL with a generic message (the detail goes to the log, never the caller).
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
		return withFieldDetail(status.New(codes.InvalidArgument, t.Service+": invalid "+fe.Error()), fe.Field, fe.Problem)
	}
	for sentinel, code := range t.Codes {
		if errors.Is(err, sentinel) {
			return withFieldDetail(status.New(code, err.Error()), t.Fields[sentinel])
		}
	}
	logger := t.Logger
	if logger == nil {
		logger = slog.Default()
	}
	rid := RequestID(ctx)
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		// Not a fault of the request, nor a bug: the operator frees space and the service
		// goes on, with no restart (a bbolt write that failed left the file as it was).
		logger.ErrorContext(ctx, "disk full", "service", t.Service, "request_id", rid, "err", err)
		// The file's name tells the operator which disk; its path, in the log, is not the
		// caller's to know.
		file := "a file"
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			file = filepath.Base(pe.Path)
		}
		return status.Errorf(codes.Unavailable, "%s: the server's disk is full (no space left writing %s in its data directory): free space on that file system and retry; the server goes on without a restart (request id %s)", t.Service, file, rid)
	}
	logger.ErrorContext(ctx, "internal error", "service", t.Service, "request_id", rid, "err", err)
	return status.Errorf(codes.Internal, "%s: internal error (request id %s); the server log has the detail", t.Service, rid)
}

// withFieldDetail adds a BadRequest detail naming field to an INVALID_ARGUMENT status (its
// description is problem, else the status message); other statuses and an empty field are
// returned as they are.
func withFieldDetail(st *status.Status, field string, problem ...string) error {
	if field == "" || st.Code() != codes.InvalidArgument {
		return st.Err()
	}
	description := st.Message()
	if len(problem) > 0 {
		description = problem[0]
	}
	if withDetail, err := st.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: description}},
	}); err == nil {
		st = withDetail
	}
	return st.Err()
}
