package dockertest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ringfence/ringfence/internal/testutil"
)

// RegistryBinary is Debian's distribution registry (package docker-registry), which
// scripts/ensure-docker.sh installs beside the engine.
const RegistryBinary = "docker-registry"

// DigestRef pushes the fixture image to a registry of its own on loopback and returns the
// reference an operator pins in production: "<registry>/<name>@sha256:<digest>". The engine
// then knows the image by that digest (its RepoDigests), as after a `docker pull` of it. The
// registry stops when the test ends; the engine keeps the digest, which names the same
// content forever.
func DigestRef(t testing.TB) string {
	t.Helper()
	image := FixtureImage(t)
	bin, err := exec.LookPath(RegistryBinary)
	if err != nil {
		t.Fatalf("dockertest: %s is not installed: install Debian's docker-registry package (make test does), or set %s=1 to skip engine tests", RegistryBinary, NoDockerEnv)
	}
	dir := t.TempDir()
	addr := testutil.FreeAddr(t)
	config := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(config), 0o600); err != nil {
		t.Fatalf("dockertest: %v", err)
	}
	logs := &testutil.SyncBuffer{}
	cmd := exec.Command(bin, "serve", filepath.Join(dir, "config.yml"))
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("dockertest: start %s: %v", RegistryBinary, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	waitForRegistry(t, addr, logs)

	// 127.0.0.0/8 is an insecure registry to every engine by default, so plain HTTP works.
	repo := addr + "/ringfence-test/fixture"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	docker := func(args ...string) string {
		out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("dockertest: docker %s: %v\n%s\nregistry log:\n%s", strings.Join(args, " "), err, out, logs.String())
		}
		return strings.TrimSpace(string(out))
	}
	docker("tag", image, repo+":pushed")
	// Each run pushes to a registry on a new port: drop its references afterwards, so the
	// fixture image does not collect them (the image keeps its own tag).
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", repo+":pushed").Run() })
	docker("push", repo+":pushed")
	for _, d := range strings.Fields(docker("image", "inspect", "--format", `{{join .RepoDigests " "}}`, image)) {
		if strings.HasPrefix(d, repo+"@sha256:") {
			t.Cleanup(func() { _ = exec.Command("docker", "rmi", d).Run() })
			return d
		}
	}
	t.Fatalf("dockertest: the engine has no digest of %s in %s after the push", image, repo)
	return ""
}

func waitForRegistry(t testing.TB, addr string, logs *testutil.SyncBuffer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("dockertest: the registry on %s did not answer within 30s:\n%s", addr, logs.String())
}
