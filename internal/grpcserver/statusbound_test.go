package grpcserver

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/fielderr"
)

// failing is a publisher whose ListGraphs fails with err.
type failing struct {
	publisherv1.UnimplementedPublisherServiceServer
	err error
}

func (f *failing) ListGraphs(context.Context, *publisherv1.ListGraphsRequest) (*publisherv1.ListGraphsResponse, error) {
	return nil, f.err
}

func withDetails(t *testing.T, code codes.Code, msg string, details ...proto.Message) error {
	st := status.New(code, msg)
	for _, d := range details {
		var err error
		st, err = st.WithDetails(protoadapt.MessageV1Of(d))
		require.NoError(t, err)
	}
	return st.Err()
}

// TestEveryStatusStaysWithinItsBound: errors that quote a huge caller value, carry a huge
// message, list thousands of violations or a long stderr tail reach a gRPC client as a status
// of at most MaxStatusBytes (so a proxy passes its trailers), still saying what happened.
func TestEveryStatusStaysWithinItsBound(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	var violations []*publisherv1.Violation
	for i := range 2000 {
		violations = append(violations, &publisherv1.Violation{Rule: "ceiling", NodeId: "n" + strings.Repeat("i", i%50), Message: strings.Repeat("m", 1000)})
	}
	tail := strings.Repeat("early line\n", 800) + "the last thing the server said"
	table := ErrorTable{Service: "test", Logger: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		name   string
		err    error
		checks func(t *testing.T, st *status.Status)
	}{
		{"a field error quoting a huge value", table.Status(t.Context(), fielderr.New("ref", "%s is not a ref", fielderr.Quote(huge))),
			func(t *testing.T, st *status.Status) {
				require.Contains(t, st.Message(), "(1048576 bytes) is not a ref")
				require.Equal(t, "ref", st.Details()[0].(*errdetails.BadRequest).GetFieldViolations()[0].GetField())
			}},
		{"a huge message", status.Error(codes.InvalidArgument, "test: "+huge),
			func(t *testing.T, st *status.Status) {
				require.True(t, strings.HasPrefix(st.Message(), "test: xxx"))
				require.Contains(t, st.Message(), "(cut from 1048582 bytes)")
			}},
		{"thousands of violations", withDetails(t, codes.FailedPrecondition, "publisher: 2000 violation(s)", &publisherv1.PublishViolations{Violations: violations}),
			func(t *testing.T, st *status.Status) {
				require.Contains(t, st.Message(), "publisher: 2000 violation(s)")
				require.Contains(t, st.Message(), "details shortened")
				pv := st.Details()[0].(*publisherv1.PublishViolations)
				require.NotEmpty(t, pv.GetViolations(), "the first violations are still listed")
				require.Equal(t, "ceiling", pv.GetViolations()[0].GetRule())
			}},
		{"a long stderr tail", withDetails(t, codes.Unavailable, "could not start", &typesv1.ServerFailure{Class: "spawn_failed", StderrTail: tail}, &errdetails.BadRequest{}),
			func(t *testing.T, st *status.Status) {
				sf := st.Details()[0].(*typesv1.ServerFailure)
				require.Equal(t, "spawn_failed", sf.GetClass())
				require.True(t, strings.HasSuffix(sf.GetStderrTail(), "the last thing the server said"), "a tail keeps its end")
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", Authorizer: allowAll{}, Logger: slog.New(slog.DiscardHandler)})
			publisherv1.RegisterPublisherServiceServer(srv.GRPC(), &failing{err: tc.err})
			conn, _ := start(t, srv)
			_, err := publisherv1.NewPublisherServiceClient(conn).ListGraphs(t.Context(), &publisherv1.ListGraphsRequest{})
			st, ok := status.FromError(err)
			require.True(t, ok, "the caller gets the status, not a reset stream: %v", err)
			require.Equal(t, status.Code(tc.err), st.Code())
			require.LessOrEqual(t, len(st.Message()), MaxStatusMessageBytes)
			require.LessOrEqual(t, proto.Size(st.Proto()), MaxStatusBytes)
			tc.checks(t, st)
		})
	}
}

// TestRESTRefusalsAreBounded: the gateway's own refusals (here a body with a huge key given
// twice) are bounded as the RPCs' are.
func TestRESTRefusalsAreBounded(t *testing.T) {
	key := strings.Repeat("k", 1<<20)
	err := newJSONMarshaler().NewDecoder(strings.NewReader(`{"ref":"a","env":{"` + key + `":"1","` + key + `":"2"}}`)).Decode(&registryv1.CreateServerRequest{})
	require.ErrorContains(t, err, "(1048580 bytes) is given twice")
	rec := httptest.NewRecorder()
	writeError(t.Context(), nil, nil, rec, nil, status.Error(codes.InvalidArgument, err.Error()))
	var body ErrorBody
	require.NoError(t, json.NewDecoder(io.LimitReader(rec.Body, 1<<20)).Decode(&body))
	require.LessOrEqual(t, len(body.Message), MaxStatusMessageBytes)
}
