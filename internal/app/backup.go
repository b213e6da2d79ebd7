package app

import (
	"path/filepath"

	adminv1 "github.com/ringfence/ringfence/gen/go/ringfence/admin/v1"
	"github.com/ringfence/ringfence/internal/admin"
	"github.com/ringfence/ringfence/internal/backup"
	"github.com/ringfence/ringfence/internal/config"
)

// registerAdmin serves AdminService (the online backup) on the binary's public port, over the
// files of the services this binary opened: the producers' first, audit.db last. Its audit
// records go through the binary's first producer spool, or into the log itself on
// ringfence-audit. Not on REST: the copy is a stream of binary chunks (docs/api.md).
func (a *App) registerAdmin(cfg *config.Config, name string) {
	c := admin.Config{Binary: name, DataDir: cfg.DataDir, StoreBackend: cfg.Store.Backend, Logger: a.log.With("service", "admin"), StallTimeout: cfg.Limits.BackupStallTimeout}
	if a.Registry != nil {
		c.Sources = append(c.Sources, a.Registry.BackupFiles)
		c.Record, c.Producer = a.Registry.Spool().Enqueue, "registry"
	}
	if a.Publisher != nil {
		c.Sources = append(c.Sources, a.Publisher.BackupFiles)
		if c.Record == nil {
			c.Record, c.Producer = a.Publisher.Spool().Enqueue, "publisher"
		}
	}
	if a.Pool != nil {
		c.Sources = append(c.Sources, a.Pool.BackupFiles)
		if c.Record == nil {
			c.Record, c.Producer = a.Pool.Spool().Enqueue, "pool"
		}
	}
	if a.Audit != nil {
		c.Sources = append(c.Sources, backup.Source(a.Audit.BackupFiles))
		if c.Record == nil {
			c.Record, c.Producer = a.Audit.Record, "audit"
		}
	}
	// The registry seals secrets with the key, and the pool its users' OAuth tokens.
	if a.Registry != nil || a.Pool != nil {
		c.SecretsKeyFile = cfg.SecretsKeyFile
		if c.SecretsKeyFile == "" {
			c.SecretsKeyFile = filepath.Join(cfg.DataDir, "secrets.key")
		}
		c.NotIncluded = append(c.NotIncluded, "the secrets key ("+c.SecretsKeyFile+", secrets_key_file) that opens the sealed secrets: it is never in a backup; keep a copy of it apart from the backups, and put it back beside the restored data_dir")
	}
	if cfg.Store.Etcd() {
		var in []string
		if a.Registry != nil {
			in = append(in, "registrations, secrets and API keys")
		}
		if a.Publisher != nil {
			in = append(in, "graphs and versions")
		}
		if a.Pool != nil && cfg.InternalAddr != "" {
			in = append(in, "runs, agent tokens and sign-ins")
		}
		if a.Audit != nil && cfg.InternalAddr != "" {
			in = append(in, "the shared audit chain")
		}
		if len(in) > 0 {
			c.NotIncluded = append(c.NotIncluded, "with store.backend=etcd, the "+joinAnd(in)+" are kept in etcd: take them with `etcdctl snapshot save` (docs/operations.md#scaling-out)")
		}
	}
	adminv1.RegisterAdminServiceServer(a.Server.GRPC(), admin.New(c))
}

// joinAnd joins a, b and c.
func joinAnd(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	out := items[0]
	for _, s := range items[1 : len(items)-1] {
		out += ", " + s
	}
	return out + " and " + items[len(items)-1]
}
