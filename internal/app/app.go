// Package app wires Ringfence's services into runnable binaries: every service in one process
// (ringfenced) or each on its own (ringfence-registry, …). Wiring is by hand, so what talks to
// what is visible in one place.
package app

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/moby/moby/client"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	publisherinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/publisher/v1"
	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/config"
	"github.com/ringfence/ringfence/internal/documents"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/peers"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/telemetry"
	auditsvc "github.com/ringfence/ringfence/services/audit"
	"github.com/ringfence/ringfence/services/pool"
	"github.com/ringfence/ringfence/services/pool/spawner"
	"github.com/ringfence/ringfence/services/publisher"
	"github.com/ringfence/ringfence/services/registry"
)

// App is a configured binary: its server, its services, and what must be closed after it
// stops.
type App struct {
	Server    *grpcserver.Server
	Registry  *registry.Service
	Pool      *pool.Service
	Publisher *publisher.Service
	Audit     *auditsvc.Service

	log     *slog.Logger
	tracing *telemetry.Tracing
	etcd    *clientv3.Client
	closers []func() error
}

// NewLogger builds the process logger from config.
func NewLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Run serves until ctx ends, then closes everything.
func (a *App) Run(ctx context.Context) error {
	err := a.Server.Run(ctx)
	return errors.Join(err, a.Close())
}

// Close releases services in reverse order of opening (producers before the audit log they
// forward to).
func (a *App) Close() error {
	var errs []error
	for i := len(a.closers) - 1; i >= 0; i-- {
		errs = append(errs, a.closers[i]())
	}
	a.closers = nil
	return errors.Join(errs...)
}

func (a *App) onClose(f func() error) { a.closers = append(a.closers, f) }

// startTracing starts the OTLP exporter; tests replace it with an in-memory span recorder.
var startTracing = telemetry.Start

// build starts tracing when configured, runs f, and closes what it opened when it fails.
func build(ctx context.Context, cfg *config.Config, name string, log *slog.Logger, f func(a *App) error) (*App, error) {
	a := &App{log: log}
	if cfg.OTel.Endpoint != "" {
		tracing, err := startTracing(ctx, cfg.OTel.Endpoint, name)
		if err != nil {
			return nil, err
		}
		a.tracing = tracing
		// Closed last (closers run in reverse), so the spans of a graceful stop are sent.
		a.onClose(func() error { return tracing.Shutdown(context.Background()) })
	}
	if err := f(a); err != nil {
		_ = a.Close()
		return nil, err
	}
	return a, nil
}

// NewAllInOne builds ringfenced: every service in this process, talking to each other through
// Go calls, behind one gRPC server and one HTTP server. It serves no internal API on any
// port: nothing outside the process calls its services' internal RPCs.
func NewAllInOne(ctx context.Context, cfg *config.Config, log *slog.Logger) (*App, error) {
	return build(ctx, cfg, "ringfenced", log, func(a *App) error {
		roles, err := loadRoles(cfg, log)
		if err != nil {
			return err
		}
		// Its producers append in-process, to this log alone: it stays in bbolt whatever the
		// store, and several ringfenced processes do not share it.
		if a.Audit, err = a.openAudit(ctx, cfg, false, log); err != nil {
			return err
		}
		sink := a.Audit.Sink()
		// The registry shows the callback of this process's own pool.
		if a.Registry, err = a.openRegistry(ctx, cfg, roles, sink, oauthCallbackURL(cfg), log); err != nil {
			return err
		}
		// The pool reads published versions from the publisher, which imports through the pool:
		// the pool gets a forwarder that the publisher fills in below.
		versions := &lateVersions{}
		if a.Pool, err = a.openPool(ctx, cfg, a.Registry, versions, sink, log); err != nil {
			return err
		}
		a.Registry.SetDiscoverer(a.Pool)
		a.Registry.SetWarmReporter(a.Pool)
		if a.Publisher, err = a.openPublisher(ctx, cfg, a.Registry, a.Pool, sink, log); err != nil {
			return err
		}
		versions.v = a.Publisher
		a.Registry.SetStrandFinder(a.Publisher)
		authz := auth.NewAuthorizer(a.Registry, auth.Rules)
		if a.Server, err = a.newServer(cfg, "ringfenced", authz, log); err != nil {
			return err
		}
		registerRegistry(a.Server, a.Registry)
		if err := registerPool(a.Server, a.Pool, cfg, log); err != nil {
			return err
		}
		registerPublisher(a.Server, a.Publisher)
		registerAudit(a.Server, a.Audit, authz)
		a.registerAdmin(cfg, "ringfenced")
		return nil
	})
}

// lateVersions lets the pool be built before the publisher it reads versions from.
type lateVersions struct{ v pool.Versions }

func (l *lateVersions) PublishedVersion(ctx context.Context, tenant, graphID string, version int64) (*graph.Version, error) {
	if l.v == nil {
		return nil, errors.New("app: the publisher is not wired yet")
	}
	return l.v.PublishedVersion(ctx, tenant, graphID, version)
}

// NewRegistry builds ringfence-registry: registrations, secrets and keys, reaching the pool
// (discovery) and the audit service over mutual TLS.
func NewRegistry(ctx context.Context, cfg *config.Config, log *slog.Logger) (*App, error) {
	return build(ctx, cfg, "ringfence-registry", log, func(a *App) error {
		roles, err := loadRoles(cfg, log)
		if err != nil {
			return err
		}
		sink, err := a.auditPeer(cfg)
		if err != nil {
			return err
		}
		// A registry apart from the pool shows the callback only when it is configured: its own
		// listener is not where users come back.
		if a.Registry, err = a.openRegistry(ctx, cfg, roles, sink, cfg.OAuth.CallbackURL, log); err != nil {
			return err
		}
		if cfg.Peers.PoolAddr != "" {
			conn, err := a.dial(cfg, mtls.Pool, cfg.Peers.PoolAddr)
			if err != nil {
				return err
			}
			poolPeer := peers.NewPool(conn)
			a.Registry.SetDiscoverer(poolPeer)
			a.Registry.SetWarmReporter(poolPeer)
		}
		if a.Server, err = a.newServer(cfg, "ringfence-registry", auth.NewAuthorizer(a.Registry, auth.Rules), log); err != nil {
			return err
		}
		registerRegistry(a.Server, a.Registry)
		registryinternalv1.RegisterRegistryInternalServiceServer(a.Server.Internal(), a.Registry.Internal())
		a.registerAdmin(cfg, "ringfence-registry")
		return nil
	})
}

// NewPublisher builds ringfence-publisher: graphs and publish proofs, reaching the registry
// (grants, API keys), the pool (discovery for imports) and the audit service over mutual TLS.
func NewPublisher(ctx context.Context, cfg *config.Config, log *slog.Logger) (*App, error) {
	return build(ctx, cfg, "ringfence-publisher", log, func(a *App) error {
		if cfg.Peers.RegistryAddr == "" || cfg.Peers.PoolAddr == "" {
			return errors.New("app: ringfence-publisher needs the registry and the pool: set RINGFENCE_PEERS__REGISTRY_ADDR and RINGFENCE_PEERS__POOL_ADDR")
		}
		registry, err := a.registryPeer(cfg)
		if err != nil {
			return err
		}
		poolConn, err := a.dial(cfg, mtls.Pool, cfg.Peers.PoolAddr)
		if err != nil {
			return err
		}
		sink, err := a.auditPeer(cfg)
		if err != nil {
			return err
		}
		if a.Publisher, err = a.openPublisher(ctx, cfg, registry, peers.NewPool(poolConn), sink, log); err != nil {
			return err
		}
		if a.Server, err = a.newServer(cfg, "ringfence-publisher", auth.NewAuthorizer(registry, auth.Rules), log); err != nil {
			return err
		}
		registerPublisher(a.Server, a.Publisher)
		publisherinternalv1.RegisterPublisherInternalServiceServer(a.Server.Internal(), a.Publisher.Internal())
		a.registerAdmin(cfg, "ringfence-publisher")
		return nil
	})
}

// NewPool builds ringfence-pool: runs and the spawner on a hardened host, reaching the
// registry (registrations, grants, API keys), the publisher (versions) and the audit service
// over mutual TLS.
func NewPool(ctx context.Context, cfg *config.Config, log *slog.Logger) (*App, error) {
	return build(ctx, cfg, "ringfence-pool", log, func(a *App) error {
		if cfg.Peers.RegistryAddr == "" || cfg.Peers.PublisherAddr == "" {
			return errors.New("app: ringfence-pool needs the registry and the publisher: set RINGFENCE_PEERS__REGISTRY_ADDR and RINGFENCE_PEERS__PUBLISHER_ADDR")
		}
		registry, err := a.registryPeer(cfg)
		if err != nil {
			return err
		}
		pubConn, err := a.dial(cfg, mtls.Publisher, cfg.Peers.PublisherAddr)
		if err != nil {
			return err
		}
		sink, err := a.auditPeer(cfg)
		if err != nil {
			return err
		}
		if a.Pool, err = a.openPool(ctx, cfg, registry, peers.NewPublisher(pubConn), sink, log); err != nil {
			return err
		}
		if a.Server, err = a.newServer(cfg, "ringfence-pool", auth.NewAuthorizer(registry, auth.Rules), log); err != nil {
			return err
		}
		if err := registerPool(a.Server, a.Pool, cfg, log); err != nil {
			return err
		}
		poolinternalv1.RegisterPoolInternalServiceServer(a.Server.Internal(), pool.NewInternalServer(a.Pool))
		a.Server.OnShutdown(a.Pool.EndListingWatches)
		a.registerAdmin(cfg, "ringfence-pool")
		return nil
	})
}

// NewAudit builds ringfence-audit: the log, verifying readers' API keys through the registry.
func NewAudit(ctx context.Context, cfg *config.Config, log *slog.Logger) (*App, error) {
	return build(ctx, cfg, "ringfence-audit", log, func(a *App) error {
		if cfg.Peers.RegistryAddr == "" {
			return errors.New("app: ringfence-audit needs the registry to verify API keys: set RINGFENCE_PEERS__REGISTRY_ADDR")
		}
		registry, err := a.registryPeer(cfg)
		if err != nil {
			return err
		}
		if a.Audit, err = a.openAudit(ctx, cfg, cfg.Store.Etcd(), log); err != nil {
			return err
		}
		authz := auth.NewAuthorizer(registry, auth.Rules)
		if a.Server, err = a.newServer(cfg, "ringfence-audit", authz, log); err != nil {
			return err
		}
		registerAudit(a.Server, a.Audit, authz)
		auditinternalv1.RegisterAuditInternalServiceServer(a.Server.Internal(), a.Audit.Internal())
		a.registerAdmin(cfg, "ringfence-audit")
		return nil
	})
}

func loadRoles(cfg *config.Config, log *slog.Logger) (*auth.Roles, error) {
	roles, err := auth.NewRolesFrom(cfg.ServiceRolesJSON, cfg.Source("service_roles_json"))
	if err != nil {
		return nil, err
	}
	for _, w := range roles.Warnings() {
		log.Warn("risky role: "+w, "check", "ringfence roles check")
	}
	return roles, nil
}

func spoolPolicy(cfg *config.Config) audit.FullPolicy {
	if cfg.Audit.OnSpoolFull == "continue_and_alarm" {
		return audit.ContinueAndAlarm
	}
	return audit.FailClosed
}

func dataFile(cfg *config.Config, name string) (string, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return "", fmt.Errorf("app: create data_dir (%s) %s: %w: name a directory this user may create and write", cfg.Source("data_dir"), cfg.DataDir, err)
	}
	return filepath.Join(cfg.DataDir, name), nil
}

// openAudit opens the audit log: with shared, a copy of the chain that the audit instances
// share in etcd (one writes it at a time), else the log itself, in data_dir.
func (a *App) openAudit(ctx context.Context, cfg *config.Config, shared bool, log *slog.Logger) (*auditsvc.Service, error) {
	path, err := dataFile(cfg, "audit.db")
	if err != nil {
		return nil, err
	}
	c := auditsvc.Config{DBPath: path, Logger: log.With("service", "audit")}
	if shared {
		if c.Etcd, err = a.etcdClient(ctx, cfg, log); err != nil {
			return nil, err
		}
		host, _ := os.Hostname()
		c.EtcdRoot, c.Instance = cfg.Store.EtcdPrefix, host+" (internal_addr "+cfg.InternalAddr+")"
	}
	svc, err := auditsvc.Open(c)
	if err != nil {
		return nil, err
	}
	a.onClose(svc.Close)
	return svc, nil
}

func (a *App) openRegistry(ctx context.Context, cfg *config.Config, roles *auth.Roles, sink audit.Sink, callback string, log *slog.Logger) (*registry.Service, error) {
	path, err := dataFile(cfg, "registry.db")
	if err != nil {
		return nil, err
	}
	box, err := secretsBox(cfg)
	if err != nil {
		return nil, err
	}
	cli, err := a.etcdClient(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	svc, err := registry.Open(registry.Config{
		DBPath:           path,
		Etcd:             cli,
		EtcdRoot:         cfg.Store.EtcdPrefix,
		Secrets:          box,
		SecretsKeyFile:   secretsKeyFile(cfg),
		Roles:            roles,
		AllowedEnvKeys:   cfg.Sandbox.MCPIsolationAllowedEnvironmentKeys,
		OAuthCallbackURL: callback,
		AuditSink:        sink,
		SpoolMaxRecords:  cfg.Audit.SpoolMaxRecords,
		OnSpoolFull:      spoolPolicy(cfg),
		Logger:           log.With("service", "registry"),
	})
	if err != nil {
		return nil, err
	}
	a.onClose(svc.Close)
	requeueQuarantined(cfg, svc.Spool(), log.With("service", "registry"))
	ctx = auth.SystemContext(ctx, "startup")
	if cfg.BootstrapAdminKey != "" {
		if err := svc.EnsureBootstrapAdmin(ctx, cfg.BootstrapAdminKey); err != nil {
			return nil, err
		}
	} else if !hasActiveKey(ctx, svc) {
		log.Warn("no API key exists and RINGFENCE_BOOTSTRAP_ADMIN_KEY is unset: every request will be refused; set it to a long random value (openssl rand -hex 32) and restart, then mint real keys with `ringfence keys create`")
	}
	return svc, nil
}

// secretsBox is the deployment's key for secrets at rest (secrets_key_file, default
// <data_dir>/secrets.key): the registry's secrets, the pool's users' OAuth tokens.
func secretsBox(cfg *config.Config) (*secretbox.Box, error) {
	box, err := secretbox.LoadOrCreate(secretsKeyFile(cfg))
	if err != nil {
		return nil, fmt.Errorf("app: secrets_key_file (%s; default <data_dir>/secrets.key): %w", cfg.Source("secrets_key_file"), err)
	}
	return box, nil
}

// oauthCallbackURL is where authorization servers send users back: oauth.callback_url, else
// /v1/oauth/callback at the origin of frontdoor.public_url, else at the HTTP listener's
// address (127.0.0.1 for an unspecified host); "" without an HTTP listener (sign-in is off).
func oauthCallbackURL(cfg *config.Config) string {
	if cfg.OAuth.CallbackURL != "" {
		return cfg.OAuth.CallbackURL
	}
	if cfg.HTTPAddr == "" {
		return ""
	}
	if p := cfg.FrontDoor.PublicURL; p != "" {
		if u, err := url.Parse(p); err == nil && u.Host != "" {
			return u.Scheme + "://" + u.Host + pool.OAuthCallbackPath
		}
	}
	if base := httpBase(cfg); base != "" {
		return base + pool.OAuthCallbackPath
	}
	return ""
}

// httpBase is the HTTP listener's scheme and address as a local client reaches it
// (127.0.0.1 for an unspecified host); "" when http_addr cannot be read.
func httpBase(cfg *config.Config) string {
	host, port, err := net.SplitHostPort(cfg.HTTPAddr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	scheme := "http"
	if cfg.TLS.Enabled() {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

// hasActiveKey says whether any key can call the registry: without one, and without a
// bootstrap key, a fresh deployment refuses everything and nothing says why. ctx carries the
// system principal (auth.SystemContext), which sees every tenant's keys.
func hasActiveKey(ctx context.Context, svc *registry.Service) bool {
	req := &registryv1.ListKeysRequest{PageSize: 1000}
	for {
		resp, err := svc.ListKeys(ctx, req)
		if err != nil {
			return true // not this check's to report
		}
		for _, k := range resp.GetKeys() {
			if !k.GetRevoked() {
				return true
			}
		}
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			return false
		}
	}
}

// poolRegistry is what the pool needs of the registry: registrations, policies, and the
// registrations that ask for warm containers.
type poolRegistry interface {
	pool.Registry
	pool.WarmSource
}

func (a *App) openPool(ctx context.Context, cfg *config.Config, reg poolRegistry, versions pool.Versions, sink audit.Sink, log *slog.Logger) (*pool.Service, error) {
	path, err := dataFile(cfg, "pool.db")
	if err != nil {
		return nil, err
	}
	plog := log.With("service", "pool")
	sp, err := newSpawner(cfg, plog)
	if err != nil {
		return nil, err
	}
	// References resolve through the platform's document service when one is configured,
	// else through the pool's built-in store.
	var docs documents.Resolver
	if cfg.Documents.URLTemplate != "" {
		if docs, err = documents.NewHTTP(cfg.Documents.URLTemplate, cfg.Documents.TokenFile); err != nil {
			_ = sp.Close(ctx)
			return nil, err
		}
	}
	// Pool hosts share etcd on split binaries (ringfence-pool), which serve the internal plane
	// that forwards requests between hosts; ringfenced's pool stays one host on bbolt.
	var hostCfg pool.Config
	if cfg.Store.Etcd() && cfg.InternalAddr != "" {
		if hostCfg.Etcd, err = a.etcdClient(ctx, cfg, log); err != nil {
			_ = sp.Close(ctx)
			return nil, err
		}
		hosts := peers.NewPoolHosts(mtls.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, CAFile: cfg.TLS.ClientCAFile}, a.tracing)
		a.onClose(hosts.Close)
		hostCfg.EtcdRoot, hostCfg.Peers, hostCfg.HostAddr, hostCfg.HostLeaseTTL = cfg.Store.EtcdPrefix, hosts, cfg.Pool.AdvertiseAddr, cfg.Pool.HostLeaseTTL
		hostCfg.HostID = cmp.Or(cfg.Pool.HostID, cfg.Sandbox.PoolID, defaultPoolID(cfg.DataDir))
	}
	box, err := secretsBox(cfg)
	if err != nil {
		_ = sp.Close(ctx)
		return nil, err
	}
	pl, err := pool.Open(ctx, pool.Config{
		Etcd:                   hostCfg.Etcd,
		EtcdRoot:               hostCfg.EtcdRoot,
		HostID:                 hostCfg.HostID,
		HostAddr:               hostCfg.HostAddr,
		HostLeaseTTL:           hostCfg.HostLeaseTTL,
		Peers:                  hostCfg.Peers,
		DBPath:                 path,
		Secrets:                box,
		OAuthCallbackURL:       oauthCallbackURL(cfg),
		OAuthClientMetadataURL: cfg.OAuth.ClientMetadataURL,
		OAuthStateTTL:          cfg.OAuth.StateTTL,
		OAuthRefreshBefore:     cfg.OAuth.RefreshBefore,
		Registry:               reg,
		Versions:               versions,
		Spawner:                sp,
		AuditSink:              sink,
		SpoolMaxRecords:        cfg.Audit.SpoolMaxRecords,
		OnSpoolFull:            spoolPolicy(cfg),
		DriftMaxAge:            cfg.Pool.DriftMaxAge,
		RunIdleTimeout:         cfg.Pool.RunIdleTimeout,
		PausedRunTimeout:       cfg.Pool.PausedTimeout,
		MaxRuns:                cfg.Pool.MaxRuns,
		MaxSessions:            cfg.Pool.MaxSessions,
		AllowAdvisory:          cfg.Pool.AllowAdvisory,
		AllowInlineMCPServers:  cfg.Dev.AllowInlineMCPServers,
		ApprovalTimeout:        cfg.Pool.ApprovalTimeout,
		Documents:              docs,
		DocumentMaxBytes:       int64(cfg.Documents.MaxBytes),
		DocumentMaxCallBytes:   int64(cfg.Documents.MaxCallBytes),
		DocumentMaxTenantBytes: int64(cfg.Documents.MaxTenantBytes),
		Warm:                   reg,
		MaxWarm:                cfg.Pool.MaxWarm,
		WarmMaxAge:             cfg.Pool.WarmMaxAge,
		FrontDoorURL:           frontDoorURL(cfg),
		AgentTokenTTL:          cfg.FrontDoor.TokenTTL,
		AgentTokenMaxTTL:       cfg.FrontDoor.TokenMaxTTL,
		Logger:                 plog,
	})
	if err != nil {
		return nil, err
	}
	a.onClose(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return pl.Close(ctx)
	})
	requeueQuarantined(cfg, pl.Spool(), log.With("service", "pool"))
	return pl, nil
}

// newSpawner wires the pool's spawner back ends from the sandbox settings: Docker (the
// isolation image, on the configured OCI runtime) when an image is set, else host processes
// when unisolated development is allowed, and remote servers always. A new back end is a
// package implementing spawner.Backend, chosen here.
func newSpawner(cfg *config.Config, log *slog.Logger) (*spawner.Router, error) {
	sb := cfg.Sandbox
	poolID := sb.PoolID
	if poolID == "" {
		poolID = defaultPoolID(cfg.DataDir)
	}
	budget, err := resultBudget(cfg)
	if err != nil {
		return nil, err
	}
	sc := spawner.Config{
		Image: sb.MCPIsolationImage, Network: sb.MCPIsolationNetwork, AllowedEnvKeys: sb.MCPIsolationAllowedEnvironmentKeys,
		NanoCPUs: int64(sb.MCPIsolationCPUs * 1e9), MemoryBytes: int64(sb.MCPIsolationMemory), PidsLimit: sb.MCPIsolationPids,
		TmpfsSizeBytes: int64(sb.MCPIsolationTmpSize), AllowUnisolated: sb.AllowUnisolatedMCPDevelopment, Runtime: sb.Runtime,
		PoolID: poolID, CloseTimeout: sb.StopTimeout, Logger: log, ResultBudget: budget,
	}
	var backends []spawner.Backend
	switch {
	case sb.MCPIsolationImage != "":
		if sb.DockerHost != "" {
			docker, err := client.New(client.FromEnv, client.WithHost(sb.DockerHost))
			if err != nil {
				return nil, fmt.Errorf("pool: docker client for %s: %w", sb.DockerHost, err)
			}
			sc.Docker = docker
		}
		d, err := spawner.NewDocker(sc)
		if err != nil {
			if c, ok := sc.Docker.(*client.Client); ok {
				_ = c.Close()
			}
			return nil, err
		}
		backends = append(backends, d)
	case sb.AllowUnisolatedMCPDevelopment:
		h, err := spawner.NewHost(sc)
		if err != nil {
			return nil, err
		}
		backends = append(backends, h)
	}
	remote, err := spawner.NewRemote(sc)
	if err != nil {
		return nil, err
	}
	return spawner.NewRouter(sc, append(backends, remote)...)
}

// resultBudget is the pool's budget for results in flight (pool.result_budget, or its default
// from GOMEMLIMIT).
func resultBudget(cfg *config.Config) (*spawner.Budget, error) {
	size := cfg.Pool.ResultBudget
	if size == 0 {
		size = config.DefaultResultBudget(debug.SetMemoryLimit(-1))
	}
	return spawner.NewBudget(int64(size), cfg.Pool.ResultBudgetWait)
}

// defaultPoolID derives a pool's id from its data directory, so a restart on the same data
// sweeps what the previous process left and two pools with their own data never touch each
// other's containers.
func defaultPoolID(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return "pool-" + hex.EncodeToString(sum[:6])
}

// openPublisher opens the publisher with the registry as its grants resolver (the ceiling) and
// the pool as its discoverer.
func (a *App) openPublisher(ctx context.Context, cfg *config.Config, policies publisher.Policies, disc publisher.Discoverer, sink audit.Sink, log *slog.Logger) (*publisher.Service, error) {
	path, err := dataFile(cfg, "publisher.db")
	if err != nil {
		return nil, err
	}
	cli, err := a.etcdClient(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	pub, err := publisher.Open(publisher.Config{
		DBPath:                path,
		Etcd:                  cli,
		EtcdRoot:              cfg.Store.EtcdPrefix,
		Policies:              policies,
		Discoverer:            disc,
		AllowInlineMCPServers: cfg.Dev.AllowInlineMCPServers,
		AuditSink:             sink,
		SpoolMaxRecords:       cfg.Audit.SpoolMaxRecords,
		OnSpoolFull:           spoolPolicy(cfg),
		Logger:                log.With("service", "publisher"),
	})
	if err != nil {
		return nil, err
	}
	a.onClose(pub.Close)
	requeueQuarantined(cfg, pub.Spool(), log.With("service", "publisher"))
	return pub, nil
}

// etcdClient is the binary's client of the store's etcd cluster (store.backend=etcd), dialed
// once and shared by the services that keep their state there; nil with bbolt. It closes
// after them: closers run in reverse order of opening.
func (a *App) etcdClient(ctx context.Context, cfg *config.Config, log *slog.Logger) (*clientv3.Client, error) {
	if !cfg.Store.Etcd() || a.etcd != nil {
		return a.etcd, nil
	}
	st := cfg.Store
	cli, err := etcdstore.Dial(ctx, etcdstore.Config{
		Endpoints: st.EtcdEndpoints, CAFile: st.EtcdCAFile, CertFile: st.EtcdCertFile, KeyFile: st.EtcdKeyFile, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	a.etcd = cli
	a.onClose(cli.Close)
	return cli, nil
}

// requeueQuarantined puts a producer's quarantined audit records back in its spool when the
// operator asked for it (audit.requeue_quarantine). A failure is logged, not fatal: the records
// stay quarantined and the service is as useful as before.
func requeueQuarantined(cfg *config.Config, spool *audit.Spool, log *slog.Logger) {
	if !cfg.Audit.RequeueQuarantine {
		return
	}
	n, err := spool.RequeueQuarantined()
	if err != nil {
		log.Error("audit: quarantined records could not be requeued; they stay quarantined", "err", err)
		return
	}
	log.Info("audit: quarantined records requeued", "records", n)
}

// registryPeer dials the registry and returns its client (grants, resolution, API keys).
func (a *App) registryPeer(cfg *config.Config) (*peers.Registry, error) {
	conn, err := a.dial(cfg, mtls.Registry, cfg.Peers.RegistryAddr)
	if err != nil {
		return nil, err
	}
	return peers.NewRegistry(conn), nil
}

// auditPeer dials the audit service for a producer's spool.
func (a *App) auditPeer(cfg *config.Config) (audit.Sink, error) {
	if cfg.Peers.AuditAddr == "" {
		return nil, errors.New("app: this service records admin events or call attempts and needs the audit service: set RINGFENCE_PEERS__AUDIT_ADDR")
	}
	// Several audit instances share the log on etcd: the client finds the one that leads.
	var conns []*grpc.ClientConn
	for addr := range strings.SplitSeq(cfg.Peers.AuditAddr, ",") {
		conn, err := a.dial(cfg, mtls.Audit, strings.TrimSpace(addr))
		if err != nil {
			return nil, err
		}
		conns = append(conns, conn)
	}
	return peers.NewAudit(conns...), nil
}

// dial connects to a peer with this binary's service certificate; the connection closes with
// the app.
func (a *App) dial(cfg *config.Config, peer, addr string) (*grpc.ClientConn, error) {
	conn, err := peers.Dial(peer, addr, mtls.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, CAFile: cfg.TLS.ClientCAFile}, a.tracing)
	if err != nil {
		return nil, err
	}
	a.onClose(conn.Close)
	return conn, nil
}

// newServer builds the binary's server: the public listeners, and for a split binary
// (cfg.InternalAddr set, which config allows only with TLS) the internal listener, mutual TLS
// only.
func (a *App) newServer(cfg *config.Config, name string, authz grpcserver.Authorizer, log *slog.Logger) (*grpcserver.Server, error) {
	opts := grpcserver.Options{
		Name: name, GRPCAddr: cfg.GRPCAddr, HTTPAddr: cfg.HTTPAddr,
		Authorizer: authz, Logger: log, Tracing: a.tracing,
		Limits: grpcserver.Limits{MaxConnsPerAddress: cfg.Limits.MaxConnectionsPerAddress},
	}
	files := mtls.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, CAFile: cfg.TLS.ClientCAFile}
	if cfg.TLS.Enabled() {
		tlsCfg, err := mtls.ServerConfig(files)
		if err != nil {
			return nil, err
		}
		opts.TLS = tlsCfg
	}
	if cfg.InternalAddr != "" {
		if !cfg.TLS.Enabled() {
			return nil, fmt.Errorf("app: %s serves internal RPCs on internal_addr %s, which takes mutual TLS only: set RINGFENCE_TLS__CERT_FILE, RINGFENCE_TLS__KEY_FILE and RINGFENCE_TLS__CLIENT_CA_FILE", name, cfg.InternalAddr)
		}
		internalTLS, err := mtls.InternalServerConfig(files)
		if err != nil {
			return nil, err
		}
		opts.InternalAddr, opts.InternalTLS = cfg.InternalAddr, internalTLS
	}
	return grpcserver.New(opts), nil
}

// spoolCollectors are a producer's audit spool series, under one name for every producer so
// that one alert covers them all: how many records wait for the audit service (growing while
// it is unreachable; at RINGFENCE_AUDIT__SPOOL_MAX_RECORDS changes or calls are refused) and
// how many this process dropped under on_spool_full=continue_and_alarm.
func spoolCollectors(producer string, spool *audit.Spool) []prometheus.Collector {
	labels := prometheus.Labels{"producer": producer}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringfence_audit_spool_pending", ConstLabels: labels,
			Help: "Audit records a producer holds in its outbox or spool, waiting for the audit service."},
			func() float64 { return float64(spool.Pending()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringfence_audit_spool_dropped_total", ConstLabels: labels,
			Help: "Audit records a producer dropped since it started because its spool was full (on_spool_full=continue_and_alarm)."},
			func() float64 { return float64(spool.Dropped()) }),
	}
}

func registerRegistry(srv *grpcserver.Server, reg *registry.Service) {
	srv.Metrics().MustRegister(spoolCollectors("registry", reg.Spool())...)
	registryv1.RegisterRegistryServiceServer(srv.GRPC(), reg)
	registryv1.RegisterKeyServiceServer(srv.GRPC(), reg)
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		if err := registryv1.RegisterRegistryServiceHandler(ctx, mux, conn); err != nil {
			return err
		}
		return registryv1.RegisterKeyServiceHandler(ctx, mux, conn)
	})
}

// registerPool serves the pool's API, and its MCP front door at /mcp when it has one.
func registerPool(srv *grpcserver.Server, pl *pool.Service, cfg *config.Config, log *slog.Logger) error {
	poolv1.RegisterPoolServiceServer(srv.GRPC(), pool.NewServer(pl))
	srv.Metrics().MustRegister(pl.Collectors()...)
	srv.Metrics().MustRegister(spoolCollectors("pool", pl.Spool())...)
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return poolv1.RegisterPoolServiceHandler(ctx, mux, conn)
	})
	// The sign-in callback is a browser redirect: no API key, its state authenticates it.
	srv.Handle(pool.OAuthCallbackPath, pl.OAuthCallbackHandler())
	// Authorization servers fetch the client ID metadata document themselves: no API key.
	srv.Handle(pool.OAuthClientMetadataPath, pl.ClientMetadataHandler())
	if pl.FrontDoorURL() == "" {
		return nil
	}
	f := cfg.FrontDoor
	fd, err := pl.FrontDoor(pool.FrontDoorConfig{
		AllowedHosts: f.AllowedHosts, AllowedOrigins: f.AllowedOrigins, ListTTL: f.ListTTL, MaxBodyBytes: int64(f.MaxBodyBytes),
		RateLimit: f.RateLimit, RateBurst: f.RateBurst, SessionIdleTimeout: f.SessionIdleTimeout, MaxSessionsPerAgent: f.MaxSessionsPerAgent,
		ClientApprovals: f.ClientApprovals, Logger: log.With("service", "pool"),
	})
	if err != nil {
		return err
	}
	srv.Handle("/mcp", fd)
	return nil
}

// frontDoorURL is the front door's public URL: frontdoor.public_url, else the HTTP listener's
// address with /mcp (127.0.0.1 for an unspecified host); "" when the front door is off or
// there is no HTTP listener.
func frontDoorURL(cfg *config.Config) string {
	if !cfg.FrontDoor.Enabled || cfg.HTTPAddr == "" {
		return ""
	}
	if cfg.FrontDoor.PublicURL != "" {
		return cfg.FrontDoor.PublicURL
	}
	if base := httpBase(cfg); base != "" {
		return base + "/mcp"
	}
	return ""
}

func registerPublisher(srv *grpcserver.Server, pub *publisher.Service) {
	srv.Metrics().MustRegister(spoolCollectors("publisher", pub.Spool())...)
	publisherv1.RegisterPublisherServiceServer(srv.GRPC(), pub)
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return publisherv1.RegisterPublisherServiceHandler(ctx, mux, conn)
	})
}

func registerAudit(srv *grpcserver.Server, svc *auditsvc.Service, authz grpcserver.Authorizer) {
	// The log's head: its rate is the rate records arrive, flat while producers cannot reach
	// the log, and its value the head seq `audit verify` proves.
	srv.Metrics().MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringfence_audit_records_total",
		Help: "Records in this audit service's log (its copy, with several replicas on etcd): the seq of its head."},
		func() float64 { return float64(svc.HeadSeq()) }))
	auditv1.RegisterAuditServiceServer(srv.GRPC(), svc)
	srv.OnShutdown(svc.EndWatches)
	srv.Handle("/v1/audit/export", svc.ExportHandler(authz))
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return auditv1.RegisterAuditServiceHandler(ctx, mux, conn)
	})
}
