// Package tests holds the end-to-end tests: they build the real binaries, start them on
// loopback ports with temporary data directories, and drive them over REST, gRPC, grpcurl and
// the CLI exactly as operators do.
package tests

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
)

// bins holds the binaries built once for the whole test run.
var bins struct {
	dir  string
	root string
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "ringfence-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	build := exec.Command("go", "build", "-o", dir+"/",
		"./cmd/ringfence", "./cmd/ringfenced", "./cmd/ringfence-registry",
		"./cmd/ringfence-publisher", "./cmd/ringfence-pool", "./cmd/ringfence-audit")
	build.Dir = root
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the binaries failed:", err)
		return 1
	}
	bins.dir, bins.root = dir, root
	return m.Run()
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("tests: cannot find the repository root (go.work) above the working directory")
		}
		dir = parent
	}
}

func bin(name string) string { return filepath.Join(bins.dir, name) }

// tool returns a pinned tool installed by `make tools`.
func tool(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(bins.root, ".tmp", "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is not installed: run `make tools` (make test does)", p)
	}
	return p
}

// daemon is one running server binary.
type daemon struct {
	t        testing.TB
	name     string
	env      []string
	DataDir  string
	GRPCAddr string
	HTTPAddr string
	// InternalAddr is a split binary's internal listener (mutual TLS only); empty for ringfenced.
	InternalAddr string
	// HTTPBase is http://HTTPAddr, or https:// when the daemon serves TLS; HTTP is the
	// client that trusts it.
	HTTPBase string
	HTTP     *http.Client
	Logs     *testutil.SyncBuffer
	cmd      *exec.Cmd
	exited   chan struct{}
}

// startDaemon starts a server binary with a fresh data dir (unless env sets one) and free
// loopback ports, and waits until /healthz answers.
func startDaemon(t testing.TB, name string, env ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, name: name, DataDir: t.TempDir(), GRPCAddr: testutil.FreeAddr(t), HTTPAddr: testutil.FreeAddr(t), Logs: &testutil.SyncBuffer{}}
	// A test that must know the HTTP address before the binary starts (an authorization
	// server's redirect URI names it) passes it in env.
	if a := envValue(env, "RINGFENCE_HTTP_ADDR"); a != "" {
		d.HTTPAddr = a
	}
	d.env = append([]string{
		"RINGFENCE_DATA_DIR=" + d.DataDir,
		"RINGFENCE_GRPC_ADDR=" + d.GRPCAddr,
		"RINGFENCE_HTTP_ADDR=" + d.HTTPAddr,
	}, env...)
	// A split binary listens on its internal address too: one of its own, unless env names it
	// (peers need it before the binary starts).
	if name != "ringfenced" {
		if d.InternalAddr = envValue(env, "RINGFENCE_INTERNAL_ADDR"); d.InternalAddr == "" {
			d.InternalAddr = testutil.FreeAddr(t)
			d.env = append(d.env, "RINGFENCE_INTERNAL_ADDR="+d.InternalAddr)
		}
	}
	d.HTTPBase, d.HTTP = "http://"+d.HTTPAddr, http.DefaultClient
	if ca := envValue(env, "RINGFENCE_TLS__CLIENT_CA_FILE"); ca != "" {
		d.HTTPBase, d.HTTP = "https://"+d.HTTPAddr, trustingClient(t, ca)
	}
	d.start()
	t.Cleanup(d.stop)
	return d
}

func (d *daemon) start() {
	t := d.t
	t.Helper()
	d.cmd = exec.Command(bin(d.name))
	d.cmd.Env = append(baseEnv(), d.env...)
	d.cmd.Stdout, d.cmd.Stderr = d.Logs, d.Logs
	require.NoError(t, d.cmd.Start())
	d.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(d.cmd, d.exited)
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-d.exited:
			t.Fatalf("%s exited during start:\n%s", d.name, d.Logs.String())
		default:
		}
		resp, err := d.HTTP.Get(d.HTTPBase + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not become healthy within 30s:\n%s", d.name, d.Logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// envValue is the value of key in env (KEY=value entries), or "".
func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// trustingClient is an HTTP client that trusts the CA in caFile (as `ringfence certs init`
// writes it).
func trustingClient(t testing.TB, caFile string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pem), "no certificate in %s", caFile)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}}}
}

// baseEnv is the environment without RINGFENCE_* variables from the developer's shell.
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RINGFENCE_") {
			out = append(out, kv)
		}
	}
	return out
}

// stop ends the process gracefully (SIGTERM), or kills it after 15s.
// requireLogged waits until the daemon's log has a line matching pattern. The process writes
// its log through a pipe the test reads on a goroutine of its own, so a line written before a
// response can reach d.Logs after the test holds the response.
func (d *daemon) requireLogged(t *testing.T, pattern string, msgAndArgs ...any) {
	t.Helper()
	re := regexp.MustCompile(pattern)
	if !assert.Eventually(t, func() bool { return re.MatchString(d.Logs.String()) }, 10*time.Second, 20*time.Millisecond, msgAndArgs...) {
		t.Fatalf("no line of %s's log matches %s:\n%s", d.name, pattern, d.Logs.String())
	}
}

func (d *daemon) stop() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (d *daemon) kill() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
}

// restart starts the same binary again on the same data dir and ports.
func (d *daemon) restart() {
	d.stop()
	d.start()
}

// result is a finished command.
type result struct {
	Stdout, Stderr string
	Code           int
}

// runCmd runs a program to completion with extra env.
func runCmd(t testing.TB, stdin io.Reader, env []string, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(baseEnv(), env...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{Stdout: stdout.String(), Stderr: stderr.String(), Code: code}
}
