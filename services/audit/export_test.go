package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/audit/auditpb"
	"github.com/ringfence/ringfence/internal/auth"
)

// auditorKeys knows one key, an auditor's.
type auditorKeys struct{}

const auditorKey = "auditor-key-0123456789"

func (auditorKeys) VerifyKey(_ context.Context, keySHA256 string) (auth.Principal, error) {
	sum := sha256.Sum256([]byte(auditorKey))
	if keySHA256 != hex.EncodeToString(sum[:]) {
		return auth.Principal{}, auth.ErrUnknownKey
	}
	return auth.Principal{KeyID: "k", Role: auth.RoleAuditor, Permissions: []auth.Permission{auth.AuditRead}}, nil
}

// TestExportRefusesABadFilterBeforeAnswering: a filter the log cannot apply is a 400 that
// names it, never a 200 with an empty body an auditor would read as "no records".
func TestExportRefusesABadFilterBeforeAnswering(t *testing.T) {
	svc := open(t)
	for _, r := range []audit.Record{call("acme", "a1"), call("globex", "g1")} {
		_, err := svc.Append(context.Background(), &auditv1.AppendRequest{Records: []*auditv1.Record{auditpb.RecordToProto(r)}})
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
	} {
		rec := export(tc.query)
		require.Equal(t, http.StatusBadRequest, rec.Code, "%s: %s", tc.query, rec.Body.String())
		require.Contains(t, rec.Body.String(), tc.want, tc.query)
		require.Contains(t, rec.Header().Get("Content-Type"), "application/json")
	}
}
