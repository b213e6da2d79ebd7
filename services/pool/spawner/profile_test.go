package spawner

import (
	"reflect"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/stretchr/testify/require"
)

const hex64 = "4357270bd0eed8154675e88a4e6edaa76fa561a479c230724a0b21bb9435708f"

func TestParseImageRef(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantID  string
		wantErr string
	}{
		{name: "image id", in: "sha256:" + hex64, wantID: "sha256:" + hex64},
		{name: "repository digest", in: "registry.example/ringfence-mcp@sha256:" + hex64},
		{name: "tag and digest", in: "ringfence-mcp:1@sha256:" + hex64},
		{name: "tag", in: "ringfence-mcp:latest", wantErr: "is not pinned"},
		{name: "bare name", in: "ringfence-mcp", wantErr: "is not pinned"},
		{name: "short id", in: "sha256:4357270bd0ee", wantErr: "64 lower-case hex"},
		{name: "upper-case id", in: "sha256:" + strings.ToUpper(hex64), wantErr: "64 lower-case hex"},
		{name: "short digest", in: "ringfence-mcp@sha256:abcd", wantErr: "not a valid reference"},
		{name: "empty", in: "", wantErr: "no isolation image"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref, err := ParseImageRef(tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.in, ref.Ref)
			require.Equal(t, tt.wantID, ref.ID)
		})
	}
}

func TestParseImageRefSaysHowToPin(t *testing.T) {
	_, err := ParseImageRef("ringfence-mcp:latest")
	require.ErrorContains(t, err, "name@sha256:<64 hex>")
	require.ErrorContains(t, err, "sha256:<64 hex>")
	require.ErrorContains(t, err, "ringfence image build")
}

func TestCheckEnvNeverShowsValues(t *testing.T) {
	const secret = "s3cr3t-value"
	_, err := checkEnv(map[string]string{"LD_PRELOAD": secret}, []string{"LD_PRELOAD"})
	require.Equal(t, ClassInvalidSpec, ClassOf(err))
	require.NotContains(t, err.Error(), secret)

	_, err = checkEnv(map[string]string{"APP_TOKEN": secret + "\x00"}, []string{"APP_TOKEN"})
	require.Equal(t, ClassInvalidSpec, ClassOf(err))
	require.NotContains(t, err.Error(), secret)
}

func TestNewRefusesUnsafeConfig(t *testing.T) {
	img := "sha256:" + hex64
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "tagged image", cfg: Config{Image: "ringfence-mcp:latest", PoolID: "p"}, wantErr: "is not pinned"},
		{name: "host network", cfg: Config{Image: img, PoolID: "p", Network: "host"}, wantErr: "undo the isolation"},
		{name: "container network", cfg: Config{Image: img, PoolID: "p", Network: "container:abc"}, wantErr: "undo the isolation"},
		{name: "allowlisted loader key", cfg: Config{Image: img, PoolID: "p", AllowedEnvKeys: []string{"LD_PRELOAD"}}, wantErr: "LD_PRELOAD"},
		{name: "allowlisted docker key", cfg: Config{Image: img, PoolID: "p", AllowedEnvKeys: []string{"DOCKER_HOST"}}, wantErr: "DOCKER_HOST"},
		{name: "no pool id", cfg: Config{Image: img}, wantErr: "PoolID"},
		{name: "tiny memory", cfg: Config{Image: img, PoolID: "p", MemoryBytes: 1 << 20}, wantErr: "at least 6 MiB"},
		{name: "negative pids", cfg: Config{Image: img, PoolID: "p", PidsLimit: -1}, wantErr: "PID limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// TestContainerShape checks the profile as the engine will receive it; the
// engine-side inspection is in TestDockerInspectShowsProfile.
func TestContainerShape(t *testing.T) {
	cfg := Config{Image: "sha256:" + hex64, PoolID: "p"}
	require.NoError(t, cfg.normalize())
	spec := fixtureSpec("--x")
	cc, hc := containerShape(&cfg, "sha256:"+hex64, &spec, []string{"APP_TOKEN=v"}, map[string]string{LabelPool: "p"})

	require.Equal(t, "sha256:"+hex64, cc.Image)
	require.Equal(t, "65534:65534", cc.User)
	require.Equal(t, []string{"mcpfixture"}, cc.Entrypoint)
	require.Equal(t, []string{"--x"}, cc.Cmd)
	require.Equal(t, []string{"APP_TOKEN=v"}, cc.Env)
	require.True(t, cc.OpenStdin && cc.StdinOnce && cc.AttachStdin && cc.AttachStdout && cc.AttachStderr)
	require.False(t, cc.Tty)
	require.Empty(t, cc.Volumes)
	require.Empty(t, cc.ExposedPorts)

	require.Equal(t, container.NetworkMode("none"), hc.NetworkMode)
	require.True(t, hc.ReadonlyRootfs)
	require.Equal(t, []string{"ALL"}, hc.CapDrop)
	require.Empty(t, hc.CapAdd)
	require.Equal(t, []string{"no-new-privileges"}, hc.SecurityOpt)
	require.Equal(t, map[string]string{"/tmp": "rw,noexec,nosuid,nodev,size=67108864"}, hc.Tmpfs)
	require.True(t, *hc.Init)
	require.True(t, hc.AutoRemove)
	require.Equal(t, container.IPCModePrivate, hc.IpcMode)
	require.False(t, hc.Privileged)
	require.Empty(t, hc.Binds)
	require.Empty(t, hc.Mounts)
	require.Empty(t, hc.VolumesFrom)
	require.Empty(t, hc.PortBindings)
	require.Equal(t, int64(1e9), hc.NanoCPUs)
	require.Equal(t, int64(512<<20), hc.Memory)
	require.Equal(t, hc.Memory, hc.MemorySwap)
	require.Equal(t, int64(128), *hc.PidsLimit)
	require.Equal(t, "none", hc.LogConfig.Type)
	require.Empty(t, hc.Runtime, "the engine's default runtime unless the operator names one")

	cfg.Runtime = "runsc"
	_, hc = containerShape(&cfg, "sha256:"+hex64, &spec, nil, nil)
	require.Equal(t, "runsc", hc.Runtime)
}

// TestSpecCannotSteerTheProfile pins the shape of Spec: the only ways a
// registration reaches the container are the command, its arguments and the
// allowlisted environment. A new field must be added here deliberately.
func TestSpecCannotSteerTheProfile(t *testing.T) {
	var names []string
	st := reflect.TypeFor[Spec]()
	for i := range st.NumField() {
		names = append(names, st.Field(i).Name)
	}
	require.Equal(t, []string{
		"ServerRef", "Transport", "Command", "Args", "Env", "URL", "Headers",
		"HandshakeTimeout", "Purpose", "RunID", "OnToolListChanged",
		// What the pool reads of the server, never what the container may do.
		"MaxResultBytes",
	}, names)
}

func TestCheckSpec(t *testing.T) {
	base := func() Spec { return fixtureSpec() }
	tests := []struct {
		name   string
		mut    func(*Spec)
		wantOK bool
	}{
		{name: "fixture", mut: func(*Spec) {}, wantOK: true},
		{name: "bad ref", mut: func(s *Spec) { s.ServerRef = "Bad Ref" }},
		{name: "bad purpose", mut: func(s *Spec) { s.Purpose = "other" }},
		{name: "no command", mut: func(s *Spec) { s.Command = "" }},
		{name: "control in command", mut: func(s *Spec) { s.Command = "a\nb" }},
		{name: "NUL in arg", mut: func(s *Spec) { s.Args = []string{"a\x00"} }},
		{name: "too many args", mut: func(s *Spec) { s.Args = make([]string, maxArgs+1) }},
		{name: "stdio with url", mut: func(s *Spec) { s.URL = "https://x" }},
		{name: "unknown transport", mut: func(s *Spec) { s.Transport = "websocket" }},
		{name: "remote with command", mut: func(s *Spec) { s.Transport = TransportSSE }},
		{name: "control in run id", mut: func(s *Spec) { s.RunID = "a\x1b" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base()
			tt.mut(&s)
			err := checkSpec(&s)
			if tt.wantOK {
				require.NoError(t, err)
				return
			}
			require.Equal(t, ClassInvalidSpec, ClassOf(err), "%v", err)
		})
	}
}
