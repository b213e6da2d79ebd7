package config

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func load(t *testing.T, args, env []string) (*Config, error) {
	t.Helper()
	var out bytes.Buffer
	return Load("test", args, env, &out)
}

func TestDefaults(t *testing.T) {
	cfg, err := load(t, nil, nil)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:50051", cfg.GRPCAddr)
	require.Equal(t, "127.0.0.1:8000", cfg.HTTPAddr)
	require.Equal(t, "none", cfg.Sandbox.MCPIsolationNetwork)
	require.Equal(t, ByteSize(512<<20), cfg.Sandbox.MCPIsolationMemory)
	require.Equal(t, time.Second, cfg.Pool.DriftMaxAge)
	require.Equal(t, 7*24*time.Hour, cfg.Pool.PausedTimeout)
	require.Equal(t, 16, cfg.Pool.MaxWarm)
	require.Equal(t, 10*time.Minute, cfg.Pool.WarmMaxAge)
	require.Equal(t, 15*time.Minute, cfg.Pool.ApprovalTimeout)
	require.Equal(t, ByteSize(10<<20), cfg.Documents.MaxBytes)
	require.Equal(t, ByteSize(16<<20), cfg.Documents.MaxCallBytes)
	require.Equal(t, ByteSize(1<<30), cfg.Documents.MaxTenantBytes)
	require.Empty(t, cfg.Documents.URLTemplate, "the built-in store by default")
	require.Equal(t, 128, cfg.Limits.MaxConnectionsPerAddress)
	require.Zero(t, cfg.Pool.ResultBudget, "derived at start")
	require.Equal(t, 10*time.Second, cfg.Pool.ResultBudgetWait)
	require.False(t, cfg.IsProduction())
}

// TestDefaultResultBudget: a quarter of GOMEMLIMIT when the process has one, else 256 MiB.
func TestDefaultResultBudget(t *testing.T) {
	require.Equal(t, ByteSize(256<<20), DefaultResultBudget(math.MaxInt64))
	require.Equal(t, ByteSize(512<<20), DefaultResultBudget(2<<30))
	require.Equal(t, ByteSize(1<<20), DefaultResultBudget(1<<20), "never below 1 MiB")
	cfg, err := load(t, nil, []string{"RINGFENCE_POOL__RESULT_BUDGET=1GiB"})
	require.NoError(t, err)
	require.Equal(t, ByteSize(1<<30), cfg.Pool.ResultBudget)
}

func TestPrecedenceFlagsOverEnvOverFileOverDefaults(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ringfence.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`
grpc_addr: 127.0.0.1:1111
http_addr: 127.0.0.1:2222
log_level: warn
sandbox:
  mcp_isolation_allowed_environment_keys: [APP_TOKEN, OTHER]
  mcp_isolation_pids: 64
pool:
  drift_max_age: 0s
`), 0o600))
	cfg, err := load(t,
		[]string{"--config", file, "--grpc-addr", "127.0.0.1:3333"},
		[]string{"RINGFENCE_GRPC_ADDR=127.0.0.1:4444", "RINGFENCE_HTTP_ADDR=127.0.0.1:5555", "PATH=/bin"})
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:3333", cfg.GRPCAddr, "flag wins over env and file")
	require.Equal(t, "127.0.0.1:5555", cfg.HTTPAddr, "env wins over file")
	require.Equal(t, "warn", cfg.LogLevel, "file wins over default")
	require.Equal(t, []string{"APP_TOKEN", "OTHER"}, cfg.Sandbox.MCPIsolationAllowedEnvironmentKeys)
	require.Equal(t, int64(64), cfg.Sandbox.MCPIsolationPids)
	require.Equal(t, time.Duration(0), cfg.Pool.DriftMaxAge)
}

func TestNestedEnvKeys(t *testing.T) {
	cfg, err := load(t, nil, []string{
		"RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE=" + digest,
		`RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS=["APP_TOKEN"]`,
		"RINGFENCE_SANDBOX__MCP_ISOLATION_MEMORY=1GiB",
		"RINGFENCE_DEV__ALLOW_INLINE_MCP_SERVERS=true",
		"RINGFENCE_API_KEY=ignored-because-it-is-the-cli's",
		"RINGFENCE_SERVER_IDENTITY=registry",
	})
	require.NoError(t, err)
	require.Equal(t, digest, cfg.Sandbox.MCPIsolationImage)
	require.Equal(t, []string{"APP_TOKEN"}, cfg.Sandbox.MCPIsolationAllowedEnvironmentKeys)
	require.Equal(t, ByteSize(1<<30), cfg.Sandbox.MCPIsolationMemory)
	require.True(t, cfg.Dev.AllowInlineMCPServers)
}

func TestPprofOnLoopback(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:6060", "[::1]:6060", "localhost:0"} {
		cfg, err := load(t, nil, []string{"RINGFENCE_DEBUG__PPROF_ADDR=" + addr})
		require.NoError(t, err, addr)
		require.Equal(t, addr, cfg.Debug.PprofAddr)
	}
}

func TestRefusals(t *testing.T) {
	dir := t.TempDir()
	unknownFile := filepath.Join(dir, "unknown.yaml")
	require.NoError(t, os.WriteFile(unknownFile, []byte("sandbox:\n  mcp_isolation_imag: x\n"), 0o600))

	for _, tc := range []struct {
		name     string
		args     []string
		env      []string
		contains []string
	}{
		{"unknown env key names a near key", nil, []string{"RINGFENCE_GRPC_ADR=x"}, []string{"RINGFENCE_GRPC_ADR", "did you mean RINGFENCE_GRPC_ADDR"}},
		{"env key without its section names the key", nil, []string{"RINGFENCE_CERT_FILE=x"}, []string{"RINGFENCE_CERT_FILE", "did you mean RINGFENCE_TLS__CERT_FILE"}},
		{"unknown file key", []string{"--config", unknownFile}, nil, []string{`"sandbox.mcp_isolation_imag"`, `did you mean "sandbox.mcp_isolation_image"`}},
		{"every unknown key and bad value at once", []string{"--config", unknownFile}, []string{"RINGFENCE_GRPC_ADR=x", "RINGFENCE_POOL__MAX_RUNZ=1", "RINGFENCE_POOL__MAX_RUNS=many"},
			[]string{`"sandbox.mcp_isolation_imag"`, "RINGFENCE_GRPC_ADR", "RINGFENCE_POOL__MAX_RUNZ", "RINGFENCE_POOL__MAX_RUNS", "not an integer"}},
		{"unknown flag", []string{"--nope"}, nil, []string{"nope"}},
		{"bad integer names the env", nil, []string{"RINGFENCE_POOL__MAX_RUNS=many"}, []string{"RINGFENCE_POOL__MAX_RUNS", "not an integer"}},
		{"bad duration", []string{"--pool.drift-max-age=soon"}, nil, []string{"--pool.drift-max-age", "not a duration"}},
		{"negative paused timeout", nil, []string{"RINGFENCE_POOL__PAUSED_RUN_TIMEOUT=-1h"}, []string{"RINGFENCE_POOL__PAUSED_RUN_TIMEOUT", "must not be negative", "use 0 to keep"}},
		{"negative max warm", nil, []string{"RINGFENCE_POOL__MAX_WARM=-1"}, []string{"RINGFENCE_POOL__MAX_WARM", "must not be negative", "use 0 to keep no warm containers"}},
		{"zero warm max age", nil, []string{"RINGFENCE_POOL__WARM_MAX_AGE=0s"}, []string{"RINGFENCE_POOL__WARM_MAX_AGE", "must be positive"}},
		{"bad list", nil, []string{"RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS=APP_TOKEN"}, []string{"JSON list"}},
		{"tag refused", nil, []string{"RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE=mcp:latest"}, []string{"RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE", "not pinned by digest", "sha256:<64 hex>"}},
		{"production refuses unisolated development", nil, []string{"RINGFENCE_ENV=production", "RINGFENCE_SANDBOX__ALLOW_UNISOLATED_MCP_DEVELOPMENT=true"}, []string{"RINGFENCE_SANDBOX__ALLOW_UNISOLATED_MCP_DEVELOPMENT", "refused in production", "host processes"}},
		{"production refuses inline servers", nil, []string{"RINGFENCE_ENV=production", "RINGFENCE_DEV__ALLOW_INLINE_MCP_SERVERS=true"}, []string{"RINGFENCE_DEV__ALLOW_INLINE_MCP_SERVERS", "no ceiling"}},
		{"bad runtime name", nil, []string{"RINGFENCE_SANDBOX__RUNTIME=run sc"}, []string{"RINGFENCE_SANDBOX__RUNTIME", "not a runtime name", "docker info"}},
		{"partial tls", nil, []string{"RINGFENCE_TLS__CERT_FILE=a.pem"}, []string{"set together"}},
		{"bad env", nil, []string{"RINGFENCE_ENV=staging"}, []string{"RINGFENCE_ENV", "development or production"}},
		{"no connections per address", nil, []string{"RINGFENCE_LIMITS__MAX_CONNECTIONS_PER_ADDRESS=0"}, []string{"RINGFENCE_LIMITS__MAX_CONNECTIONS_PER_ADDRESS", "at least 1", "proxy or NAT"}},
		{"result budget too small", nil, []string{"RINGFENCE_POOL__RESULT_BUDGET=64KiB"}, []string{"RINGFENCE_POOL__RESULT_BUDGET", "at least 1MiB", "max_result_bytes"}},
		{"no result budget wait", nil, []string{"RINGFENCE_POOL__RESULT_BUDGET_WAIT=0s"}, []string{"RINGFENCE_POOL__RESULT_BUDGET_WAIT", "must be positive"}},
		{"no approval timeout", nil, []string{"RINGFENCE_POOL__APPROVAL_TIMEOUT=0s"}, []string{"RINGFENCE_POOL__APPROVAL_TIMEOUT", "must be positive"}},
		{"a document URL without the tenant", nil, []string{"RINGFENCE_DOCUMENTS__URL_TEMPLATE=https://docs.internal/{id}"}, []string{"RINGFENCE_DOCUMENTS__URL_TEMPLATE", "{tenant} and {id}"}},
		{"a document URL in the clear in production", nil, []string{"RINGFENCE_ENV=production", "RINGFENCE_DOCUMENTS__URL_TEMPLATE=http://docs.internal/{tenant}/{id}"}, []string{"RINGFENCE_DOCUMENTS__URL_TEMPLATE", "not https://"}},
		{"a token for no document service", nil, []string{"RINGFENCE_DOCUMENTS__TOKEN_FILE=/run/token"}, []string{"RINGFENCE_DOCUMENTS__TOKEN_FILE", "without documents.url_template"}},
		{"documents past the bound", nil, []string{"RINGFENCE_DOCUMENTS__MAX_BYTES=1GiB"}, []string{"RINGFENCE_DOCUMENTS__MAX_BYTES", "[1, 256MiB]"}},
		{"profiles only on loopback", nil, []string{"RINGFENCE_DEBUG__PPROF_ADDR=0.0.0.0:6060"}, []string{"RINGFENCE_DEBUG__PPROF_ADDR", "not a loopback address", "no key"}},
		{"a client metadata document off https", nil, []string{"RINGFENCE_OAUTH__CLIENT_METADATA_URL=http://tools.example.com/v1/oauth/client-metadata"}, []string{"RINGFENCE_OAUTH__CLIENT_METADATA_URL", "not an https URL with a path"}},
		{"secret values are not echoed", nil, []string{"RINGFENCE_BOOTSTRAP_ADMIN_KEY=short"}, []string{"RINGFENCE_BOOTSTRAP_ADMIN_KEY", "shorter than 16"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.args, tc.env)
			require.Error(t, err)
			for _, s := range tc.contains {
				require.Contains(t, err.Error(), s)
			}
			require.NotContains(t, err.Error(), "=short")
		})
	}
}

func TestHelpListsEnvNames(t *testing.T) {
	var out bytes.Buffer
	_, err := Load("ringfenced", []string{"--help"}, nil, &out)
	require.True(t, errors.Is(err, flag.ErrHelp))
	require.Contains(t, out.String(), "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE")
	require.Contains(t, out.String(), "-sandbox.mcp-isolation-image")
}

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]ByteSize{"512MiB": 512 << 20, "64m": 64 << 20, "1GiB": 1 << 30, "1024": 1024, "2kb": 2000} {
		got, err := ParseByteSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "lots", "-1MiB", "1.5GiB"} {
		_, err := ParseByteSize(bad)
		require.Error(t, err, bad)
	}
}

// TestConfigurationDocCoversEveryKey keeps docs/configuration.md in step with Config.
func TestConfigurationDocCoversEveryKey(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	require.NoError(t, err)
	for _, k := range Keys() {
		require.Contains(t, string(doc), "`"+k.Env+"`", "docs/configuration.md does not document %s", k.Env)
	}
}

// TestSampleConfigsLoad keeps deploy/config/*.yaml valid as keys change.
func TestSampleConfigsLoad(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "deploy", "config", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			cfg, err := Load(binaryOf(filepath.Base(f)), []string{"--config", f}, nil, io.Discard)
			require.NoError(t, err)
			require.True(t, cfg.IsProduction(), "samples are production configurations")
		})
	}
}

// binaryOf is the binary a sample (registry.yaml) or compose service (registry) configures.
func binaryOf(name string) string {
	name = strings.TrimSuffix(name, ".yaml")
	if name == AllInOne {
		return name
	}
	return "ringfence-" + name
}

// TestConfigurationDependsOnTheBinary: a split binary serves internal RPCs on its own
// listener, mutual TLS only, so it needs TLS and gets 127.0.0.1:50052 by default; ringfenced
// serves none, so an internal address there is a mistake.
func TestConfigurationDependsOnTheBinary(t *testing.T) {
	tlsEnv := []string{"RINGFENCE_TLS__CERT_FILE=c.pem", "RINGFENCE_TLS__KEY_FILE=k.pem", "RINGFENCE_TLS__CLIENT_CA_FILE=ca.pem"}
	cfg, err := Load("ringfence-pool", nil, tlsEnv, io.Discard)
	require.NoError(t, err)
	require.Equal(t, DefaultInternalAddr, cfg.InternalAddr)

	_, err = Load("ringfence-registry", nil, nil, io.Discard)
	require.ErrorContains(t, err, "ringfence-registry serves internal RPCs to its peers on internal_addr (RINGFENCE_INTERNAL_ADDR), which takes mutual TLS only")
	require.ErrorContains(t, err, "RINGFENCE_TLS__CERT_FILE")

	_, err = Load("ringfence-audit", nil, append(tlsEnv, "RINGFENCE_INTERNAL_ADDR=127.0.0.1:50051"), io.Discard)
	require.ErrorContains(t, err, "internal_addr (RINGFENCE_INTERNAL_ADDR) \"127.0.0.1:50051\" is also grpc_addr or http_addr")

	cfg, err = Load(AllInOne, nil, nil, io.Discard)
	require.NoError(t, err)
	require.Empty(t, cfg.InternalAddr, "ringfenced serves no internal RPCs")
	_, err = Load(AllInOne, nil, []string{"RINGFENCE_INTERNAL_ADDR=127.0.0.1:50052"}, io.Discard)
	require.ErrorContains(t, err, "ringfenced serves no internal RPCs")

	_, err = Load(AllInOne, nil, []string{"RINGFENCE_PEERS__POOL_ADDR=127.0.0.1:50052"}, io.Discard)
	require.ErrorContains(t, err, "peers.pool_addr (RINGFENCE_PEERS__POOL_ADDR) is set, but ringfenced dials no peer")

	_, err = Load(AllInOne, nil, []string{"RINGFENCE_OTEL__ENDPOINT=collector:4317"}, io.Discard)
	require.ErrorContains(t, err, "otel.endpoint (RINGFENCE_OTEL__ENDPOINT)")
	cfg, err = Load(AllInOne, nil, []string{"RINGFENCE_OTEL__ENDPOINT=http://127.0.0.1:4317"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:4317", cfg.OTel.Endpoint)
}

// TestDeployEnvironmentsLoad keeps the environment that deploy/compose/compose.yaml and the
// systemd unit give each service to keys the services know: an unknown RINGFENCE_* variable
// stops a service at start, so a renamed key would break a deployment that copied them.
func TestDeployEnvironmentsLoad(t *testing.T) {
	// compose.etcd.yaml (the scaled-out rehearsal) names replicas registry-1, registry-2, ...
	// beside etcd members and a helper, which are not Ringfence's.
	replica := regexp.MustCompile(`-[0-9]+$`)
	for _, file := range []string{"compose.yaml", "compose.etcd.yaml"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "compose", file))
		require.NoError(t, err)
		var compose struct {
			Services map[string]struct {
				Environment map[string]string `yaml:"environment"`
				Volumes     []string          `yaml:"volumes"`
			} `yaml:"services"`
		}
		require.NoError(t, yaml.Unmarshal(raw, &compose))
		require.NotEmpty(t, compose.Services)
		for name, svc := range compose.Services {
			name = replica.ReplaceAllString(name, "")
			if name != "secrets-key" {
				checkComposeCertificates(t, file+"/"+name, name, svc.Volumes)
			}
			if name == "etcd" || name == "secrets-key" {
				continue
			}
			checkComposeService(t, file+"/"+name, name, svc.Environment)
		}
	}

	unit, err := os.ReadFile(filepath.Join("..", "..", "deploy", "systemd", "ringfence-pool.service"))
	require.NoError(t, err)
	var env []string
	for _, line := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(line, "Environment="); ok {
			env = append(env, v)
		}
	}
	require.NotEmpty(t, env)
	_, err = Load("ringfence-pool", []string{"--config", filepath.Join("..", "..", "deploy", "config", "pool.yaml")}, env, io.Discard)
	require.NoError(t, err, "the systemd unit with the pool.yaml it names")
}

// checkComposeCertificates: a compose service mounts the CA certificate and its own
// certificate and key, never the whole directory certs init wrote, which holds the CA's key
// and every other service's key (with either, it could pass for any service).
func checkComposeCertificates(t *testing.T, label, name string, volumes []string) {
	t.Helper()
	var mounted []string
	for _, v := range volumes {
		source, _, _ := strings.Cut(v, ":")
		if source == "./certs" || strings.HasPrefix(source, "./certs/") {
			mounted = append(mounted, strings.TrimPrefix(source, "./certs/"))
		}
	}
	require.ElementsMatch(t, []string{"ca.pem", name + ".pem", name + "-key.pem"}, mounted, "%s mounts of ./certs", label)
}

// checkComposeService loads a compose service's environment as its binary would.
func checkComposeService(t *testing.T, label, name string, environment map[string]string) {
	// ${NAME:-default} takes its default; ${NAME:?message} needs a value from the operator.
	interpolation := regexp.MustCompile(`\$\{[A-Z_]+(:-([^}]*)|:\?[^}]*)\}`)
	t.Run(label, func(t *testing.T) {
		require.NotEmpty(t, environment, "the x-common environment is merged in")
		var env []string
		for k, v := range environment {
			v = interpolation.ReplaceAllStringFunc(v, func(s string) string {
				if m := interpolation.FindStringSubmatch(s); strings.HasPrefix(m[1], ":-") {
					return m[2]
				}
				if k == "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE" {
					return "registry.example/mcp@" + digest // what the operator supplies: pinned
				}
				return "operator-supplied-value"
			})
			env = append(env, k+"="+v)
		}
		cfg, err := Load(binaryOf(name), nil, env, io.Discard)
		require.NoError(t, err)
		require.True(t, cfg.IsProduction())
	})
}

// TestSeedNamesAreAliases: the seed's ZEROTH_ names configure the same keys as the RINGFENCE_
// ones; when both are set the RINGFENCE_ name wins, with a warning, and a ZEROTH_ name that is
// no alias is ignored with a warning naming the closest one, not refused.
func TestSeedNamesAreAliases(t *testing.T) {
	image := "registry.example/mcp@" + digest
	cfg, err := load(t, nil, []string{
		"ZEROTH_SANDBOX__MCP_ISOLATION_IMAGE=" + image,
		"ZEROTH_SANDBOX__MCP_ISOLATION_NETWORK=isolated",
		`ZEROTH_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS=["APP_TOKEN"]`,
		"ZEROTH_SANDBOX__ALLOW_UNISOLATED_MCP_DEVELOPMENT=true",
		`ZEROTH_SERVICE_ROLES_JSON={"viewer":["audit:read"]}`,
	})
	require.NoError(t, err)
	require.Equal(t, image, cfg.Sandbox.MCPIsolationImage)
	require.Equal(t, "isolated", cfg.Sandbox.MCPIsolationNetwork)
	require.Equal(t, []string{"APP_TOKEN"}, cfg.Sandbox.MCPIsolationAllowedEnvironmentKeys)
	require.True(t, cfg.Sandbox.AllowUnisolatedMCPDevelopment)
	require.JSONEq(t, `{"viewer":["audit:read"]}`, cfg.ServiceRolesJSON)
	require.Empty(t, cfg.Warnings)

	cfg, err = load(t, nil, []string{
		"ZEROTH_SANDBOX__MCP_ISOLATION_NETWORK=from-zeroth",
		"RINGFENCE_SANDBOX__MCP_ISOLATION_NETWORK=from-ringfence",
		"ZEROTH_SANDBOX__MCP_ISOLATON_IMAGE=x",
		"ZEROTH_DATABASE_URL=postgres://elsewhere",
	})
	require.NoError(t, err)
	require.Equal(t, "from-ringfence", cfg.Sandbox.MCPIsolationNetwork, "the RINGFENCE_ name wins")
	require.Equal(t, []string{
		"ZEROTH_DATABASE_URL is ignored: it is not the alias of a Ringfence setting (remove it; --help lists every key)",
		"ZEROTH_SANDBOX__MCP_ISOLATION_NETWORK is ignored: RINGFENCE_SANDBOX__MCP_ISOLATION_NETWORK is also set, and wins",
		"ZEROTH_SANDBOX__MCP_ISOLATON_IMAGE is ignored: it is not the alias of a Ringfence setting (did you mean RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE?)",
	}, cfg.Warnings)

	_, err = load(t, nil, []string{"ZEROTH_POOL__MAX_RUNS=many"})
	require.ErrorContains(t, err, `pool.max_runs (ZEROTH_POOL__MAX_RUNS, read as RINGFENCE_POOL__MAX_RUNS) "many" is not an integer`)
}

// TestARuleNamesTheVariableItsValueCameFrom: a value that parses but breaks a rule at start is
// named by where it was set, as a value that does not parse is: the ZEROTH_ alias (read as the
// RINGFENCE_ name), the flag or the file; the RINGFENCE_ name when set so or left at the default.
func TestARuleNamesTheVariableItsValueCameFrom(t *testing.T) {
	for env, want := range map[string]string{
		"ZEROTH_SANDBOX__MCP_ISOLATION_IMAGE=alpine:latest": `sandbox.mcp_isolation_image (ZEROTH_SANDBOX__MCP_ISOLATION_IMAGE, read as RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE) "alpine:latest" is not pinned by digest`,
		"ZEROTH_ENV=prodx":                  `env (ZEROTH_ENV, read as RINGFENCE_ENV) "prodx" is not an environment`,
		"RINGFENCE_ENV=prodx":               `env (RINGFENCE_ENV) "prodx" is not an environment`,
		"ZEROTH_STORE__ETCD_CA_FILE=ca.pem": "store.backend (RINGFENCE_STORE__BACKEND) is bbolt, but etcd settings are set",
	} {
		_, err := Load(AllInOne, nil, []string{env}, io.Discard)
		require.ErrorContains(t, err, want, env)
	}
	_, err := Load(AllInOne, nil, []string{"ZEROTH_ENV=production", "ZEROTH_SANDBOX__ALLOW_UNISOLATED_MCP_DEVELOPMENT=true"}, io.Discard)
	require.ErrorContains(t, err, "sandbox.allow_unisolated_mcp_development (ZEROTH_SANDBOX__ALLOW_UNISOLATED_MCP_DEVELOPMENT, read as RINGFENCE_SANDBOX__ALLOW_UNISOLATED_MCP_DEVELOPMENT) is refused in production")
	_, err = Load(AllInOne, nil, []string{"ZEROTH_STORE__BACKEND=etcd", `ZEROTH_STORE__ETCD_ENDPOINTS=["https://etcd-1:2379"]`, "ZEROTH_STORE__ETCD_CA_FILE=ca.pem"}, io.Discard)
	require.ErrorContains(t, err, "(ZEROTH_STORE__ETCD_CA_FILE, RINGFENCE_STORE__ETCD_CERT_FILE, RINGFENCE_STORE__ETCD_KEY_FILE) must be set together", "a rule over several keys names the alias that set one")

	_, err = Load(AllInOne, []string{"--env", "prodx"}, []string{"ZEROTH_ENV=production"}, io.Discard)
	require.ErrorContains(t, err, `env (--env) "prodx" is not an environment`, "the flag wins, and is named")
	file := filepath.Join(t.TempDir(), "ringfenced.yaml")
	require.NoError(t, os.WriteFile(file, []byte("env: prodx\n"), 0o600))
	_, err = Load(AllInOne, []string{"--config", file}, nil, io.Discard)
	require.ErrorContains(t, err, `env (in `+file+`) "prodx" is not an environment`)
	_, err = Load(AllInOne, []string{"--config", file}, []string{"RINGFENCE_ENV=prodz"}, io.Discard)
	require.ErrorContains(t, err, `env (RINGFENCE_ENV) "prodz" is not an environment`, "the environment wins over the file, and is named")

	cfg, err := Load(AllInOne, nil, []string{`ZEROTH_SERVICE_ROLES_JSON={"viewer":["audit:read"]}`}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "ZEROTH_SERVICE_ROLES_JSON, read as RINGFENCE_SERVICE_ROLES_JSON", cfg.Source("service_roles_json"), "what the roles check names (internal/app)")
	require.Equal(t, "RINGFENCE_ENV", cfg.Source("env"))
}

// TestInvalidValuesAllAtOnce: values that do not parse are reported together with the values
// that break a rule, each with its key, where it was set and the fix, so one start names them
// all (docs/configuration.md).
func TestInvalidValuesAllAtOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ringfenced.yaml")
	require.NoError(t, os.WriteFile(file, []byte("pool:\n  max_sessions: lots\n"), 0o600))
	_, err := load(t, []string{"--config", file, "--pool.drift-max-age=soon"}, []string{
		"RINGFENCE_POOL__MAX_RUNS=many",
		"RINGFENCE_SANDBOX__MCP_ISOLATION_CPUS=one",
		"RINGFENCE_GRPC_ADDR=x",
	})
	require.Error(t, err)
	msg := err.Error()
	require.True(t, strings.HasPrefix(msg, "config: invalid configuration:\n"), msg)
	for _, want := range []string{
		`pool.max_runs (RINGFENCE_POOL__MAX_RUNS) "many" is not an integer: use a whole number, e.g. 256`,
		`sandbox.mcp_isolation_cpus (RINGFENCE_SANDBOX__MCP_ISOLATION_CPUS) "one" is not a number: use a decimal number, e.g. 1`,
		`pool.drift_max_age (--pool.drift-max-age) "soon" is not a duration: use e.g. 500ms, 2s or 15m`,
		`pool.max_sessions (in ` + file + `) "lots" is not an integer: use a whole number, e.g. 512`,
		`grpc_addr (RINGFENCE_GRPC_ADDR) "x" is not host:port`,
	} {
		require.Contains(t, msg, want)
	}
}

// TestStoreSettings: the etcd back end needs its members' URLs and takes mutual TLS to them,
// which production requires; etcd settings under bbolt, and etcd for the pool, are refused
// rather than ignored.
func TestStoreSettings(t *testing.T) {
	etcdTLS := []string{
		"RINGFENCE_STORE__BACKEND=etcd",
		`RINGFENCE_STORE__ETCD_ENDPOINTS=["https://etcd-1:2379","https://etcd-2:2379"]`,
		"RINGFENCE_STORE__ETCD_CA_FILE=ca.pem", "RINGFENCE_STORE__ETCD_CERT_FILE=registry.pem", "RINGFENCE_STORE__ETCD_KEY_FILE=registry-key.pem",
	}
	cfg, err := load(t, nil, append(etcdTLS, "RINGFENCE_ENV=production"))
	require.NoError(t, err)
	require.True(t, cfg.Store.Etcd())
	require.Equal(t, []string{"https://etcd-1:2379", "https://etcd-2:2379"}, cfg.Store.EtcdEndpoints)
	require.Equal(t, defaultEtcdPrefix, cfg.Store.EtcdPrefix, "the constant is the tag's default")

	cfg, err = load(t, nil, []string{"RINGFENCE_STORE__BACKEND=etcd", `RINGFENCE_STORE__ETCD_ENDPOINTS=["http://127.0.0.1:2379"]`})
	require.NoError(t, err, "plain http without TLS files in development")
	require.True(t, cfg.Store.Etcd())
	cfg, err = load(t, nil, nil)
	require.NoError(t, err)
	require.Equal(t, "bbolt", cfg.Store.Backend, "the default")

	for name, tc := range map[string]struct {
		env  []string
		want string
	}{
		"unknown back end": {[]string{"RINGFENCE_STORE__BACKEND=postgres"}, `store.backend (RINGFENCE_STORE__BACKEND) "postgres" is not a back end: use bbolt or etcd`},
		"no endpoints":     {[]string{"RINGFENCE_STORE__BACKEND=etcd"}, "store.etcd_endpoints (RINGFENCE_STORE__ETCD_ENDPOINTS) is empty, and store.backend is etcd"},
		"not a URL": {[]string{"RINGFENCE_STORE__BACKEND=etcd", `RINGFENCE_STORE__ETCD_ENDPOINTS=["etcd-1:2379"]`},
			`"etcd-1:2379" is not an etcd client URL: use https://host:port`},
		"https without TLS": {[]string{"RINGFENCE_STORE__BACKEND=etcd", `RINGFENCE_STORE__ETCD_ENDPOINTS=["https://etcd-1:2379"]`},
			`"https://etcd-1:2379" is https://, but the TLS files are unset`},
		"http with TLS": {append(slices.Clone(etcdTLS[2:]), "RINGFENCE_STORE__BACKEND=etcd", `RINGFENCE_STORE__ETCD_ENDPOINTS=["http://etcd-1:2379"]`),
			`"http://etcd-1:2379" is http://, but the TLS files are set`},
		"half the TLS files": {append(slices.Clone(etcdTLS[:3]), "RINGFENCE_STORE__ETCD_CERT_FILE=registry.pem"),
			"store.etcd_ca_file, store.etcd_cert_file and store.etcd_key_file (RINGFENCE_STORE__ETCD_CA_FILE, RINGFENCE_STORE__ETCD_CERT_FILE, RINGFENCE_STORE__ETCD_KEY_FILE) must be set together"},
		"production without TLS": {[]string{"RINGFENCE_ENV=production", "RINGFENCE_STORE__BACKEND=etcd", `RINGFENCE_STORE__ETCD_ENDPOINTS=["http://etcd-1:2379"]`},
			"are required in production: etcd holds the registry's sealed secrets"},
		"etcd settings under bbolt": {[]string{`RINGFENCE_STORE__ETCD_ENDPOINTS=["https://etcd-1:2379"]`},
			"store.backend (RINGFENCE_STORE__BACKEND) is bbolt, but etcd settings are set: set it to etcd to use them"},
		"etcd prefix under bbolt": {[]string{"RINGFENCE_STORE__ETCD_PREFIX=/ringfence-staging"},
			"store.backend (RINGFENCE_STORE__BACKEND) is bbolt, but etcd settings are set: set it to etcd to use them"},
		"bad prefix": {append(slices.Clone(etcdTLS), "RINGFENCE_STORE__ETCD_PREFIX=ringfence/"),
			`store.etcd_prefix (RINGFENCE_STORE__ETCD_PREFIX) "ringfence/" is not a key prefix`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := load(t, nil, tc.env)
			require.ErrorContains(t, err, tc.want)
		})
	}

	tlsEnv := []string{"RINGFENCE_TLS__CERT_FILE=c.pem", "RINGFENCE_TLS__KEY_FILE=k.pem", "RINGFENCE_TLS__CLIENT_CA_FILE=ca.pem"}
	for _, binary := range []string{"ringfence-registry", "ringfence-publisher", "ringfence-pool", "ringfence-audit", AllInOne} {
		env := etcdTLS
		if binary != AllInOne {
			env = append(slices.Clone(etcdTLS), tlsEnv...)
		}
		_, err := Load(binary, nil, env, io.Discard)
		require.NoError(t, err, binary)
	}

	// A pool host on etcd tells the others where its internal plane is.
	cfg, err = Load("ringfence-pool", nil, append(slices.Clone(etcdTLS), tlsEnv...), io.Discard)
	require.NoError(t, err)
	require.Equal(t, DefaultInternalAddr, cfg.Pool.AdvertiseAddr, "internal_addr by default")
	_, err = Load("ringfence-pool", nil, append(slices.Clone(etcdTLS), append(tlsEnv, "RINGFENCE_INTERNAL_ADDR=0.0.0.0:50052")...), io.Discard)
	require.ErrorContains(t, err, `pool.advertise_addr (RINGFENCE_POOL__ADVERTISE_ADDR) "0.0.0.0:50052" is not an address other pool hosts can dial`)
	cfg, err = Load("ringfence-pool", nil, append(slices.Clone(etcdTLS), append(tlsEnv, "RINGFENCE_INTERNAL_ADDR=0.0.0.0:50052", "RINGFENCE_POOL__ADVERTISE_ADDR=pool-1:50052")...), io.Discard)
	require.NoError(t, err)
	require.Equal(t, "pool-1:50052", cfg.Pool.AdvertiseAddr)
	_, err = Load("ringfence-pool", nil, append(slices.Clone(etcdTLS), append(tlsEnv, "RINGFENCE_POOL__HOST_LEASE_TTL=100ms")...), io.Discard)
	require.ErrorContains(t, err, "pool.host_lease_ttl")

	// On bbolt the settings of pool hosts sharing etcd would do nothing: refused, as store.etcd_* are.
	for _, binary := range []string{"ringfence-pool", AllInOne} {
		env := []string{"RINGFENCE_POOL__HOST_ID=pool-1", "RINGFENCE_POOL__ADVERTISE_ADDR=pool-1:50052", "RINGFENCE_POOL__HOST_LEASE_TTL=5s"}
		if binary != AllInOne {
			env = append(env, tlsEnv...)
		}
		_, err = Load(binary, nil, env, io.Discard)
		for _, key := range []string{"pool.host_id (RINGFENCE_POOL__HOST_ID)", "pool.advertise_addr", "pool.host_lease_ttl"} {
			require.ErrorContains(t, err, key+" ", binary)
		}
		require.ErrorContains(t, err, "store.backend is bbolt, and only pool hosts sharing etcd use it")
	}
}
