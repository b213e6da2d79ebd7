package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
)

// TestARestoreWithoutItsSecretsKeyIsRefused: a data directory backed up as operations.md says
// (the server stopped, secrets.key kept apart) and restored without its key file does not
// start: ringfenced names the key it needs, and exits non-zero, instead of making a new key
// and failing every secret at its first use. Restored with its key, it serves the secrets.
func TestARestoreWithoutItsSecretsKeyIsRefused(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	cli := func(args ...string) result {
		return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), args...)
	}
	r := runCmd(t, strings.NewReader(canarySecret), []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey},
		bin("ringfence"), "secrets", "set", "tickets-token")
	require.Equal(t, 0, r.Code, r.Stderr)
	d.stop()

	restored := filepath.Join(t.TempDir(), "data")
	copyDir(t, d.DataDir, restored)
	require.NoError(t, os.Remove(filepath.Join(restored, "secrets.key")))
	env := []string{"RINGFENCE_DATA_DIR=" + restored, "RINGFENCE_GRPC_ADDR=" + testutil.FreeAddr(t), "RINGFENCE_HTTP_ADDR=" + testutil.FreeAddr(t)}
	r = runCmd(t, nil, append(env, registryEnv()...), bin("ringfenced"))
	require.NotEqual(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "the secrets key does not open what "+filepath.Join(restored, "registry.db")+` holds sealed (secret \"tickets-token\")`)
	require.Contains(t, r.Stderr, "RINGFENCE_SECRETS_KEY_FILE")
	require.NotContains(t, r.Stderr, canarySecret)

	key, err := os.ReadFile(filepath.Join(d.DataDir, "secrets.key"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(restored, "secrets.key"), key, 0o600))
	d.env = append(d.env, "RINGFENCE_DATA_DIR="+restored)
	d.start()
	r = cli("secrets", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "tickets-token")
	r = cli("servers", "add", "tickets", "--transport", "streamable_http", "--url", "http://127.0.0.1:9/mcp",
		"--header-secret", "Authorization=tickets-token")
	require.Equal(t, 0, r.Code, r.Stderr)
}

const canarySecret = "restore-canary-7c1e"

// copyDir copies the regular files of src (one level of directories) to dst, modes kept, as
// `cp -a` of a stopped server's data directory does.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(src, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		if e.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), info.Mode().Perm())
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, info.Mode().Perm())
	}))
}

// TestABadRolesJSONIsAConfigError: custom roles that do not parse, or name an unknown
// permission, stop the start as any invalid value does (configuration.md: exit status 2),
// naming the key and the fix, with nothing opened in data_dir.
func TestABadRolesJSONIsAConfigError(t *testing.T) {
	for _, roles := range []string{`{bad`, `{"deployer": ["run:exec"]}`} {
		data := filepath.Join(t.TempDir(), "data")
		env := []string{"RINGFENCE_DATA_DIR=" + data, "RINGFENCE_GRPC_ADDR=" + testutil.FreeAddr(t), "RINGFENCE_HTTP_ADDR=" + testutil.FreeAddr(t),
			"RINGFENCE_SERVICE_ROLES_JSON=" + roles}
		r := runCmd(t, nil, env, bin("ringfenced"))
		require.Equal(t, 2, r.Code, r.Stderr)
		require.Contains(t, r.Stderr, "ringfenced: config: auth: service_roles_json (RINGFENCE_SERVICE_ROLES_JSON)")
		require.NoDirExists(t, data)
	}
	// Set under the seed's name, it is named so (configuration.md).
	env := []string{"RINGFENCE_DATA_DIR=" + filepath.Join(t.TempDir(), "data"), "RINGFENCE_GRPC_ADDR=" + testutil.FreeAddr(t), "RINGFENCE_HTTP_ADDR=" + testutil.FreeAddr(t),
		"ZEROTH_SERVICE_ROLES_JSON={bad"}
	r := runCmd(t, nil, env, bin("ringfenced"))
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "ringfenced: config: auth: service_roles_json (ZEROTH_SERVICE_ROLES_JSON, read as RINGFENCE_SERVICE_ROLES_JSON) is not a JSON object")
}
