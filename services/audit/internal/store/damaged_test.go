package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/boltdb"
)

// TestADamagedPageMetByTheWriterRefusesAppends: the log is not checked page by page at start,
// so a damaged page may first be read by the writer, where bbolt panics. The commit fails
// instead, naming the file and the fix; every append after it is refused the same way, and
// the store (with the process it is in) stays up and closes cleanly. Without the guard the
// panic ended the process.
func TestADamagedPageMetByTheWriterRefusesAppends(t *testing.T) {
	s, path := newStore(t)
	for i := range 2000 {
		appendAll(t, s, toolRec(call{tenant: "t", run: "run-1", server: "fx", tool: "echo"}, fmt.Sprintf("call-%04d", i)))
	}
	require.NoError(t, s.Close())

	// The id index's root page, which every append reads to find duplicates, is made a page
	// of no type.
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	var root uint64
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		root = uint64(tx.Bucket(bucketByID).Root())
		return nil
	}))
	pageSize := int64(db.Info().PageSize)
	require.NoError(t, db.Close())
	require.NotZero(t, root, "the index outgrew an inline bucket")
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	flags := make([]byte, 2)
	binary.LittleEndian.PutUint16(flags, 0x00ff)
	_, err = f.WriteAt(flags, int64(root)*pageSize+8) // a page header: id (8 bytes), then flags
	require.NoError(t, err)
	require.NoError(t, f.Close())

	s, err = Open(path, Options{})
	require.NoError(t, err, "the damaged page is not read at start")
	for range 2 {
		_, err = s.Append(context.Background(), []audit.Record{toolRec(call{tenant: "t", run: "run-2", server: "fx", tool: "echo"}, "call-new")})
		var damaged *boltdb.DamagedError
		require.True(t, errors.As(err, &damaged), "%v", err)
		require.ErrorContains(t, err, path+" is damaged (")
		require.ErrorContains(t, err, "restore the data directory from a backup")
	}
	require.NoError(t, s.Close())
}
