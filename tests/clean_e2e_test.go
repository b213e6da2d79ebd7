package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/isoimage"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
)

// TestCleanRemovesOnlyThisCheckoutsImages: make clean removes the images its checkout built
// (labeled with the checkout's id) and leaves another checkout's on the same engine; the id
// the script computes is the one the tests label their images with.
func TestCleanRemovesOnlyThisCheckoutsImages(t *testing.T) {
	docker := dockertest.RequireEngine(t)
	bin := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	build := func(checkout string) string {
		id, err := dockertest.CheckoutID(checkout)
		require.NoError(t, err)
		ref, err := isoimage.Build(t.Context(), docker, isoimage.BuildOptions{
			Binaries: []string{bin}, Name: "ringfence-test/clean:" + id, Labels: map[string]string{isoimage.CheckoutLabel: id},
		})
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = docker.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{Force: true}) })
		return ref
	}
	mine, other := t.TempDir(), t.TempDir()
	mineRef, otherRef := build(mine), build(other)
	require.NotEqual(t, mineRef, otherRef, "the same binaries, another checkout: another image")

	clean := filepath.Join(bins.root, "scripts", "clean-images.sh")
	r := runCmd(t, nil, nil, clean, mine)
	require.Equal(t, 0, r.Code, r.Stdout+r.Stderr)
	require.Contains(t, r.Stdout, "clean: removing the 1 image(s) this checkout")
	_, err := docker.ImageInspect(t.Context(), mineRef)
	require.Error(t, err, "this checkout's image is gone")
	_, err = docker.ImageInspect(t.Context(), otherRef)
	require.NoError(t, err, "another checkout's image stays")

	r = runCmd(t, nil, nil, clean, mine)
	require.Equal(t, 0, r.Code, r.Stdout+r.Stderr)
	require.Contains(t, r.Stdout, "no images of this checkout")

	// make clean runs it on its own checkout.
	out, err := exec.Command("make", "-C", bins.root, "-n", "clean").CombinedOutput()
	require.NoError(t, err, string(out))
	require.True(t, strings.Contains(string(out), "scripts/clean-images.sh"), string(out))
}

// TestTwoCheckoutsKeepTheirDemoImages: the demo's isolation image (scripts/demo-image.sh, which
// make run calls) is tagged with its checkout's id, so a second checkout's make run does not
// take the first one's tag and leave its image dangling (a `docker image prune` would remove it
// under the first one's running demo); each checkout's make clean removes its own image alone.
func TestTwoCheckoutsKeepTheirDemoImages(t *testing.T) {
	docker := dockertest.RequireEngine(t)
	server := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	script := filepath.Join(bins.root, "scripts", "demo-image.sh")
	checkout := func() (dir, tag string) {
		dir = t.TempDir()
		require.NoError(t, os.Mkdir(filepath.Join(dir, "bin"), 0o755))
		require.NoError(t, os.Symlink(bin("ringfence"), filepath.Join(dir, "bin", "ringfence")))
		id, err := dockertest.CheckoutID(dir)
		require.NoError(t, err)
		return dir, "ringfence-demo:" + id
	}
	build := func(dir string) string {
		r := runCmd(t, nil, nil, script, server, dir)
		require.Equal(t, 0, r.Code, r.Stdout+r.Stderr)
		ref := strings.TrimSpace(r.Stdout)
		require.True(t, strings.HasPrefix(ref, "sha256:"), "it prints the reference to pin alone: %q", r.Stdout)
		t.Cleanup(func() { _, _ = docker.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{Force: true}) })
		return ref
	}
	tags := func(ref string) []string {
		img, err := docker.ImageInspect(t.Context(), ref)
		require.NoError(t, err)
		return img.RepoTags
	}
	first, firstTag := checkout()
	second, secondTag := checkout()
	firstRef := build(first)
	secondRef := build(second)
	require.NotEqual(t, firstRef, secondRef)
	require.Equal(t, []string{firstTag}, tags(firstRef), "the second checkout's demo image took the first one's tag")
	require.Equal(t, []string{secondTag}, tags(secondRef))

	r := runCmd(t, nil, nil, filepath.Join(bins.root, "scripts", "clean-images.sh"), first)
	require.Equal(t, 0, r.Code, r.Stdout+r.Stderr)
	_, err := docker.ImageInspect(t.Context(), firstRef)
	require.Error(t, err, "the first checkout's image is gone")
	require.Equal(t, []string{secondTag}, tags(secondRef), "the second checkout's image stays, tagged")
}

// TestCleanRefusesWhileADemoRuns: make clean removes .tmp, where a running demo keeps its data
// directory and the lock it holds while its ringfenced lives: while one runs, clean refuses,
// naming the lock and what to do, and removes nothing; once it stopped, clean goes on.
func TestCleanRefusesWhileADemoRuns(t *testing.T) {
	checkout := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(checkout, ".tmp", "demo-data-50051"), 0o755))
	lockPath := filepath.Join(checkout, ".tmp", "demo-data-50051.lock")
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB), "the running demo's lock")

	clean := filepath.Join(bins.root, "scripts", "clean-images.sh")
	r := runCmd(t, nil, nil, clean, checkout)
	require.Equal(t, 1, r.Code, r.Stdout+r.Stderr)
	require.Contains(t, r.Stderr, "clean: a demo of this checkout still runs (it holds "+lockPath+"): stop it (Ctrl-C in its shell), then make clean again")

	require.NoError(t, lock.Close(), "the demo stops")
	r = runCmd(t, nil, nil, clean, checkout)
	require.Equal(t, 0, r.Code, r.Stdout+r.Stderr)
}
