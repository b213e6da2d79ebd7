package store

import (
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// releaseStep is how much the log writes between two releases of its mapped pages.
const releaseStep = 8 << 20

// releaseMapped lets go of the pages of the log's file that this process has mapped. bbolt
// reads the file through a shared, read-only memory map, and an append-only log reads every
// page it writes through it at least once (each leaf is the last one for a while, and the
// next commit reads it), so the pages it maps grow with the log and count in the process's
// resident memory (RssFile), ~2.6 KB per tool call: an idle server that served a million calls
// would look like it kept 2.6 GB. MADV_DONTNEED drops the mappings, not the data: the pages
// stay in the kernel's page cache, and the next read of one maps it again (a minor fault).
// The map does not move while a read transaction is open (bbolt remaps only under a lock that
// waits for every reader), so the range advised is bbolt's map for the whole call.
func (s *Store) releaseMapped() error {
	return s.db.View(func(tx *bolt.Tx) error {
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, s.db.Info().Data, uintptr(tx.Size()), unix.MADV_DONTNEED); errno != 0 {
			return errno
		}
		return nil
	})
}

// noteWritten counts what a commit wrote, and releases the mapped pages every releaseStep.
// Only the writer calls it.
func (w *writer) noteWritten(n int) {
	w.sinceRelease += n
	if w.sinceRelease < releaseStep {
		return
	}
	w.sinceRelease = 0
	if err := w.s.releaseMapped(); err != nil {
		w.s.log.Warn("audit: could not release the log's mapped pages; resident memory includes them until the next try", "err", err)
	}
}
