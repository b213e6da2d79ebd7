package tests

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
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
