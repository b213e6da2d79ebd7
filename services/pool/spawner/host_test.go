package spawner

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
)

func TestIsolationRequiredWithoutImage(t *testing.T) {
	r, err := New(Config{})
	require.NoError(t, err)
	_, err = r.Spawn(t.Context(), fixtureSpec())
	require.Equal(t, ClassIsolationRequired, ClassOf(err))
	require.Contains(t, err.Error(), IsolationImageEnv)

	rep, err := r.Preflight(t.Context())
	require.NoError(t, err)
	require.Equal(t, "none", rep.Isolation)
}

func hostRouter(t *testing.T, logs *testutil.SyncBuffer, mut ...func(*Config)) *Router {
	t.Helper()
	cfg := Config{AllowUnisolated: true, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	for _, m := range mut {
		m(&cfg)
	}
	r, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close(context.Background())) })
	return r
}

func TestHostEnvironmentAndWorkingDirectory(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	t.Setenv("RINGFENCE_TEST_SERVICE_SECRET", "must-not-leak")
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs, func(c *Config) {
		c.AllowedEnvKeys = []string{"APP_TOKEN", "APP_MODE"}
		c.HostPATH = filepath.Dir(fixture)
	})
	spec := fixtureSpec()
	spec.Command = "mcpfixture" // resolved through HostPATH only
	spec.Env = map[string]string{"APP_TOKEN": "tok", "APP_MODE": "dev"}
	s := spawn(t, r, spec)

	out := callStructured[struct {
		Env []string `json:"env"`
		Cwd string   `json:"cwd"`
	}](t, s, "env", nil)
	require.Equal(t, []string{"APP_MODE=dev", "APP_TOKEN=tok", "PATH=" + filepath.Dir(fixture)}, out.Env,
		"a host server sees only the allowlisted keys and a minimal PATH")
	require.True(t, strings.HasPrefix(filepath.Base(out.Cwd), "ringfence-mcp-fixture-"), out.Cwd)
	st, err := os.Stat(out.Cwd)
	require.NoError(t, err)
	require.True(t, st.IsDir())

	require.Contains(t, logs.String(), "UNISOLATED")
	require.Contains(t, logs.String(), "level=WARN")

	require.NoError(t, s.Close(t.Context()))
	_, err = os.Stat(out.Cwd)
	require.True(t, os.IsNotExist(err), "the private working directory is removed on close")
	require.NoError(t, s.Err())
}

func TestHostRefusesSteeringEnv(t *testing.T) {
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs, func(c *Config) { c.AllowedEnvKeys = []string{"APP_TOKEN"} })
	spec := fixtureSpec()
	spec.Command = fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	for _, k := range []string{"LD_PRELOAD", "PATH", "OTHER"} {
		spec.Env = map[string]string{k: "x"}
		_, err := r.Spawn(t.Context(), spec)
		require.Equal(t, ClassInvalidSpec, ClassOf(err), k)
	}
	require.NotContains(t, logs.String(), "UNISOLATED", "a refused spec starts nothing")
}

func TestHostErrorClasses(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-exec")
	require.NoError(t, os.WriteFile(notExec, []byte("x"), 0o644))
	notProgram := filepath.Join(dir, "not-program")
	require.NoError(t, os.WriteFile(notProgram, []byte("\x00\x01\x02\x03"), 0o755))
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs)
	tests := []struct {
		name  string
		spec  Spec
		class Class
	}{
		{name: "not on PATH", spec: Spec{ServerRef: "x", Transport: TransportStdio, Command: "no-such-server-anywhere", Purpose: PurposeRun}, class: ClassCommandNotFound},
		{name: "relative path", spec: Spec{ServerRef: "x", Transport: TransportStdio, Command: "./mcpfixture", Purpose: PurposeRun}, class: ClassInvalidSpec},
		{name: "not executable", spec: hostSpec(notExec), class: ClassCommandNotFound},
		{name: "not a program", spec: hostSpec(notProgram), class: ClassCommandNotFound},
		{name: "exits before handshake", spec: hostSpec(fixture, "--exit-before-handshake"), class: ClassExitedBeforeHandshake},
		{name: "garbage", spec: withHandshake(hostSpec(fixture, "--garbage"), 2e9), class: ClassNotMCPServer},
		{name: "never answers", spec: withHandshake(hostSpec(fixture, "--never-answer"), 1e9), class: ClassHandshakeTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := r.Spawn(t.Context(), tt.spec)
			require.Equal(t, tt.class, ClassOf(err), "%v", err)
		})
	}
	t.Run("crash during list", func(t *testing.T) {
		s := spawn(t, r, hostSpec(fixture, "--crash-during-list"))
		_, err := s.ListTools(t.Context())
		require.Equal(t, ClassCrashed, ClassOf(err), "%v", err)
		require.Contains(t, err.Error(), "exited with status 2")
	})
}

func hostSpec(path string, args ...string) Spec {
	s := fixtureSpec(args...)
	s.Command = path
	return s
}

func TestHostStdoutHygieneAndRedaction(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs, func(c *Config) { c.AllowedEnvKeys = []string{"APP_TOKEN"} })
	spec := hostSpec(fixture, "--banner", "--stderr-env", "APP_TOKEN")
	spec.Env = map[string]string{"APP_TOKEN": "host-secret-42"}
	s := spawn(t, r, spec)
	tools, err := s.ListTools(t.Context())
	require.NoError(t, err)
	require.Contains(t, toolNames(tools), "echo")
	tail := s.StderrTail()
	require.Contains(t, tail, "[stdout] mcpfixture banner: starting up")
	require.Contains(t, tail, "APP_TOKEN="+Mask)
	require.NotContains(t, tail, "host-secret-42")
	require.NotContains(t, logs.String(), "host-secret-42")
}
