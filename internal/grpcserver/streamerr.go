package grpcserver

import (
	"context"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/status"
)

// A streaming route (GET /v1/documents/{document_id}, GET /v1/audit/records:watch) that fails
// before its first message was answered by grpc-gateway as its streams end,
// {"error":{"code":5,…}} with the gRPC code, where every other REST error is the ErrorBody
// with the HTTP one. streamStart answers such a failure with the ErrorBody; a failure after
// the first message still ends the stream with grpc-gateway's {"error":{…}} line, which is
// what a reader of the stream's lines looks for.

type streamErrKey struct{}

// streamErr holds the status of a stream's failure, which the stream error handler sees and
// the response writer needs.
type streamErr struct{ st *status.Status }

// streamError is the gateway's stream error handler: the default conversion, kept where
// streamStart finds it.
func streamError(ctx context.Context, err error) *status.Status {
	st, _ := status.FromError(boundStatus(err))
	if holder, ok := ctx.Value(streamErrKey{}).(*streamErr); ok {
		holder.st = st
	}
	return st
}

// answerStreamFailuresAsErrors wraps every route's response writer, so a stream that fails
// before its first message answers with the usual error body.
func answerStreamFailuresAsErrors(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		holder := &streamErr{}
		r = r.WithContext(context.WithValue(r.Context(), streamErrKey{}, holder))
		next(&streamStart{ResponseWriter: w, r: r, holder: holder}, r, params)
	}
}

type streamStart struct {
	http.ResponseWriter
	r      *http.Request
	holder *streamErr
	// started is set once the answer began as the gateway wrote it; replaced once it was
	// answered as an ErrorBody instead, after which the gateway's error chunk is dropped.
	started, replaced bool
}

func (s *streamStart) WriteHeader(code int) {
	if !s.started && !s.replaced && code >= http.StatusBadRequest && s.holder.st != nil {
		s.replaced = true
		s.Header().Del("Transfer-Encoding")
		writeError(s.r.Context(), nil, nil, s.ResponseWriter, s.r, s.holder.st.Err())
		return
	}
	s.started = true
	s.ResponseWriter.WriteHeader(code)
}

func (s *streamStart) Write(b []byte) (int, error) {
	if s.replaced {
		return len(b), nil
	}
	s.started = true
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush, which streams need.
func (s *streamStart) Unwrap() http.ResponseWriter { return s.ResponseWriter }
