package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/boltdb"
)

// damagedLog writes a log of 2000 records at path and makes the root page of bucket, or with
// middle the middle child of that root, a page of no type: bbolt panics where it reads it.
func damagedLog(t *testing.T, path string, bucket []byte, middle bool) {
	t.Helper()
	s := openStore(t, path)
	for i := range 2000 {
		appendAll(t, s, toolRec(call{tenant: "t", run: "run-1", server: "fx", tool: "echo"}, fmt.Sprintf("call-%04d", i)))
	}
	require.NoError(t, s.Close())

	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	var root uint64
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		root = uint64(tx.Bucket(bucket).Root())
		return nil
	}))
	pageSize := int64(db.Info().PageSize)
	require.NoError(t, db.Close())
	require.NotZero(t, root, "the bucket outgrew an inline one")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	if middle {
		// A branch page: a 16-byte header (id, flags, count, overflow), then per child 16
		// bytes (key position, key size, child page id).
		page := make([]byte, pageSize)
		_, err = f.ReadAt(page, int64(root)*pageSize)
		require.NoError(t, err)
		require.Equal(t, uint16(0x01), binary.LittleEndian.Uint16(page[8:]), "the root is a branch page")
		count := int(binary.LittleEndian.Uint16(page[10:]))
		root = binary.LittleEndian.Uint64(page[16+(count/2)*16+8:])
	}
	flags := make([]byte, 2)
	binary.LittleEndian.PutUint16(flags, 0x00ff)
	_, err = f.WriteAt(flags, int64(root)*pageSize+8) // a page header: id (8 bytes), then flags
	require.NoError(t, err)
}

// TestADamagedPageMetAfterTheStartIsNamed: the log is not checked page by page at start, so a
// damaged page may first be read by Verify or the writer, in goroutines of their own (Verify
// also runs in the background, and walks the indexes beside the chain), where bbolt panics.
// Verify fails instead, and so does the commit, naming the file and the fix; every append
// after it is refused the same way, and the store (with the process it is in) stays up and
// closes cleanly. Without the guards the panic ended the process.
func TestADamagedPageMetAfterTheStartIsNamed(t *testing.T) {
	for name, tc := range map[string]struct {
		bucket []byte
		middle bool
	}{
		"id index": {bucketByID, false}, "tenant index": {bucketByTenant, false}, "run index": {bucketByRun, false},
		"call index": {bucketByCall, false},
		// The records' root and last page are read at start (and refused there), not those between.
		"records": {bucketRecords, true},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.db")
			damagedLog(t, path, tc.bucket, tc.middle)
			s, err := Open(path, Options{})
			require.NoError(t, err, "the damaged page is not read at start")
			var damaged *boltdb.DamagedError
			for range 2 {
				_, err = s.Verify(context.Background(), nil)
				require.True(t, errors.As(err, &damaged), "%v", err)
				require.ErrorContains(t, err, path+" is damaged (")
				_, err = s.Append(context.Background(), []audit.Record{toolRec(call{tenant: "t", run: "run-2", server: "fx", tool: "echo"}, "call-new")})
				if tc.middle {
					require.NoError(t, err, "an append reads no page between the first and the last")
					continue
				}
				require.True(t, errors.As(err, &damaged), "%v", err)
				require.ErrorContains(t, err, path+" is damaged (")
				require.ErrorContains(t, err, "restore the data directory from a backup")
			}
			require.NoError(t, s.Close())
		})
	}
}
