package peers_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/peers"
	"github.com/ringfence/ringfence/internal/testutil"
	auditsvc "github.com/ringfence/ringfence/services/audit"
)

// TestAuditAppendNamesARefusal: the audit service's INVALID_ARGUMENT reaches a spool as
// audit.ErrRejected (set the records aside), anything else as a plain error (retry).
func TestAuditAppendNamesARefusal(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := auditsvc.Open(auditsvc.Config{DBPath: filepath.Join(t.TempDir(), "audit.db"), Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { svc.Close() })
	// No authorizer: the mutual TLS identity check is the split deployment's test.
	srv := grpcserver.New(grpcserver.Options{Name: "audit", GRPCAddr: "127.0.0.1:0", Logger: log})
	auditinternalv1.RegisterAuditInternalServiceServer(srv.GRPC(), svc.Internal())
	conn, _ := testutil.Serve(t, srv)
	client := peers.NewAudit(conn)

	tc := audit.ToolCallAttempt{RunID: "run-1", CallID: "call-1", Attempt: 1, ToolName: "echo"}
	tc.Succeeded()
	good := audit.NewToolCallRecord("pool", "default", tc)
	require.NoError(t, client.Append(t.Context(), []audit.Record{good}))

	bad := audit.NewToolCallRecord("pool", "default", tc)
	bad.ToolCall.Outcome = "maybe"
	err = client.Append(t.Context(), []audit.Record{bad})
	require.ErrorIs(t, err, audit.ErrRejected)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err = client.Append(ctx, []audit.Record{good})
	require.Error(t, err)
	require.NotErrorIs(t, err, audit.ErrRejected, "a failed call is not a refusal")
}
