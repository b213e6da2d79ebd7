package tests

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	adminv1 "github.com/ringfence/ringfence/gen/go/ringfence/admin/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/testutil"
)

// TestAStalledBackupDoesNotHoldTheRegistrysWrites: a caller that opens `AdminService.Backup`
// on a running ringfenced and stops reading, with the smallest flow-control windows gRPC
// allows, would hold registry.db's read transaction, and with it every write that must grow
// the file, for as long as it keeps its connection. With limits.backup_stall_timeout the
// backup is ended: writes that grow registry.db well past its size all succeed, the caller
// reads DEADLINE_EXCEEDED naming the setting, and the process's log says who stalled, never a
// secret value written before or after.
func TestAStalledBackupDoesNotHoldTheRegistrysWrites(t *testing.T) {
	d := startDaemon(t, "ringfenced", append(registryEnv(), "RINGFENCE_LIMITS__BACKUP_STALL_TIMEOUT=1s")...)
	conn, err := grpc.NewClient(d.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx := testutil.WithKey(t.Context(), adminKey)
	reg := registryv1.NewRegistryServiceClient(conn)
	canary := "canary-" + hex.EncodeToString(randomBytes(t, 8))
	put := func(from, to int) error {
		var g errgroup.Group
		g.SetLimit(8)
		for i := from; i < to; i++ {
			g.Go(func() error {
				value := canary + "-" + hex.EncodeToString(randomBytes(t, 3000)) // 6 KiB
				_, err := reg.PutSecret(ctx, &registryv1.PutSecretRequest{Name: fmt.Sprintf("s%04d", i), Value: value})
				return err
			})
		}
		return g.Wait()
	}
	require.NoError(t, put(0, 400), "registry.db takes several chunks of a backup")

	stalled, err := grpc.NewClient(d.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	require.NoError(t, err)
	t.Cleanup(func() { stalled.Close() })
	stream, err := adminv1.NewAdminServiceClient(stalled).Backup(ctx, &adminv1.BackupRequest{})
	require.NoError(t, err)
	first, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, "registry.db", first.GetPath())
	// It reads no more.

	done := make(chan error, 1)
	go func() { done <- put(400, 1600) }() // several times the file's size: it must grow
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(2 * time.Minute):
		t.Fatalf("writes that grow registry.db wait for ever behind a backup nobody reads:\n%s", d.Logs.String())
	}

	var got error
	for got == nil {
		_, got = stream.Recv()
	}
	st := testutil.RequireStatus(t, got, codes.DeadlineExceeded)
	require.Contains(t, st.Message(), "limits.backup_stall_timeout")
	d.requireLogged(t, `level=WARN msg="admin: a backup was ended: its client took no chunk of it for limits.backup_stall_timeout" service=admin actor="key:bootstrap-admin [^"]*" file=registry.db`)
	require.NotContains(t, d.Logs.String(), canary, "no secret value in the log")
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}
