// Package pool is the pool service: the only part of Ringfence that starts MCP servers. It
// runs on hardened hosts, apart from the authoring plane. Discovery starts a registered server
// in isolation, lists its tools with their pins and screen findings, and stops it; runs get
// their own sessions, and every call passes every gate before anything reaches a server.
package pool

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/moby/moby/client"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/pool/internal/spawner"
)

// Registry resolves registrations with their secrets: the registry service in-process, or its
// internal ResolveServer RPC over mutual TLS.
type Registry interface {
	ResolveRegistration(ctx context.Context, ref string) (*mcpserver.Resolved, error)
}

// Sandbox is the operator's isolation profile (see config.Sandbox).
type Sandbox struct {
	// Image is the pinned isolation image; empty refuses every stdio server unless
	// AllowUnisolated is set.
	Image           string
	Network         string
	AllowedEnvKeys  []string
	NanoCPUs        int64
	MemoryBytes     int64
	PidsLimit       int64
	TmpfsSizeBytes  int64
	AllowUnisolated bool
	// PoolID labels this pool's containers so a restart can sweep what it orphaned.
	PoolID string
	// DockerHost overrides DOCKER_HOST for the engine client.
	DockerHost string
	// CloseTimeout bounds a graceful stop before it is forced.
	CloseTimeout time.Duration
}

// Config holds the service's dependencies.
type Config struct {
	Registry Registry
	Sandbox  Sandbox
	Logger   *slog.Logger
}

// Service implements PoolService.
type Service struct {
	// TODO(runs): the run RPCs land with the pool runtime.
	poolv1.UnimplementedPoolServiceServer

	cfg     Config
	log     *slog.Logger
	errors  grpcserver.ErrorTable
	spawner *spawner.Router
}

var _ poolv1.PoolServiceServer = (*Service)(nil)

var errorCodes = map[error]codes.Code{
	mcpserver.ErrNotRegistered:     codes.NotFound,
	discovery.ErrIsolationRequired: codes.Unavailable,
}

// Open builds the service and its spawner, then checks the isolation image (missing, or
// declaring a VOLUME, stops the start) and sweeps containers an earlier instance of this pool
// left behind.
func Open(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	sc := spawner.Config{
		Image: cfg.Sandbox.Image, Network: cfg.Sandbox.Network, AllowedEnvKeys: cfg.Sandbox.AllowedEnvKeys,
		NanoCPUs: cfg.Sandbox.NanoCPUs, MemoryBytes: cfg.Sandbox.MemoryBytes, PidsLimit: cfg.Sandbox.PidsLimit,
		TmpfsSizeBytes: cfg.Sandbox.TmpfsSizeBytes, AllowUnisolated: cfg.Sandbox.AllowUnisolated,
		PoolID: cfg.Sandbox.PoolID, CloseTimeout: cfg.Sandbox.CloseTimeout, Logger: cfg.Logger,
	}
	if cfg.Sandbox.Image != "" && cfg.Sandbox.DockerHost != "" {
		docker, err := client.New(client.FromEnv, client.WithHost(cfg.Sandbox.DockerHost))
		if err != nil {
			return nil, fmt.Errorf("pool: docker client for %s: %w", cfg.Sandbox.DockerHost, err)
		}
		sc.Docker = docker
	}
	router, err := spawner.New(sc)
	if err != nil {
		return nil, err
	}
	report, err := router.Preflight(ctx)
	if err != nil {
		_ = router.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("pool: the isolation profile cannot be used: %w", err)
	}
	switch report.Isolation {
	case "docker":
		cfg.Logger.Info("isolation image ready", "image", report.ImageRef, "id", report.ImageID, "swept_orphans", report.Swept)
		if len(report.ImageEnvKeys) > 0 {
			cfg.Logger.Warn("the isolation image sets its own ENV; every MCP server sees these keys", "keys", strings.Join(report.ImageEnvKeys, ","))
		}
	case "none":
		cfg.Logger.Warn("no isolation image: discovery and calls of stdio MCP servers are refused until RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE is set")
	}
	return &Service{
		cfg:     cfg,
		log:     cfg.Logger,
		errors:  grpcserver.ErrorTable{Service: "pool", Codes: errorCodes, Logger: cfg.Logger},
		spawner: router,
	}, nil
}

// Close stops every session and removes what this instance started.
func (s *Service) Close(ctx context.Context) error {
	return s.spawner.Close(ctx)
}
