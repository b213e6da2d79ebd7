package mcpserver

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ErrEnvKeyRefused is wrapped by every refusal of CheckEnvKey.
var ErrEnvKeyRefused = errors.New("environment key refused")

// MaxEnvKey bounds an env key's length.
const MaxEnvKey = 128

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
	"USER":              "the profile runs every server as 65534:65534",
	"LOGNAME":           "the profile runs every server as 65534:65534",
	"UID":               "the profile runs every server as 65534:65534",
	"GID":               "the profile runs every server as 65534:65534",
	"HOSTNAME":          "the engine names the container",
	"HTTP_PROXY":        "it routes the server's traffic; the network is the operator's choice",
	"HTTPS_PROXY":       "it routes the server's traffic; the network is the operator's choice",
	"ALL_PROXY":         "it routes the server's traffic; the network is the operator's choice",
	"NO_PROXY":          "it routes the server's traffic; the network is the operator's choice",
	"FTP_PROXY":         "it routes the server's traffic; the network is the operator's choice",
}

// deniedEnvPrefixes: Docker's own client and engine settings, the loaders
// of Linux and macOS, container runtimes, and Ringfence's own configuration
// (a server must not see or set the pool's settings).
var deniedEnvPrefixes = []string{"DOCKER_", "CONTAINER_", "COMPOSE_", "LD_", "DYLD_", "RUNC_", "CONTAINERD_", "BUILDKIT_", "MALLOC_", "RINGFENCE_", "NPM_CONFIG_"}

// IsEnvKeyName reports whether key has the form of an environment variable name.
func IsEnvKeyName(key string) bool {
	return len(key) > 0 && len(key) <= MaxEnvKey && envKeySyntax.MatchString(key)
}

// ControlKeyReason returns why key may never be set by a registration, or "" when it may be
// (subject to the allowlist).
func ControlKeyReason(key string) string {
	if !IsEnvKeyName(key) {
		return fmt.Sprintf("a key is 1 to %d characters of A-Z, a-z, 0-9 and _, not starting with a digit", MaxEnvKey)
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

// CheckEnvKey reports whether a registration may set the environment key: it must be a
// portable variable name, not one of the keys that steer the runtime, loader, user, mounts or
// network (refused even when allowlisted), and on the operator's allowlist. The registry calls
// it when a registration is written, config at start for the allowlist itself, and the
// spawner again before every spawn. Every refusal wraps ErrEnvKeyRefused and names the key,
// never a value.
func CheckEnvKey(key string, allowed []string) error {
	if reason := ControlKeyReason(key); reason != "" {
		return fmt.Errorf("%w: %s: %s", ErrEnvKeyRefused, QuoteKey(key), reason)
	}
	if !slices.Contains(allowed, key) {
		return fmt.Errorf("%w: %s is not on the operator's allowlist: add it to RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS (a JSON list) first", ErrEnvKeyRefused, QuoteKey(key))
	}
	return nil
}

// QuoteKey quotes a key for a message, shortened when absurdly long.
func QuoteKey(key string) string {
	if len(key) > MaxEnvKey {
		key = key[:MaxEnvKey] + "…"
	}
	return strconv.Quote(key)
}
