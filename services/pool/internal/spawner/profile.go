package spawner

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/distribution/reference"
	"github.com/moby/moby/api/types/container"
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

// ErrEnvKeyRefused is wrapped by every refusal of CheckEnvKey.
var ErrEnvKeyRefused = errors.New("environment key refused")

// Bounds on a spec's environment.
const (
	maxEnvKeyLen   = 128
	maxEnvValueLen = 32 << 10
	maxEnvEntries  = 256
)

var envKeySyntax = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// deniedEnvKeys are refused even when an operator allowlists them, because
// they steer the container runtime, the dynamic loader, the libc, a shell or
// an interpreter rather than configure the server: with them a registration
// could load code other than the command it names, or change what the
// command resolves to. PATH is refused because the command is resolved
// through the image's PATH, which is the image owner's choice. HOME is
// refused because the root is read-only and nothing in the profile provides
// one; an image that needs HOME (e.g. HOME=/tmp) sets it in its own ENV.
// Matching ignores case.
var deniedEnvKeys = map[string]string{
	"PATH":              "it changes which executable the command resolves to",
	"HOME":              "the image decides HOME (set it in the image's ENV)",
	"SHELL":             "it selects a shell",
	"IFS":               "it changes how shells split words",
	"ENV":               "shells source the file it names",
	"BASH_ENV":          "bash sources the file it names",
	"SHELLOPTS":         "it changes shell behaviour",
	"BASHOPTS":          "it changes shell behaviour",
	"PS4":               "shells evaluate it",
	"PROMPT_COMMAND":    "shells run it",
	"GCONV_PATH":        "glibc loads modules from it",
	"GLIBC_TUNABLES":    "it tunes the loader and allocator",
	"LOCPATH":           "glibc loads locale data from it",
	"NLSPATH":           "it selects message catalogues",
	"HOSTALIASES":       "it redirects host name resolution",
	"RES_OPTIONS":       "it changes the resolver",
	"LOCALDOMAIN":       "it changes the resolver",
	"TMPDIR":            "the profile's temporary directory is /tmp",
	"NODE_OPTIONS":      "it makes node load arbitrary modules",
	"NODE_PATH":         "it changes where node loads modules from",
	"PYTHONPATH":        "it changes where python imports from",
	"PYTHONHOME":        "it changes python's standard library",
	"PYTHONSTARTUP":     "python runs the file it names",
	"PYTHONINSPECT":     "it makes python interactive",
	"PERL5LIB":          "it changes where perl loads modules from",
	"PERL5OPT":          "it passes options to perl",
	"PERLLIB":           "it changes where perl loads modules from",
	"RUBYOPT":           "it passes options to ruby",
	"RUBYLIB":           "it changes where ruby loads from",
	"JAVA_TOOL_OPTIONS": "it passes options to the JVM",
	"JDK_JAVA_OPTIONS":  "it passes options to the JVM",
	"_JAVA_OPTIONS":     "it passes options to the JVM",
	"CLASSPATH":         "it changes where the JVM loads classes from",
	"GODEBUG":           "it changes the Go runtime's behaviour",
	"GOTRACEBACK":       "it changes what the Go runtime prints on a crash",
	"GOMAXPROCS":        "the profile's CPU limit decides parallelism",
	"GOMEMLIMIT":        "the profile's memory limit decides memory",
}

// deniedEnvPrefixes: Docker's own client and engine settings, the loaders
// of Linux and macOS, container runtimes, and Ringfence's own configuration
// (a server must not see or set the pool's settings).
var deniedEnvPrefixes = []string{"DOCKER_", "LD_", "DYLD_", "RUNC_", "CONTAINERD_", "BUILDKIT_", "MALLOC_", "RINGFENCE_", "NPM_CONFIG_"}

// CheckEnvKey reports whether a registration may set the environment key: it
// must be a portable variable name, on the operator's allowlist, and not one
// of the keys that steer the runtime or loader (those are refused even when
// allowlisted). The registry calls it when a registration is written; the
// spawner calls it again before every spawn. Every refusal wraps
// ErrEnvKeyRefused and names the key but never a value.
func CheckEnvKey(key string, allowed []string) error {
	if reason := deniedEnvKey(key); reason != "" {
		return fmt.Errorf("spawner: %w: %s: %s", ErrEnvKeyRefused, quoteKey(key), reason)
	}
	if !slices.Contains(allowed, key) {
		return fmt.Errorf("spawner: %w: %s is not on the isolation allowlist (RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS)", ErrEnvKeyRefused, quoteKey(key))
	}
	return nil
}

// deniedEnvKey returns why key may never be set, or "".
func deniedEnvKey(key string) string {
	if len(key) == 0 || len(key) > maxEnvKeyLen || !envKeySyntax.MatchString(key) {
		return fmt.Sprintf("a key is 1 to %d characters of A-Z, a-z, 0-9 and _, not starting with a digit", maxEnvKeyLen)
	}
	upper := strings.ToUpper(key)
	if reason, ok := deniedEnvKeys[upper]; ok {
		return "it is never passed to a server: " + reason
	}
	for _, p := range deniedEnvPrefixes {
		if strings.HasPrefix(upper, p) {
			return fmt.Sprintf("keys starting with %s are never passed to a server: they steer the runtime, the loader or Ringfence itself", p)
		}
	}
	return ""
}

func quoteKey(key string) string {
	if len(key) > maxEnvKeyLen {
		key = key[:maxEnvKeyLen] + "…"
	}
	return strconv.Quote(key)
}

// checkEnv validates a spec's environment and returns it as sorted
// KEY=value entries.
func checkEnv(env map[string]string, allowed []string) ([]string, error) {
	if len(env) > maxEnvEntries {
		return nil, newError(ClassInvalidSpec, "%d environment entries given, at most %d are allowed", len(env), maxEnvEntries)
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		if err := CheckEnvKey(k, allowed); err != nil {
			return nil, &Error{Class: ClassInvalidSpec, Message: strings.TrimPrefix(err.Error(), "spawner: ")}
		}
		if len(v) > maxEnvValueLen {
			return nil, newError(ClassInvalidSpec, "the value of %s is longer than %d bytes", quoteKey(k), maxEnvValueLen)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, newError(ClassInvalidSpec, "the value of %s contains a NUL byte", quoteKey(k))
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
