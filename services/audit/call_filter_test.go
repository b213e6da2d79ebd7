package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/audit/auditpb"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/testutil"
)

// approvedCall appends the story of call c-1 of run r1 that asked for confirmation: its
// refusal while it waited (attempt 1), the approved execution (attempt 2: its pending record
// and its outcome), and the record of the retry, call c-9, that was handed the outcome. Around
// them: call c-2 of the same run, a call c-1 of globex's run, call c-10 (c-1 is a prefix of
// it) and an admin record.
func approvedCall(t *testing.T, svc *Service) {
	t.Helper()
	tc := func(tenant, run, callID string, attempt int32) audit.ToolCallAttempt {
		return audit.ToolCallAttempt{RunID: run, CallID: callID, Attempt: attempt, ServerRef: "docs", ToolName: "write_file"}
	}
	waiting := tc("acme", "r1", "c-1", 1)
	waiting.Refused(audit.ReasonApprovalRequired)
	waiting.Approval = &audit.ToolCallApproval{ID: "apr-1", State: audit.ApprovalPending}
	other := tc("acme", "r1", "c-2", 1)
	other.Refused(audit.ReasonUnknownTool)
	pending := tc("acme", "r1", "c-1", 2)
	pending.Pending()
	pending.Approval = &audit.ToolCallApproval{ID: "apr-1", State: audit.ApprovalApproved, DecidedBy: "key:alice (approver, k1)"}
	pendingRec := audit.NewToolCallRecord("pool", "acme", pending)
	outcome := pending
	outcome.Succeeded()
	outcome.PendingID = pendingRec.ID
	prefix := tc("acme", "r1", "c-10", 1)
	prefix.Refused(audit.ReasonUnknownTool)
	retry := tc("acme", "r1", "c-9", 1)
	retry.Succeeded()
	retry.PendingID = pendingRec.ID
	retry.Approval = &audit.ToolCallApproval{ID: "apr-1", State: audit.ApprovalDelivered, DecidedBy: "key:alice (approver, k1)",
		DispatchedCallID: "c-1", DispatchedAttempt: 2}
	globex := tc("globex", "g1", "c-1", 1)
	globex.Refused(audit.ReasonUnknownTool)
	recs := []audit.Record{
		audit.NewToolCallRecord("pool", "acme", waiting),
		audit.NewToolCallRecord("pool", "acme", other),
		audit.NewAdminRecord("registry", "acme", audit.AdminEvent{ActorKeyID: "k", ActorRole: "admin", Action: audit.ActionCreate, ResourceType: "mcp_server", ResourceID: "c-1"}),
		pendingRec,
		audit.NewToolCallRecord("pool", "acme", outcome),
		audit.NewToolCallRecord("pool", "acme", prefix),
		audit.NewToolCallRecord("pool", "globex", globex),
		audit.NewToolCallRecord("pool", "acme", retry),
	}
	for _, r := range recs {
		_, err := svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(r)}})
		require.NoError(t, err)
	}
}

// callLine names a record as "call#attempt state", with "<dispatched" for a retry's record.
func callLine(r *auditv1.Record) string {
	tc := r.GetToolCall()
	s := fmt.Sprintf("%s#%d %s", tc.GetCallId(), tc.GetAttempt(), r.GetTenant())
	if d := tc.GetApproval().GetDispatchedCallId(); d != "" {
		s += " <" + d
	}
	return s
}

// TestAFilterByCallFindsTheCallsRecords: filter.call_id over real gRPC (List, Watch, Export),
// over the REST gateway and over GET /v1/audit/export answers the call's own records (each
// attempt's, the approved execution's pending record and outcome) and the retry's record that
// was handed its outcome, in log order; never another call's (of the same run, nor a call id it
// is a prefix of, nor an admin record naming it). A tenant-bound key sees its tenant's call
// only. A call id no call can have is refused naming the field.
func TestAFilterByCallFindsTheCallsRecords(t *testing.T) {
	svc := open(t)
	approvedCall(t, svc)
	authz := auth.NewAuthorizer(auditorKeys{}, auth.Rules)
	srv := grpcserver.New(grpcserver.Options{Name: "audit", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: authz,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	auditv1.RegisterAuditServiceServer(srv.GRPC(), svc)
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return auditv1.RegisterAuditServiceHandler(ctx, mux, conn)
	})
	srv.Handle("/v1/audit/export", svc.ExportHandler(authz))
	conn, base := testutil.Serve(t, srv)
	client := auditv1.NewAuditServiceClient(conn)
	acme := testutil.WithKey(t.Context(), acmeAuditorKey)
	want := []string{"c-1#1 acme", "c-1#2 acme", "c-1#2 acme", "c-9#1 acme <c-1"}

	t.Run("list", func(t *testing.T) {
		resp, err := client.List(acme, &auditv1.ListRequest{Filter: &auditv1.Filter{CallId: "c-1"}})
		require.NoError(t, err)
		var got []string
		for _, r := range resp.GetRecords() {
			got = append(got, callLine(r))
		}
		require.Equal(t, want, got)
		require.Empty(t, resp.GetNextPageToken())

		// Paged one at a time, the token holds the filter.
		got = nil
		token := ""
		for {
			resp, err := client.List(acme, &auditv1.ListRequest{Filter: &auditv1.Filter{CallId: "c-1", RunId: "r1"}, PageSize: 1, PageToken: token})
			require.NoError(t, err)
			for _, r := range resp.GetRecords() {
				got = append(got, callLine(r))
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		require.Equal(t, want, got, "with a run as well")

		all, err := client.List(testutil.WithKey(t.Context(), auditorKey), &auditv1.ListRequest{Filter: &auditv1.Filter{CallId: "c-1"}})
		require.NoError(t, err)
		require.Len(t, all.GetRecords(), 5, "a key bound to no tenant sees globex's call c-1 too")
		resp, err = client.List(acme, &auditv1.ListRequest{Filter: &auditv1.Filter{CallId: "c-9"}})
		require.NoError(t, err)
		require.Len(t, resp.GetRecords(), 1, "the retry's own records only")
	})

	t.Run("watch", func(t *testing.T) {
		ctx, cancel := context.WithCancel(acme)
		defer cancel()
		stream, err := client.Watch(ctx, &auditv1.WatchRequest{FromSeq: 1, Filter: &auditv1.Filter{CallId: "c-1"}})
		require.NoError(t, err)
		var got []string
		for len(got) < len(want) {
			resp, err := stream.Recv()
			require.NoError(t, err)
			got = append(got, callLine(resp.GetRecord()))
		}
		require.Equal(t, want, got)
		// A record of another call, then one of c-1: the next the stream sends is c-1's.
		for _, id := range []string{"c-2", "c-1"} {
			tc := audit.ToolCallAttempt{RunID: "r1", CallID: id, Attempt: 3}
			tc.Refused(audit.ReasonUnknownTool)
			_, err := svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(audit.NewToolCallRecord("pool", "acme", tc))}})
			require.NoError(t, err)
		}
		resp, err := stream.Recv()
		require.NoError(t, err)
		require.Equal(t, "c-1#3 acme", callLine(resp.GetRecord()))
		want = append(want, "c-1#3 acme")
	})

	t.Run("export", func(t *testing.T) {
		stream, err := client.Export(acme, &auditv1.ExportRequest{Filter: &auditv1.Filter{CallId: "c-1"}})
		require.NoError(t, err)
		var got []string
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			got = append(got, callLine(resp.GetRecord()))
		}
		require.Equal(t, want, got)
	})

	get := func(path string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+path, nil)
		require.NoError(t, err)
		req.Header.Set("X-API-Key", acmeAuditorKey)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	t.Run("rest", func(t *testing.T) {
		code, body := get("/v1/audit/records?filter.call_id=c-1")
		require.Equal(t, http.StatusOK, code, body)
		var list struct {
			Records []struct {
				ToolCall struct {
					CallID string `json:"call_id"`
				} `json:"tool_call"`
			} `json:"records"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &list), body)
		var ids []string
		for _, r := range list.Records {
			ids = append(ids, r.ToolCall.CallID)
		}
		require.Equal(t, []string{"c-1", "c-1", "c-1", "c-9", "c-1"}, ids, body)

		code, body = get("/v1/audit/export?call_id=c-1")
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, len(want), strings.Count(body, "\n"), body)
		require.NotContains(t, body, `"call_id":"c-2"`)
		require.NotContains(t, body, "globex")
	})

	// HEAD answers as GET begins, without the body: on a watch, which would go on forever,
	// it ends once the status is sent; on the export, it reads no record.
	t.Run("head", func(t *testing.T) {
		for _, tc := range []struct {
			path, contentType string
			code              int
		}{
			{"/v1/audit/records?filter.call_id=c-1", "application/json", http.StatusOK},
			{"/v1/audit/records:watch?from_seq=1&filter.call_id=c-1", "application/json", http.StatusOK},
			{"/v1/audit/export?call_id=c-1", "application/x-ndjson", http.StatusOK},
			{"/v1/audit/records:watch?filter.call_id=c%201", "application/json", http.StatusBadRequest},
			{"/v1/audit/export?call_id=c%201", "application/json", http.StatusBadRequest},
		} {
			// Bounded so that a HEAD that never ends fails here rather than at the test timeout.
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			req, err := http.NewRequestWithContext(ctx, http.MethodHead, base+tc.path, nil)
			require.NoError(t, err)
			req.Header.Set("X-API-Key", acmeAuditorKey)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err, tc.path)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			cancel()
			require.NoError(t, err, tc.path)
			require.Equal(t, tc.code, resp.StatusCode, tc.path)
			require.Empty(t, body, tc.path)
			require.Equal(t, tc.contentType, resp.Header.Get("Content-Type"), tc.path)
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, id := range []string{"c 1", "..", strings.Repeat("c", 513)} {
			_, err := client.List(acme, &auditv1.ListRequest{Filter: &auditv1.Filter{CallId: id}})
			st := testutil.RequireStatus(t, err, codes.InvalidArgument)
			require.Contains(t, st.Message(), "audit: invalid filter: call_id ")
			require.Contains(t, st.Message(), "use 1 to 512 of A-Z a-z 0-9 _ . : -")
			stream, err := client.Watch(acme, &auditv1.WatchRequest{Filter: &auditv1.Filter{CallId: id}})
			require.NoError(t, err)
			_, err = stream.Recv()
			testutil.RequireStatus(t, err, codes.InvalidArgument, "a watch for no call is refused, not silent")
		}
		code, body := get("/v1/audit/export?call_id=c%201")
		require.Equal(t, http.StatusBadRequest, code, body)
		require.Contains(t, body, `call_id \"c 1\" holds a space`)
	})
}

// TestACallIsInTheFirstPageOfALongLog: over real gRPC, filter.call_id alone on a log longer
// than the store's scan budget (10,000 records a List) answers the call's records in the first
// page, with no token: they are read through the call index (a tenant-bound key's through its
// tenant's), where the log was scanned before and the first pages came back empty with a token.
func TestACallIsInTheFirstPageOfALongLog(t *testing.T) {
	svc := open(t)
	const filler = 10_500
	for from := 0; from < filler; from += audit.MaxBatchSize {
		var recs []*auditv1.Record
		for i := from; i < min(from+audit.MaxBatchSize, filler); i++ {
			tc := audit.ToolCallAttempt{RunID: "r1", CallID: fmt.Sprint("other-", i), Attempt: 1, ServerRef: "docs", ToolName: "read_file"}
			tc.Succeeded()
			recs = append(recs, auditpb.RecordToProto(audit.NewToolCallRecord("pool", "acme", tc)))
		}
		_, err := svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: recs})
		require.NoError(t, err)
	}
	approvedCall(t, svc)
	srv := grpcserver.New(grpcserver.Options{Name: "audit", GRPCAddr: "127.0.0.1:0", Authorizer: auth.NewAuthorizer(auditorKeys{}, auth.Rules),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	auditv1.RegisterAuditServiceServer(srv.GRPC(), svc)
	conn, _ := testutil.Serve(t, srv)
	client := auditv1.NewAuditServiceClient(conn)

	for key, want := range map[string][]string{
		acmeAuditorKey: {"c-1#1 acme", "c-1#2 acme", "c-1#2 acme", "c-9#1 acme <c-1"},
		auditorKey:     {"c-1#1 acme", "c-1#2 acme", "c-1#2 acme", "c-1#1 globex", "c-9#1 acme <c-1"},
	} {
		resp, err := client.List(testutil.WithKey(t.Context(), key), &auditv1.ListRequest{Filter: &auditv1.Filter{CallId: "c-1"}})
		require.NoError(t, err)
		var got []string
		for _, r := range resp.GetRecords() {
			got = append(got, callLine(r))
		}
		require.Equal(t, want, got, key)
		require.Empty(t, resp.GetNextPageToken(), key)
	}
}
