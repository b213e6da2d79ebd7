package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ringfence/ringfence/internal/backup"
)

// BackupFiles is a consistent copy of the files the spool keeps on local disk, as of one
// instant: its quarantine file, and for a spool in files (the pool's) its segments and
// counters. A bbolt outbox is copied with its producer's database, an etcd outbox with etcd.
func (s *Spool) BackupFiles() ([]backup.File, error) {
	var files []backup.File
	if fo, ok := s.out.(*fileOutbox); ok {
		var err error
		if files, err = fo.backupFiles(); err != nil {
			return nil, err
		}
	}
	q, err := s.quarantineBackup()
	if err != nil {
		backup.Release(files)
		return nil, err
	}
	return append(files, q...), nil
}

// quarantineBackup is the quarantine file as it is now: records are only ever appended to it
// (under quarantineMu), and a requeue renames it aside, which leaves the open file whole.
func (s *Spool) quarantineBackup() ([]backup.File, error) {
	s.quarantineMu.Lock()
	defer s.quarantineMu.Unlock()
	return openSection(s.quarantinePath)
}

// openSection opens path and copies it up to its present size; nothing when it does not exist.
func openSection(path string) ([]backup.File, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("audit: back up %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("audit: back up %s: %w", path, err)
	}
	return []backup.File{backup.Section(path, f, st.Size())}, nil
}

// backupFiles snapshots the spool's files while no writer runs (wmu): each segment up to its
// last durable frame (the zeros filled ahead are left out, as a start cuts them), opened now so
// that a segment deleted once forwarded is still copied whole, and the counters as they are.
// The copy is a spool as a crash at this instant would leave it: opened, it forwards what was
// not acknowledged then, and the audit log keeps one of each record it already holds.
func (o *fileOutbox) backupFiles() (files []backup.File, err error) {
	o.wmu.Lock()
	defer o.wmu.Unlock()
	o.mu.Lock()
	closed, segs := o.closed, append([]segment(nil), o.segs...)
	o.mu.Unlock()
	if closed {
		return nil, errOutboxClosed
	}
	defer func() {
		if err != nil {
			backup.Release(files)
			files = nil
		}
	}()
	for _, name := range []string{ackedFile, droppedFile} {
		path := filepath.Join(o.dir, name)
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return files, fmt.Errorf("audit: back up %s: %w", path, err)
		}
		files = append(files, backup.Bytes(path, b))
	}
	for _, seg := range segs {
		f, err := os.Open(seg.path)
		if err != nil {
			return files, fmt.Errorf("audit: back up spool segment %s: %w", seg.path, err)
		}
		files = append(files, backup.Section(seg.path, f, seg.size))
	}
	return files, nil
}
