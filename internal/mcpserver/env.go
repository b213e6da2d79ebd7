package mcpserver

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

var envKeyPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// controlPrefixes and controlKeys name environment variables that could steer the container
// runtime, the dynamic loader, the user, the filesystem layout or the network path. A
// registration may never set them, even when an operator put them on the allowlist: they would
// let a registration change what the isolation profile decides.
var (
	controlPrefixes = []string{"DOCKER_", "CONTAINER_", "COMPOSE_", "BUILDKIT_", "LD_", "DYLD_", "RINGFENCE_"}
	controlKeys     = []string{
		"PATH", "HOME", "USER", "LOGNAME", "UID", "GID", "HOSTNAME", "SHELL", "TMPDIR",
		"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "FTP_PROXY",
	}
)

// IsControlKey reports whether key is one a registration may never set.
func IsControlKey(key string) bool {
	up := strings.ToUpper(key)
	if slices.Contains(controlKeys, up) {
		return true
	}
	for _, p := range controlPrefixes {
		if strings.HasPrefix(up, p) {
			return true
		}
	}
	return false
}

// CheckEnvKey refuses an env key that is malformed, steers the runtime (see IsControlKey), or
// is not on the operator's allowlist.
func CheckEnvKey(key string, allowed []string) error {
	if !envKeyPattern.MatchString(key) {
		return fmt.Errorf("%q is not an environment variable name", truncate(key))
	}
	if IsControlKey(key) {
		return fmt.Errorf("%q can steer the runtime, loader, user, mounts or network of the isolated server, so no registration may set it", key)
	}
	if !slices.Contains(allowed, key) {
		return fmt.Errorf("%q is not on the operator's allowlist: add it to RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS (a JSON list) first", key)
	}
	return nil
}
