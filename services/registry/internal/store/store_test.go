package store

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/boltdb"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
)

func openStore(t *testing.T) *Store {
	t.Helper()
	box, err := secretbox.New(make([]byte, 32))
	require.NoError(t, err)
	s, err := Open(filepath.Join(t.TempDir(), "registry.db"), box)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestCacheFollowsTheFileWhenWritesFinishOutOfOrder: writes commit in order but return
// in any order. Here the first update commits and then stalls (in a commit handler, after
// bbolt has released the file) while a second update commits and returns; reads must then
// answer the second, also after the first returns. A cache updated after each commit
// ended on the first: the pool enforced grants the stored registration no longer had, and
// an update carrying the read revision was refused forever.
func TestCacheFollowsTheFileWhenWritesFinishOutOfOrder(t *testing.T) {
	s := openStore(t)
	ctx := t.Context()
	require.NoError(t, s.CreateServer(ctx, &mcpserver.Registration{Ref: "docs", Transport: "stdio", Command: "x"}, nil))
	grant := func(g string) func(*mcpserver.Registration) (*mcpserver.Registration, error) {
		return func(cur *mcpserver.Registration) (*mcpserver.Registration, error) {
			next := *cur
			next.Grants = []string{g}
			return &next, nil
		}
	}

	committed, resume := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := s.UpdateServer(ctx, "docs", grant("first"), func(tx *bolt.Tx, _, _ *mcpserver.Registration) error {
			tx.OnCommit(func() {
				close(committed)
				<-resume
			})
			return nil
		})
		first <- err
	}()
	<-committed
	_, err := s.UpdateServer(ctx, "docs", grant("second"), nil)
	require.NoError(t, err)
	close(resume)
	require.NoError(t, <-first)

	p, err := s.ServerPolicy(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, []string{"second"}, p.Grants)
	require.Equal(t, int64(3), p.Revision)

	require.NoError(t, s.DeleteServer(ctx, "docs", nil))
	_, err = s.ServerPolicy(ctx, "docs")
	require.ErrorIs(t, err, ErrNotFound)
}

const urlCanary = "canary-url-e41b"

// TestMigrationSealsStoredURLs: a file written by schema version 1 (the URL in clear) is
// migrated on open: the URL is sealed, its masked form shown, the clear URL still resolves,
// and the raw file (free pages included) no longer holds the credential.
func TestMigrationSealsStoredURLs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.db")
	box, err := secretbox.New(make([]byte, 32))
	require.NoError(t, err)
	remote := "https://mcp.example.com/mcp?api_key=" + urlCanary + "&region=eu"

	// Schema version 1, as the binary before this one wrote it.
	db, err := boltdb.Open(path)
	require.NoError(t, err)
	require.NoError(t, boltdb.Migrate(db, allBuckets, migrations(box)[:1]))
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(serversBucket)
		if err := b.Put([]byte("tickets"), []byte(`{"ref":"tickets","transport":"streamable_http","url":"`+remote+`","grants":[],"revision":3}`)); err != nil {
			return err
		}
		return b.Put([]byte("docs"), []byte(`{"ref":"docs","transport":"stdio","command":"x","grants":[],"revision":1}`))
	}))
	require.NoError(t, db.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(raw), urlCanary, "the old format holds the URL in clear")

	s, err := Open(path, box)
	require.NoError(t, err)
	ctx := t.Context()
	got, err := s.GetServer(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, remote, got.URL, "the pool still gets the URL")
	require.Equal(t, int64(3), got.Revision)
	masked, err := s.GetServerMasked(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, "https://mcp.example.com/mcp?api_key=********&region=********", masked.URL)
	docs, err := s.GetServer(ctx, "docs")
	require.NoError(t, err)
	require.Empty(t, docs.URL)
	require.NoError(t, s.Close())

	raw, err = os.ReadFile(path)
	require.NoError(t, err)
	require.NotContains(t, string(raw), urlCanary, "the migrated file still holds the URL's credential")
	require.Contains(t, string(raw), "api_key", "query keys stay readable")

	// Opening again migrates nothing and keeps the URL.
	s, err = Open(path, box)
	require.NoError(t, err)
	got, err = s.GetServer(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, remote, got.URL)
	require.NoError(t, s.Close())
}

// TestListingOpensNoSeal: a listing and a masked read show the masked URL and env keys
// without opening a seal, so they work (and cost no decryption) even under a key that could
// not open them; a full read cannot.
func TestListingOpensNoSeal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.db")
	box, err := secretbox.New(make([]byte, 32))
	require.NoError(t, err)
	s, err := Open(path, box)
	require.NoError(t, err)
	ctx := t.Context()
	remote := "https://mcp.example.com/mcp?" + urlCanary
	require.NoError(t, s.CreateServer(ctx, &mcpserver.Registration{Ref: "tickets", Transport: mcpserver.TransportStreamableHTTP, URL: remote}, nil))
	require.NoError(t, s.CreateServer(ctx, &mcpserver.Registration{Ref: "docs", Transport: "stdio", Command: "x", Env: map[string]string{"APP_TOKEN": urlCanary}}, nil))
	require.NoError(t, s.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NotContains(t, string(raw), urlCanary)

	other := make([]byte, 32)
	other[0] = 1
	wrong, err := secretbox.New(other)
	require.NoError(t, err)
	s, err = Open(path, wrong)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	list, _, err := s.ListServers(ctx, "", 10)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, map[string]string{"APP_TOKEN": ""}, list[0].Env, "docs: keys without values")
	require.Equal(t, "https://mcp.example.com/mcp?********", list[1].URL)
	_, err = s.GetServer(ctx, "tickets")
	require.ErrorIs(t, err, secretbox.ErrOpen)
}
