package publisher

import (
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/backup"
)

// BackupFiles is the publisher's part of a data_dir backup: publisher.db (graphs, drafts, versions
// and the audit outbox, in one read transaction) on bbolt, and the audit
// quarantine file. On etcd the publisher's state is in etcd, and only the quarantine file is
// local.
func (s *Service) BackupFiles() ([]backup.File, error) {
	var files []backup.File
	if b, ok := s.store.(interface{ DB() *bolt.DB }); ok {
		files = append(files, backup.Bolt(b.DB()))
	}
	q, err := s.spool.BackupFiles()
	if err != nil {
		return nil, err
	}
	return append(files, q...), nil
}
