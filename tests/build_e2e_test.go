package tests

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMakeBuildWritesStaticBinaries: deploy/Dockerfile copies what make build writes into a
// FROM-scratch image, which has no loader, so every binary must be static whatever the
// machine's cgo default (a dynamic one fails in the image with "exec …: no such file or
// directory"). The build goes to a directory of the test's own (OUT).
func TestMakeBuildWritesStaticBinaries(t *testing.T) {
	out := t.TempDir()
	cmd := exec.CommandContext(t.Context(), "make", "-C", bins.root, "OUT="+out, "build")
	cmd.Env = append(baseEnv(), "CGO_ENABLED=1") // as a machine with a C compiler defaults to
	log, err := cmd.CombinedOutput()
	require.NoError(t, err, string(log))
	for _, name := range []string{"ringfence", "ringfenced", "ringfence-registry", "ringfence-publisher", "ringfence-pool", "ringfence-audit"} {
		f, err := elf.Open(filepath.Join(out, name))
		require.NoError(t, err)
		for _, p := range f.Progs {
			require.NotEqual(t, elf.PT_INTERP, p.Type, "%s is dynamically linked: a FROM-scratch image cannot run it", name)
		}
		libs, err := f.ImportedLibraries()
		require.NoError(t, err)
		require.Empty(t, libs, name)
		require.NoError(t, f.Close())
	}

	// Each binary says which commit it was built from (Go's own VCS stamp is off in workspace
	// mode): what an operator compares before upgrading pool hosts together.
	head, err := exec.Command("git", "-C", bins.root, "rev-parse", "--short=12", "HEAD").Output()
	require.NoError(t, err)
	for _, name := range []string{"ringfence", "ringfenced", "ringfence-pool"} {
		got, err := exec.Command(filepath.Join(out, name), "--version").Output()
		require.NoError(t, err, name)
		require.Regexp(t, `^`+regexp.QuoteMeta(name)+` commit `+strings.TrimSpace(string(head))+`(\+modified)? \(go1\.\d+`, string(got))
	}
}

// TestMakeBuildFollowsACommit: a commit changes no source, but it changes the commit the
// binaries must name: make build after it rebuilds them, so --version (and the serving line)
// names the new commit rather than the one before. Built in a clone of the checkout's HEAD.
func TestMakeBuildFollowsACommit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "clone")
	git := func(args ...string) string {
		out, err := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.invalid"}, args...)...).CombinedOutput()
		require.NoError(t, err, string(out))
		return strings.TrimSpace(string(out))
	}
	out, err := exec.Command("git", "clone", "--quiet", "--shared", bins.root, dir).CombinedOutput()
	require.NoError(t, err, string(out))
	version := func() string {
		cmd := exec.CommandContext(t.Context(), "make", "-C", dir, "build")
		cmd.Env = baseEnv()
		log, err := cmd.CombinedOutput()
		require.NoError(t, err, string(log))
		got, err := exec.Command(filepath.Join(dir, "bin", "ringfenced"), "--version").Output()
		require.NoError(t, err)
		return string(got)
	}
	require.Contains(t, version(), "commit "+git("rev-parse", "--short=12", "HEAD")+" (")
	git("commit", "--quiet", "--allow-empty", "-m", "next")
	require.Contains(t, version(), "commit "+git("rev-parse", "--short=12", "HEAD")+" (")
}
