package peers_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/peers"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
	auditsvc "github.com/ringfence/ringfence/services/audit"
	"github.com/ringfence/ringfence/services/registry"
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

// TestServerPolicyCarriesTheDescription: the policy a split pool reads over the internal API
// is the registry's own, description (a deferred server's entry) and tool filter included.
func TestServerPolicyCarriesTheDescription(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := openRegistry(t, t.TempDir(), log)
	admin := auth.WithPrincipal(t.Context(), auth.Principal{KeyID: "key_admin", Role: auth.RoleAdmin, Permissions: auth.AllPermissions})
	_, err := reg.CreateServer(admin, &registryv1.CreateServerRequest{Ref: "tickets", Command: "mcp-server", Description: "The support team's ticket system.",
		Grants: []string{"process_spawn"}, ToolFilter: &registryv1.ToolFilter{Exclude: []string{"delete_ticket"}}})
	require.NoError(t, err)
	// No authorizer: the mutual TLS identity check is the split deployment's test.
	srv := grpcserver.New(grpcserver.Options{Name: "registry", GRPCAddr: "127.0.0.1:0", Logger: log})
	registryinternalv1.RegisterRegistryInternalServiceServer(srv.GRPC(), reg.Internal())
	conn, _ := testutil.Serve(t, srv)

	got, err := peers.NewRegistry(conn).ServerPolicy(t.Context(), "tickets")
	require.NoError(t, err)
	want, err := reg.ServerPolicy(t.Context(), "tickets")
	require.NoError(t, err)
	require.Equal(t, "The support team's ticket system.", got.Description)
	require.Equal(t, want, got)
}

// openRegistry opens a registry service with its files in dir.
func openRegistry(t *testing.T, dir string, log *slog.Logger) *registry.Service {
	t.Helper()
	box, err := secretbox.LoadOrCreate(filepath.Join(dir, "secrets.key"))
	require.NoError(t, err)
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	reg, err := registry.Open(registry.Config{DBPath: filepath.Join(dir, "registry.db"), Secrets: box, Roles: roles,
		AuditSink: testutil.NewAuditRecorder(), Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { reg.Close() })
	return reg
}
