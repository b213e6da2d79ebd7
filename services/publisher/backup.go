package publisher

import "github.com/ringfence/ringfence/internal/backup"

// BackupFiles is the publisher's part of a data_dir backup: publisher.db (graphs, drafts,
// versions and the audit outbox, in one read transaction) on bbolt, and the audit quarantine
// file. On etcd the publisher's state is in etcd, and only the quarantine file is local.
func (s *Service) BackupFiles() ([]backup.File, error) { return backup.Producer(s.store, s.spool) }
