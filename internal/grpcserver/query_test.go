package grpcserver

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
)

// echoAudit answers List with one record whose kind is the filter's, so a test sees what the
// gateway bound from the query.
type echoAudit struct {
	auditv1.UnimplementedAuditServiceServer
}

func (echoAudit) List(_ context.Context, req *auditv1.ListRequest) (*auditv1.ListResponse, error) {
	return &auditv1.ListResponse{Records: []*auditv1.Record{{Kind: req.GetFilter().GetKind()}}, NextPageToken: req.GetPageToken()}, nil
}

// TestUnknownQueryParametersAreRefused: a misspelt filter is 400 naming it and the
// parameters the route takes, never a silently unfiltered answer.
func TestUnknownQueryParametersAreRefused(t *testing.T) {
	base := auditGateway(t)
	get := func(query string) (int, map[string]any) {
		t.Helper()
		return getJSON(t, base+"/v1/audit/records?"+query)
	}

	for _, ok := range []string{"filter.kind=admin", "filter.kind=admin&page_size=1&page_token=x", "filter.runId=r&pageSize=1", "filter.since=2026-01-01T00:00:00Z"} {
		code, body := get(ok)
		require.Equal(t, http.StatusOK, code, "%s: %v", ok, body)
	}
	code, body := get("filter.kind=admin")
	require.Equal(t, "admin", body["records"].([]any)[0].(map[string]any)["kind"])

	for _, tc := range []struct{ query, param string }{
		{"kidn=admin", "kidn"},
		{"kind=admin", "kind"},
		{"filter.kidn=admin&page_size=1", "filter.kidn"},
		{"page_size=1&zzz=1&aaa=2", "aaa"},
	} {
		code, body = get(tc.query)
		require.Equal(t, http.StatusBadRequest, code, tc.query)
		require.Equal(t, "INVALID_ARGUMENT", body["status"])
		require.Contains(t, body["message"], `unknown query parameter "`+tc.param+`": this route takes only filter.tenant, filter.run_id, `)
		require.Contains(t, body["message"], "filter.kind, filter.since, filter.until, page_size, page_token")
	}
}

// TestAnUnknownPathNamesItself: a path no route takes is a 404 that says so, not a bare "Not
// Found" that reads like a missing resource.
func TestAnUnknownPathNamesItself(t *testing.T) {
	code, body := getJSON(t, auditGateway(t)+"/v1/audit/recordz")
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, "NOT_FOUND", body["status"])
	require.Contains(t, body["message"], "no route takes GET /v1/audit/recordz: docs/api.md lists the routes")
}

// auditGateway serves echoAudit over gRPC and REST and returns the REST base URL.
func auditGateway(t *testing.T) string {
	t.Helper()
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: allowAll{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	auditv1.RegisterAuditServiceServer(srv.GRPC(), echoAudit{})
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return auditv1.RegisterAuditServiceHandler(ctx, mux, conn)
	})
	_, base := start(t, srv)
	return base
}

func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return resp.StatusCode, body
}
