package admin_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	adminv1 "github.com/ringfence/ringfence/gen/go/ringfence/admin/v1"
	"github.com/ringfence/ringfence/internal/admin"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/backup"
	"github.com/ringfence/ringfence/internal/testutil"
)

// liveness bounds how long a test waits for what must happen (a write that must go on): never
// an assertion on how long it took, only on whether it happened at all.
const liveness = time.Minute

// fixture is the admin service of one binary over a real bbolt file, served on loopback.
type fixture struct {
	db      *bolt.DB
	svc     *admin.Service
	addr    string
	log     *testutil.SyncBuffer
	mu      sync.Mutex
	records []audit.Record
}

// adminCaller is what the server's interceptor resolves for an admin key bound to no tenant;
// the interceptor itself, and every role and key kind, are tried on the real binary
// (internal/app's TestBackupNeedsThePermissionAndNoTenant).
func adminCaller(ctx context.Context) context.Context {
	ctx = auth.WithPrincipal(ctx, auth.Principal{KeyID: "k-ops", KeyName: "ops", Role: auth.RoleAdmin, Permissions: []auth.Permission{auth.Backup}})
	return auth.WithTenancy(ctx, auth.Tenancy{All: true})
}

type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s callerStream) Context() context.Context { return s.ctx }

// newFixture fills a bbolt file with size bytes (several chunks of a backup) and serves it.
func newFixture(t *testing.T, size int, stall time.Duration) *fixture {
	t.Helper()
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "registry.db"), 0o600, nil)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("filler"))
		if err != nil {
			return err
		}
		for i := 0; i < size/(64<<10); i++ {
			v := make([]byte, 64<<10)
			_, _ = rand.Read(v)
			if err := b.Put([]byte{byte(i >> 8), byte(i)}, v); err != nil {
				return err
			}
		}
		return nil
	}))
	f := &fixture{db: db, log: &testutil.SyncBuffer{}}
	f.svc = admin.New(admin.Config{
		Binary: "ringfence-registry", DataDir: dir, StoreBackend: "bbolt",
		Sources:  []backup.Source{func() ([]backup.File, error) { return []backup.File{backup.Bolt(db)}, nil }},
		Producer: "registry",
		Record: func(_ context.Context, rec audit.Record) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.records = append(f.records, rec)
			return nil
		},
		Logger:       slog.New(slog.NewTextHandler(f.log, nil)),
		StallTimeout: stall,
	})
	srv := grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, callerStream{ServerStream: ss, ctx: adminCaller(ss.Context())})
	}))
	adminv1.RegisterAdminServiceServer(srv, f.svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	f.addr = lis.Addr().String()
	return f
}

// client is a caller that reads what it is sent.
func (f *fixture) client(t *testing.T) adminv1.AdminServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return adminv1.NewAdminServiceClient(conn)
}

// stallingClient is a caller that opens backups and does not read them: its flow-control
// windows are the smallest gRPC allows and never grow, so the server's sends block at once.
func (f *fixture) stallingClient(t *testing.T) adminv1.AdminServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return adminv1.NewAdminServiceClient(conn)
}

// growFile writes more than the file has room for, which bbolt does only once no read
// transaction holds the file's map; it reports whether the write ended within liveness.
func (f *fixture) growFile(t *testing.T) bool {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- f.db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("growth"))
			if err != nil {
				return err
			}
			return b.Put([]byte("big"), make([]byte, 32<<20))
		})
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
		return true
	case <-time.After(liveness):
		return false
	}
}

// TestAStalledBackupIsEndedAndWritersGoOn: a caller that opens a backup and stops reading
// would hold the bbolt read transaction of the file being copied for as long as it keeps its
// connection, and with it every write that must grow the file. The backup is ended once the
// client has taken nothing for limits.backup_stall_timeout: the read transaction is released,
// the write goes on, the caller reads DEADLINE_EXCEEDED naming the setting, and the log says
// who stalled which file.
func TestAStalledBackupIsEndedAndWritersGoOn(t *testing.T) {
	f := newFixture(t, 8<<20, time.Second)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := f.stallingClient(t).Backup(ctx, &adminv1.BackupRequest{})
	require.NoError(t, err)
	first, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, "registry.db", first.GetPath())
	// The client reads no more.

	require.True(t, f.growFile(t), "a write that must grow the file waits for ever behind a backup nobody reads")
	require.Zero(t, f.db.Stats().OpenTxN, "the stalled backup's read transaction is released")

	var got error
	for got == nil {
		_, got = stream.Recv()
	}
	st := testutil.RequireStatus(t, got, codes.DeadlineExceeded)
	require.Contains(t, st.Message(), "limits.backup_stall_timeout")
	require.Contains(t, st.Message(), "registry.db")
	require.Contains(t, f.log.String(), "its client took no chunk of it")
	require.Contains(t, f.log.String(), "actor=")

}

// TestBackupsAtOnceAreBounded: each backup holds chunks in memory and a read transaction, so
// one binary sends MaxConcurrent at once and refuses one more, RESOURCE_EXHAUSTED, before any
// byte is sent; a backup its caller cancels frees its place and leaves no read transaction
// open, so writes that must grow the file go on.
func TestBackupsAtOnceAreBounded(t *testing.T) {
	f := newFixture(t, 8<<20, time.Hour)
	client := f.stallingClient(t)
	var cancels []context.CancelFunc
	for range admin.MaxConcurrent {
		ctx, cancel := context.WithCancel(t.Context())
		cancels = append(cancels, cancel)
		stream, err := client.Backup(ctx, &adminv1.BackupRequest{})
		require.NoError(t, err)
		_, err = stream.Recv()
		require.NoError(t, err)
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	stream, err := client.Backup(t.Context(), &adminv1.BackupRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	st := testutil.RequireStatus(t, err, codes.ResourceExhausted)
	require.Contains(t, st.Message(), "wait for one to end")
	f.mu.Lock()
	require.Len(t, f.records, admin.MaxConcurrent, "the refused backup is not recorded as started")
	f.mu.Unlock()

	for _, c := range cancels {
		c()
	}
	require.True(t, f.growFile(t), "a cancelled backup leaves a read transaction open")
	require.Zero(t, f.db.Stats().OpenTxN)
	reader := f.client(t)
	require.Eventually(t, func() bool { return drain(t, reader) == nil }, liveness, 50*time.Millisecond, "a cancelled backup keeps its place")
}

// drain reads a whole backup, answering its error.
func drain(t *testing.T, client adminv1.AdminServiceClient) error {
	t.Helper()
	stream, err := client.Backup(t.Context(), &adminv1.BackupRequest{})
	if err != nil {
		return err
	}
	var data bytes.Buffer
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if data.Len() == 0 {
				return errors.New("no data")
			}
			return nil
		}
		if err != nil {
			return err
		}
		data.Write(resp.GetData())
	}
}
