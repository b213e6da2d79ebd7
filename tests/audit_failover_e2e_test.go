package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/testutil"
)

// TestAuditLeaderKilledUnderLoad runs two ringfence-audit processes on an embedded
// three-member etcd cluster, sharing the log, and a ringfence-registry whose outbox forwards
// to both (peers.audit_addr lists them). Under a steady stream of registrations, the audit
// leader is killed with SIGKILL, and later etcd's leader member: the standby takes over, and
// every change the registry acknowledged is in the log exactly once, and the chain verifies.
func TestAuditLeaderKilledUnderLoad(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	certs, root := cluster.CertDir, cluster.Root()
	keyFile := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(keyFile, []byte(strings.Repeat("ab", 32)+"\n"), 0o600))
	tlsEnv := func(svc string) []string {
		return []string{
			"RINGFENCE_TLS__CERT_FILE=" + filepath.Join(certs, svc+".pem"),
			"RINGFENCE_TLS__KEY_FILE=" + filepath.Join(certs, svc+"-key.pem"),
			"RINGFENCE_TLS__CLIENT_CA_FILE=" + filepath.Join(certs, "ca.pem"),
		}
	}
	registryInternal := testutil.FreeAddr(t)
	auditInternal := []string{testutil.FreeAddr(t), testutil.FreeAddr(t)}
	audits := make([]*daemon, 2)
	for i := range audits {
		audits[i] = startDaemon(t, "ringfence-audit", append(append(tlsEnv("audit"), etcdEnv(cluster, root, "audit")...),
			"RINGFENCE_ENV=production",
			"RINGFENCE_INTERNAL_ADDR="+auditInternal[i],
			"RINGFENCE_PEERS__REGISTRY_ADDR="+registryInternal,
		)...)
	}
	// Which audit instance leads: its election key holds its name, which ends with its
	// internal address.
	etcd := cluster.Client(t, "audit")
	leader := func() int {
		resp, err := etcd.Get(t.Context(), root+"/audit/leader/", clientv3.WithFirstCreate()...)
		if err != nil || len(resp.Kvs) == 0 {
			return -1
		}
		for i, addr := range auditInternal {
			if strings.HasSuffix(string(resp.Kvs[0].Value), addr+")") && audits[i] != nil {
				return i
			}
		}
		return -1
	}
	var first int
	require.Eventually(t, func() bool { first = leader(); return first >= 0 }, 30*time.Second, 20*time.Millisecond)

	// The registry lists the leader first, so that its client has to find the standby when
	// the leader is gone.
	registry := startDaemon(t, "ringfence-registry", append(tlsEnv("registry"),
		"RINGFENCE_ENV=production",
		"RINGFENCE_INTERNAL_ADDR="+registryInternal,
		"RINGFENCE_BOOTSTRAP_ADMIN_KEY="+adminKey,
		"RINGFENCE_SECRETS_KEY_FILE="+keyFile,
		"RINGFENCE_PEERS__AUDIT_ADDR="+auditInternal[first]+","+auditInternal[1-first],
	)...)

	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-api-key", adminKey)
	regClient := registryv1.NewRegistryServiceClient(dialTLS(t, registry.GRPCAddr, filepath.Join(certs, "ca.pem"), mtls.Registry))

	// The load: four writers registering servers until told to stop; a ref is acknowledged
	// once CreateServer answered OK, and its record is then the registry's to deliver.
	var (
		mu    sync.Mutex
		acked []string
		wg    sync.WaitGroup
	)
	stop := make(chan struct{})
	ackedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ref := fmt.Sprintf("load-%d-%d", w, i)
				_, err := regClient.CreateServer(ctx, &registryv1.CreateServerRequest{Ref: ref, Command: "mcpfixture", Grants: []string{"process_spawn"}})
				if err == nil {
					mu.Lock()
					acked = append(acked, ref)
					mu.Unlock()
				}
			}
		})
	}
	waitAcked := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { return ackedCount() >= n }, 60*time.Second, 10*time.Millisecond)
	}

	waitAcked(40)
	audits[first].kill()
	killed := audits[first]
	audits[first] = nil
	survivor := audits[1-first]
	waitAcked(ackedCount() + 40)
	require.Eventually(t, func() bool { return leader() == 1-first }, 30*time.Second, 20*time.Millisecond, "the standby leads")

	// etcd loses its leader member; the log goes on once the others elected one.
	cluster.Kill(cluster.WaitLeader(t))
	cluster.WaitLeader(t)
	waitAcked(ackedCount() + 40)
	close(stop)
	wg.Wait()

	// Every acknowledged change reaches the log once.
	auditClient := auditv1.NewAuditServiceClient(dialTLS(t, survivor.GRPCAddr, filepath.Join(certs, "ca.pem"), mtls.Audit))
	var missing []string
	var seen map[string]int
	collect := func() error {
		seen = map[string]int{}
		token := ""
		for {
			resp, err := auditClient.List(ctx, &auditv1.ListRequest{Filter: &auditv1.Filter{Kind: "admin"}, PageSize: 1000, PageToken: token})
			if err != nil {
				return err
			}
			for _, r := range resp.GetRecords() {
				if a := r.GetAdmin(); a.GetAction() == "create" && a.GetResourceType() == "mcp_server" {
					seen[a.GetResourceId()]++
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		missing = missing[:0]
		for _, ref := range acked {
			if seen[ref] == 0 {
				missing = append(missing, ref)
			}
		}
		return nil
	}
	// The registry's outbox delivers within seconds once an instance takes its records.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := collect()
		if err == nil && len(missing) == 0 || time.Now().After(deadline) {
			require.NoError(t, err)
			require.Empty(t, missing, "acknowledged changes missing from the audit log (of %d)", len(acked))
			break
		}
	}
	for ref, n := range seen {
		require.Equal(t, 1, n, "%s is in the log %d times", ref, n)
	}

	res, err := auditClient.Verify(ctx, &auditv1.VerifyRequest{})
	require.NoError(t, err)
	require.True(t, res.GetOk(), "%+v", res)
	require.GreaterOrEqual(t, res.GetHeadSeq(), uint64(len(acked)))

	// The killed instance comes back as a standby, copies what it missed, and verifies to
	// the same head.
	killed.start()
	killedClient := auditv1.NewAuditServiceClient(dialTLS(t, killed.GRPCAddr, filepath.Join(certs, "ca.pem"), mtls.Audit))
	again, err := killedClient.Verify(ctx, &auditv1.VerifyRequest{})
	require.NoError(t, err)
	require.True(t, again.GetOk(), "%+v", again)
	require.GreaterOrEqual(t, again.GetHeadSeq(), res.GetHeadSeq())
	if again.GetHeadSeq() == res.GetHeadSeq() {
		require.Equal(t, res.GetHeadHash(), again.GetHeadHash())
	}
}

// dialTLS is a gRPC client of a split binary's public port, verifying it carries peer's
// identity as the CLI does.
func dialTLS(t *testing.T, addr, caFile, peer string) *grpc.ClientConn {
	t.Helper()
	cfg, err := mtls.CAOnlyConfig(caFile, "", peer)
	require.NoError(t, err)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
