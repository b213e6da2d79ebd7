package audit

import "github.com/ringfence/ringfence/internal/backup"

// BackupFiles is the audit log's part of a data_dir backup: audit.db, in one read transaction.
// With several instances on etcd it is this instance's copy of the shared chain.
func (s *Service) BackupFiles() ([]backup.File, error) {
	return []backup.File{s.store.BackupFile()}, nil
}
