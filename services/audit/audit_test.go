package audit

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/audit/auditpb"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/testutil"
)

func open(t *testing.T) *Service {
	t.Helper()
	svc, err := Open(Config{DBPath: filepath.Join(t.TempDir(), "audit.db")})
	require.NoError(t, err)
	t.Cleanup(func() { svc.Close() })
	return svc
}

func call(tenant, run string) audit.Record {
	tc := audit.ToolCallAttempt{RunID: run, CallID: "c-" + run, Attempt: 1}
	tc.Succeeded()
	return audit.NewToolCallRecord("pool", tenant, tc)
}

// auditor is an auditor key bound to tenant ("" for none).
func auditor(tenant string) auth.Principal {
	return auth.Principal{KeyID: "k", Role: auth.RoleAuditor, Permissions: []auth.Permission{auth.AuditRead}, Tenant: tenant}
}

// as is the context an auditor key bound to tenant reaches a handler with, for a request that
// names no tenant: what the server's interceptor resolves (its tenant, or every tenant).
func as(tenant string) context.Context {
	ctx, err := auth.NewAuthorizer(nil, auth.Rules).Resolve(auth.WithPrincipal(context.Background(), auditor(tenant)),
		auditv1.AuditService_Verify_FullMethodName, &auditv1.VerifyRequest{})
	if err != nil {
		panic(err)
	}
	return ctx
}

// list calls List as the interceptor would hand it an auditor bound to tenant.
func list(svc *Service, tenant string, req *auditv1.ListRequest) (*auditv1.ListResponse, error) {
	ctx, err := auth.NewAuthorizer(nil, auth.Rules).Resolve(auth.WithPrincipal(context.Background(), auditor(tenant)),
		auditv1.AuditService_List_FullMethodName, req)
	if err != nil {
		return nil, err
	}
	return svc.List(ctx, req)
}

func TestAppendIsIdempotentAndValidated(t *testing.T) {
	svc := open(t)
	rec := call("acme", "r1")
	req := &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(rec)}}
	first, err := svc.Internal().Append(context.Background(), req)
	require.NoError(t, err)
	again, err := svc.Internal().Append(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, first.GetSeqs(), again.GetSeqs(), "a retried append never duplicates")

	bad := auditpb.RecordToProto(call("acme", "r2"))
	bad.GetToolCall().OperationSupport = "exactly_once"
	_, err = svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: []*auditv1.Record{bad}})
	testutil.RequireStatus(t, err, codes.InvalidArgument)
}

func TestATenantBoundKeySeesItsTenantOnly(t *testing.T) {
	svc := open(t)
	for _, r := range []audit.Record{call("acme", "a1"), call("globex", "g1"), call("acme", "a2")} {
		_, err := svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(r)}})
		require.NoError(t, err)
	}
	got, err := list(svc, "acme", &auditv1.ListRequest{})
	require.NoError(t, err)
	require.Len(t, got.GetRecords(), 2)
	for _, r := range got.GetRecords() {
		require.Equal(t, "acme", r.GetTenant())
		require.NotNil(t, r.GetReceiveTime(), "the log's receive time is shown beside the producer's")
		require.False(t, r.GetReceiveTime().AsTime().Before(r.GetTime().AsTime()))
	}
	_, err = list(svc, "acme", &auditv1.ListRequest{Filter: &auditv1.Filter{Tenant: "globex"}})
	st := testutil.RequireStatus(t, err, codes.PermissionDenied)
	require.Equal(t, `auth: this API key is bound to another tenant ("acme"): omit the tenant or use "acme"`, st.Message(),
		"the refusal names the fix, as the publisher's does")
	got, err = list(svc, "acme", &auditv1.ListRequest{Filter: &auditv1.Filter{Tenant: "acme"}})
	require.NoError(t, err)
	require.Len(t, got.GetRecords(), 2, "naming the key's own tenant is fine")
	_, err = svc.List(auth.WithPrincipal(context.Background(), auditor("")), &auditv1.ListRequest{})
	testutil.RequireStatus(t, err, codes.PermissionDenied, "a handler reached without a resolved tenancy refuses")

	all, err := list(svc, "", &auditv1.ListRequest{})
	require.NoError(t, err)
	require.Len(t, all.GetRecords(), 3, "a key bound to no tenant sees every tenant")

	v, err := svc.Verify(as(""), &auditv1.VerifyRequest{})
	require.NoError(t, err)
	require.True(t, v.GetOk())
	require.Equal(t, uint64(3), v.GetChecked())
	require.Equal(t, uint64(3), v.GetHeadSeq())

	// A tenant-bound auditor's Verify walks the whole chain and reports its tenant's records.
	v, err = svc.Verify(as("acme"), &auditv1.VerifyRequest{})
	require.NoError(t, err)
	require.True(t, v.GetOk())
	require.Equal(t, uint64(2), v.GetChecked(), "acme's records, not the deployment's")
	require.Equal(t, uint64(3), v.GetHeadSeq(), "acme's last record")
	v, err = svc.Verify(as("acme"), &auditv1.VerifyRequest{AnchorSeq: 2, AnchorHash: all.GetRecords()[1].GetHash()})
	require.NoError(t, err)
	require.False(t, v.GetOk(), "globex's record is no anchor of acme's")
}

// TestARunFilterKeepsToTheKeysTenant: acme and globex both have a run "nightly". An acme
// auditor's list of it holds acme's record and ends there (no page token, which would say that
// another tenant's run of that id has records after it); an unbound key naming no tenant sees
// both runs.
func TestARunFilterKeepsToTheKeysTenant(t *testing.T) {
	svc := open(t)
	for _, r := range []audit.Record{call("acme", "nightly"), call("globex", "nightly"), call("globex", "nightly")} {
		r.ToolCall.CallID = r.ID
		_, err := svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(r)}})
		require.NoError(t, err)
	}
	got, err := list(svc, "acme", &auditv1.ListRequest{Filter: &auditv1.Filter{RunId: "nightly"}, PageSize: 1})
	require.NoError(t, err)
	require.Len(t, got.GetRecords(), 1)
	require.Equal(t, "acme", got.GetRecords()[0].GetTenant())
	require.Empty(t, got.GetNextPageToken(), "acme's run has no more records")
	all, err := list(svc, "", &auditv1.ListRequest{Filter: &auditv1.Filter{RunId: "nightly"}})
	require.NoError(t, err)
	require.Len(t, all.GetRecords(), 3)
}

// watchStream adapts a channel to the server-streaming interface for Watch.
type watchStream struct {
	grpc.ServerStream
	ctx  context.Context
	recs chan *auditv1.Record
}

func (w *watchStream) Context() context.Context            { return w.ctx }
func (w *watchStream) Send(r *auditv1.WatchResponse) error { w.recs <- r.GetRecord(); return nil }
func (w *watchStream) SetHeader(metadata.MD) error         { return nil }
func (w *watchStream) SendHeader(metadata.MD) error        { return nil }

func TestWatchResumesFromASequenceAndKeepsToTheTenant(t *testing.T) {
	svc := open(t)
	for _, r := range []audit.Record{call("acme", "a1"), call("globex", "g1")} {
		_, err := svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(r)}})
		require.NoError(t, err)
	}
	ctx, cancel := context.WithCancel(as("acme"))
	defer cancel()
	stream := &watchStream{ctx: ctx, recs: make(chan *auditv1.Record, 10)}
	done := make(chan error, 1)
	go func() { done <- svc.Watch(&auditv1.WatchRequest{FromSeq: 1}, stream) }()

	var got *auditv1.Record
	select {
	case got = <-stream.recs:
		require.Equal(t, "a1", got.GetToolCall().GetRunId(), "replayed from seq 1, globex filtered out")
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not replay the stored record")
	}
	_, err := svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(call("acme", "a3"))}})
	require.NoError(t, err)
	select {
	case got = <-stream.recs:
		require.Equal(t, "a3", got.GetToolCall().GetRunId(), "then follows new records")
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not deliver the new record")
	}
	cancel()
	require.NoError(t, <-done)

	// A filter nothing can match is refused at once, not watched silently forever.
	err = svc.Watch(&auditv1.WatchRequest{Filter: &auditv1.Filter{Kind: "toolcall"}}, &watchStream{ctx: as("acme")})
	testutil.RequireStatus(t, err, codes.InvalidArgument, "a misspelled kind")
	require.ErrorContains(t, err, `kind "toolcall" is not one of`)
}

// asService is the context of a call made with svc's verified certificate.
func asService(svc string) context.Context {
	cert := &x509.Certificate{URIs: []*url.URL{mtls.ServiceURI(svc)}}
	info := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
}

// TestAServiceAppendsOnlyItsOwnRecords: a record's producer is the calling certificate's
// service, and tool-call records come from the pool only.
func TestAServiceAppendsOnlyItsOwnRecords(t *testing.T) {
	svc := open(t)
	appendAs := func(caller string, rec audit.Record) error {
		_, err := svc.Internal().Append(asService(caller), &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(rec)}})
		return err
	}
	require.NoError(t, appendAs(mtls.Pool, call("acme", "r1")))
	st := testutil.RequireStatus(t, appendAs(mtls.Publisher, call("acme", "r2")), codes.InvalidArgument)
	require.Contains(t, st.Message(), `is "pool", but the caller's certificate is the publisher service's`)

	forged := call("acme", "r3")
	forged.Producer = mtls.Publisher
	st = testutil.RequireStatus(t, appendAs(mtls.Publisher, forged), codes.InvalidArgument)
	require.Contains(t, st.Message(), "only the pool produces")

	admin := audit.NewAdminRecord(mtls.Registry, "", audit.AdminEvent{ActorKeyID: "k", ActorRole: "admin", Action: audit.ActionCreate, ResourceType: "mcp_server", ResourceID: "x"})
	require.NoError(t, appendAs(mtls.Registry, admin))
}

// TestARefusedFilterOrPageTokenNamesTheField: a filter no record can match (a kind or
// outcome records never have, a time range that is empty) is refused rather than answered
// empty, and every such refusal carries a BadRequest detail naming the field, as field
// errors do.
func TestARefusedFilterOrPageTokenNamesTheField(t *testing.T) {
	svc := open(t)
	since := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, field, message string
		req                  *auditv1.ListRequest
	}{
		{"until before since", "filter", "audit: invalid filter: until (2026-01-01T00:00:00Z) is not after since (2027-01-01T00:00:00Z)",
			&auditv1.ListRequest{Filter: &auditv1.Filter{Since: timestamppb.New(since), Until: timestamppb.New(since.AddDate(-1, 0, 0))}}},
		{"until equal to since", "filter", "is not after since",
			&auditv1.ListRequest{Filter: &auditv1.Filter{Since: timestamppb.New(since), Until: timestamppb.New(since)}}},
		{"unknown outcome", "filter", `audit: invalid filter: outcome "refused" is not one of`,
			&auditv1.ListRequest{Filter: &auditv1.Filter{Outcome: "refused"}}},
		{"made-up page token", "page_token", "audit: page_token is not one this server issued",
			&auditv1.ListRequest{PageToken: "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := list(svc, "", tc.req)
			st := testutil.RequireStatus(t, err, codes.InvalidArgument)
			require.Contains(t, st.Message(), tc.message)
			require.Len(t, st.Details(), 1)
			br, ok := st.Details()[0].(*errdetails.BadRequest)
			require.True(t, ok, "%T", st.Details()[0])
			require.Equal(t, tc.field, br.GetFieldViolations()[0].GetField())
		})
	}
	_, err := list(svc, "", &auditv1.ListRequest{Filter: &auditv1.Filter{Since: timestamppb.New(since), Until: timestamppb.New(since.Add(time.Nanosecond))}})
	require.NoError(t, err, "a range of one instant is not empty")
}
