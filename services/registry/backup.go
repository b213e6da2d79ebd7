package registry

import "github.com/ringfence/ringfence/internal/backup"

// BackupFiles is the registry's part of a data_dir backup: registry.db (registrations, keys,
// sealed secrets and the audit outbox, in one read transaction) on bbolt, and the audit
// quarantine file. On etcd the registry's state is in etcd, and only the quarantine file is
// local.
func (s *Service) BackupFiles() ([]backup.File, error) { return backup.Producer(s.store, s.spool) }
