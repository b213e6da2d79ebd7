package audit

import (
	"context"
	"errors"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/backup"
)

// BackupFiles is the audit log's part of a data_dir backup: audit.db, in one read transaction.
// With several instances on etcd it is this instance's copy of the shared chain.
func (s *Service) BackupFiles() ([]backup.File, error) {
	return []backup.File{s.store.BackupFile()}, nil
}

// Record appends one record of this binary's own (the admin records of its backups) as an
// Append from a producer is: with several instances on etcd only the leader appends, and a
// standby refuses (UNAVAILABLE, naming the leader) rather than write to its copy alone.
func (s *Service) Record(ctx context.Context, rec audit.Record) error {
	if s.shared != nil && !s.shared.Leading() {
		return s.notLeader(ctx)
	}
	_, err := s.store.Append(ctx, []audit.Record{rec})
	if errors.Is(err, ErrNotLeader) {
		return s.notLeader(ctx)
	}
	return err
}
