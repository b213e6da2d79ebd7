// Package config loads the runtime configuration every Ringfence binary shares.
//
// Sources, strongest first: command-line flags, RINGFENCE_* environment variables (nesting
// with "__", as in RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE), an optional YAML file, defaults.
// Every key is declared once, as a field of Config with a `key` tag; flag names, env names and
// YAML paths all derive from it, so the three sources cannot drift apart. Unknown keys and
// invalid values stop the start with a message that names the key, where it came from, and
// the fix.
package config

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ringfence/ringfence/internal/documents"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/telemetry"
)

// Config is the typed runtime configuration. Field tags:
//
//	key:     the key, snake_case; nested structs add a "section." prefix
//	default: the default value, parsed like any other source
//	help:    one line for --help and docs
//	secret:  the value is never printed
type Config struct {
	Env      string `key:"env" default:"development" help:"development or production; production refuses every development escape hatch"`
	DataDir  string `key:"data_dir" default:"./data" help:"directory for the bbolt files and the secrets key"`
	GRPCAddr string `key:"grpc_addr" default:"127.0.0.1:50051" help:"gRPC listen address"`
	HTTPAddr string `key:"http_addr" default:"127.0.0.1:8000" help:"REST, /healthz and /metrics listen address; empty disables"`
	// InternalAddr has no static default: a split binary listens on DefaultInternalAddr when it
	// is unset, and ringfenced, whose services call each other in-process, on nothing.
	InternalAddr      string `key:"internal_addr" help:"split binaries: listen address of the internal plane (ringfence.internal.*), mutual TLS only; peers' peers.*_addr name it; default 127.0.0.1:50052; ringfenced serves none"`
	LogLevel          string `key:"log_level" default:"info" help:"debug, info, warn or error"`
	LogFormat         string `key:"log_format" default:"text" help:"text or json"`
	BootstrapAdminKey string `key:"bootstrap_admin_key" secret:"true" help:"this exact value becomes an admin API key at start (idempotent)"`
	ServiceRolesJSON  string `key:"service_roles_json" help:"custom roles as a JSON object: {\"role\": [\"permission\", ...]}"`
	SecretsKeyFile    string `key:"secrets_key_file" help:"AES-256 key file for secrets at rest, one key a line (64 hex characters; the first seals, every one opens: to rotate it, see docs/operations.md); default <data_dir>/secrets.key, created 0600 on first start"`

	// Warnings are what loading noticed without refusing it (a ZEROTH_ alias another name
	// overrides, say); the binary logs them once its logger exists.
	Warnings []string

	// sources maps a key Load set from somewhere other than its RINGFENCE_ variable to where
	// that was (Source), so a refusal names what the operator set.
	sources map[string]string

	TLS       TLS       `key:"tls"`
	Store     Store     `key:"store"`
	Peers     Peers     `key:"peers"`
	OTel      OTel      `key:"otel"`
	Sandbox   Sandbox   `key:"sandbox"`
	Pool      Pool      `key:"pool"`
	Documents Documents `key:"documents"`
	FrontDoor FrontDoor `key:"frontdoor"`
	OAuth     OAuth     `key:"oauth"`
	Audit     Audit     `key:"audit"`
	Limits    Limits    `key:"limits"`
	Debug     Debug     `key:"debug"`
	Dev       Dev       `key:"dev"`
}

// TLS is this binary's certificate and the CA its clients' certificates must chain to.
// Split deployments set all three; internal RPCs then require a service certificate.
type TLS struct {
	CertFile     string `key:"cert_file" help:"PEM certificate served on gRPC and HTTP (REST, /healthz, /metrics) and presented to peers"`
	KeyFile      string `key:"key_file" help:"PEM private key of cert_file"`
	ClientCAFile string `key:"client_ca_file" help:"PEM CA bundle that client and peer certificates must chain to"`
}

// Enabled reports whether TLS is configured.
func (t TLS) Enabled() bool { return t.CertFile != "" }

// Store chooses where the registry, the publisher and the audit log keep their state: a bbolt
// file each in data_dir, or an etcd cluster that several replicas of each share (the audit
// instances keep a copy of the log in data_dir too). The pool keeps its state in bbolt.
type Store struct {
	Backend       string   `key:"backend" default:"bbolt" help:"bbolt (a file per service in data_dir) or etcd (registry, publisher and audit log state in an etcd cluster their replicas share)"`
	EtcdEndpoints []string `key:"etcd_endpoints" help:"JSON list of the etcd members' client URLs, e.g. [\"https://etcd-1:2379\",\"https://etcd-2:2379\",\"https://etcd-3:2379\"]"`
	EtcdCAFile    string   `key:"etcd_ca_file" help:"PEM CA bundle the etcd members' certificates chain to"`
	EtcdCertFile  string   `key:"etcd_cert_file" help:"PEM client certificate this service presents to etcd (mutual TLS)"`
	EtcdKeyFile   string   `key:"etcd_key_file" help:"PEM private key of etcd_cert_file"`
	EtcdPrefix    string   `key:"etcd_prefix" default:"/ringfence" help:"prefix of every key Ringfence keeps in etcd (<prefix>/registry/..., <prefix>/publisher/...); deployments sharing a cluster need one each"`
}

// Etcd reports whether the etcd back end is chosen.
func (s Store) Etcd() bool { return s.Backend == "etcd" }

// etcdTLS reports how many of the three etcd TLS files are set.
func (s Store) etcdTLS() int { return countSet(s.EtcdCAFile, s.EtcdCertFile, s.EtcdKeyFile) }

// Peers are the internal addresses (each peer's internal_addr) of the other services in a
// split deployment. Empty means the service runs in this process (ringfenced) or is not needed
// by this binary.
type Peers struct {
	RegistryAddr  string `key:"registry_addr" help:"internal address (internal_addr) of ringfence-registry"`
	PublisherAddr string `key:"publisher_addr" help:"internal address (internal_addr) of ringfence-publisher"`
	PoolAddr      string `key:"pool_addr" help:"internal address (internal_addr) of ringfence-pool"`
	AuditAddr     string `key:"audit_addr" help:"internal address (internal_addr) of ringfence-audit; with several audit instances (store.backend=etcd), each one's, comma-separated: records go to whichever leads"`
}

// OTel configures tracing (OpenTelemetry). Nothing is exported unless Endpoint is set.
type OTel struct {
	Endpoint string `key:"endpoint" help:"OTLP/gRPC collector URL (http://host:4317, or https://) to export traces to; empty exports nothing"`
}

// Sandbox is the operator-owned isolation profile for stdio MCP servers. No registration can
// change any of it.
type Sandbox struct {
	MCPIsolationImage                  string        `key:"mcp_isolation_image" help:"pinned isolation image: name@sha256:<64 hex> or sha256:<64 hex>"`
	MCPIsolationNetwork                string        `key:"mcp_isolation_network" default:"none" help:"Docker network for MCP containers; none unless you need egress"`
	MCPIsolationAllowedEnvironmentKeys []string      `key:"mcp_isolation_allowed_environment_keys" help:"JSON list of env keys registrations may set"`
	MCPIsolationCPUs                   float64       `key:"mcp_isolation_cpus" default:"1" help:"CPU limit per MCP container"`
	MCPIsolationMemory                 ByteSize      `key:"mcp_isolation_memory" default:"512MiB" help:"memory limit per MCP container (memory+swap)"`
	MCPIsolationPids                   int64         `key:"mcp_isolation_pids" default:"128" help:"PID limit per MCP container"`
	MCPIsolationTmpSize                ByteSize      `key:"mcp_isolation_tmp_size" default:"64MiB" help:"size of the noexec /tmp tmpfs"`
	AllowUnisolatedMCPDevelopment      bool          `key:"allow_unisolated_mcp_development" help:"run stdio MCP servers as host processes (development only; refused in production)"`
	PoolID                             string        `key:"pool_id" help:"label that lets a restarted pool sweep its orphaned containers; default derived from data_dir"`
	DockerHost                         string        `key:"docker_host" help:"Docker engine endpoint; default from DOCKER_HOST or the local socket"`
	Runtime                            string        `key:"runtime" help:"OCI runtime of MCP containers, as the engine names it (e.g. runsc for gVisor); default the engine's default runtime"`
	StopTimeout                        time.Duration `key:"stop_timeout" default:"2s" help:"bound on a graceful MCP server stop before it is forced"`
}

// Pool holds the run-time session and gate settings.
type Pool struct {
	DriftMaxAge    time.Duration `key:"drift_max_age" default:"1s" help:"re-list a session's tools before a call when its listing is older; 0 re-lists before every call"`
	RunIdleTimeout time.Duration `key:"run_idle_timeout" default:"15m" help:"end runs with no call for this long"`
	PausedTimeout  time.Duration `key:"paused_run_timeout" default:"168h" help:"end runs paused for this long (an approval that never came); 0 keeps paused runs until they are ended"`
	MaxRuns        int           `key:"max_runs" default:"256" help:"concurrent active runs on this host"`
	MaxSessions    int           `key:"max_sessions" default:"512" help:"concurrent MCP sessions on this host, warm ones included"`
	MaxWarm        int           `key:"max_warm" default:"16" help:"warm containers (registrations' prewarm) this host keeps ready at most, all servers together; 0 keeps none"`
	WarmMaxAge     time.Duration `key:"warm_max_age" default:"10m" help:"a warm container that waited this long is replaced by a fresh one"`
	AllowAdvisory  bool          `key:"allow_advisory" help:"honour graphs whose capability_mode is advisory (the agent floor recorded, not enforced); off, every graph's agent floor is enforced"`
	// ResultBudget 0 is derived at start (DefaultResultBudget).
	ResultBudget     ByteSize      `key:"result_budget" help:"bytes of tool results this pool holds in flight at once, across runs (each costs about three times its size in heap while it is handled); default a quarter of GOMEMLIMIT when that is set, else 256MiB"`
	ResultBudgetWait time.Duration `key:"result_budget_wait" default:"10s" help:"how long a call waits for room in the result budget before it is refused (limit_exceeded), and a result being read before its call fails (result_too_large)"`
	// ApprovalTimeout bounds how long a call waits for an approver, and how long an approved
	// call's outcome waits for the caller's retry.
	ApprovalTimeout time.Duration `key:"approval_timeout" default:"15m" help:"a call that asks a person first expires as refused when nobody decides it for this long; an approved call's result waits this long for the caller's retry"`
	// Several pool hosts share etcd (store.backend=etcd on ringfence-pool).
	HostID        string        `key:"host_id" help:"with store.backend=etcd: this pool host's id among the hosts sharing the cluster; default sandbox.pool_id (derived from data_dir when unset)"`
	AdvertiseAddr string        `key:"advertise_addr" help:"with store.backend=etcd: host:port where the other pool hosts reach this one's internal plane; default internal_addr (which must then name a host, not 0.0.0.0)"`
	HostLeaseTTL  time.Duration `key:"host_lease_ttl" default:"10s" help:"with store.backend=etcd: a pool host the cluster has not heard from for this long is lost, and its runs fail (ResumeRun re-homes them on a live host)"`
}

// DefaultResultBudget is pool.result_budget when none is set: a quarter of memoryLimit (the
// process's GOMEMLIMIT; math.MaxInt64 when there is none) when that is set, else 256 MiB. Each
// result costs about three times its size in heap while the pool handles it.
func DefaultResultBudget(memoryLimit int64) ByteSize {
	if memoryLimit > 0 && memoryLimit < math.MaxInt64 {
		return ByteSize(max(memoryLimit/4, 1<<20))
	}
	return 256 << 20
}

// FrontDoor configures the MCP front door: the pool's agents' tools served as MCP at /mcp on
// the HTTP listener, to clients holding an agent token (ringfence runs connect).
type FrontDoor struct {
	Enabled             bool          `key:"enabled" default:"true" help:"serve the MCP front door at /mcp on the HTTP listener (ringfenced and ringfence-pool)"`
	PublicURL           string        `key:"public_url" help:"the front door's URL as clients reach it, which ringfence runs connect prints and whose host the front door answers to; default http(s)://<http_addr>/mcp"`
	AllowedHosts        []string      `key:"allowed_hosts" help:"JSON list of host names a request's Host may name besides public_url's (DNS-rebinding protection); loopback names are allowed on a loopback listener"`
	AllowedOrigins      []string      `key:"allowed_origins" help:"JSON list of browser origins (scheme://host[:port]) allowed besides public_url's; loopback origins are allowed on a loopback listener"`
	TokenTTL            time.Duration `key:"token_ttl" default:"1h" help:"an agent token's lifetime when ringfence runs connect names none"`
	TokenMaxTTL         time.Duration `key:"token_max_ttl" default:"24h" help:"the longest lifetime an agent token may ask for"`
	ListTTL             time.Duration `key:"list_ttl" default:"5s" help:"how long an agent's tool listing is served before it is read again (the ttlMs of tools/list)"`
	MaxBodyBytes        ByteSize      `key:"max_body_bytes" default:"2MiB" help:"largest request body (a call's arguments are at most 1MiB)"`
	RateLimit           float64       `key:"rate_limit" default:"20" help:"requests a second one agent token may make on average; past it (and rate_burst) a request is 429 with Retry-After"`
	RateBurst           int           `key:"rate_burst" default:"40" help:"requests one agent token may make at once"`
	SessionIdleTimeout  time.Duration `key:"session_idle_timeout" default:"30m" help:"close a session that received no request for this long"`
	MaxSessionsPerAgent int           `key:"max_sessions_per_agent" default:"16" help:"open sessions one agent of a run may have at once"`
	ClientApprovals     bool          `key:"client_approvals" default:"true" help:"let the client's user approve a call that asks a person first, when the client can be asked (elicitation); off, such a call waits for an approver (ringfence runs approve)"`
}

// OAuth configures sign-in to servers that sign each user in (docs/oauth.md).
type OAuth struct {
	CallbackURL       string        `key:"callback_url" help:"where authorization servers send users back: /v1/oauth/callback on the pool's HTTP listener as the user's browser reaches it, which each authorization server must list as the client's redirect URI; default the origin of frontdoor.public_url, else http(s)://<http_addr>, with /v1/oauth/callback"`
	ClientMetadataURL string        `key:"client_metadata_url" help:"the URL of the pool's client ID metadata document as authorization servers reach it, which is the client id it stands for; it must be https for them to accept it (else the pool registers itself where it can); default the callback's origin with /v1/oauth/client-metadata"`
	StateTTL          time.Duration `key:"state_ttl" default:"10m" help:"how long an authorization URL is good (its state is single use)"`
	RefreshBefore     time.Duration `key:"refresh_before" default:"1m" help:"refresh a user's token this long before it expires"`
}

// Documents configures how my-documents://<id> references in tool arguments are resolved: the
// pool's built-in store (PutDocument), or a platform's own document service.
type Documents struct {
	URLTemplate    string   `key:"url_template" help:"resolve references with one GET to this URL instead of the built-in store, {tenant} and {id} filled in, e.g. https://docs.internal/api/{tenant}/{id}"`
	TokenFile      string   `key:"token_file" help:"file holding the bearer token sent to url_template (read on every request, so it can be rotated)"`
	MaxBytes       ByteSize `key:"max_bytes" default:"10MiB" help:"largest document stored or fetched"`
	MaxCallBytes   ByteSize `key:"max_call_bytes" default:"16MiB" help:"most document content one call receives, all its references together (before base64)"`
	MaxTenantBytes ByteSize `key:"max_tenant_bytes" default:"1GiB" help:"most document content one tenant stores in the built-in store"`
}

// Audit holds the producer-side spool settings.
type Audit struct {
	SpoolMaxRecords int    `key:"spool_max_records" default:"100000" help:"audit records a producer may hold while the audit service is unreachable"`
	OnSpoolFull     string `key:"on_spool_full" default:"fail_closed" help:"fail_closed refuses changes when the spool is full; continue_and_alarm drops records and alarms"`
	// RequeueQuarantine is a one-shot switch for after an upgrade of the audit service.
	RequeueQuarantine bool `key:"requeue_quarantine" help:"at start, put the records each producer quarantined (refused by the audit log) back in its spool; set it for one start after upgrading the audit service"`
}

// Limits bound what one peer can hold on the gRPC and HTTP listeners, and how long a backup's
// client may stall. The others (streams per connection, header size, keepalive) are fixed:
// docs/security.md states them.
type Limits struct {
	MaxConnectionsPerAddress int           `key:"max_connections_per_address" default:"128" help:"open connections one peer address (an IPv4 address or an IPv6 /64) may hold on each listener; raise it when clients reach the server through a proxy or NAT that hides their addresses"`
	BackupStallTimeout       time.Duration `key:"backup_stall_timeout" default:"1m" help:"a backup (ringfence backup) whose client takes no chunk (1 MiB) of it for this long is ended, DEADLINE_EXCEEDED, so a client that stops reading never holds a bbolt read transaction, and with it every write that must grow the file; raise it for a very slow link"`
}

// Debug holds what an operator turns on to look inside a running binary.
type Debug struct {
	PprofAddr string `key:"pprof_addr" help:"loopback address (e.g. 127.0.0.1:6060) to serve Go's profiles on, /debug/pprof/; empty serves none"`
}

// Dev holds development-only escape hatches; production refuses each of them.
type Dev struct {
	AllowInlineMCPServers bool `key:"allow_inline_mcp_servers" help:"publish graphs with inline mcp_servers over a warning, and run them (no ceiling applies to them)"`
}

// The binaries whose configuration Load checks beyond the keys themselves.
const (
	AllInOne = "ringfenced"
	// DefaultInternalAddr is a split binary's internal_addr when none is set.
	DefaultInternalAddr = "127.0.0.1:50052"
)

// SplitBinaries run one service each and serve its internal RPCs to their peers.
var SplitBinaries = []string{"ringfence-registry", "ringfence-publisher", "ringfence-pool", "ringfence-audit"}

// IsProduction reports whether the deployment declared itself production.
func (c *Config) IsProduction() bool { return c.Env == "production" }

var imageRefPattern = regexp.MustCompile(`^(?:[a-z0-9][a-z0-9._/:-]*@)?sha256:[0-9a-f]{64}$`)

// runtimeNamePattern is a runtime name as the engine takes it (a key of daemon.json "runtimes").
var runtimeNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

// Validate checks every value and cross-field rule, returning all problems at once.
func (c *Config) Validate() error { return c.check().err(c.Source) }

// Source says where key's value came from, as a refusal names it: the RINGFENCE_ variable
// (also for a key left at its default), "ZEROTH_X, read as RINGFENCE_X" for the seed's alias,
// "--flag", or "in <file>".
func (c *Config) Source(key string) string {
	if s, ok := c.sources[key]; ok {
		return s
	}
	return EnvName(key)
}

// variable is the environment variable a rule over several keys names for key: the ZEROTH_
// alias when that is what set it, else the RINGFENCE_ name.
func (c *Config) variable(key string) string {
	if s := c.sources[key]; strings.HasPrefix(s, AliasPrefix) {
		alias, _, _ := strings.Cut(s, ",")
		return alias
	}
	return EnvName(key)
}

// check is Validate's list of problems, which Load reports with the values that did not parse.
func (c *Config) check() problems {
	var errs problems
	switch c.Env {
	case "development", "production":
	default:
		errs.add("env", fmt.Sprintf("%q is not an environment", c.Env), "use development or production")
	}
	if c.DataDir == "" {
		errs.add("data_dir", "is empty", "name a directory the service may write")
	}
	if err := checkAddr(c.GRPCAddr); err != nil {
		errs.add("grpc_addr", err.Error(), "use host:port, e.g. 127.0.0.1:50051")
	}
	if c.HTTPAddr != "" {
		if err := checkAddr(c.HTTPAddr); err != nil {
			errs.add("http_addr", err.Error(), "use host:port, e.g. 127.0.0.1:8000, or empty to disable REST")
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs.add("log_level", fmt.Sprintf("%q is not a level", c.LogLevel), "use debug, info, warn or error")
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		errs.add("log_format", fmt.Sprintf("%q is not a format", c.LogFormat), "use text or json")
	}
	if c.BootstrapAdminKey != "" && len(c.BootstrapAdminKey) < 16 {
		errs.add("bootstrap_admin_key", "is shorter than 16 characters", "use a long random value, e.g. `openssl rand -hex 32`")
	}
	if n := countSet(c.TLS.CertFile, c.TLS.KeyFile, c.TLS.ClientCAFile); n != 0 && n != 3 {
		errs.addRule(fmt.Sprintf("tls.cert_file, tls.key_file and tls.client_ca_file (%s, %s, %s) must be set together",
			c.variable("tls.cert_file"), c.variable("tls.key_file"), c.variable("tls.client_ca_file")),
			"set all three (`ringfence certs init --dir D` writes a development set) or none")
	}
	c.validateStore(&errs)
	if img := c.Sandbox.MCPIsolationImage; img != "" && !imageRefPattern.MatchString(img) {
		errs.add("sandbox.mcp_isolation_image", fmt.Sprintf("%q is not pinned by digest", img),
			"use name@sha256:<64 hex> or sha256:<64 hex>; `ringfence image build` prints one, `docker image inspect --format '{{.Id}}' NAME` shows a local image's ID")
	}
	if c.Sandbox.MCPIsolationNetwork == "" || c.Sandbox.MCPIsolationNetwork == "host" {
		errs.add("sandbox.mcp_isolation_network", fmt.Sprintf("%q is not allowed", c.Sandbox.MCPIsolationNetwork), "use none (the default) or a named Docker network")
	}
	for _, k := range c.Sandbox.MCPIsolationAllowedEnvironmentKeys {
		if reason := mcpserver.ControlKeyReason(k); reason != "" {
			errs.add("sandbox.mcp_isolation_allowed_environment_keys", fmt.Sprintf("%s is refused (%s)", mcpserver.QuoteKey(k), reason), "remove it: no registration may set it, allowlisted or not")
		}
	}
	if c.Sandbox.MCPIsolationCPUs <= 0 || c.Sandbox.MCPIsolationCPUs > 64 {
		errs.add("sandbox.mcp_isolation_cpus", "must be in (0, 64]", "e.g. 1 or 0.5")
	}
	if c.Sandbox.MCPIsolationMemory < 16<<20 {
		errs.add("sandbox.mcp_isolation_memory", "must be at least 16MiB", "e.g. 512MiB")
	}
	if c.Sandbox.MCPIsolationPids < 8 || c.Sandbox.MCPIsolationPids > 65536 {
		errs.add("sandbox.mcp_isolation_pids", "must be in [8, 65536]", "e.g. 128")
	}
	if c.Sandbox.MCPIsolationTmpSize < 1<<20 {
		errs.add("sandbox.mcp_isolation_tmp_size", "must be at least 1MiB", "e.g. 64MiB")
	}
	if r := c.Sandbox.Runtime; r != "" && !runtimeNamePattern.MatchString(r) {
		errs.add("sandbox.runtime", fmt.Sprintf("%q is not a runtime name", r), "name a runtime the Docker engine lists (docker info), e.g. runc or runsc")
	}
	if c.Sandbox.StopTimeout <= 0 {
		errs.add("sandbox.stop_timeout", "must be positive", "e.g. 2s")
	}
	if c.Pool.DriftMaxAge < 0 {
		errs.add("pool.drift_max_age", "must not be negative", "use 0 to re-list before every call, or e.g. 1s")
	}
	if c.Pool.RunIdleTimeout <= 0 {
		errs.add("pool.run_idle_timeout", "must be positive", "e.g. 15m")
	}
	if c.Pool.PausedTimeout < 0 {
		errs.add("pool.paused_run_timeout", "must not be negative", "use 0 to keep paused runs until they are ended, or e.g. 168h")
	}
	if c.Pool.MaxRuns < 1 {
		errs.add("pool.max_runs", "must be at least 1", "e.g. 256")
	}
	if c.Pool.MaxSessions < 1 {
		errs.add("pool.max_sessions", "must be at least 1", "e.g. 512")
	}
	if c.Pool.MaxWarm < 0 {
		errs.add("pool.max_warm", "must not be negative", "use 0 to keep no warm containers, or e.g. 16")
	}
	if c.Pool.WarmMaxAge <= 0 {
		errs.add("pool.warm_max_age", "must be positive", "e.g. 10m")
	}
	if c.Pool.ResultBudget != 0 && c.Pool.ResultBudget < 1<<20 {
		errs.add("pool.result_budget", "must be at least 1MiB (or 0 for the default)", "e.g. 256MiB: the results of one call at a time need at least their max_result_bytes (16MiB by default)")
	}
	if c.Pool.ResultBudgetWait <= 0 {
		errs.add("pool.result_budget_wait", "must be positive", "e.g. 10s")
	}
	if c.Pool.ApprovalTimeout <= 0 {
		errs.add("pool.approval_timeout", "must be positive", "e.g. 15m")
	}
	c.validateDocuments(&errs)
	c.validateFrontDoor(&errs)
	c.validateOAuth(&errs)
	if c.Audit.SpoolMaxRecords < 1 {
		errs.add("audit.spool_max_records", "must be at least 1", "e.g. 100000")
	}
	if c.Limits.MaxConnectionsPerAddress < 1 {
		errs.add("limits.max_connections_per_address", "must be at least 1", "e.g. 128; raise it when clients share an address (a proxy or NAT)")
	}
	if c.Limits.BackupStallTimeout <= 0 {
		errs.add("limits.backup_stall_timeout", "must be positive", "e.g. 1m; raise it for a very slow link")
	}
	if a := c.Debug.PprofAddr; a != "" {
		if err := checkLoopback(a); err != nil {
			errs.add("debug.pprof_addr", err.Error(), "use a loopback host:port, e.g. 127.0.0.1:6060: the profiles answer anyone who reaches them, with no key")
		}
	}
	switch c.Audit.OnSpoolFull {
	case "fail_closed", "continue_and_alarm":
	default:
		errs.add("audit.on_spool_full", fmt.Sprintf("%q is not a policy", c.Audit.OnSpoolFull), "use fail_closed or continue_and_alarm")
	}
	if c.OTel.Endpoint != "" {
		if err := telemetry.CheckEndpoint(c.OTel.Endpoint); err != nil {
			errs.add("otel.endpoint", fmt.Sprintf("%q is not an OTLP endpoint", c.OTel.Endpoint), "use an http:// or https:// URL of an OTLP/gRPC collector, e.g. http://127.0.0.1:4317, or leave it empty")
		}
	}
	if c.IsProduction() {
		if c.Sandbox.AllowUnisolatedMCPDevelopment {
			errs.add("sandbox.allow_unisolated_mcp_development", "is refused in production: it runs registered MCP servers as host processes with this service's privileges, so mcp:admin becomes code execution on the host",
				"unset it and configure sandbox.mcp_isolation_image; use it only with env=development on a machine you own")
		}
		if c.Dev.AllowInlineMCPServers {
			errs.add("dev.allow_inline_mcp_servers", "is refused in production: inline mcp_servers have no registry row, so no ceiling applies to them",
				"unset it, register the servers and run `ringfence mcp-import`")
		}
	}
	return errs
}

// validateOAuth checks the sign-in settings.
func (c *Config) validateOAuth(errs *problems) {
	o := c.OAuth
	if o.CallbackURL != "" {
		u, err := url.Parse(o.CallbackURL)
		switch {
		case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || u.RawQuery != "" || u.Fragment != "":
			errs.add("oauth.callback_url", fmt.Sprintf("%q is not an http(s) URL with a host and no query", o.CallbackURL), "e.g. https://tools.example.com/v1/oauth/callback")
		case u.Path != "/v1/oauth/callback":
			errs.add("oauth.callback_url", "must end in /v1/oauth/callback, where the pool serves the callback", "e.g. https://tools.example.com/v1/oauth/callback")
		case c.IsProduction() && u.Scheme != "https" && !isLoopbackName(u.Hostname()):
			errs.add("oauth.callback_url", "is not https:// in production: authorization codes would cross the network in the clear", "serve TLS (tls.cert_file) or put a TLS proxy in front, and name its https:// URL")
		}
	}
	if o.ClientMetadataURL != "" {
		u, err := url.Parse(o.ClientMetadataURL)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.Path == "" || u.Path == "/" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			errs.add("oauth.client_metadata_url", fmt.Sprintf("%q is not an https URL with a path and no query, fragment or userinfo (draft-ietf-oauth-client-id-metadata-document)", o.ClientMetadataURL),
				"e.g. https://tools.example.com/v1/oauth/client-metadata, served by the pool's HTTP listener behind TLS")
		}
	}
	if o.StateTTL < time.Minute || o.StateTTL > time.Hour {
		errs.add("oauth.state_ttl", "must be from 1m to 1h", "e.g. 10m")
	}
	if o.RefreshBefore < 0 || o.RefreshBefore > time.Hour {
		errs.add("oauth.refresh_before", "must be from 0s to 1h", "e.g. 1m")
	}
}

// validateFrontDoor checks the front door's settings.
func (c *Config) validateFrontDoor(errs *problems) {
	f := c.FrontDoor
	if f.PublicURL != "" {
		u, err := url.Parse(f.PublicURL)
		switch {
		case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
			errs.add("frontdoor.public_url", fmt.Sprintf("%q is not an http(s) URL with a host", f.PublicURL), "e.g. https://tools.example.com/mcp")
		case c.IsProduction() && u.Scheme != "https" && !isLoopbackName(u.Hostname()):
			errs.add("frontdoor.public_url", "is not https:// in production: agent tokens would cross the network in the clear", "serve TLS (tls.cert_file) or put a TLS proxy in front, and name its https:// URL")
		}
	}
	for _, o := range f.AllowedOrigins {
		if u, err := url.Parse(o); err != nil || u.Host == "" || u.Path != "" || (u.Scheme != "http" && u.Scheme != "https") {
			errs.add("frontdoor.allowed_origins", fmt.Sprintf("%q is not an origin", o), `list origins as browsers send them, e.g. ["https://app.example.com"]`)
		}
	}
	for _, h := range f.AllowedHosts {
		if h == "" || strings.ContainsAny(h, ":/ ") {
			errs.add("frontdoor.allowed_hosts", fmt.Sprintf("%q is not a host name", h), `list names without ports, e.g. ["tools.example.com"]`)
		}
	}
	if f.TokenMaxTTL < time.Minute {
		errs.add("frontdoor.token_max_ttl", "must be at least 1m", "e.g. 24h")
	}
	if f.TokenTTL < time.Minute || f.TokenTTL > f.TokenMaxTTL {
		errs.add("frontdoor.token_ttl", "must be from 1m to frontdoor.token_max_ttl", "e.g. 1h")
	}
	if f.ListTTL <= 0 {
		errs.add("frontdoor.list_ttl", "must be positive", "e.g. 5s")
	}
	if f.MaxBodyBytes < 64<<10 || f.MaxBodyBytes > 16<<20 {
		errs.add("frontdoor.max_body_bytes", "must be in [64KiB, 16MiB]", "e.g. 2MiB")
	}
	if f.RateLimit <= 0 {
		errs.add("frontdoor.rate_limit", "must be positive", "e.g. 20")
	}
	if f.RateBurst < 1 {
		errs.add("frontdoor.rate_burst", "must be at least 1", "e.g. 40")
	}
	if f.SessionIdleTimeout <= 0 {
		errs.add("frontdoor.session_idle_timeout", "must be positive", "e.g. 30m")
	}
	if f.MaxSessionsPerAgent < 1 {
		errs.add("frontdoor.max_sessions_per_agent", "must be at least 1", "e.g. 16")
	}
}

func isLoopbackName(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// validateDocuments checks the document settings.
func (c *Config) validateDocuments(errs *problems) {
	d := c.Documents
	if d.URLTemplate != "" {
		if err := documents.CheckURLTemplate(d.URLTemplate); err != nil {
			errs.add("documents.url_template", err.Error(), "or leave it empty to use the built-in store")
		} else if c.IsProduction() && !strings.HasPrefix(d.URLTemplate, "https://") {
			errs.add("documents.url_template", "is not https:// in production: the bearer token and the documents would cross the network in the clear", "use the document service's https:// URL")
		}
	}
	if d.TokenFile != "" && d.URLTemplate == "" {
		errs.add("documents.token_file", "is set without documents.url_template, which is what it authenticates to", "set documents.url_template, or unset token_file")
	}
	if d.MaxBytes < 1 || d.MaxBytes > 256<<20 {
		errs.add("documents.max_bytes", "must be in [1, 256MiB]", "e.g. 10MiB")
	}
	if d.MaxCallBytes < 1 {
		errs.add("documents.max_call_bytes", "must be at least 1", "e.g. 16MiB")
	}
	if d.MaxTenantBytes < 1 {
		errs.add("documents.max_tenant_bytes", "must be at least 1", "e.g. 1GiB")
	}
}

var etcdPrefixPattern = regexp.MustCompile(`^(/[A-Za-z0-9_.-]+)+$`)

// validatePoolHost checks what a pool host sharing etcd tells the others: an address they can
// dial (advertise_addr, else internal_addr, with a host that is not unspecified) and a lease of
// at least a second.
func (c *Config) validatePoolHost(errs *problems) {
	p := &c.Pool
	if p.AdvertiseAddr == "" {
		p.AdvertiseAddr = c.InternalAddr
	}
	host, _, err := net.SplitHostPort(p.AdvertiseAddr)
	if ip := net.ParseIP(host); err != nil || host == "" || (ip != nil && ip.IsUnspecified()) {
		errs.add("pool.advertise_addr", fmt.Sprintf("%q is not an address other pool hosts can dial", p.AdvertiseAddr),
			"set it to this host's name or address and the internal port, e.g. pool-1.internal:50052")
	}
	if p.HostLeaseTTL < time.Second {
		errs.add("pool.host_lease_ttl", fmt.Sprintf("%s is shorter than a second", p.HostLeaseTTL), "use 10s (the default) or more")
	}
}

// defaultEtcdPrefix and defaultHostLeaseTTL are store.etcd_prefix's and pool.host_lease_ttl's
// defaults (their fields' tags).
const (
	defaultEtcdPrefix   = "/ringfence"
	defaultHostLeaseTTL = 10 * time.Second
)

// validateStore checks the store section: an etcd back end needs its members' URLs, and talks
// mutual TLS to them (https:// with all three files), which production requires.
func (c *Config) validateStore(errs *problems) {
	st := c.Store
	tlsKeys := fmt.Sprintf("store.etcd_ca_file, store.etcd_cert_file and store.etcd_key_file (%s, %s, %s)",
		c.variable("store.etcd_ca_file"), c.variable("store.etcd_cert_file"), c.variable("store.etcd_key_file"))
	switch st.Backend {
	case "bbolt":
		// A prefix other than its default was set on purpose, for an etcd this store does not use.
		if len(st.EtcdEndpoints) > 0 || st.etcdTLS() > 0 || st.EtcdPrefix != defaultEtcdPrefix {
			errs.add("store.backend", "is bbolt, but etcd settings are set", "set it to etcd to use them, or unset store.etcd_*")
		}
		return
	case "etcd":
	default:
		errs.add("store.backend", fmt.Sprintf("%q is not a back end", st.Backend), "use bbolt or etcd")
		return
	}
	if len(st.EtcdEndpoints) == 0 {
		errs.add("store.etcd_endpoints", "is empty, and store.backend is etcd", `list the etcd members' client URLs, e.g. ["https://etcd-1:2379","https://etcd-2:2379","https://etcd-3:2379"]`)
	}
	want := "https"
	if st.etcdTLS() == 0 {
		want = "http"
	}
	for _, e := range st.EtcdEndpoints {
		u, err := url.Parse(e)
		if err != nil || u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || (u.Scheme != "http" && u.Scheme != "https") {
			errs.add("store.etcd_endpoints", fmt.Sprintf("%q is not an etcd client URL", e), "use https://host:port, e.g. https://etcd-1:2379")
		} else if u.Scheme != want {
			errs.add("store.etcd_endpoints", fmt.Sprintf("%q is %s://, but the TLS files are %s", e, u.Scheme, map[string]string{"https": "unset", "http": "set"}[u.Scheme]),
				"use https:// with "+tlsKeys+", or http:// without them (development only)")
		}
	}
	if n := st.etcdTLS(); n != 0 && n != 3 {
		errs.addRule(tlsKeys+" must be set together", "set all three (`ringfence certs init --dir D` writes a development set: ca.pem, and <service>.pem as the client certificate) or none")
	}
	if c.IsProduction() && st.etcdTLS() == 0 {
		errs.addRule(tlsKeys+" are required in production: etcd holds the registry's sealed secrets and key hashes and the publisher's graphs, and takes mutual TLS",
			"issue the members' and this service's certificates from one CA (`ringfence certs init` writes etcd.pem for the members) and set all three")
	}
	if !etcdPrefixPattern.MatchString(st.EtcdPrefix) {
		errs.add("store.etcd_prefix", fmt.Sprintf("%q is not a key prefix", st.EtcdPrefix), "use /name, e.g. /ringfence or /ringfence-staging: a leading slash, no trailing one, letters, digits, _ . -")
	}
}

// validateFor checks what depends on which binary runs the configuration, and fills in a
// split binary's internal address. Other names (tests, the CLI) get the checks above only.
func (c *Config) validateFor(binary string) problems {
	var errs problems
	switch {
	case binary == AllInOne:
		if c.InternalAddr != "" {
			errs.add("internal_addr", "is set, but ringfenced serves no internal RPCs: its services call each other in-process", "unset it; it is for split binaries (ringfence-registry, -publisher, -pool, -audit)")
		}
		for _, p := range []struct{ key, addr string }{{"peers.registry_addr", c.Peers.RegistryAddr}, {"peers.publisher_addr", c.Peers.PublisherAddr},
			{"peers.pool_addr", c.Peers.PoolAddr}, {"peers.audit_addr", c.Peers.AuditAddr}} {
			if p.addr != "" {
				errs.add(p.key, "is set, but ringfenced dials no peer: its services call each other in-process", "unset it; peers.* are for split binaries (ringfence-registry, -publisher, -pool, -audit)")
			}
		}
	case slices.Contains(SplitBinaries, binary):
		if c.InternalAddr == "" {
			c.InternalAddr = DefaultInternalAddr
		}
		if err := checkAddr(c.InternalAddr); err != nil {
			errs.add("internal_addr", err.Error(), "use host:port, e.g. "+DefaultInternalAddr)
		} else if c.InternalAddr == c.GRPCAddr || c.InternalAddr == c.HTTPAddr {
			errs.add("internal_addr", fmt.Sprintf("%q is also grpc_addr or http_addr", c.InternalAddr), "give the internal plane a port of its own, e.g. "+DefaultInternalAddr)
		}
		if binary == "ringfence-pool" && c.Store.Etcd() {
			c.validatePoolHost(&errs)
		}
		if !c.TLS.Enabled() {
			errs.addRule(fmt.Sprintf("%s serves internal RPCs to its peers on internal_addr (%s), which takes mutual TLS only, so tls.cert_file, tls.key_file and tls.client_ca_file (%s, %s, %s) are required",
				binary, c.variable("internal_addr"), c.variable("tls.cert_file"), c.variable("tls.key_file"), c.variable("tls.client_ca_file")),
				"`ringfence certs init --dir D` writes a development set; or run every service in one process with ringfenced")
		}
	}
	if !c.Store.Etcd() && (binary == AllInOne || binary == "ringfence-pool") {
		// As store.etcd_* on bbolt: a setting that does nothing is refused, not ignored.
		for _, k := range []struct {
			key string
			set bool
		}{{"pool.host_id", c.Pool.HostID != ""}, {"pool.advertise_addr", c.Pool.AdvertiseAddr != ""}, {"pool.host_lease_ttl", c.Pool.HostLeaseTTL != defaultHostLeaseTTL}} {
			if k.set {
				errs.add(k.key, "is set, but store.backend is bbolt, and only pool hosts sharing etcd use it", "set store.backend to etcd to use it, or unset it")
			}
		}
	}
	return errs
}

func checkAddr(addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	return nil
}

// checkLoopback accepts host:port on a loopback address only.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address", addr)
	}
	return nil
}

func countSet(vals ...string) int {
	n := 0
	for _, v := range vals {
		if v != "" {
			n++
		}
	}
	return n
}

// problems collects validation failures so a start reports all of them at once.
type problems []problem

// problem is one failure: a value of key that breaks a rule (what: fix, named with where the
// value came from when reported), or, with no key, a line that names its keys itself.
type problem struct{ key, text string }

func (p *problems) add(key, what, fix string) {
	*p = append(*p, problem{key: key, text: what + ": " + fix})
}

// addValue records a value that did not parse as its key's type; source says where it was set
// (its environment variable, flag or file) and why is the parser's "not a …: use …".
func (p *problems) addValue(key, source, shown string, why error) {
	*p = append(*p, problem{text: fmt.Sprintf("%s (%s) %s is %v", key, source, shown, why)})
}

// addRule records a failed rule over several keys, which it names itself.
func (p *problems) addRule(what, fix string) {
	*p = append(*p, problem{text: fmt.Sprintf("%s: %s", what, fix)})
}

// err reports every problem, naming each key's value by source (Config.Source).
func (p problems) err(source func(key string) string) error {
	if len(p) == 0 {
		return nil
	}
	lines := make([]string, len(p))
	for i, q := range p {
		lines[i] = q.text
		if q.key != "" {
			lines[i] = fmt.Sprintf("%s (%s) %s", q.key, source(q.key), q.text)
		}
	}
	return fmt.Errorf("config: invalid configuration:\n  %s", strings.Join(lines, "\n  "))
}
