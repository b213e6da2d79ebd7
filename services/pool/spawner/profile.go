package spawner

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/distribution/reference"
	"github.com/moby/moby/api/types/container"

	"github.com/ringfence/ringfence/internal/mcpserver"
)

// Labels put on every container the spawner creates. The pool and managed
// labels let a restarted pool find and remove whatever a previous instance
// left behind; the others tell an operator what a container is for.
const (
	LabelManaged  = "io.ringfence.managed"
	LabelPool     = "io.ringfence.pool"
	LabelInstance = "io.ringfence.instance"
	LabelServer   = "io.ringfence.server"
	LabelPurpose  = "io.ringfence.purpose"
	LabelRun      = "io.ringfence.run"
)

// The fixed parts of the isolation profile. Nothing in a Spec can change them.
const (
	// containerUser is nobody:nogroup by number, which works in a FROM
	// scratch image that has no /etc/passwd.
	containerUser = "65534:65534"
	tmpfsOptions  = "rw,noexec,nosuid,nodev"
)

// ImageRef is an isolation image reference that pins content: either an
// image ID ("sha256:<64 hex>") or a repository digest ("name@sha256:<64 hex>").
type ImageRef struct {
	// Ref is the reference as the operator wrote it.
	Ref string
	// ID is set when Ref is an image ID.
	ID string
}

var imageID = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ParseImageRef accepts only references that pin content. A tag can be moved
// to other content at any time, so it is refused with a message that says how
// to pin the image.
func ParseImageRef(s string) (ImageRef, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return ImageRef{}, errors.New("spawner: no isolation image given")
	}
	if strings.HasPrefix(s, "sha256:") {
		if !imageID.MatchString(s) {
			return ImageRef{}, fmt.Errorf("spawner: image ID %q is not sha256: followed by 64 lower-case hex digits", s)
		}
		return ImageRef{Ref: s, ID: s}, nil
	}
	howToPin := fmt.Sprintf("pin it as name@sha256:<64 hex> (docker image inspect --format '{{index .RepoDigests 0}}' %[1]s) "+
		"or by image ID sha256:<64 hex> (docker image inspect --format '{{.Id}}' %[1]s); `ringfence image build` prints the ID", s)
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return ImageRef{}, fmt.Errorf("spawner: image %q is not a valid reference (%v): %s", s, err, howToPin)
	}
	digested, ok := named.(reference.Digested)
	if !ok {
		return ImageRef{}, fmt.Errorf("spawner: image %q is not pinned: a tag can be moved to other content; %s", s, howToPin)
	}
	if digested.Digest().Algorithm() != "sha256" {
		return ImageRef{}, fmt.Errorf("spawner: image %q is pinned with %s; use a sha256 digest", s, digested.Digest().Algorithm())
	}
	return ImageRef{Ref: s}, nil
}

// Bounds on a spec's environment (the registry's own limits are tighter).
const (
	maxEnvValueLen = 32 << 10
	maxEnvEntries  = 256
)

// checkEnv validates a spec's environment and returns it as sorted
// KEY=value entries.
func checkEnv(env map[string]string, allowed []string) ([]string, error) {
	if len(env) > maxEnvEntries {
		return nil, newError(ClassInvalidSpec, "%d environment entries given, at most %d are allowed", len(env), maxEnvEntries)
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		if err := mcpserver.CheckEnvKey(k, allowed); err != nil {
			return nil, &Error{Class: ClassInvalidSpec, Message: err.Error()}
		}
		if len(v) > maxEnvValueLen {
			return nil, newError(ClassInvalidSpec, "the value of %s is longer than %d bytes", mcpserver.QuoteKey(k), maxEnvValueLen)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, newError(ClassInvalidSpec, "the value of %s contains a NUL byte", mcpserver.QuoteKey(k))
		}
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out, nil
}

// containerShape is the whole isolation profile for one server. Only the
// command, its arguments, the allowlisted environment and the labels come
// from the spec; every other field is fixed here or comes from the
// operator's Config.
func containerShape(cfg *Config, imageID string, spec *Spec, env []string, labels map[string]string) (*container.Config, *container.HostConfig) {
	init := true
	pids := cfg.PidsLimit
	cc := &container.Config{
		Image:        imageID,
		User:         containerUser,
		Entrypoint:   []string{spec.Command},
		Cmd:          slices.Clone(spec.Args),
		Env:          env,
		Labels:       labels,
		OpenStdin:    true,
		StdinOnce:    true,
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		Tty:          false,
	}
	if cc.Cmd == nil {
		cc.Cmd = []string{}
	}
	hc := &container.HostConfig{
		NetworkMode:    container.NetworkMode(cfg.Network),
		ReadonlyRootfs: true,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		Tmpfs:          map[string]string{"/tmp": fmt.Sprintf("%s,size=%d", tmpfsOptions, cfg.TmpfsSizeBytes)},
		Init:           &init,
		AutoRemove:     true,
		IpcMode:        container.IPCModePrivate,
		// Empty runs on the engine's default runtime; Preflight checked a named one exists.
		Runtime: cfg.Runtime,
		// The engine's log driver would keep a copy of everything the server
		// writes (secrets on stderr, every tool result on stdout) in a file
		// on the host with no bound; the attach stream is the only copy.
		LogConfig: container.LogConfig{Type: "none"},
		Resources: container.Resources{
			NanoCPUs:   cfg.NanoCPUs,
			Memory:     cfg.MemoryBytes,
			MemorySwap: cfg.MemoryBytes,
			PidsLimit:  &pids,
		},
	}
	return cc, hc
}
