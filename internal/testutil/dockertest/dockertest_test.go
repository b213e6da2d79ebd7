package dockertest

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/ringfence/ringfence/internal/isoimage"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
	"github.com/stretchr/testify/require"
)

func TestFixtureImage(t *testing.T) {
	docker := RequireEngine(t)
	ref := FixtureImage(t)
	require.Regexp(t, regexp.MustCompile(`^sha256:[0-9a-f]{64}$`), ref)
	require.Equal(t, ref, FixtureImage(t), "built once per test binary")

	set := fixtures.Binaries(t)
	labels := CheckoutLabels(t)
	img, err := docker.ImageInspect(t.Context(), ImageRepo+":"+labels[isoimage.CheckoutLabel]+"-"+set.Hash[:24])
	require.NoError(t, err, "the image is tagged with the checkout and the binaries' content hash, for reuse")
	require.Equal(t, ref, img.ID)
	require.Equal(t, labels, img.Config.Labels, "make clean in this checkout finds it by its label")

	// What is in /bin, read back from a container that never starts.
	ctx := t.Context()
	c, err := docker.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: ref, Entrypoint: []string{"mcpfixture"}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = docker.ContainerRemove(context.Background(), c.ID, client.ContainerRemoveOptions{Force: true})
	})
	cp, err := docker.CopyFromContainer(ctx, c.ID, client.CopyFromContainerOptions{SourcePath: "/bin"})
	require.NoError(t, err)
	defer cp.Content.Close()
	var names []string
	tr := tar.NewReader(cp.Content)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if h.Typeflag == tar.TypeReg {
			names = append(names, strings.TrimPrefix(h.Name, "bin/"))
		}
	}
	sort.Strings(names)
	require.Equal(t, []string{
		fixtures.ConformanceEverything, fixtures.MCPFixture, fixtures.MCPGoEverything, fixtures.MCPGoStructured, fixtures.SDKEverything, fixtures.SDKMemory,
	}, names)
}

const helperEnv = "RINGFENCE_DOCKERTEST_HELPER"

// TestHelperRequireEngine is run as a child process by
// TestRequireEngineFailsWithoutEngine.
func TestHelperRequireEngine(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process")
	}
	RequireEngine(t)
}

func TestRequireEngineFailsWithoutEngine(t *testing.T) {
	run := func(extra ...string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRequireEngine$", "-test.v")
		cmd.Env = append(os.Environ(), helperEnv+"=1", "DOCKER_HOST=unix:///nonexistent/docker.sock", NoDockerEnv+"=")
		cmd.Env = append(cmd.Env, extra...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run()
	require.Error(t, err, "no engine must fail the test, not skip it:\n%s", out)
	require.Contains(t, out, "--- FAIL: TestHelperRequireEngine")
	require.Contains(t, out, "no Docker engine answered")
	require.Contains(t, out, NoDockerEnv+"=1")

	out, err = run(NoDockerEnv + "=1")
	require.NoError(t, err, out)
	require.Contains(t, out, "--- SKIP: TestHelperRequireEngine")
}
