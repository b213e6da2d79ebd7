package audit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/backup"
)

// TestSpoolBackupIsTheSpoolOfOneInstant: a spool in files (the pool's) copied by BackupFiles
// while records go on being spooled is the spool as of the snapshot: opened, it forwards, in
// order, exactly the records that waited then (over several segments), and none spooled after
// the snapshot; what was forwarded before is not sent again, and the quarantine file is copied
// whole.
func TestSpoolBackupIsTheSpoolOfOneInstant(t *testing.T) {
	env := newSpoolEnvOf(t, "files", nil)
	fo := env.spool.out.(*fileOutbox)
	fo.segmentMax = 4 << 10 // several segments
	env.run(t)

	refused := toolRecord(0, "q")
	env.sink.mu.Lock()
	env.sink.refuse[refused.ID] = true
	env.sink.mu.Unlock()
	require.NoError(t, env.spool.Enqueue(t.Context(), refused))
	for i := range 20 {
		require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(i, "forwarded")))
	}
	require.NoError(t, env.spool.Flush(t.Context()))

	env.sink.down.Store(true)
	var waiting []string
	for i := range 200 {
		r := toolRecord(i, "waiting")
		require.NoError(t, env.spool.Enqueue(t.Context(), r))
		waiting = append(waiting, r.ID)
	}
	files, err := env.spool.BackupFiles()
	require.NoError(t, err)
	t.Cleanup(func() { backup.Release(files) })
	// Spooled after the snapshot, before and while the files are copied.
	for i := range 50 {
		require.NoError(t, env.spool.Enqueue(t.Context(), toolRecord(i, "later")))
	}
	var segs int
	dst := filepath.Join(t.TempDir(), "spool")
	require.NoError(t, os.MkdirAll(dst, 0o700))
	for _, f := range files {
		require.Equal(t, fo.dir, filepath.Dir(f.Path), "every file is in the spool directory")
		if filepath.Ext(f.Path) == segmentExt {
			segs++
		}
		out, err := os.Create(filepath.Join(dst, filepath.Base(f.Path)))
		require.NoError(t, err)
		require.NoError(t, f.Copy(out))
		require.NoError(t, out.Close())
		if f.Release != nil {
			f.Release()
		}
	}
	files = nil
	require.Greater(t, segs, 1, "the records wait in several segments")
	q, err := os.ReadFile(filepath.Join(fo.dir, "quarantine.jsonl"))
	require.NoError(t, err)
	qc, err := os.ReadFile(filepath.Join(dst, "quarantine.jsonl"))
	require.NoError(t, err)
	require.Equal(t, q, qc)

	sink := newFakeSink()
	restored, err := NewSpool(SpoolConfig{Dir: dst, Sink: sink, Producer: "pool", Logger: env.spool.log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = restored.Close() })
	require.Equal(t, len(waiting), restored.Pending())
	renv := &spoolEnv{sink: sink, spool: restored}
	renv.run(t)
	require.NoError(t, restored.Flush(t.Context()))
	require.Equal(t, waiting, ids(sink.records()))
}
