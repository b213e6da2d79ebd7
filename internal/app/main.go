package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/config"
	"github.com/ringfence/ringfence/internal/gctune"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/version"
)

// Builder builds one binary's App from its configuration.
type Builder func(ctx context.Context, cfg *config.Config, log *slog.Logger) (*App, error)

// Main is every server binary's main: load and validate config (exit 2 on a bad one), build,
// serve until SIGINT or SIGTERM, shut down gracefully (exit 1 on failure).
func Main(name string, build Builder) int {
	if slices.Contains(os.Args[1:], "--version") || slices.Contains(os.Args[1:], "-version") {
		fmt.Println(version.String(name))
		return 0
	}
	if len(os.Args) > 1 && os.Args[1] == "secrets-key" {
		return secretsKeyCommand(name, os.Args[2:], os.Environ(), os.Stdout, os.Stderr)
	}
	cfg, err := config.Load(name, os.Args[1:], os.Environ(), os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	// Custom roles are configuration too: a bad one is exit 2 like any invalid value, before
	// anything is opened (loadRoles builds them again for the services).
	if _, err := auth.NewRolesFrom(cfg.ServiceRolesJSON, cfg.Source("service_roles_json")); err != nil {
		fmt.Fprintf(os.Stderr, "%s: config: %v\n", name, err)
		return 2
	}
	log := NewLogger(cfg, os.Stderr)
	grpcserver.RouteGRPCLog(log)
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}
	if _, applied := gctune.Apply(); applied {
		log.Debug("GOGC is unset: the garbage collector runs with the servers' default", "gogc", gctune.Percent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.Debug.PprofAddr != "" {
		if _, err := serveProfiles(ctx, cfg.Debug.PprofAddr, log); err != nil {
			log.Error(name+" cannot start", "err", err)
			return 1
		}
	}
	a, err := build(ctx, cfg, log)
	if err != nil {
		log.Error(name+" cannot start", "err", err)
		return 1
	}
	if err := a.Run(ctx); err != nil {
		log.Error(name+" stopped with an error", "err", err)
		return 1
	}
	return 0
}
