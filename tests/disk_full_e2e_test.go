package tests

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
)

// smallDisk mounts a tmpfs of size bytes at dir (created), unmounted at the end of the test;
// it skips the test where mounting is not allowed (not root, no CAP_SYS_ADMIN).
func smallDisk(t *testing.T, dir string, size int) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o700))
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small file system (root with CAP_SYS_ADMIN is needed): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// fillDisk writes a file in dir until the file system is full and returns its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			require.True(t, errors.Is(err, syscall.ENOSPC), "filling %s: %v", dir, err)
			break
		}
	}
	for _, n := range []int{4096, 512, 1} { // the last partial blocks
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
	return path
}

// TestAuditOutageFillsThePoolsSpool runs the split deployment with the audit service stopped
// while a run calls tools from several clients: the pool's spool grows until it is full, its
// disk (a small file system) or its record limit (RINGFENCE_AUDIT__SPOOL_MAX_RECORDS), and
// from then on calls are refused before dispatch (audit_unavailable) with an error that names
// what is full. Once the audit service is back the spool drains, which frees it, and calls
// succeed again without a restart; every answered call has its pending and outcome records,
// in the order the calls were made, and the chain verifies.
func TestAuditOutageFillsThePoolsSpool(t *testing.T) {
	t.Run("disk", func(t *testing.T) {
		testAuditOutageFillsThePoolsSpool(t, 0, func(t *testing.T, spoolDir string) (string, func()) {
			smallDisk(t, spoolDir, 3<<20)
			return "no space left on device", func() {
				filler := fillDisk(t, spoolDir)
				t.Cleanup(func() { require.NoError(t, os.Remove(filler)) })
			}
		})
	})
	t.Run("record limit", func(t *testing.T) {
		testAuditOutageFillsThePoolsSpool(t, 300, func(*testing.T, string) (string, func()) {
			// The outcomes of calls in flight when it filled are written past the limit.
			return `audit: spool full: 3\d\d records wait for the audit service \(limit 300\)`, func() {}
		})
	})
}

// testAuditOutageFillsThePoolsSpool is one case of TestAuditOutageFillsThePoolsSpool: limit is
// the pool's SPOOL_MAX_RECORDS (0: the default), full prepares the spool directory before the
// pool starts and returns what a refusal says (a regular expression) and what fills the spool
// once the audit service is down.
func testAuditOutageFillsThePoolsSpool(t *testing.T, limit int, full func(t *testing.T, spoolDir string) (string, func())) {
	image := dockertest.FixtureImage(t)
	certs, addr, internal := splitPlan(t)
	poolID := "e2e-full-" + randomHex(4)
	t.Cleanup(func() { requireNoContainers(t, poolID) })
	poolData := t.TempDir()
	spoolDir := filepath.Join(poolData, "pool-audit-spool")
	refusal, fill := full(t, spoolDir)
	poolEnv := []string{"RINGFENCE_DATA_DIR=" + poolData}
	if limit > 0 {
		poolEnv = append(poolEnv, fmt.Sprintf("RINGFENCE_AUDIT__SPOOL_MAX_RECORDS=%d", limit))
	}

	services := startSplit(t, certs, addr, internal, map[string][]string{
		"registry": {"RINGFENCE_BOOTSTRAP_ADMIN_KEY=" + adminKey},
		"pool":     append(poolEnv, "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE="+image, "RINGFENCE_SANDBOX__POOL_ID="+poolID),
	})
	audit, pool := services["audit"], services["pool"]
	cli := func(svc string, args ...string) result { return splitCLI(t, certs, addr, svc, nil, args...) }
	must := func(r result) result { t.Helper(); return mustSucceed(t, r) }
	must(cli("registry", "servers", "add", "fx", "--command", "mcpfixture --lean", "--grant", "process_spawn", "--grant", "external_api_call"))
	must(cli("publisher", "graphs", "create", "--graph", "full", "--agent", "a"))
	must(cli("publisher", "mcp-import", "--server", "fx", "--graph", "full", "--agent", "a", "--tool", "echo"))
	must(cli("publisher", "graphs", "publish", "--graph", "full"))

	ctx := testutil.WithKey(t.Context(), adminKey)
	client := poolv1.NewPoolServiceClient(dialTLS(t, addr["pool"], filepath.Join(certs, "ca.pem"), mtls.Pool))
	started, err := client.StartRun(ctx, &poolv1.StartRunRequest{GraphId: "full"})
	require.NoError(t, err)
	run := started.GetRun().GetRunId()
	args, err := structpb.NewStruct(map[string]any{"text": "ping"})
	require.NoError(t, err)
	call := func(id string) error {
		res, err := client.CallTool(ctx, &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: "fx__echo", Arguments: args, CallId: id})
		if err == nil && res.GetResult() != "succeeded" {
			return fmt.Errorf("call %s: %s", id, res.GetResult())
		}
		return err
	}
	require.NoError(t, call("before"))

	// The outage: the spool keeps every record until it is full.
	audit.stop()
	fill()
	var (
		mu       sync.Mutex
		answered = map[int][]string{} // by worker, in the order made
		refusals []error
		wg       sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			// Each worker calls until it is refused, within a bound: the spool holds a few
			// thousand records.
			for i := range 5000 {
				id := fmt.Sprintf("w%d-%04d", w, i)
				err := call(id)
				mu.Lock()
				if err == nil {
					answered[w] = append(answered[w], id)
				} else {
					refusals = append(refusals, err)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	require.Len(t, refusals, 4, "every worker is refused once the spool is full")
	for _, err := range refusals {
		requireStatus(t, err, codes.Unavailable)
		msg := status.Convert(err).Message()
		require.Contains(t, msg, "audit_unavailable")
		require.Regexp(t, refusal, msg)
		if limit == 0 {
			require.Contains(t, msg, spoolDir+"/", "the refusal names the spool's file")
		}
	}
	// Still refused while the spool stays full.
	requireStatus(t, call("while-full"), codes.Unavailable)

	// The audit service returns: the spool drains, frees its segments, and calls succeed
	// again, with the disk's filler still in place and no restart.
	audit.start()
	require.Eventually(t, func() bool { return call(fmt.Sprintf("after-%d", time.Now().UnixNano())) == nil },
		60*time.Second, 200*time.Millisecond, "calls succeed once the spool drained: %s; pool log:\n%s", call("last"), pool.Logs)

	// Every answered call is on record: its pending record and its outcome, in the order
	// each worker made them.
	auditClient := auditv1.NewAuditServiceClient(dialTLS(t, addr["audit"], filepath.Join(certs, "ca.pem"), mtls.Audit))
	total := 0
	for _, ids := range answered {
		total += len(ids)
	}
	var byCall map[string]onRecord
	require.Eventually(t, func() bool {
		var err error
		if byCall, err = callsOnRecord(ctx, auditClient, run); err != nil {
			return false
		}
		for _, ids := range answered {
			for _, id := range ids {
				if e := byCall[id]; e.pending == 0 || e.outcome == 0 {
					return false
				}
			}
		}
		return true
	}, 60*time.Second, 250*time.Millisecond, "every one of %d answered calls reaches the audit log", total)
	for w, ids := range answered {
		for i := 1; i < len(ids); i++ {
			require.Less(t, byCall[ids[i-1]].pending, byCall[ids[i]].pending, "worker %d's calls are on record in order", w)
		}
	}
	t.Logf("%d calls answered during the outage before the spool filled", total)
	res, err := auditClient.Verify(ctx, &auditv1.VerifyRequest{})
	require.NoError(t, err)
	require.True(t, res.GetOk(), "%+v", res)
	require.NotContains(t, pool.Logs.String(), "panic")

	_, err = client.EndRun(ctx, &poolv1.EndRunRequest{RunId: run})
	require.NoError(t, err)
}

// requireStatus asserts that err is a gRPC status with code.
func requireStatus(t *testing.T, err error, code codes.Code) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, status.Code(err), "%v", err)
}

// TestAFullDataDiskRefusesChangesAndRecovers puts ringfenced's whole data directory on a small
// file system and fills it: registry changes are refused with an error that names the full
// disk, every change acknowledged before is kept, and once space is freed changes are taken
// again without a restart; the files open cleanly afterwards and the chain verifies.
func TestAFullDataDiskRefusesChangesAndRecovers(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	smallDisk(t, dataDir, 64<<20)
	d := startDaemon(t, "ringfenced", append(registryEnv(), "RINGFENCE_DATA_DIR="+dataDir)...)
	api := rest{t: t, base: "http://" + d.HTTPAddr, key: adminKey}
	add := func(ref string) (int, string) {
		code, _, raw := api.do("POST", "/v1/mcp/servers", fmt.Sprintf(`{"ref":%q,"command":"mcpfixture","description":"%s"}`, ref, strings.Repeat("d", 2000)))
		return code, raw
	}
	var acked []string
	for i := range 5 {
		ref := fmt.Sprintf("before-%d", i)
		code, raw := add(ref)
		require.Equal(t, http.StatusOK, code, raw)
		acked = append(acked, ref)
	}
	filler := fillDisk(t, dataDir)
	var refusal string
	for i := range 2000 {
		ref := fmt.Sprintf("full-%04d", i)
		code, raw := add(ref)
		if code == http.StatusOK {
			acked = append(acked, ref)
			continue
		}
		refusal = fmt.Sprintf("%d %s", code, raw)
		break
	}
	require.Contains(t, refusal, `503 {"code":503,"status":"UNAVAILABLE","message":"registry: the server's disk is full (no space left writing registry.db in its data directory): free space on that file system and retry; the server goes on without a restart`)
	require.NotContains(t, refusal, dataDir, "the caller is not told the server's paths")
	// The refusal can reach the caller before the server's log line is read from its stderr.
	d.requireLogged(t, regexp.QuoteMeta(filepath.Join(dataDir, "registry.db")+": no space left on device"), "the log names the file")
	// The server frees space of its own (its audit outbox drops what it forwarded), so a
	// change may fit again; with the disk filled again it is refused again.
	refusedAgain := false
	for i := 0; i < 20 && !refusedAgain; i++ {
		fillDisk(t, dataDir)
		ref := fmt.Sprintf("still-full-%d", i)
		code, raw := add(ref)
		if code == http.StatusOK {
			acked = append(acked, ref)
			continue
		}
		require.Equal(t, http.StatusServiceUnavailable, code, raw)
		refusedAgain = true
	}
	require.True(t, refusedAgain, "refused while the disk stays full")

	require.NoError(t, os.Remove(filler))
	code, raw := add("after")
	require.Equal(t, http.StatusOK, code, "taken again once space is freed, without a restart: %s", raw)
	acked = append(acked, "after")

	// The files are whole: a restart checks every page of registry.db and finds every
	// acknowledged change, and the audit chain verifies.
	d.restart()
	for _, ref := range acked {
		code, _, raw := api.do("GET", "/v1/mcp/servers/"+ref, "")
		require.Equal(t, http.StatusOK, code, "%s: %s", ref, raw)
	}
	r := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), "audit", "verify")
	require.Equal(t, 0, r.Code, "%s%s", r.Stdout, r.Stderr)
}

// onRecord is where a call's records are in the audit log: the seqs of its pending record and
// of its outcome (0: not there).
type onRecord struct{ pending, outcome uint64 }

// callsOnRecord reads every tool-call record of run, by call id.
func callsOnRecord(ctx context.Context, client auditv1.AuditServiceClient, run string) (map[string]onRecord, error) {
	out := map[string]onRecord{}
	token := ""
	for {
		resp, err := client.List(ctx, &auditv1.ListRequest{Filter: &auditv1.Filter{RunId: run}, PageSize: 1000, PageToken: token})
		if err != nil {
			return nil, err
		}
		for _, rec := range resp.GetRecords() {
			tc := rec.GetToolCall()
			e := out[tc.GetCallId()]
			if tc.GetResult() == "pending" {
				e.pending = rec.GetSeq()
			} else if tc.GetPendingId() != "" {
				e.outcome = rec.GetSeq()
			}
			out[tc.GetCallId()] = e
		}
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}
