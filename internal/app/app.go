// Package app wires Ringfence's services into runnable binaries: every service in one process
// (ringfenced) or each on its own (ringfence-registry, …). Wiring is by hand, so what talks to
// what is visible in one place.
package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/config"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/peers"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/services/pool"
	"github.com/ringfence/ringfence/services/publisher"
	"github.com/ringfence/ringfence/services/registry"
)

// App is a configured binary: its server and what must be closed after it stops.
type App struct {
	Server    *grpcserver.Server
	Registry  *registry.Service
	Pool      *pool.Service
	Publisher *publisher.Service

	log     *slog.Logger
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

// Close releases stores in reverse order of opening.
func (a *App) Close() error {
	var errs []error
	for i := len(a.closers) - 1; i >= 0; i-- {
		errs = append(errs, a.closers[i]())
	}
	a.closers = nil
	return errors.Join(errs...)
}

func (a *App) onClose(f func() error) { a.closers = append(a.closers, f) }

// NewAllInOne builds ringfenced: every service in this process, talking to each other through
// Go calls, behind one gRPC server and one HTTP server.
func NewAllInOne(ctx context.Context, cfg *config.Config, log *slog.Logger) (_ *App, err error) {
	a := &App{log: log}
	defer func() {
		if err != nil {
			_ = a.Close()
		}
	}()
	roles, err := loadRoles(cfg, log)
	if err != nil {
		return nil, err
	}
	reg, err := a.openRegistry(ctx, cfg, roles, log)
	if err != nil {
		return nil, err
	}
	pl, err := a.openPool(ctx, cfg, reg, log)
	if err != nil {
		return nil, err
	}
	reg.SetDiscoverer(pl)
	pub, err := a.openPublisher(cfg, reg, pl, log)
	if err != nil {
		return nil, err
	}
	srv, err := newServer(cfg, "ringfenced", auth.NewAuthorizer(reg, auth.Rules), log)
	if err != nil {
		return nil, err
	}
	a.Server, a.Registry, a.Pool, a.Publisher = srv, reg, pl, pub
	registerRegistry(srv, reg)
	registerPool(srv, pl)
	registerPublisher(srv, pub)
	return a, nil
}

// NewRegistry builds ringfence-registry.
func NewRegistry(ctx context.Context, cfg *config.Config, log *slog.Logger) (_ *App, err error) {
	a := &App{log: log}
	defer func() {
		if err != nil {
			_ = a.Close()
		}
	}()
	roles, err := loadRoles(cfg, log)
	if err != nil {
		return nil, err
	}
	reg, err := a.openRegistry(ctx, cfg, roles, log)
	if err != nil {
		return nil, err
	}
	if cfg.Peers.PoolAddr != "" {
		conn, err := a.dial(cfg, cfg.Peers.PoolAddr)
		if err != nil {
			return nil, err
		}
		reg.SetDiscoverer(peers.NewPool(conn))
	}
	srv, err := newServer(cfg, "ringfence-registry", auth.NewAuthorizer(reg, auth.Rules), log)
	if err != nil {
		return nil, err
	}
	a.Server, a.Registry = srv, reg
	registerRegistry(srv, reg)
	return a, nil
}

// NewPool builds ringfence-pool: runs and the spawner on a hardened host, reaching the
// registry (registrations, grants, API keys) over mutual TLS.
func NewPool(ctx context.Context, cfg *config.Config, log *slog.Logger) (_ *App, err error) {
	a := &App{log: log}
	defer func() {
		if err != nil {
			_ = a.Close()
		}
	}()
	if cfg.Peers.RegistryAddr == "" {
		return nil, errors.New("app: ringfence-pool needs the registry: set RINGFENCE_PEERS__REGISTRY_ADDR")
	}
	conn, err := a.dial(cfg, cfg.Peers.RegistryAddr)
	if err != nil {
		return nil, err
	}
	registry := peers.NewRegistry(conn)
	pl, err := a.openPool(ctx, cfg, registry, log)
	if err != nil {
		return nil, err
	}
	srv, err := newServer(cfg, "ringfence-pool", auth.NewAuthorizer(registry, auth.Rules), log)
	if err != nil {
		return nil, err
	}
	a.Server, a.Pool = srv, pl
	registerPool(srv, pl)
	return a, nil
}

// NewPublisher builds ringfence-publisher: graphs and publish proofs, reaching the registry
// (grants, API keys) and the pool (discovery for imports) over mutual TLS.
func NewPublisher(ctx context.Context, cfg *config.Config, log *slog.Logger) (_ *App, err error) {
	a := &App{log: log}
	defer func() {
		if err != nil {
			_ = a.Close()
		}
	}()
	if cfg.Peers.RegistryAddr == "" || cfg.Peers.PoolAddr == "" {
		return nil, errors.New("app: ringfence-publisher needs the registry and the pool: set RINGFENCE_PEERS__REGISTRY_ADDR and RINGFENCE_PEERS__POOL_ADDR")
	}
	regConn, err := a.dial(cfg, cfg.Peers.RegistryAddr)
	if err != nil {
		return nil, err
	}
	poolConn, err := a.dial(cfg, cfg.Peers.PoolAddr)
	if err != nil {
		return nil, err
	}
	registry := peers.NewRegistry(regConn)
	pub, err := a.openPublisher(cfg, registry, peers.NewPool(poolConn), log)
	if err != nil {
		return nil, err
	}
	srv, err := newServer(cfg, "ringfence-publisher", auth.NewAuthorizer(registry, auth.Rules), log)
	if err != nil {
		return nil, err
	}
	a.Server, a.Publisher = srv, pub
	registerPublisher(srv, pub)
	return a, nil
}

// dial connects to a peer with this binary's service certificate; the connection closes with
// the app.
func (a *App) dial(cfg *config.Config, addr string) (*grpc.ClientConn, error) {
	conn, err := peers.Dial(addr, mtls.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, CAFile: cfg.TLS.ClientCAFile})
	if err != nil {
		return nil, err
	}
	a.onClose(conn.Close)
	return conn, nil
}

func loadRoles(cfg *config.Config, log *slog.Logger) (*auth.Roles, error) {
	roles, err := auth.NewRoles(cfg.ServiceRolesJSON)
	if err != nil {
		return nil, err
	}
	for _, w := range roles.Warnings() {
		log.Warn("risky role: "+w, "check", "ringfence roles check")
	}
	return roles, nil
}

func (a *App) openRegistry(ctx context.Context, cfg *config.Config, roles *auth.Roles, log *slog.Logger) (*registry.Service, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("app: create data_dir %s: %w", cfg.DataDir, err)
	}
	keyFile := cfg.SecretsKeyFile
	if keyFile == "" {
		keyFile = filepath.Join(cfg.DataDir, "secrets.key")
	}
	box, err := secretbox.LoadOrCreate(keyFile)
	if err != nil {
		return nil, err
	}
	svc, err := registry.Open(registry.Config{
		DBPath:         filepath.Join(cfg.DataDir, "registry.db"),
		Secrets:        box,
		Roles:          roles,
		AllowedEnvKeys: cfg.Sandbox.MCPIsolationAllowedEnvironmentKeys,
		Logger:         log.With("service", "registry"),
	})
	if err != nil {
		return nil, err
	}
	a.onClose(svc.Close)
	if cfg.BootstrapAdminKey != "" {
		if err := svc.EnsureBootstrapAdmin(ctx, cfg.BootstrapAdminKey); err != nil {
			return nil, err
		}
	}
	return svc, nil
}

func (a *App) openPool(ctx context.Context, cfg *config.Config, reg pool.Registry, log *slog.Logger) (*pool.Service, error) {
	sb := cfg.Sandbox
	poolID := sb.PoolID
	if poolID == "" {
		poolID = defaultPoolID(cfg.DataDir)
	}
	pl, err := pool.Open(ctx, pool.Config{
		Registry: reg,
		Sandbox: pool.Sandbox{
			Image: sb.MCPIsolationImage, Network: sb.MCPIsolationNetwork, AllowedEnvKeys: sb.MCPIsolationAllowedEnvironmentKeys,
			NanoCPUs: int64(sb.MCPIsolationCPUs * 1e9), MemoryBytes: int64(sb.MCPIsolationMemory), PidsLimit: sb.MCPIsolationPids,
			TmpfsSizeBytes: int64(sb.MCPIsolationTmpSize), AllowUnisolated: sb.AllowUnisolatedMCPDevelopment,
			PoolID: poolID, DockerHost: sb.DockerHost, CloseTimeout: sb.StopTimeout,
		},
		Logger: log.With("service", "pool"),
	})
	if err != nil {
		return nil, err
	}
	a.onClose(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return pl.Close(ctx)
	})
	return pl, nil
}

// openPublisher opens the publisher with the registry as its grants resolver (the ceiling) and
// the pool as its discoverer (imports start servers only through the isolated spawner).
func (a *App) openPublisher(cfg *config.Config, policies publisher.Policies, disc publisher.Discoverer, log *slog.Logger) (*publisher.Service, error) {
	pub, err := publisher.Open(publisher.Config{
		DBPath:                filepath.Join(cfg.DataDir, "publisher.db"),
		Policies:              policies,
		Discoverer:            disc,
		AllowInlineMCPServers: cfg.Dev.AllowInlineMCPServers,
		Logger:                log.With("service", "publisher"),
	})
	if err != nil {
		return nil, err
	}
	a.onClose(pub.Close)
	if cfg.Dev.AllowInlineMCPServers {
		log.Warn("dev.allow_inline_mcp_servers is set: graphs with inline mcp_servers publish over a warning, and no ceiling applies to those servers")
	}
	return pub, nil
}

func registerPublisher(srv *grpcserver.Server, pub *publisher.Service) {
	publisherv1.RegisterPublisherServiceServer(srv.GRPC(), pub)
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return publisherv1.RegisterPublisherServiceHandler(ctx, mux, conn)
	})
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

func registerPool(srv *grpcserver.Server, pl *pool.Service) {
	poolv1.RegisterPoolServiceServer(srv.GRPC(), pl)
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return poolv1.RegisterPoolServiceHandler(ctx, mux, conn)
	})
}

func newServer(cfg *config.Config, name string, authz grpcserver.Authorizer, log *slog.Logger) (*grpcserver.Server, error) {
	opts := grpcserver.Options{
		Name: name, GRPCAddr: cfg.GRPCAddr, HTTPAddr: cfg.HTTPAddr,
		Authorizer: authz, Logger: log,
	}
	if cfg.TLS.Enabled() {
		tlsCfg, err := mtls.ServerConfig(mtls.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, CAFile: cfg.TLS.ClientCAFile})
		if err != nil {
			return nil, err
		}
		opts.TLS = tlsCfg
	}
	return grpcserver.New(opts), nil
}

func registerRegistry(srv *grpcserver.Server, reg *registry.Service) {
	registryv1.RegisterRegistryServiceServer(srv.GRPC(), reg)
	registryv1.RegisterKeyServiceServer(srv.GRPC(), reg)
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		if err := registryv1.RegisterRegistryServiceHandler(ctx, mux, conn); err != nil {
			return err
		}
		return registryv1.RegisterKeyServiceHandler(ctx, mux, conn)
	})
}
