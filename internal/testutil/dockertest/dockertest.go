// Package dockertest gives tests a real Docker engine and the fixture
// isolation image. Tests that need the engine fail, not skip, when none
// answers: a CI run that silently skipped the isolation tests would prove
// nothing. RINGFENCE_TEST_NO_DOCKER=1 is the one explicit way to skip them.
package dockertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/ringfence/ringfence/internal/isoimage"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
)

// NoDockerEnv, set to 1, makes engine-backed tests skip.
const NoDockerEnv = "RINGFENCE_TEST_NO_DOCKER"

// ImageRepo is the repository under which fixture images are tagged; the tag
// is a prefix of the binaries' content hash.
const ImageRepo = "ringfence-test/fixtures"

// pingTimeout bounds how long RequireEngine waits for the engine to answer.
const pingTimeout = 10 * time.Second

// RequireEngine returns a client of the engine named by the DOCKER_*
// environment, closed when the test ends. It fails the test when no engine
// answers, unless RINGFENCE_TEST_NO_DOCKER=1, in which case it skips.
func RequireEngine(t testing.TB) *client.Client {
	t.Helper()
	if os.Getenv(NoDockerEnv) == "1" {
		t.Skipf("dockertest: %s=1: skipping a test that needs a Docker engine", NoDockerEnv)
	}
	c, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatalf("dockertest: cannot configure a Docker client: %v (set %s=1 to skip engine tests)", err, NoDockerEnv)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	if _, err := c.Ping(ctx, client.PingOptions{}); err != nil {
		t.Fatalf("dockertest: no Docker engine answered at %s within %s: %v\n"+
			"these tests need a real engine (start dockerd, or point DOCKER_HOST at one); set %s=1 to skip them explicitly",
			c.DaemonHost(), pingTimeout, err, NoDockerEnv)
	}
	return c
}

var (
	imageOnce sync.Once
	imageRef  string
	imageErr  error
)

// CheckoutID is the id of the checkout the tests run in, as scripts/checkout-id.sh computes
// it: the first 16 hex digits of the SHA-256 of the checkout's physical path.
func CheckoutID(dir string) (string, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(real)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:])[:16], nil
}

// CheckoutLabels are the labels of every image a test builds: isoimage.CheckoutLabel with
// this checkout's id, so that make clean in this checkout removes them, and in no other.
func CheckoutLabels(t testing.TB) map[string]string {
	t.Helper()
	labels, err := checkoutLabels()
	if err != nil {
		t.Fatalf("dockertest: %v", err)
	}
	return labels
}

func checkoutLabels() (map[string]string, error) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		return nil, err
	}
	id, err := CheckoutID(root)
	if err != nil {
		return nil, err
	}
	return map[string]string{isoimage.CheckoutLabel: id}, nil
}

// FixtureImage returns the pinned reference ("sha256:<64 hex>") of an
// isolation image holding every fixture binary in /bin. The image is built
// once per checkout and content: it is tagged ImageRepo:<checkout id>-<hash
// prefix>, labeled with the checkout (CheckoutLabels), and an existing image
// with that tag is reused.
func FixtureImage(t testing.TB) string {
	t.Helper()
	docker := RequireEngine(t)
	set := fixtures.Binaries(t)
	imageOnce.Do(func() { imageRef, imageErr = fixtureImage(docker, set) })
	if imageErr != nil {
		t.Fatalf("dockertest: %v", imageErr)
	}
	return imageRef
}

func fixtureImage(docker *client.Client, set fixtures.Set) (string, error) {
	labels, err := checkoutLabels()
	if err != nil {
		return "", err
	}
	tag := ImageRepo + ":" + labels[isoimage.CheckoutLabel] + "-" + set.Hash[:24]
	var ref string
	err = fixtures.WithLock(func(string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if img, err := docker.ImageInspect(ctx, tag); err == nil {
			ref = img.ID
			return nil
		}
		var progress bytes.Buffer
		id, err := isoimage.Build(ctx, docker, isoimage.BuildOptions{
			Binaries: set.Sorted(),
			Name:     tag,
			Progress: &progress,
			Labels:   labels,
		})
		if err != nil {
			return fmt.Errorf("build fixture image: %w\n%s", err, progress.String())
		}
		ref = id
		return nil
	})
	return ref, err
}
