package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/testutil"
)

// runnerKey is a key whose role lacks audit:read.
const runnerKey = "runner-key-0123456789"

// auditorAndRunnerKeys knows auditorKeys' two auditors and runnerKey.
type auditorAndRunnerKeys struct{ auditorKeys }

func (k auditorAndRunnerKeys) VerifyKey(ctx context.Context, keySHA256 string) (auth.Principal, error) {
	if sum := sha256.Sum256([]byte(runnerKey)); keySHA256 == hex.EncodeToString(sum[:]) {
		return auth.Principal{KeyID: "k-runner", Role: auth.RoleRunner, Permissions: []auth.Permission{auth.RunExecute}}, nil
	}
	return k.auditorKeys.VerifyKey(ctx, keySHA256)
}

// TestHeadOnAnIdleWatchAnswersAtOnce: HEAD on the watch route of a log nothing is appended to
// (a monitoring probe, curl -I) answers 200 as soon as the watch is admitted, the key
// authorized and the filter accepted, instead of waiting for a first record that may never
// come; it sends no body and leaves no watch behind. Without a key, or with one that lacks
// audit:read, HEAD answers what GET answers.
func TestHeadOnAnIdleWatchAnswersAtOnce(t *testing.T) {
	svc := open(t)
	srv := grpcserver.New(grpcserver.Options{Name: "audit", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Authorizer: auth.NewAuthorizer(auditorAndRunnerKeys{}, auth.Rules), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	auditv1.RegisterAuditServiceServer(srv.GRPC(), svc)
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return auditv1.RegisterAuditServiceHandler(ctx, mux, conn)
	})
	_, base := testutil.Serve(t, srv)

	send := func(method, path, key string) (int, http.Header, string) {
		t.Helper()
		// Bounded so that an answer that waits for a record fails here, not at the test timeout.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, "%s %s", method, path)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(body)
	}

	for _, path := range []string{"/v1/audit/records:watch", "/v1/audit/records:watch?filter.kind=tool_call", "/v1/audit/records:watch?from_seq=1"} {
		code, header, body := send(http.MethodHead, path, auditorKey)
		require.Equal(t, http.StatusOK, code, path)
		require.Empty(t, body, path)
		require.Equal(t, "application/json", header.Get("Content-Type"), path)
		require.NotEmpty(t, header.Get("X-Request-Id"), path)
		for name := range header {
			require.NotContains(t, strings.ToLower(name), "admitted", "%s: the stream's own header metadata stays inside", path)
		}
	}
	require.Eventually(t, func() bool {
		svc.watchMu.Lock()
		defer svc.watchMu.Unlock()
		return len(svc.watches) == 0
	}, 10*time.Second, 10*time.Millisecond, "each HEAD's watch ended with its answer")

	for _, tc := range []struct {
		name, key string
		code      int
	}{
		{"no key", "", http.StatusUnauthorized},
		{"a key without audit:read", runnerKey, http.StatusForbidden},
		{"a bad filter", auditorKey, http.StatusBadRequest},
	} {
		path := "/v1/audit/records:watch"
		if tc.name == "a bad filter" {
			path += "?filter.call_id=c%201"
		}
		getCode, getHeader, getBody := send(http.MethodGet, path, tc.key)
		require.Equal(t, tc.code, getCode, "%s: %s", tc.name, getBody)
		code, header, body := send(http.MethodHead, path, tc.key)
		require.Equal(t, getCode, code, tc.name)
		require.Empty(t, body, tc.name)
		require.Equal(t, getHeader.Get("Content-Type"), header.Get("Content-Type"), tc.name)
	}
}
