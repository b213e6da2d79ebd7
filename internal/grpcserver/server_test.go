package grpcserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/fielderr"
)

// panicky is a health server whose Check panics, to prove recovery.
type panicky struct {
	grpc_health_v1.UnimplementedHealthServer
}

func (panicky) Check(context.Context, *grpc_health_v1.HealthCheckRequest) (*grpc_health_v1.HealthCheckResponse, error) {
	panic("boom")
}

type allowAll struct{}

func (allowAll) Authorize(ctx context.Context, _ string) (context.Context, error) { return ctx, nil }

func start(t testing.TB, srv *Server) (*grpc.ClientConn, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	g, h, err := srv.Addrs(ctx)
	require.NoError(t, err)
	conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	if h == nil {
		return conn, ""
	}
	return conn, "http://" + h.String()
}

func TestHealthMetricsAndRequestIDs(t *testing.T) {
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: allowAll{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	conn, base := start(t, srv)

	var header metadata.MD
	ctx := metadata.AppendToOutgoingContext(t.Context(), RequestIDKey, "caller-chosen-id")
	resp, err := grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{}, grpc.Header(&header))
	require.NoError(t, err)
	require.Equal(t, grpc_health_v1.HealthCheckResponse_SERVING, resp.GetStatus())
	require.Equal(t, []string{"caller-chosen-id"}, header.Get(RequestIDKey))

	_, err = grpc_health_v1.NewHealthClient(conn).Check(t.Context(), &grpc_health_v1.HealthCheckRequest{}, grpc.Header(&header))
	require.NoError(t, err)
	require.Len(t, header.Get(RequestIDKey)[0], 16, "a request id is made when none is sent")

	for _, bad := range []string{"has space", "semi;colon", strings.Repeat("x", 65)} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), RequestIDKey, bad)
		_, err = grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{}, grpc.Header(&header))
		require.NoError(t, err)
		require.NotEqual(t, bad, header.Get(RequestIDKey)[0], "an insane caller id is replaced, never echoed into logs")
		require.Len(t, header.Get(RequestIDKey)[0], 16)
	}

	r, err := http.Get(base + "/healthz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.StatusCode)
	r.Body.Close()

	r, err = http.Get(base + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	require.Contains(t, string(body), `ringfence_grpc_requests_total{code="OK",method="/grpc.health.v1.Health/Check"} 5`)
	require.Contains(t, string(body), "ringfence_grpc_request_duration_seconds_bucket")
}

func TestPanicBecomesInternalAndTheServerKeepsServing(t *testing.T) {
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", Authorizer: allowAll{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	srv.GRPC().RegisterService(&grpc.ServiceDesc{
		ServiceName: "test.Panicky", HandlerType: (*grpc_health_v1.HealthServer)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Check", Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(grpc_health_v1.HealthCheckRequest)
			if err := dec(in); err != nil {
				return nil, err
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Panicky/Check"}
			return icpt(ctx, in, info, func(ctx context.Context, req any) (any, error) {
				return srv.(grpc_health_v1.HealthServer).Check(ctx, req.(*grpc_health_v1.HealthCheckRequest))
			})
		}}},
	}, panicky{})
	conn, _ := start(t, srv)
	for range 2 {
		out := new(grpc_health_v1.HealthCheckResponse)
		err := conn.Invoke(t.Context(), "/test.Panicky/Check", &grpc_health_v1.HealthCheckRequest{}, out)
		require.Equal(t, codes.Internal, status.Code(err))
		require.Contains(t, status.Convert(err).Message(), "request id")
		require.NotContains(t, status.Convert(err).Message(), "boom", "panic detail stays in the log")
	}
}

func TestErrorTable(t *testing.T) {
	sentinel := errors.New("widget: the widget is busy: retry later")
	table := ErrorTable{Service: "widget", Codes: map[error]codes.Code{sentinel: codes.Unavailable}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx := context.Background()
	require.Equal(t, codes.Unavailable, status.Code(table.Status(ctx, sentinel)))
	require.Equal(t, codes.Unavailable, status.Code(table.Status(ctx, errors.Join(errors.New("wrapped"), sentinel))))
	require.Equal(t, codes.InvalidArgument, status.Code(table.Status(ctx, fielderr.New("name", "is empty"))))
	require.Equal(t, codes.DeadlineExceeded, status.Code(table.Status(ctx, context.DeadlineExceeded)))
	internal := table.Status(ctx, errors.New("disk on fire at /var/secret/path"))
	require.Equal(t, codes.Internal, status.Code(internal))
	require.NotContains(t, internal.Error(), "disk on fire", "unknown errors are not shown to callers")
	// A full disk is the operator's to fix, not a bug: UNAVAILABLE naming the file, not its path.
	full := table.Status(ctx, fmt.Errorf("commit: %w", &fs.PathError{Op: "write", Path: "/var/lib/ringfence/registry.db", Err: syscall.ENOSPC}))
	require.Equal(t, codes.Unavailable, status.Code(full))
	require.Contains(t, status.Convert(full).Message(), "widget: the server's disk is full (no space left writing registry.db in its data directory): free space on that file system and retry; the server goes on without a restart")
	require.NotContains(t, full.Error(), "/var/lib")
}

func TestGracefulShutdownIsBounded(t *testing.T) {
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	_, _, err := srv.Addrs(ctx)
	require.NoError(t, err)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// TestOnShutdownRunsAsShutdownBegins: what OnShutdown registered runs once Run's context
// ends, before Run returns.
func TestOnShutdownRunsAsShutdownBegins(t *testing.T) {
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	told := make(chan struct{})
	srv.OnShutdown(func() { close(told) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	_, _, err := srv.Addrs(ctx)
	require.NoError(t, err)
	select {
	case <-told:
		t.Fatal("OnShutdown ran while the server serves")
	default:
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	select {
	case <-told:
	default:
		t.Fatal("Run returned without running what OnShutdown registered")
	}
}

func TestErrorBodyShape(t *testing.T) {
	var b ErrorBody
	require.NoError(t, json.Unmarshal([]byte(`{"code":409,"status":"ALREADY_EXISTS","message":"m"}`), &b))
	require.Equal(t, "ALREADY_EXISTS", strings.ToUpper(toSnake("AlreadyExists")))
}

// A refused publish carries its violations as a status detail; REST clients get them as a
// top-level "violations" array as well.
func TestRESTErrorBodyLiftsPublishViolations(t *testing.T) {
	st, err := status.New(codes.FailedPrecondition, "publisher: graph \"g\" cannot be published").WithDetails(&publisherv1.PublishViolations{
		Violations: []*publisherv1.Violation{
			{Rule: "ceiling", NodeId: "docs__read_file", ServerRef: "docs", Excess: []string{"fs.write"}, Message: "remove it or ask an operator"},
			{Rule: "agent_floor", NodeId: "docs__read_file", AgentId: "researcher", Missing: []string{"external_api_call"}, Message: "add it to the agent"},
		},
	})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	writeError(t.Context(), NewGatewayMux(), nil, rec, httptest.NewRequest(http.MethodPost, "/v1/graphs/g:publish", nil), st.Err())
	require.Equal(t, http.StatusBadRequest, rec.Code)
	var body struct {
		Status     string           `json:"status"`
		Violations []map[string]any `json:"violations"`
		Details    []map[string]any `json:"details"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Equal(t, "FAILED_PRECONDITION", body.Status)
	require.Len(t, body.Violations, 2)
	require.Equal(t, "ceiling", body.Violations[0]["rule"])
	require.Equal(t, []any{"fs.write"}, body.Violations[0]["excess"])
	require.Equal(t, []any{}, body.Violations[0]["missing"], "empty lists are present, so clients need not test for absence")
	require.Equal(t, "researcher", body.Violations[1]["agent_id"])
	require.Len(t, body.Details, 1)

	// Other errors carry no violations key.
	rec = httptest.NewRecorder()
	writeError(t.Context(), NewGatewayMux(), nil, rec, httptest.NewRequest(http.MethodGet, "/v1/graphs", nil), status.Error(codes.NotFound, "x"))
	require.NotContains(t, rec.Body.String(), "violations")
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAccessLogIsQuietOnSuccess: a served call is logged at debug only; a refused one at info,
// with its code and request id.
func TestAccessLogIsQuietOnSuccess(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) {
			var logs lockedBuffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level}))
			conn, _ := start(t, New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", Authorizer: allowAll{}, Logger: log}))
			health := grpc_health_v1.NewHealthClient(conn)
			_, err := health.Check(t.Context(), &grpc_health_v1.HealthCheckRequest{})
			require.NoError(t, err)
			_, err = health.Check(t.Context(), &grpc_health_v1.HealthCheckRequest{Service: "no.such.Service"})
			require.Equal(t, codes.NotFound, status.Code(err))

			require.Contains(t, logs.String(), "level=INFO msg=rpc method=/grpc.health.v1.Health/Check code=NotFound")
			served := strings.Contains(logs.String(), "msg=rpc method=/grpc.health.v1.Health/Check code=OK")
			require.Equal(t, level == slog.LevelDebug, served, "a served call is a debug line:\n%s", logs.String())
		})
	}
}
