package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	adminv1 "github.com/ringfence/ringfence/gen/go/ringfence/admin/v1"
	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/admin"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/boltdb"
	"github.com/ringfence/ringfence/internal/cli"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/testutil"
)

// serveApp runs a on loopback until the test ends; it answers a client connection and the
// gRPC address.
func serveApp(t *testing.T, a *App) (*grpc.ClientConn, string) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	addr, _, err := a.Server.Addrs(ctx)
	require.NoError(t, err)
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn, addr.String()
}

// dataFiles lists the files under dir by their slash path under it.
func dataFiles(t *testing.T, dir string) map[string]os.FileInfo {
	t.Helper()
	out := map[string]os.FileInfo{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if rel != "." {
			out[filepath.ToSlash(rel)] = info
		}
		return nil
	}))
	return out
}

// TestBackupCopiesADataDirWhileWritesGoOn: `ringfence backup` against ringfenced over real
// gRPC copies every file of its data_dir but the secrets key (the bbolt files and the pool's
// audit spool) while registrations are written, each file whole (it opens with every page
// checked), mode 0600 in 0700 directories; ringfenced started on the copy with the same key
// serves the secrets, servers, graph, run and keys of before, and its audit log verifies and
// holds the backup's record.
func TestBackupCopiesADataDirWhileWritesGoOn(t *testing.T) {
	cfg := testConfig(t)
	a, err := NewAllInOne(t.Context(), cfg, quietLogger())
	require.NoError(t, err)
	conn, addr := serveApp(t, a)
	adminCtx := testutil.WithKey(t.Context(), bootstrapKey)

	reg := registryv1.NewRegistryServiceClient(conn)
	_, err = reg.PutSecret(adminCtx, &registryv1.PutSecretRequest{Name: "docs-token", Value: "s3cret-value"})
	require.NoError(t, err)
	_, err = reg.CreateServer(adminCtx, &registryv1.CreateServerRequest{Ref: "docs", Command: "docs-mcp"})
	require.NoError(t, err)
	op, err := registryv1.NewKeyServiceClient(conn).CreateKey(adminCtx, &registryv1.CreateKeyRequest{Name: "ops", Role: auth.RoleOperator})
	require.NoError(t, err)
	pub := publisherv1.NewPublisherServiceClient(conn)
	_, err = pub.CreateGraph(adminCtx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"a"}})
	require.NoError(t, err)
	_, err = pub.Publish(adminCtx, &publisherv1.PublishRequest{GraphId: "g"})
	require.NoError(t, err)
	_, err = poolv1.NewPoolServiceClient(conn).StartRun(adminCtx, &poolv1.StartRunRequest{GraphId: "g", RunId: "nightly"})
	require.NoError(t, err)

	// Registrations are written all through the backup.
	var written atomic.Int64
	ctx, stopWriting := context.WithCancel(adminCtx)
	writing := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			_, err := reg.CreateServer(ctx, &registryv1.CreateServerRequest{Ref: fmt.Sprintf("w-%d", i), Command: "x", Args: []string{strings.Repeat("a", 2000)}})
			if ctx.Err() != nil {
				writing <- nil
				return
			}
			if err != nil {
				writing <- err
				return
			}
			written.Add(1)
		}
	}()
	// Enough that registry.db takes several chunks of the stream (admin.ChunkBytes).
	for written.Load() < 600 {
		select {
		case err := <-writing:
			t.Fatalf("the writer stopped: %v", err)
		default:
		}
	}
	before := written.Load()

	out := filepath.Join(t.TempDir(), "backup")
	var stdout, stderr bytes.Buffer
	code := cli.Execute([]string{"backup", "--addr", addr, "--api-key", bootstrapKey, "--out", out}, nil, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	t.Logf("ringfence backup:\n%s", stdout.String())
	stopWriting()
	require.NoError(t, <-writing)
	after := written.Load()
	require.NoError(t, a.Registry.Spool().Flush(t.Context()))
	require.NoError(t, a.Pool.Spool().Flush(t.Context()))

	// Every file of the data_dir is in the copy, but the secrets key.
	keyFile := filepath.Join(cfg.DataDir, "secrets.key")
	orig, copied := dataFiles(t, cfg.DataDir), dataFiles(t, out)
	delete(orig, "secrets.key")
	var want, got []string
	for p, info := range orig {
		if !info.IsDir() {
			want = append(want, p)
		}
	}
	for p, info := range copied {
		if info.IsDir() {
			require.Equal(t, os.FileMode(0o700), info.Mode().Perm(), p)
			continue
		}
		require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), p)
		got = append(got, p)
	}
	slices.Sort(want)
	slices.Sort(got)
	require.Equal(t, want, got)
	for _, f := range []string{"registry.db", "publisher.db", "pool.db", "audit.db", "pool-audit-spool/acked"} {
		require.Contains(t, got, f)
		require.Contains(t, stdout.String(), f)
	}
	require.NotContains(t, got, "secrets.key")
	require.Greater(t, copied["registry.db"].Size(), int64(admin.ChunkBytes), "registry.db came in several chunks")
	for _, f := range []string{"registry.db", "publisher.db", "pool.db", "audit.db"} {
		db, err := boltdb.Open(filepath.Join(out, f)) // every page checked
		require.NoError(t, err, f)
		require.NoError(t, db.Close())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	require.Contains(t, stdout.String(), "the secrets key is not in the backup: keep "+keyFile+" apart")
	require.True(t, strings.HasPrefix(lines[len(lines)-1], "to restore: stop ringfenced, point its data_dir (RINGFENCE_DATA_DIR) at "+out), lines[len(lines)-1])

	// The backup is recorded: who took it, which files, their sizes; never their content.
	recs, err := auditv1.NewAuditServiceClient(conn).List(adminCtx, &auditv1.ListRequest{Filter: &auditv1.Filter{Kind: "admin"}, PageSize: 1000})
	require.NoError(t, err)
	var backups []*auditv1.AdminEvent
	for _, r := range recs.GetRecords() {
		if r.GetAdmin().GetAction() == admin.ActionBackup {
			backups = append(backups, r.GetAdmin())
		}
	}
	require.Len(t, backups, 2, "started and completed")
	require.Contains(t, backups[0].GetChangeJson(), `"status":"started"`)
	require.Contains(t, backups[1].GetChangeJson(), `"status":"completed"`)
	require.Contains(t, backups[1].GetChangeJson(), `"path":"registry.db","size":`)
	require.Equal(t, auth.RoleAdmin, backups[1].GetActorRole())
	require.NotContains(t, backups[1].GetChangeJson(), "s3cret-value")

	// ringfenced on the copy, with the key kept apart.
	rcfg := testConfig(t, "RINGFENCE_DATA_DIR="+out, "RINGFENCE_SECRETS_KEY_FILE="+keyFile)
	restored, err := NewAllInOne(t.Context(), rcfg, quietLogger())
	require.NoError(t, err)
	rconn, _ := serveApp(t, restored)
	rreg := registryv1.NewRegistryServiceClient(rconn)
	_, err = rreg.GetServer(adminCtx, &registryv1.GetServerRequest{Ref: "docs"})
	require.NoError(t, err)
	secrets, err := rreg.ListSecrets(adminCtx, &registryv1.ListSecretsRequest{})
	require.NoError(t, err)
	require.Len(t, secrets.GetSecrets(), 1)
	var servers []string
	req := &registryv1.ListServersRequest{PageSize: 1000}
	for {
		resp, err := rreg.ListServers(adminCtx, req)
		require.NoError(t, err)
		for _, s := range resp.GetServers() {
			servers = append(servers, s.GetRef())
		}
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	// The registrations of one instant: all written before the backup began, none after it
	// ended, and each one whole.
	require.GreaterOrEqual(t, int64(len(servers)-1), before)
	require.LessOrEqual(t, int64(len(servers)-1), after)
	for _, ref := range servers {
		s, err := rreg.GetServer(adminCtx, &registryv1.GetServerRequest{Ref: ref})
		require.NoError(t, err, ref)
		require.NotEmpty(t, s.GetServer().GetCommand(), ref)
	}
	_, err = publisherv1.NewPublisherServiceClient(rconn).GetVersion(adminCtx, &publisherv1.GetVersionRequest{GraphId: "g", Version: 1})
	require.NoError(t, err)
	run, err := poolv1.NewPoolServiceClient(rconn).GetRun(adminCtx, &poolv1.GetRunRequest{RunId: "nightly"})
	require.NoError(t, err)
	require.Equal(t, "running", run.GetRun().GetState())
	// The operator key minted before still authenticates: its role lacks mcp:admin.
	_, err = rreg.ListServers(testutil.WithKey(t.Context(), op.GetSecret()), &registryv1.ListServersRequest{})
	testutil.RequireStatus(t, err, codes.PermissionDenied)

	require.NoError(t, restored.Registry.Spool().Flush(t.Context()))
	rac := auditv1.NewAuditServiceClient(rconn)
	verified, err := rac.Verify(adminCtx, &auditv1.VerifyRequest{})
	require.NoError(t, err)
	require.True(t, verified.GetOk(), "%v", verified)
	rrecs, err := rac.List(adminCtx, &auditv1.ListRequest{Filter: &auditv1.Filter{Kind: "admin"}, PageSize: 1000})
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(rrecs.GetRecords(), func(r *auditv1.Record) bool {
		return r.GetAdmin().GetAction() == admin.ActionBackup && strings.Contains(r.GetAdmin().GetChangeJson(), `"status":"started"`)
	}), "the restored log holds the record of the backup it was restored from")
}

// TestBackupNeedsThePermissionAndNoTenant: a backup copies every tenant's data and the sealed
// secrets, so a role without backup (operator) and an admin key bound to a tenant are both
// refused, before any byte is sent.
func TestBackupNeedsThePermissionAndNoTenant(t *testing.T) {
	a, err := NewAllInOne(t.Context(), testConfig(t), quietLogger())
	require.NoError(t, err)
	conn, _ := serveApp(t, a)
	adminCtx := testutil.WithKey(t.Context(), bootstrapKey)
	kc := registryv1.NewKeyServiceClient(conn)
	op, err := kc.CreateKey(adminCtx, &registryv1.CreateKeyRequest{Name: "ops", Role: auth.RoleOperator})
	require.NoError(t, err)
	acme, err := kc.CreateKey(adminCtx, &registryv1.CreateKeyRequest{Name: "acme-admin", Role: auth.RoleAdmin, Tenant: "acme"})
	require.NoError(t, err)

	for name, key := range map[string]string{"operator": op.GetSecret(), "tenant admin": acme.GetSecret()} {
		stream, err := adminv1.NewAdminServiceClient(conn).Backup(testutil.WithKey(t.Context(), key), &adminv1.BackupRequest{})
		require.NoError(t, err)
		resp, err := stream.Recv()
		require.Nil(t, resp, name)
		st := testutil.RequireStatus(t, err, codes.PermissionDenied, name)
		require.Contains(t, st.Message(), "Backup", name)
	}
	// The CLI says the same, and leaves nothing in --out.
	out := filepath.Join(t.TempDir(), "backup")
	var stdout, stderr bytes.Buffer
	_, addr := conn, conn.Target()
	code := cli.Execute([]string{"backup", "--addr", addr, "--api-key", acme.GetSecret(), "--out", out}, nil, &stdout, &stderr)
	require.Equal(t, cli.ExitFailure, code)
	require.Contains(t, stderr.String(), "bound to tenant")
	require.Contains(t, stderr.String(), "hint: the backup did not complete and nothing was kept ("+out+" is removed): fix what the error names, then run it again")
	_, err = os.Stat(out)
	require.ErrorIs(t, err, os.ErrNotExist, "the directory the backup made for --out goes with it")

	// An admin key bound to no tenant may.
	stream, err := adminv1.NewAdminServiceClient(conn).Backup(adminCtx, &adminv1.BackupRequest{})
	require.NoError(t, err)
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if resp.GetSummary() != nil {
			require.Equal(t, "ringfenced", resp.GetSummary().GetBinary())
		}
	}
}

// TestBackupRefusesANonEmptyDirectory: --out must be new or empty, so a copy is never mixed
// with another data_dir's files; nothing is asked of the server.
func TestBackupRefusesANonEmptyDirectory(t *testing.T) {
	out := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(out, "registry.db"), []byte("theirs"), 0o600))
	var stdout, stderr bytes.Buffer
	code := cli.Execute([]string{"backup", "--addr", testutil.FreeAddr(t), "--out", out}, nil, &stdout, &stderr)
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, stderr.String(), "is not empty")
	got, err := os.ReadFile(filepath.Join(out, "registry.db"))
	require.NoError(t, err)
	require.Equal(t, "theirs", string(got))
}

// TestAFailedBackupLeavesNoDirectory: a backup that never reaches a server (a wrong --addr)
// removes the directories it made for --out, parents included, so no empty directory is taken
// for a copy later; an empty --out that was there stays, empty; the hint says which.
func TestAFailedBackupLeavesNoDirectory(t *testing.T) {
	root := t.TempDir()
	out := filepath.Join(root, "backups", "today")
	var stdout, stderr bytes.Buffer
	code := cli.Execute([]string{"backup", "--addr", testutil.FreeAddr(t), "--api-key", bootstrapKey, "--timeout", "2s", "--out", out}, nil, &stdout, &stderr)
	require.Equal(t, cli.ExitFailure, code, stderr.String())
	require.Contains(t, stderr.String(), "nothing was kept ("+out+" is removed)")
	_, err := os.Stat(filepath.Join(root, "backups"))
	require.ErrorIs(t, err, os.ErrNotExist, "the parent the backup made goes too")

	empty := t.TempDir()
	stderr.Reset()
	code = cli.Execute([]string{"backup", "--addr", testutil.FreeAddr(t), "--api-key", bootstrapKey, "--timeout", "2s", "--out", empty}, nil, &stdout, &stderr)
	require.Equal(t, cli.ExitFailure, code, stderr.String())
	require.Contains(t, stderr.String(), "nothing was kept ("+empty+" is left empty, as it was)")
	entries, err := os.ReadDir(empty)
	require.NoError(t, err)
	require.Empty(t, entries)
}

// TestABackupNamesItsDirectoryByItsAbsolutePath: --out given relative to the CLI's working
// directory is named absolute in the restore line, which is followed where the server starts,
// from another directory; the line says to put the copy in the data_dir's place, never over it.
func TestABackupNamesItsDirectoryByItsAbsolutePath(t *testing.T) {
	a, err := NewAllInOne(t.Context(), testConfig(t), quietLogger())
	require.NoError(t, err)
	_, addr := serveApp(t, a)
	work := t.TempDir()
	t.Chdir(work)
	var stdout, stderr bytes.Buffer
	code := cli.Execute([]string{"backup", "--addr", addr, "--api-key", bootstrapKey, "--out", "nightly"}, nil, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, stderr.String())
	require.Contains(t, stdout.String(), "into "+filepath.Join(work, "nightly")+"\n")
	require.Contains(t, stdout.String(), "point its data_dir (RINGFENCE_DATA_DIR) at "+filepath.Join(work, "nightly")+" (or move the old data_dir aside and this one into its place, never over it)")
}

// TestEachSplitBinaryBacksUpItsOwnFiles: in a split deployment every binary serves Backup on
// its public port over the files it keeps (the pool its database and spool, the audit service
// its log), names itself and, where it seals secrets, the key it never copies; and the backup
// reaches the audit log as an admin record from the producer that took it.
func TestEachSplitBinaryBacksUpItsOwnFiles(t *testing.T) {
	s := startSplit(t)
	ctx := testutil.WithKey(t.Context(), bootstrapKey)
	for _, tc := range []struct {
		svc, binary string
		files       []string
		secretsKey  bool
	}{
		{mtls.Registry, "ringfence-registry", []string{"registry.db"}, true},
		{mtls.Publisher, "ringfence-publisher", []string{"publisher.db"}, false},
		{mtls.Pool, "ringfence-pool", []string{"pool.db", "pool-audit-spool/acked"}, true},
		{mtls.Audit, "ringfence-audit", []string{"audit.db"}, false},
	} {
		t.Run(tc.svc, func(t *testing.T) {
			stream, err := adminv1.NewAdminServiceClient(s.dialPublic(tc.svc)).Backup(ctx, &adminv1.BackupRequest{})
			require.NoError(t, err)
			var files []string
			var summary *adminv1.BackupSummary
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				require.NoError(t, err)
				if resp.GetEnd() != nil {
					files = append(files, resp.GetPath())
				}
				if resp.GetSummary() != nil {
					summary = resp.GetSummary()
				}
			}
			require.Equal(t, tc.files, files)
			require.Equal(t, tc.binary, summary.GetBinary())
			require.Equal(t, tc.secretsKey, summary.GetSecretsKeyFile() != "", summary.GetSecretsKeyFile())
		})
	}
	audit := auditv1.NewAuditServiceClient(s.dialPublic(mtls.Audit))
	require.Eventually(t, func() bool {
		resp, err := audit.List(ctx, &auditv1.ListRequest{Filter: &auditv1.Filter{Kind: "admin"}, PageSize: 1000})
		if err != nil {
			return false
		}
		producers := map[string]bool{}
		for _, r := range resp.GetRecords() {
			if r.GetAdmin().GetAction() == admin.ActionBackup && strings.Contains(r.GetAdmin().GetChangeJson(), `"status":"completed"`) {
				producers[r.GetProducer()] = true
			}
		}
		return len(producers) == 4
	}, 15*time.Second, 50*time.Millisecond, "each binary's backup is recorded: registry, publisher, pool and audit")
}

// TestBackupOnEtcdSaysWhatIsInEtcd: ringfenced with store.backend=etcd keeps its registrations
// and graphs in etcd: the backup copies the files it still keeps (the pool's database and
// spool, the audit log) and says that the rest is in etcd and how to take it.
func TestBackupOnEtcdSaysWhatIsInEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cfg := testConfig(t,
		"RINGFENCE_STORE__BACKEND=etcd",
		`RINGFENCE_STORE__ETCD_ENDPOINTS=["`+strings.Join(cluster.Endpoints(), `","`)+`"]`,
		"RINGFENCE_STORE__ETCD_CA_FILE="+filepath.Join(cluster.CertDir, "ca.pem"),
		"RINGFENCE_STORE__ETCD_CERT_FILE="+filepath.Join(cluster.CertDir, "registry.pem"),
		"RINGFENCE_STORE__ETCD_KEY_FILE="+filepath.Join(cluster.CertDir, "registry-key.pem"),
		"RINGFENCE_STORE__ETCD_PREFIX=/backup-test",
	)
	a, err := NewAllInOne(t.Context(), cfg, quietLogger())
	require.NoError(t, err)
	_, addr := serveApp(t, a)

	out := filepath.Join(t.TempDir(), "backup")
	var stdout, stderr bytes.Buffer
	code := cli.Execute([]string{"backup", "--addr", addr, "--api-key", bootstrapKey, "--out", out}, nil, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	var got []string
	for p, info := range dataFiles(t, out) {
		if !info.IsDir() {
			got = append(got, p)
		}
	}
	slices.Sort(got)
	require.Equal(t, []string{"audit.db", "pool-audit-spool/acked", "pool.db"}, got, "registry.db and publisher.db are not kept on etcd")
	require.Contains(t, stdout.String(), "not in the backup: with store.backend=etcd, the registrations, secrets and API keys and graphs and versions are kept in etcd: take them with `etcdctl snapshot save`")
	require.Contains(t, stdout.String(), "the secrets key is not in the backup: keep "+filepath.Join(cfg.DataDir, "secrets.key")+" apart")
}

// TestBackupAsJSONIsWhatAScriptReads: `ringfence backup -o json` prints one JSON object and
// nothing else on stdout: the directory written (absolute), the binary, each file by its path
// under it with the size and full SHA-256 of the file on disk, their total, the secrets key
// file to keep apart, what is not in the copy (a list, never null) and the restore hint naming
// the directory.
func TestBackupAsJSONIsWhatAScriptReads(t *testing.T) {
	cfg := testConfig(t)
	a, err := NewAllInOne(t.Context(), cfg, quietLogger())
	require.NoError(t, err)
	_, addr := serveApp(t, a)

	out := filepath.Join(t.TempDir(), "backup")
	var stdout, stderr bytes.Buffer
	code := cli.Execute([]string{"backup", "--addr", addr, "--api-key", bootstrapKey, "--out", out, "-o", "json"}, nil, &stdout, &stderr)
	require.Equal(t, cli.ExitOK, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())

	var got struct {
		Dir          string `json:"dir"`
		Binary       string `json:"binary"`
		StoreBackend string `json:"store_backend"`
		Files        []struct {
			Path   string `json:"path"`
			Size   int64  `json:"size"`
			SHA256 string `json:"sha256"`
		} `json:"files"`
		Bytes          int64     `json:"bytes"`
		SecretsKeyFile string    `json:"secrets_key_file"`
		NotIncluded    *[]string `json:"not_included"`
		Restore        string    `json:"restore"`
	}
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&got), "stdout is one JSON object")
	require.False(t, dec.More(), "and nothing after it")

	require.Equal(t, out, got.Dir)
	require.Equal(t, "ringfenced", got.Binary)
	require.Equal(t, "bbolt", got.StoreBackend)
	require.Equal(t, filepath.Join(cfg.DataDir, "secrets.key"), got.SecretsKeyFile)
	require.NotNil(t, got.NotIncluded, "not_included is a list, never null")
	require.Contains(t, got.Restore, "point its data_dir (RINGFENCE_DATA_DIR) at "+out+" ")

	onDisk := map[string]bool{}
	for p, info := range dataFiles(t, out) {
		if !info.IsDir() {
			onDisk[p] = true
		}
	}
	var total int64
	for _, f := range got.Files {
		require.True(t, onDisk[f.Path], "%s is in the copy", f.Path)
		delete(onDisk, f.Path)
		data, err := os.ReadFile(filepath.Join(out, filepath.FromSlash(f.Path)))
		require.NoError(t, err)
		require.Equal(t, int64(len(data)), f.Size, f.Path)
		sum := sha256.Sum256(data)
		require.Equal(t, hex.EncodeToString(sum[:]), f.SHA256, f.Path)
		total += f.Size
	}
	require.Empty(t, onDisk, "every file written is listed")
	require.Contains(t, slices.Collect(func(yield func(string) bool) {
		for _, f := range got.Files {
			if !yield(f.Path) {
				return
			}
		}
	}), "registry.db")
	require.Equal(t, total, got.Bytes)
}
