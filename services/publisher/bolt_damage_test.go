package publisher

import (
	"encoding/binary"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/services/registry"
)

// TestADamagedDraftOnBoltIsDataLoss: a draft and a version in publisher.db whose bytes were
// changed behind the publisher's back no longer decode. Reading either, or editing the draft
// (which reads it first), is DATA_LOSS naming the graph, the file and what to do (restore
// the file from a backup, or delete the graph and create it again), as on etcd, not
// INTERNAL; deleting the graph does not read them, so it works and frees the id.
func TestADamagedDraftOnBoltIsDataLoss(t *testing.T) {
	box, err := secretbox.New(make([]byte, 32))
	require.NoError(t, err)
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := registry.Open(registry.Config{DBPath: filepath.Join(t.TempDir(), "registry.db"), Secrets: box, Roles: roles, Logger: quiet, AuditSink: testutil.NewAuditRecorder()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	path := filepath.Join(t.TempDir(), "publisher.db")
	open := func() *Service {
		svc, err := Open(Config{DBPath: path, Policies: reg, Logger: quiet, AuditSink: testutil.NewAuditRecorder()})
		require.NoError(t, err)
		return svc
	}

	ctx := acme(t.Context())
	svc := open()
	created, err := svc.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"researcher"}})
	require.NoError(t, err)
	_, err = svc.Publish(ctx, &publisherv1.PublishRequest{GraphId: "g"})
	require.NoError(t, err)
	require.NoError(t, svc.Close())

	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket([]byte("drafts")).Put([]byte("acme/g"), []byte("\x00not a draft")); err != nil {
			return err
		}
		return tx.Bucket([]byte("versions")).Put(binary.BigEndian.AppendUint64([]byte("acme/g/"), 1), []byte("\x00not a version"))
	}))
	require.NoError(t, db.Close())

	svc = open()
	t.Cleanup(func() { _ = svc.Close() })
	calls := map[string]struct {
		call func() error
		what string
	}{
		"a read of the draft": {func() error {
			_, err := svc.GetDraft(ctx, &publisherv1.GetDraftRequest{GraphId: "g"})
			return err
		}, "draft"},
		"an edit": {func() error {
			_, err := svc.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: created.GetDraft()})
			return err
		}, "draft"},
		"a read of the version": {func() error {
			_, err := svc.GetVersion(ctx, &publisherv1.GetVersionRequest{GraphId: "g", Version: 1})
			return err
		}, "version 1"},
		"a read of the latest version": {func() error {
			_, err := svc.GetVersion(ctx, &publisherv1.GetVersionRequest{GraphId: "g"})
			return err
		}, "version 1"},
	}
	for name, c := range calls {
		st := testutil.RequireStatus(t, c.call(), codes.DataLoss, name)
		require.Contains(t, st.Message(), `publisher: the `+c.what+` of graph "g" in tenant "acme" cannot be read from publisher.db: store: a stored value is damaged`, name)
		require.Contains(t, st.Message(), "restore publisher.db from a backup (ringfence backup", "%s names the fix", name)
		require.Contains(t, st.Message(), "delete the graph (ringfence graphs delete --graph g) and create it again", "%s names the other fix", name)
		require.NotContains(t, st.Message(), filepath.Dir(path), "%s does not show the server's data directory", name)
	}

	_, err = svc.DeleteGraph(ctx, &publisherv1.DeleteGraphRequest{GraphId: "g"})
	require.NoError(t, err)
	_, err = svc.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"researcher"}})
	require.NoError(t, err, "the id is free again")
}
