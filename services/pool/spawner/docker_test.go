package spawner

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
	"github.com/stretchr/testify/require"
)

type probeResult struct {
	UID            int    `json:"uid"`
	GID            int    `json:"gid"`
	Groups         []int  `json:"groups"`
	RootWriteError string `json:"root_write_error"`
	TmpWriteError  string `json:"tmp_write_error"`
	TmpExecError   string `json:"tmp_exec_error"`
	DialError      string `json:"dial_error"`
	LookupError    string `json:"lookup_error"`
	CapEff         string `json:"cap_eff"`
	CapBnd         string `json:"cap_bnd"`
	NoNewPrivs     string `json:"no_new_privs"`
}

// TestDockerIsolationFromInside proves the profile from inside the
// container, by what the server can and cannot do.
func TestDockerIsolationFromInside(t *testing.T) {
	e := dockerEnv(t)
	s := spawn(t, e.router(), fixtureSpec())
	p := callStructured[probeResult](t, s, "probe", nil)

	require.Contains(t, p.RootWriteError, "read-only file system", "the root file system must be read-only")
	require.Equal(t, 65534, p.UID)
	require.Equal(t, 65534, p.GID)
	require.Subset(t, []int{65534}, p.Groups, "no supplementary groups beyond 65534")
	require.Contains(t, p.DialError, "network is unreachable")
	require.NotEmpty(t, p.LookupError)
	require.Empty(t, p.TmpWriteError, "/tmp must be writable")
	require.Contains(t, p.TmpExecError, "permission denied", "/tmp must be noexec")
	require.Equal(t, "0000000000000000", p.CapEff)
	require.Equal(t, "0000000000000000", p.CapBnd)
	require.Equal(t, "1", p.NoNewPrivs)
}

func TestDockerPIDLimitStopsForkLoop(t *testing.T) {
	e := dockerEnv(t)
	s := spawn(t, e.router(func(c *Config) { c.PidsLimit = 64 }), fixtureSpec())
	out := callStructured[struct {
		Target  int    `json:"target"`
		Started int    `json:"started"`
		Error   string `json:"error"`
	}](t, s, "fork_bomb", map[string]any{"max": 1000})
	t.Logf("fork_bomb: started %d of %d: %s", out.Started, out.Target, out.Error)
	require.Less(t, out.Started, 64, "the PID limit must stop the loop")
	require.Contains(t, out.Error, "resource temporarily unavailable")
	// The server survived its own fork bomb and still answers.
	_ = callStructured[map[string]any](t, s, "add", map[string]any{"a": 1, "b": 2})
}

func TestDockerMemoryLimitKillsHog(t *testing.T) {
	e := dockerEnv(t)
	s := spawn(t, e.router(func(c *Config) { c.MemoryBytes = 64 << 20 }), fixtureSpec())
	_, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "hog", Arguments: map[string]any{"max_mib": 1024}})
	require.Error(t, err)
	require.Equal(t, ClassCrashed, ClassOf(err), "%v", err)
	require.Contains(t, err.Error(), "killed: memory limit")

	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done was not closed after the server was killed")
	}
	require.Equal(t, ClassCrashed, ClassOf(s.Err()))
	require.Contains(t, s.Err().Error(), "killed: memory limit (64 MiB)")
}

// TestDockerInspectShowsProfile reads the spawned container back from the
// engine: what the daemon applied, not what the spawner meant to send.
func TestDockerInspectShowsProfile(t *testing.T) {
	e := dockerEnv(t)
	r := e.router(func(c *Config) { c.AllowedEnvKeys = []string{"APP_TOKEN"} })
	spec := fixtureSpec("--banner")
	spec.Env = map[string]string{"APP_TOKEN": "tok"}
	spec.RunID = "run-1"
	spec.Purpose = PurposeRun
	s := spawn(t, r, spec)

	ids := e.containers()
	require.Len(t, ids, 1)
	got, err := e.docker.ContainerInspect(t.Context(), ids[0], client.ContainerInspectOptions{})
	require.NoError(t, err)
	c := got.Container
	cc, hc := c.Config, c.HostConfig

	require.Equal(t, e.image, c.Image, "the container runs the image by ID")
	require.Equal(t, "65534:65534", cc.User)
	require.Equal(t, []string{"mcpfixture"}, cc.Entrypoint)
	require.Equal(t, []string{"--banner"}, cc.Cmd)
	require.ElementsMatch(t, []string{"APP_TOKEN=tok", "PATH=/bin"}, cc.Env, "only the allowlisted key plus the image's own ENV")
	require.True(t, cc.OpenStdin && cc.StdinOnce && cc.AttachStdin && cc.AttachStdout && cc.AttachStderr)
	require.False(t, cc.Tty)
	require.Empty(t, cc.Volumes)
	// The container has the pool's labels and, as Docker gives every container, its image's
	// (the fixture image's checkout label).
	img, err := e.docker.ImageInspect(t.Context(), e.image)
	require.NoError(t, err)
	want := map[string]string{
		LabelManaged: "true", LabelPool: e.poolID, LabelInstance: r.cfg.InstanceID,
		LabelServer: "fixture", LabelPurpose: "run", LabelRun: "run-1",
	}
	maps.Copy(want, img.Config.Labels)
	require.Equal(t, want, cc.Labels)

	require.Equal(t, container.NetworkMode("none"), hc.NetworkMode)
	require.True(t, hc.ReadonlyRootfs)
	require.Equal(t, []string{"CAP_ALL"}, normalizeCaps(hc.CapDrop))
	require.Empty(t, hc.CapAdd)
	require.Equal(t, []string{"no-new-privileges"}, hc.SecurityOpt)
	require.Equal(t, map[string]string{"/tmp": "rw,noexec,nosuid,nodev,size=67108864"}, hc.Tmpfs)
	require.NotNil(t, hc.Init)
	require.True(t, *hc.Init)
	require.True(t, hc.AutoRemove)
	require.Equal(t, container.IPCModePrivate, hc.IpcMode)
	require.False(t, hc.Privileged)
	require.Empty(t, hc.Binds)
	require.Empty(t, hc.Mounts)
	require.Empty(t, hc.VolumesFrom)
	require.Empty(t, hc.PortBindings)
	require.False(t, hc.PublishAllPorts)
	require.Equal(t, int64(1e9), hc.NanoCPUs)
	require.Equal(t, int64(512<<20), hc.Memory)
	require.Equal(t, int64(512<<20), hc.MemorySwap)
	require.NotNil(t, hc.PidsLimit)
	require.Equal(t, int64(128), *hc.PidsLimit)
	require.Equal(t, "none", hc.LogConfig.Type)
	require.Empty(t, c.Mounts, "no mounts at all, not even anonymous volumes")

	require.NoError(t, s.Close(t.Context()))
}

func normalizeCaps(caps []string) []string {
	out := make([]string, len(caps))
	for i, c := range caps {
		c = strings.ToUpper(c)
		if !strings.HasPrefix(c, "CAP_") {
			c = "CAP_" + c
		}
		out[i] = c
	}
	return out
}

// TestDockerRefusesSteering: nothing a spec carries can change the image,
// user, limits, mounts or network; the only channel, the environment, is
// refused for keys that steer the runtime or loader, before anything starts.
func TestDockerRefusesSteering(t *testing.T) {
	e := dockerEnv(t)
	keys := []string{"DOCKER_HOST", "LD_PRELOAD", "PATH", "HOME", "DOCKER_CONFIG", "NODE_OPTIONS", "NOT_ALLOWLISTED"}
	r := e.router(func(c *Config) { c.AllowedEnvKeys = []string{"APP_TOKEN"} })
	for _, k := range keys {
		t.Run(k, func(t *testing.T) {
			spec := fixtureSpec()
			spec.Env = map[string]string{"APP_TOKEN": "ok", k: "v4lue-never-shown"}
			_, err := r.Spawn(t.Context(), spec)
			require.Equal(t, ClassInvalidSpec, ClassOf(err), "%v", err)
			require.Contains(t, err.Error(), k)
			require.NotContains(t, err.Error(), "v4lue-never-shown")
			require.Empty(t, e.containers(), "nothing may be created for a refused spec")
		})
	}
	// Arguments reach only the command: flags that would mean something to
	// `docker run` are plain arguments of the server.
	spec := fixtureSpec("--user=0:0", "--privileged", "-v", "/:/host", "--network=host")
	_, err := r.Spawn(t.Context(), spec)
	require.Error(t, err, "the fixture refuses unknown flags: they went to the server, not the engine")
	require.Equal(t, ClassExitedBeforeHandshake, ClassOf(err))
}

// TestDockerErrorClasses runs one fixture per class and checks, after each,
// that nothing of the test's pool is left in the engine.
func TestDockerErrorClasses(t *testing.T) {
	e := dockerEnv(t)
	r := e.router()
	tests := []struct {
		name      string
		spec      Spec
		class     Class
		inMessage string
		inTail    string
	}{
		{
			name:      "command not found",
			spec:      Spec{ServerRef: "missing", Transport: TransportStdio, Command: "no-such-server", Purpose: PurposeDiscovery},
			class:     ClassCommandNotFound,
			inMessage: `"no-such-server"`,
			inTail:    "no-such-server",
		},
		{
			name:      "exits before handshake",
			spec:      withHandshake(fixtureSpec("--exit-before-handshake"), 10*time.Second),
			class:     ClassExitedBeforeHandshake,
			inMessage: "exited with status 3",
			inTail:    "exiting before handshake",
		},
		{
			name:      "not an MCP server",
			spec:      withHandshake(fixtureSpec("--garbage"), 3*time.Second),
			class:     ClassNotMCPServer,
			inMessage: "none of them JSON-RPC",
			inTail:    "not an MCP server",
		},
		{
			name:      "never answers",
			spec:      withHandshake(fixtureSpec("--never-answer"), 2*time.Second),
			class:     ClassHandshakeTimeout,
			inMessage: "within 2s",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := r.Spawn(t.Context(), tt.spec)
			require.Error(t, err)
			require.Equal(t, tt.class, ClassOf(err), "%v", err)
			require.Contains(t, err.Error(), tt.inMessage)
			var se *Error
			require.ErrorAs(t, err, &se)
			require.Contains(t, se.StderrTail, tt.inTail)
			require.NotContains(t, se.Message, "goroutine", "no stack traces in messages")
			require.Empty(t, e.containers())
		})
	}
	t.Run("crashes during tools/list", func(t *testing.T) {
		s, err := r.Spawn(t.Context(), fixtureSpec("--crash-during-list"))
		require.NoError(t, err)
		_, err = s.ListTools(t.Context())
		require.Equal(t, ClassCrashed, ClassOf(err), "%v", err)
		require.Contains(t, err.Error(), "exited with status 2")
		var se *Error
		require.ErrorAs(t, err, &se)
		require.Contains(t, se.StderrTail, "crashing during tools/list")
		<-s.Done()
		require.Equal(t, ClassCrashed, ClassOf(s.Err()))
		require.NoError(t, s.Close(t.Context()))
		require.Empty(t, e.containers())
	})
	t.Run("tools/list never answered", func(t *testing.T) {
		r2 := e.router(func(c *Config) { c.ListTimeout = time.Second })
		s := spawn(t, r2, fixtureSpec("--hang-list"))
		_, err := s.ListTools(context.Background())
		require.Equal(t, ClassTimeout, ClassOf(err), "%v", err)
		require.Contains(t, err.Error(), "tools/list within 1s")
		require.NoError(t, s.Err(), "a slow server is not a dead one")
		require.NoError(t, s.Close(t.Context()))
		require.Empty(t, e.containers())
	})
	t.Run("caller gives up during the handshake", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := r.Spawn(ctx, withHandshake(fixtureSpec("--never-answer"), time.Minute))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Empty(t, ClassOf(err), "the caller's own deadline is not a server fault")
		require.Empty(t, e.containers())
	})
	t.Run("caller already gone", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := r.Spawn(ctx, fixtureSpec())
		require.ErrorIs(t, err, context.Canceled)
		require.Empty(t, e.containers())
	})
	t.Run("engine refuses the container", func(t *testing.T) {
		r2 := e.router(func(c *Config) { c.Network = "ringfence-no-such-network" })
		_, err := r2.Spawn(t.Context(), fixtureSpec())
		require.Equal(t, ClassSpawnFailed, ClassOf(err), "%v", err)
		require.Contains(t, err.Error(), "ringfence-no-such-network")
		require.Empty(t, e.containers())
	})
	t.Run("image removed after preflight", func(t *testing.T) {
		img := buildDerivedImage(t, e, "LABEL ringfence.test="+randomID())
		r2 := e.router(func(c *Config) { c.Image = img })
		_, err := r2.Preflight(t.Context())
		require.NoError(t, err)
		_, err = e.docker.ImageRemove(t.Context(), img, client.ImageRemoveOptions{Force: true})
		require.NoError(t, err)
		_, err = r2.Spawn(t.Context(), fixtureSpec())
		require.Equal(t, ClassImageMissing, ClassOf(err), "%v", err)
		require.Empty(t, e.containers())
	})
	t.Run("image missing", func(t *testing.T) {
		r2 := e.router(func(c *Config) { c.Image = "sha256:" + strings.Repeat("0", 64) })
		_, err := r2.Spawn(t.Context(), fixtureSpec())
		require.Equal(t, ClassImageMissing, ClassOf(err), "%v", err)
		_, err = r2.Preflight(t.Context())
		require.Equal(t, ClassImageMissing, ClassOf(err), "%v", err)
		require.Empty(t, e.containers())
	})
}

func withHandshake(s Spec, d time.Duration) Spec {
	s.HandshakeTimeout = d
	return s
}

func TestDockerStdoutHygieneAndRedaction(t *testing.T) {
	e := dockerEnv(t)
	r := e.router(func(c *Config) { c.AllowedEnvKeys = []string{"APP_TOKEN"} })
	spec := fixtureSpec("--banner", "--stderr-env", "APP_TOKEN")
	spec.Env = map[string]string{"APP_TOKEN": "tok-0123456789-secret"}
	s := spawn(t, r, spec)
	tools, err := s.ListTools(t.Context())
	require.NoError(t, err)
	require.Contains(t, toolNames(tools), "probe")

	tail := s.StderrTail()
	require.Contains(t, tail, "[stdout] mcpfixture banner: starting up")
	require.Contains(t, tail, `[stdout] {&#34;level&#34;:&#34;info&#34;`, "the tail is escaped like any server-chosen text")
	require.Contains(t, tail, "APP_TOKEN="+Mask)
	require.NotContains(t, tail, "tok-0123456789-secret")
}

func TestDockerPagingAndToolBound(t *testing.T) {
	e := dockerEnv(t)
	r := e.router(func(c *Config) { c.MaxTools = 100 })
	t.Run("follows every page", func(t *testing.T) {
		s := spawn(t, r, fixtureSpec("--tools", "80", "--page-size", "7"))
		tools, err := s.ListTools(t.Context())
		require.NoError(t, err)
		require.Len(t, tools, 80+6)
	})
	t.Run("refuses more than the bound", func(t *testing.T) {
		s := spawn(t, r, fixtureSpec("--tools", "200", "--page-size", "50"))
		_, err := s.ListTools(t.Context())
		require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
		require.Contains(t, err.Error(), "more than 100 tools")
	})
	t.Run("refuses more than the byte bound, page by page", func(t *testing.T) {
		small := e.router(func(c *Config) { c.MaxListingBytes = 4 << 10 })
		s := spawn(t, small, fixtureSpec("--tools", "80", "--page-size", "7"))
		_, err := s.ListTools(t.Context())
		require.Equal(t, ClassProtocolViolation, ClassOf(err), "%v", err)
		require.Contains(t, err.Error(), "more than 4096 bytes of tools")
	})
}

func TestDockerToolListChanged(t *testing.T) {
	e := dockerEnv(t)
	var changed atomic.Int32
	got := make(chan []string, 1)
	var s *Session
	spec := fixtureSpec("--grow-tool")
	spec.OnToolListChanged = func() {
		if changed.Add(1) == 1 {
			// Listing from inside the notification must not deadlock.
			tools, err := s.ListTools(context.Background())
			if err == nil {
				got <- toolNames(tools)
			}
		}
	}
	s = spawn(t, e.router(), spec)
	_, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "grow", Arguments: map[string]any{"name": "grown"}})
	require.NoError(t, err)
	select {
	case names := <-got:
		require.Contains(t, names, "grown")
	case <-time.After(10 * time.Second):
		t.Fatal("no notifications/tools/list_changed arrived")
	}
}

func TestDockerCloseIsIdempotentAndConcurrent(t *testing.T) {
	e := dockerEnv(t)
	s := spawn(t, e.router(), fixtureSpec())
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- s.Close(t.Context()) }()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	require.NoError(t, s.Close(t.Context()))
	<-s.Done()
	require.NoError(t, s.Err(), "a session closed by its owner did not crash")
	require.Empty(t, e.containers())

	// A closed context still closes: teardown carries its own bounds.
	s2 := spawn(t, e.router(), fixtureSpec())
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.NoError(t, s2.Close(ctx))
	require.Empty(t, e.containers())
}

func TestRouterCloseStopsEverySession(t *testing.T) {
	e := dockerEnv(t)
	r, err := New(e.config())
	require.NoError(t, err)
	var sessions []*Session
	for range 3 {
		s, err := r.Spawn(t.Context(), fixtureSpec())
		require.NoError(t, err)
		sessions = append(sessions, s)
	}
	require.Len(t, e.containers(), 3)
	require.NoError(t, r.Close(t.Context()))
	for _, s := range sessions {
		<-s.Done()
	}
	require.Empty(t, e.containers())
	_, err = r.Spawn(t.Context(), fixtureSpec())
	require.Error(t, err, "a closed router spawns nothing")
}

func TestPreflight(t *testing.T) {
	e := dockerEnv(t)
	t.Run("reports the image", func(t *testing.T) {
		rep, err := e.router().Preflight(t.Context())
		require.NoError(t, err)
		require.Equal(t, "docker", rep.Isolation)
		require.Equal(t, e.image, rep.ImageID)
		require.Equal(t, []string{"PATH"}, rep.ImageEnvKeys)
	})
	t.Run("refuses an image that declares VOLUME", func(t *testing.T) {
		vol := buildDerivedImage(t, e, "VOLUME /data")
		r := e.router(func(c *Config) { c.Image = vol })
		_, err := r.Preflight(t.Context())
		require.Equal(t, ClassImageRejected, ClassOf(err), "%v", err)
		require.Contains(t, err.Error(), "VOLUME /data")
		_, err = r.Spawn(t.Context(), fixtureSpec())
		require.Equal(t, ClassImageRejected, ClassOf(err))
		require.Empty(t, e.containers())
	})
	t.Run("refuses a tag", func(t *testing.T) {
		_, err := New(e.config(func(c *Config) { c.Image = dockertest.ImageRepo + ":latest" }))
		require.ErrorContains(t, err, "is not pinned")
	})
}

// TestDockerRuntime: the containers run on the OCI runtime the operator names, which
// Preflight checks against the engine's own list; one the engine lacks stops the start with a
// message that names the setting and what the engine has.
func TestDockerRuntime(t *testing.T) {
	e := dockerEnv(t)
	info, err := e.docker.Info(t.Context(), client.InfoOptions{})
	require.NoError(t, err)
	def := info.Info.DefaultRuntime

	rep, err := e.router().Preflight(t.Context())
	require.NoError(t, err)
	require.Equal(t, def, rep.Runtime, "no runtime configured: the engine's default")

	r := e.router(func(c *Config) { c.Runtime = def })
	rep, err = r.Preflight(t.Context())
	require.NoError(t, err)
	require.Equal(t, def, rep.Runtime)
	s := spawn(t, r, fixtureSpec())
	ids := e.containers()
	require.Len(t, ids, 1)
	got, err := e.docker.ContainerInspect(t.Context(), ids[0], client.ContainerInspectOptions{})
	require.NoError(t, err)
	require.Equal(t, def, got.Container.HostConfig.Runtime, "the container runs on the configured runtime")
	require.NoError(t, s.Close(t.Context()))

	missing := e.router(func(c *Config) { c.Runtime = "ringfence-no-such-runtime" })
	_, err = missing.Preflight(t.Context())
	require.Equal(t, ClassRuntimeMissing, ClassOf(err), "%v", err)
	require.ErrorContains(t, err, `no runtime "ringfence-no-such-runtime"`)
	require.ErrorContains(t, err, def)
	require.ErrorContains(t, err, RuntimeEnv)
	require.Empty(t, e.containers())

	_, err = New(e.config(func(c *Config) { c.Runtime = "run c" }))
	require.ErrorContains(t, err, "not a valid runtime name")
}

// TestDockerDigestPinnedReference runs the reference operators pin in production,
// name@sha256:<digest> of an image pushed to a registry: the pool resolves it in the engine to
// the image's ID and runs that; a digest the engine does not hold is refused before anything
// is created, and the pool does not pull it.
func TestDockerDigestPinnedReference(t *testing.T) {
	e := dockerEnv(t)
	ref := dockertest.DigestRef(t)
	r := e.router(func(c *Config) { c.Image = ref })
	rep, err := r.Preflight(t.Context())
	require.NoError(t, err)
	require.Equal(t, e.image, rep.ImageID, "the digest resolves to the fixture image")
	s := spawn(t, r, fixtureSpec())
	tools, err := s.ListTools(t.Context())
	require.NoError(t, err)
	require.NotEmpty(t, tools)
	require.NoError(t, s.Close(t.Context()))

	name, _, _ := strings.Cut(ref, "@")
	absent := name + "@sha256:" + strings.Repeat("0", 64)
	r = e.router(func(c *Config) { c.Image = absent })
	_, err = r.Spawn(t.Context(), fixtureSpec())
	require.Equal(t, ClassImageMissing, ClassOf(err), "%v", err)
	require.ErrorContains(t, err, "docker pull "+absent)
	require.Empty(t, e.containers())
}

// buildDerivedImage builds, with the engine's classic builder and without
// pulling, an image FROM the fixture image plus one Dockerfile instruction.
func buildDerivedImage(t *testing.T, e *env, instruction string) string {
	t.Helper()
	ctx := t.Context()
	dockerfile := fmt.Sprintf("FROM %s\n%s\n", e.image, instruction)
	buildCtx, err := tarOf(map[string]string{"Dockerfile": dockerfile})
	require.NoError(t, err)
	tag := "ringfence-test/derived:" + randomID()
	res, err := e.docker.ImageBuild(ctx, buildCtx, client.ImageBuildOptions{Tags: []string{tag}, Remove: true, ForceRemove: true, Version: "1"})
	require.NoError(t, err)
	out := new(strings.Builder)
	_, _ = ioCopyLimited(out, res.Body, 1<<20)
	_ = res.Body.Close()
	img, err := e.docker.ImageInspect(ctx, tag)
	require.NoError(t, err, "build output: %s", out)
	t.Cleanup(func() {
		_, _ = e.docker.ImageRemove(context.Background(), img.ID, client.ImageRemoveOptions{Force: true})
	})
	return img.ID
}

// TestSweepScopes leaves containers labelled as this pool's (running, never
// attached, so nothing ends them): Preflight removes only earlier
// instances', Close only its own instance's, Sweep all of them.
func TestSweepScopes(t *testing.T) {
	e := dockerEnv(t)
	r := e.router()
	orphan := e.createLabelled(t, "earlier-instance")
	own := e.createLabelled(t, r.cfg.InstanceID)

	rep, err := r.Preflight(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, rep.Swept)
	require.Equal(t, []string{own}, e.containers())
	require.NotContains(t, e.containers(), orphan)

	other := e.createLabelled(t, "concurrent-instance")
	require.NoError(t, r.Close(t.Context()))
	require.Equal(t, []string{other}, e.containers(), "Close removes only this instance's containers")

	n, err := e.router().Sweep(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Empty(t, e.containers())
}

func (e *env) createLabelled(t *testing.T, instance string) string {
	t.Helper()
	ctx := t.Context()
	res, err := e.docker.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: containerPrefix + "orphan-" + randomID(), // as the pool names its own
		Config: &container.Config{
			Image: e.image, User: "65534:65534", Entrypoint: []string{"mcpfixture", "--idle"},
			Labels: map[string]string{LabelManaged: "true", LabelPool: e.poolID, LabelInstance: instance, LabelServer: "orphan"},
		},
		HostConfig: &container.HostConfig{NetworkMode: "none", ReadonlyRootfs: true, CapDrop: []string{"ALL"}},
	})
	require.NoError(t, err)
	_, err = e.docker.ContainerStart(ctx, res.ID, client.ContainerStartOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = e.docker.ContainerRemove(context.Background(), res.ID, client.ContainerRemoveOptions{Force: true})
	})
	return res.ID
}

// Environment of the helper process that holds a session for
// TestKilledPoolLeavesNothing.
const (
	helperEnv      = "RINGFENCE_SPAWNER_TEST_HOLDER"
	helperImageEnv = "RINGFENCE_SPAWNER_TEST_IMAGE"
	helperPoolEnv  = "RINGFENCE_SPAWNER_TEST_POOL"
)

// TestHelperHoldSession is not a test: run as a child process by
// TestKilledPoolLeavesNothing, it spawns a session, says so, and waits to
// be killed.
func TestHelperHoldSession(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for TestKilledPoolLeavesNothing")
	}
	r, err := New(Config{Image: os.Getenv(helperImageEnv), PoolID: os.Getenv(helperPoolEnv)})
	require.NoError(t, err)
	s, err := r.Spawn(context.Background(), fixtureSpec())
	require.NoError(t, err)
	_, err = s.ListTools(context.Background())
	require.NoError(t, err)
	fmt.Println("holding")
	time.Sleep(time.Minute)
}

// TestKilledPoolLeavesNothing SIGKILLs a process that holds a session: no
// Close runs. StdinOnce ends the server when the attach connection drops and
// AutoRemove deletes it; a new Router's Preflight sweeps whatever is left.
func TestKilledPoolLeavesNothing(t *testing.T) {
	e := dockerEnv(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldSession$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperImageEnv+"="+e.image, helperPoolEnv+"="+e.poolID)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	waitForLine(t, out, "holding", time.Minute)
	require.Len(t, e.containers(), 1, "the holder runs one container")
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	deadline := time.Now().Add(20 * time.Second)
	for len(e.containers()) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	removedByEngine := len(e.containers()) == 0
	t.Logf("after SIGKILL the engine removed the container by itself: %v", removedByEngine)
	require.True(t, removedByEngine, "StdinOnce+AutoRemove must end an orphaned server")

	// And the sweep covers what the engine would not (e.g. a stuck server).
	rep, err := e.router().Preflight(t.Context())
	require.NoError(t, err)
	t.Logf("preflight swept %d", rep.Swept)
	require.Empty(t, e.containers())
}

// TestExampleServersMatchHostListing lists the published example servers in
// the isolation image and directly on the host: the same tools either way.
func TestExampleServersMatchHostListing(t *testing.T) {
	e := dockerEnv(t)
	bins := fixtures.Binaries(t)
	r := e.router()
	for _, name := range []string{fixtures.SDKEverything, fixtures.SDKMemory, fixtures.MCPGoEverything, fixtures.MCPGoStructured} {
		t.Run(name, func(t *testing.T) {
			s := spawn(t, r, Spec{ServerRef: "example", Transport: TransportStdio, Command: name, Purpose: PurposeDiscovery, HandshakeTimeout: 10 * time.Second})
			tools, err := s.ListTools(t.Context())
			require.NoError(t, err)
			isolated := toolNames(tools)
			sort.Strings(isolated)

			direct := hostListing(t, bins.Path(t, name))
			require.NotEmpty(t, direct)
			require.Equal(t, direct, isolated)
			require.NoError(t, s.Close(t.Context()))
		})
	}
}

// hostListing lists a server's tools over plain go-sdk stdio, with no
// spawner involved.
func hostListing(t *testing.T, path string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "direct", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: exec.Command(path)}, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	require.NoError(t, err)
	defer cs.Close()
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		require.NoError(t, err)
		names = append(names, tool.Name)
	}
	sort.Strings(names)
	return names
}
