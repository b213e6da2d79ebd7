package pool

import "github.com/ringfence/ringfence/internal/backup"

// BackupFiles is the pool's part of a data_dir backup: pool.db (runs, tokens, documents,
// sign-ins, in one read transaction; the pool keeps it on etcd too) and its audit spool
// (pool-audit-spool/), whose records of calls wait there for the audit log.
func (s *Service) BackupFiles() ([]backup.File, error) { return backup.Producer(s.store, s.spool) }
