package tests

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
)

// TestTheDemoRunsThrough runs make run's script (on the test's binaries, DEMO_BIN) to its end:
// each step prints what it did, the call that names an uploaded document as
// my-documents://<id> gets the document's text back from the docs server, the audit trail
// lists that call and verifies, and the call's records never hold the content. SIGTERM
// (as Ctrl-C) stops the server it started and ends the script with 0.
func TestTheDemoRunsThrough(t *testing.T) {
	dockertest.RequireEngine(t)
	poolID := "e2e-" + randomHex(6)
	grpcAddr := testutil.FreeAddr(t)
	cmd := exec.Command(filepath.Join(bins.root, "scripts", "demo.sh"))
	cmd.Env = append(baseEnv(), "DEMO_BIN="+bins.dir,
		"RINGFENCE_GRPC_ADDR="+grpcAddr, "RINGFENCE_HTTP_ADDR="+testutil.FreeAddr(t),
		"RINGFENCE_DATA_DIR="+filepath.Join(t.TempDir(), "demo-data"), "RINGFENCE_SANDBOX__POOL_ID="+poolID)
	// Its own process group: should the test fail before the script stops, the server it
	// started is killed with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		requireNoContainers(t, poolID)
	})
	// Bounded so a demo that stalls fails here: a cold image build takes up to a minute.
	require.Eventually(t, func() bool {
		select {
		case err := <-exited:
			t.Fatalf("the demo ended before its last step (%v):\n%s", err, out.String())
		default:
		}
		return strings.Contains(out.String(), "Ctrl-C stops the server.")
	}, 5*time.Minute, 100*time.Millisecond, "the demo did not finish its steps:\n%s", out.String())
	got := out.String()

	require.Contains(t, got, "== the user uploads a receipt; the researcher's call names it as my-documents://<id>")
	doc := regexp.MustCompile(`stored \.tmp/demo/receipt\.txt as document (doc-[0-9a-f]+)\n`).FindStringSubmatch(got)
	require.NotNil(t, doc, got)
	call := regexp.MustCompile(`dispatched: succeeded \(docs/read_upload, call (call-[0-9a-f]+) attempt 1, [^)]*\)\n` +
		regexp.QuoteMeta(`{"bytes":41,"text":"Taxi to the airport: 42.50 EUR, 3 March.\n"}`)).FindStringSubmatch(got)
	require.NotNil(t, call, "the docs server got the document's content:\n%s", got)
	require.Regexp(t, `researcher→docs/read_upload call `+call[1]+`#1\s+dispatched: succeeded`, got, "the audit trail lists the call")
	require.Contains(t, got, "dispatched: succeeded (docs/read_doc")
	require.Contains(t, got, "refused before dispatch (argument_scope)")
	require.Regexp(t, `ok: \d+ records verified`, got)

	r := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + grpcAddr, "RINGFENCE_API_KEY=ringfence-demo-admin-key"}, bin("ringfence"),
		"audit", "export", "--call", call[1])
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, `"tool_name":"read_upload"`)
	require.NotContains(t, r.Stdout, "42.50", "the trail never holds the document's content")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the demo did not stop on SIGTERM:\n%s", out.String())
	}
	require.Contains(t, out.String(), "demo: ringfenced stopped")
}

// TestASecondDemoIsToldWhatItNeeds: make run a second time while a demo runs on the same ports
// (which holds their data directory's lock too) is told that something listens there and to
// pick other ports, not to give it another RINGFENCE_DATA_DIR, with which it would only meet the
// ports next; a demo given a data directory another one holds is told to give it its own.
func TestASecondDemoIsToldWhatItNeeds(t *testing.T) {
	script := filepath.Join(bins.root, "scripts", "demo.sh")
	dataDir := filepath.Join(t.TempDir(), "demo-data")
	lock, err := os.OpenFile(dataDir+".lock", os.O_CREATE|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB), "the running demo's lock")
	running, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer running.Close()

	r := runCmd(t, nil, []string{
		"RINGFENCE_GRPC_ADDR=" + running.Addr().String(), "RINGFENCE_HTTP_ADDR=" + testutil.FreeAddr(t),
		"RINGFENCE_DATA_DIR=" + dataDir,
	}, script)
	require.Equal(t, 1, r.Code, r.Stdout+r.Stderr)
	require.Contains(t, r.Stderr, "demo: something already listens on "+running.Addr().String()+" (a demo still running?)")
	require.Contains(t, r.Stderr, "pick other ports with RINGFENCE_GRPC_ADDR and RINGFENCE_HTTP_ADDR")
	require.NotContains(t, r.Stderr, "RINGFENCE_DATA_DIR")

	r = runCmd(t, nil, []string{
		"RINGFENCE_GRPC_ADDR=" + testutil.FreeAddr(t), "RINGFENCE_HTTP_ADDR=" + testutil.FreeAddr(t),
		"RINGFENCE_DATA_DIR=" + dataDir,
	}, script)
	require.Equal(t, 1, r.Code, r.Stdout+r.Stderr)
	require.Contains(t, r.Stderr, "demo: another demo is using "+dataDir)
	require.Contains(t, r.Stderr, "give this one a RINGFENCE_DATA_DIR of its own")
}
