package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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

// auditorKeys knows two auditors' keys: one bound to no tenant, one bound to "acme".
type auditorKeys struct{}

const (
	auditorKey     = "auditor-key-0123456789"
	acmeAuditorKey = "acme-auditor-key-0123456789"
)

func (auditorKeys) VerifyKey(_ context.Context, keySHA256 string) (auth.Principal, error) {
	for key, tenant := range map[string]string{auditorKey: "", acmeAuditorKey: "acme"} {
		sum := sha256.Sum256([]byte(key))
		if keySHA256 == hex.EncodeToString(sum[:]) {
			return auth.Principal{KeyID: "k-" + tenant, Role: auth.RoleAuditor, Permissions: []auth.Permission{auth.AuditRead}, Tenant: tenant}, nil
		}
	}
	return auth.Principal{}, auth.ErrUnknownKey
}

// TestExportRefusesABadFilterBeforeAnswering: a filter the log cannot apply is a 400 that
// names it, never a 200 with an empty body an auditor would read as "no records".
func TestExportRefusesABadFilterBeforeAnswering(t *testing.T) {
	svc := open(t)
	for _, r := range []audit.Record{call("acme", "a1"), call("globex", "g1")} {
		_, err := svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(r)}})
		require.NoError(t, err)
	}
	h := svc.ExportHandler(auth.NewAuthorizer(auditorKeys{}, auth.Rules))
	export := func(query string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/v1/audit/export"+query, nil)
		req.Header.Set("X-API-Key", auditorKey)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}

	ok := export("?tenant=acme")
	require.Equal(t, http.StatusOK, ok.Code, ok.Body.String())
	require.Equal(t, 1, strings.Count(ok.Body.String(), "\n"))

	for _, tc := range []struct{ query, want string }{
		{"?kind=bogus", `kind \"bogus\" is not one of`},
		{"?outcome=refused", `outcome \"refused\" is not one of`},
		{"?filter.kind=admin", "filter.kind"},
		{"?since=yesterday", "since"},
		{"?tenant=%ff", `query parameter \"tenant\" is not valid UTF-8`},
		{"?run_id=a&%ff=1", "a query parameter's name is not valid UTF-8"},
	} {
		rec := export(tc.query)
		require.Equal(t, http.StatusBadRequest, rec.Code, "%s: %s", tc.query, rec.Body.String())
		require.Contains(t, rec.Body.String(), tc.want, tc.query)
		require.Contains(t, rec.Header().Get("Content-Type"), "application/json")
	}

	// A key sent where REST clients often put one is named, never read.
	req := httptest.NewRequest(http.MethodGet, "/v1/audit/export?api_key="+auditorKey, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusUnauthorized, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "send it in the X-API-Key header; a key in the URL")
	require.NotContains(t, rec.Body.String(), auditorKey)

	// A wrong method is the usual 405 error body, sent as JSON (it was JSON labelled text/plain).
	req = httptest.NewRequest(http.MethodPost, "/v1/audit/export", nil)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
	require.Equal(t, "GET, HEAD", rec.Header().Get("Allow"))
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.Contains(t, rec.Body.String(), `\"POST\" is not a method of \"/v1/audit/export\": it takes GET, HEAD`)
}

// TestExportKeepsToTheKeysTenant: an export, over the gRPC stream and over GET
// /v1/audit/export, as a key bound to acme holds acme's records only, and asking for globex's
// is refused; an unbound key exports every tenant, so the filter is the key's doing.
func TestExportKeepsToTheKeysTenant(t *testing.T) {
	svc := open(t)
	for _, r := range []audit.Record{call("acme", "a1"), call("globex", "g1"), call("acme", "a2")} {
		_, err := svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(r)}})
		require.NoError(t, err)
	}
	authz := auth.NewAuthorizer(auditorKeys{}, auth.Rules)
	srv := grpcserver.New(grpcserver.Options{Name: "audit", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: authz,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	auditv1.RegisterAuditServiceServer(srv.GRPC(), svc)
	srv.Handle("/v1/audit/export", svc.ExportHandler(authz))
	conn, base := testutil.Serve(t, srv)
	client := auditv1.NewAuditServiceClient(conn)

	// exportRPC returns tenant/run of every exported record, or the stream's error.
	exportRPC := func(key string, filter *auditv1.Filter) ([]string, error) {
		stream, err := client.Export(testutil.WithKey(t.Context(), key), &auditv1.ExportRequest{Filter: filter})
		require.NoError(t, err)
		var got []string
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return got, nil
			}
			if err != nil {
				return got, err
			}
			got = append(got, resp.GetRecord().GetTenant()+"/"+resp.GetRecord().GetToolCall().GetRunId())
		}
	}
	// exportHTTP returns the status and tenant/run of every exported line.
	exportHTTP := func(key, query string) (int, []string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v1/audit/export"+query, nil)
		require.NoError(t, err)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, []string{string(body)}
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
			if line == "" {
				continue
			}
			var l struct {
				Hash   string       `json:"hash"`
				Record audit.Record `json:"record"`
			}
			require.NoError(t, json.Unmarshal([]byte(line), &l), line)
			require.NotEmpty(t, l.Hash)
			got = append(got, l.Record.Tenant+"/"+l.Record.ToolCall.RunID)
		}
		return resp.StatusCode, got
	}
	acmeOnly := []string{"acme/a1", "acme/a2"}

	t.Run("grpc", func(t *testing.T) {
		got, err := exportRPC(acmeAuditorKey, nil)
		require.NoError(t, err)
		require.ElementsMatch(t, acmeOnly, got)
		got, err = exportRPC(acmeAuditorKey, &auditv1.Filter{Tenant: "acme"})
		require.NoError(t, err)
		require.ElementsMatch(t, acmeOnly, got)
		got, err = exportRPC(acmeAuditorKey, &auditv1.Filter{Tenant: "globex"})
		st := testutil.RequireStatus(t, err, codes.PermissionDenied)
		require.Contains(t, st.Message(), `("acme"): omit the tenant or use "acme"`)
		require.Empty(t, got)

		got, err = exportRPC(auditorKey, nil)
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"acme/a1", "globex/g1", "acme/a2"}, got)
	})

	t.Run("http", func(t *testing.T) {
		code, got := exportHTTP(acmeAuditorKey, "")
		require.Equal(t, http.StatusOK, code, got)
		require.ElementsMatch(t, acmeOnly, got)
		code, got = exportHTTP(acmeAuditorKey, "?tenant=acme")
		require.Equal(t, http.StatusOK, code, got)
		require.ElementsMatch(t, acmeOnly, got)
		code, got = exportHTTP(acmeAuditorKey, "?tenant=globex")
		require.Equal(t, http.StatusForbidden, code, got)
		require.Contains(t, got[0], `bound to another tenant (\"acme\"): omit the tenant or use \"acme\"`)
		require.NotContains(t, got[0], "g1")

		code, got = exportHTTP(auditorKey, "")
		require.Equal(t, http.StatusOK, code, got)
		require.ElementsMatch(t, []string{"acme/a1", "globex/g1", "acme/a2"}, got)
	})
}

// exportStream collects an Export and, at its first record, appends more, as a busy log would.
type exportStream struct {
	grpc.ServerStream
	ctx     context.Context
	onFirst func()
	got     int
}

func (e *exportStream) Context() context.Context { return e.ctx }
func (e *exportStream) Send(*auditv1.ExportResponse) error {
	if e.got++; e.got == 1 {
		e.onFirst()
	}
	return nil
}

// TestExportEndsAtTheHeadItBeganAt: records appended during an export are left out, so the
// export of a busy log ends instead of following it.
func TestExportEndsAtTheHeadItBeganAt(t *testing.T) {
	svc := open(t)
	appendRuns(t, svc, runNames(1500)...) // more than a page
	stream := &exportStream{ctx: as(""), onFirst: func() { appendRuns(t, svc, runNames(700)...) }}
	require.NoError(t, svc.Export(&auditv1.ExportRequest{}, stream))
	require.Equal(t, 1500, stream.got)
}
