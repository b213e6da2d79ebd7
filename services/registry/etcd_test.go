package registry

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/services/registry/internal/store"
)

// etcdReplicas opens n registry services on one etcd cluster and prefix: replicas of one
// registry, each with its own client and its own (same) secrets key.
func etcdReplicas(t *testing.T, cluster *etcdtest.Cluster, n int) []*Service {
	t.Helper()
	root := cluster.Root()
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	var out []*Service
	for range n {
		box, err := secretbox.New(make([]byte, 32))
		require.NoError(t, err)
		svc, err := Open(Config{
			DBPath: filepath.Join(t.TempDir(), "registry.db"), Etcd: cluster.Client(t, "registry"), EtcdRoot: root,
			Secrets: box, Roles: roles, AllowedEnvKeys: []string{"APP_TOKEN"}, AuditSink: testutil.NewAuditRecorder(),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = svc.Close() })
		out = append(out, svc)
	}
	return out
}

// TestReplicasOnEtcd: two registry services on one cluster are one registry. Both start at
// once with the same bootstrap key and both succeed, with one key between them; a registration
// created through one is served by the other's next call; a key revoked on one is refused by
// the other's next check.
func TestReplicasOnEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	replicas := etcdReplicas(t, cluster, 2)
	ctx := auth.SystemContext(t.Context(), "test")
	var wg sync.WaitGroup
	for _, r := range replicas {
		wg.Go(func() { require.NoError(t, r.EnsureBootstrapAdmin(ctx, adminKey)) })
	}
	wg.Wait()
	keys, err := replicas[1].ListKeys(ctx, &registryv1.ListKeysRequest{})
	require.NoError(t, err)
	require.Len(t, keys.GetKeys(), 1, "one bootstrap key, whichever replica created it")

	_, err = replicas[0].CreateServer(ctx, docsSearch())
	require.NoError(t, err)
	got, err := replicas[1].GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search"})
	require.NoError(t, err)
	require.Equal(t, int64(1), got.GetServer().GetRevision())
	p, err := replicas[1].ServerPolicy(ctx, "docs-search")
	require.NoError(t, err)
	require.Equal(t, []string{"process_spawn", "external_api_call"}, p.Grants)

	principal, err := replicas[0].VerifyKey(ctx, auth.HashKey(adminKey))
	require.NoError(t, err)
	_, err = replicas[1].RevokeKey(ctx, &registryv1.RevokeKeyRequest{Id: principal.KeyID})
	require.NoError(t, err)
	_, err = replicas[0].VerifyKey(ctx, auth.HashKey(adminKey))
	require.ErrorIs(t, err, auth.ErrUnknownKey, "revoked on one replica, refused by the other at once")
}

// racingStore makes the store's first UpdateServer lose its transaction to another replica,
// which changes the registration's env between the read and the commit.
type racingStore struct {
	Store
	other *Service
	once  sync.Once
}

func (r *racingStore) UpdateServer(ctx context.Context, ref string, mutate func(*mcpserver.Registration) (*mcpserver.Registration, error), hook store.UpdateHook) (*mcpserver.Registration, error) {
	return r.Store.UpdateServer(ctx, ref, func(cur *mcpserver.Registration) (*mcpserver.Registration, error) {
		r.once.Do(func() {
			req := docsSearch()
			_, err := r.other.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: ref, Command: req.Command, Args: req.Args,
				Env: env("APP_TOKEN", "from-the-other-replica"), Grants: req.Grants})
			if err != nil {
				panic(err)
			}
		})
		return mutate(cur)
	}, hook)
}

// TestARetriedUpdateKeepsWhatTheMasksStandFor: an update that sends the env mask back keeps
// the stored value. When another replica changed that value first, the update runs again on
// the newer registration, and the mask then stands for the newer value, not the one the
// first attempt read.
func TestARetriedUpdateKeepsWhatTheMasksStandFor(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	replicas := etcdReplicas(t, cluster, 2)
	ctx := auth.SystemContext(t.Context(), "test")
	_, err := replicas[0].CreateServer(ctx, docsSearch())
	require.NoError(t, err)
	replicas[0].store = &racingStore{Store: replicas[0].store, other: replicas[1]}
	req := docsSearch()
	resp, err := replicas[0].UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "docs-search", Command: "mcp-server-filesystem", Args: req.Args,
		Env: env("APP_TOKEN", SecretMask), Grants: req.Grants})
	require.NoError(t, err)
	require.Equal(t, int64(3), resp.GetServer().GetRevision(), "after the other replica's update")
	resolved, err := replicas[1].ResolveRegistration(ctx, "docs-search")
	require.NoError(t, err)
	require.Equal(t, "from-the-other-replica", resolved.Env["APP_TOKEN"])

	_, err = replicas[0].UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "docs-search", Revision: 1, Command: "x"})
	testutil.RequireStatus(t, err, codes.Aborted)
}

// TestAdmissionOnEtcdAnswersFromTheMirror: a stream's admission (auth.Authorizer.Admit, which
// the server runs on the connection's reader, one stream at a time) admits a key the replica
// holds as valid without the round trip that confirms its mirror is current, and Authorize,
// which runs before the handler, still confirms it: with etcd gone, the admission of a held key
// answers and Authorize refuses as UNAVAILABLE. A key created on another replica a moment ago
// is admitted at once; one revoked there is refused by the next Authorize.
func TestAdmissionOnEtcdAnswersFromTheMirror(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	replicas := etcdReplicas(t, cluster, 2)
	ctx := auth.SystemContext(t.Context(), "test")
	require.NoError(t, replicas[0].EnsureBootstrapAdmin(ctx, adminKey))
	const method = "/ringfence.registry.v1.RegistryService/GetServer"
	withKey := func(key string) context.Context {
		return metadata.NewIncomingContext(t.Context(), metadata.Pairs(auth.MetadataKey, key))
	}
	authz := auth.NewAuthorizer(replicas[1], auth.Rules)

	created, err := replicas[0].CreateKey(ctx, &registryv1.CreateKeyRequest{Name: "ci", Role: "admin"})
	require.NoError(t, err)
	key := created.GetSecret()
	require.NoError(t, authz.Admit(withKey(key), method), "a key created on the other replica is admitted at once")
	_, err = authz.Authorize(withKey(key), method)
	require.NoError(t, err)

	_, err = replicas[0].RevokeKey(ctx, &registryv1.RevokeKeyRequest{Id: created.GetKey().GetId()})
	require.NoError(t, err)
	_, err = authz.Authorize(withKey(key), method)
	require.Equal(t, codes.Unauthenticated, status.Code(err), "revoked on the other replica: refused by the next Authorize")

	cluster.Kill(0)
	require.NoError(t, authz.Admit(withKey(adminKey), method), "a held key is admitted without asking etcd")
	short, cancel := context.WithTimeout(withKey(adminKey), time.Second)
	defer cancel()
	_, err = authz.Authorize(short, method)
	require.Error(t, err, "Authorize confirms the key is current, and etcd is gone")
}

// TestAStartOnAnotherPrefixThanTheMoveWarns: a data_dir whose registry.db was moved into etcd,
// started on a prefix (or cluster) that holds nothing of the registry, warns naming the prefix,
// the moved file and what to check, rather than serve an empty registry that refuses every key
// of before without a word; on the prefix that holds the registry, nothing is said.
func TestAStartOnAnotherPrefixThanTheMoveWarns(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "registry.db"+store.MovedSuffix), nil, 0o600))
	open := func(root string) string {
		box, err := secretbox.New(make([]byte, 32))
		require.NoError(t, err)
		var logs testutil.SyncBuffer
		svc, err := Open(Config{
			DBPath: filepath.Join(dir, "registry.db"), Etcd: cluster.Client(t, "registry"), EtcdRoot: root,
			Secrets: box, Roles: roles, AuditSink: testutil.NewAuditRecorder(),
			Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		})
		require.NoError(t, err)
		require.NoError(t, svc.EnsureBootstrapAdmin(auth.SystemContext(t.Context(), "test"), adminKey))
		require.NoError(t, svc.Close())
		return logs.String()
	}
	typo := cluster.Root()
	logs := open(typo)
	require.Contains(t, logs, "registry: etcd holds no registration, secret or API key under "+typo+"/registry/, yet registry.db.moved-to-etcd is left by a move of this data_dir's registry.db into etcd: check that store.etcd_endpoints and store.etcd_prefix name the cluster and prefix it was moved into")
	require.Contains(t, logs, "level=WARN")
	// The bootstrap key made there is a key: the next start on that prefix says nothing.
	require.NotContains(t, open(typo), "etcd holds no registration")
}

// TestAMoveUnderARotationSaysTheOldKeyCanGoOnlyOnceMoved: a registry.db sealed under the old
// key, moved while the key file holds the new key first and the old one second, is re-sealed
// on its way into etcd; the start's line that the other lines of the key file can go comes
// after the move's, and counts what the move re-sealed: before the move, the file still needs
// the old key.
func TestAMoveUnderARotationSaysTheOldKeyCanGoOnlyOnceMoved(t *testing.T) {
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	keyOld, keyNew := make([]byte, 32), make([]byte, 32)
	keyNew[0] = 1
	oldBox, err := secretbox.New(keyOld)
	require.NoError(t, err)
	db := filepath.Join(t.TempDir(), "registry.db")
	cfg := Config{DBPath: db, Secrets: oldBox, Roles: roles, AuditSink: testutil.NewAuditRecorder(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	svc, err := Open(cfg)
	require.NoError(t, err)
	_, err = svc.PutSecret(auth.SystemContext(t.Context(), "test"), &registryv1.PutSecretRequest{Name: "tok", Value: "canary-value"})
	require.NoError(t, err)
	require.NoError(t, svc.Close())

	cluster := etcdtest.Start(t, 1)
	var logs testutil.SyncBuffer
	cfg.Secrets, err = secretbox.NewKeys(keyNew, keyOld)
	require.NoError(t, err)
	cfg.Etcd, cfg.EtcdRoot, cfg.Logger = cluster.Client(t, "registry"), cluster.Root(), slog.New(slog.NewTextHandler(&logs, nil))
	svc, err = Open(cfg)
	require.NoError(t, err)
	require.NoError(t, svc.Close())
	out := logs.String()
	moved := strings.Index(out, "moved the registry's state kept in registry.db to etcd")
	canGo := strings.Index(out, "every sealed value opens with the first key")
	require.Positive(t, moved, out)
	require.Greater(t, canGo, moved, "the line that the old key can go comes after the move:\n%s", out)
	require.Equal(t, 1, strings.Count(out, "re-sealed under the first key"), out)
	require.Contains(t, out, "resealed=1", "the secret the move re-sealed is counted")
	require.NotContains(t, out, "canary-value")
}

// TestAMoveOfADamagedFileSkipsWhatTheRegistryNeverWrites: a registry that starts on etcd over
// a registry.db holding entries the registry never writes (a secret named with a NUL, a
// registration that does not decode) starts, with the rest moved; its log names each entry
// skipped, at warn, with the reason and the file that keeps it, and never a value.
func TestAMoveOfADamagedFileSkipsWhatTheRegistryNeverWrites(t *testing.T) {
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	box, err := secretbox.New(make([]byte, 32))
	require.NoError(t, err)
	db := filepath.Join(t.TempDir(), "registry.db")
	cfg := Config{DBPath: db, Secrets: box, Roles: roles, AuditSink: testutil.NewAuditRecorder(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	svc, err := Open(cfg)
	require.NoError(t, err)
	_, err = svc.PutSecret(auth.SystemContext(t.Context(), "test"), &registryv1.PutSecretRequest{Name: "tok", Value: "canary-value"})
	require.NoError(t, err)
	require.NoError(t, svc.Close())

	raw, err := bolt.Open(db, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, raw.Update(func(tx *bolt.Tx) error {
		sealed := tx.Bucket([]byte("secrets")).Get([]byte("tok"))
		if err := tx.Bucket([]byte("secrets")).Put([]byte("tok\x00copy"), bytes.Clone(sealed)); err != nil {
			return err
		}
		return tx.Bucket([]byte("servers")).Put([]byte("broken"), []byte(`{"ref":"broken","env":{"TOKEN":"canary-value"`))
	}))
	require.NoError(t, raw.Close())

	cluster := etcdtest.Start(t, 1)
	var logs testutil.SyncBuffer
	cfg.Etcd, cfg.EtcdRoot, cfg.Logger = cluster.Client(t, "registry"), cluster.Root(), slog.New(slog.NewTextHandler(&logs, nil))
	svc, err = Open(cfg)
	require.NoError(t, err, "the start goes on without the entries the registry never writes")
	v, err := svc.store.SecretValue(t.Context(), "tok")
	require.NoError(t, err)
	require.Equal(t, "canary-value", v)
	require.NoError(t, svc.Close())
	out := logs.String()
	require.Equal(t, 2, strings.Count(out, "level=WARN msg=\"registry: an entry of registry.db was not moved to etcd"), out)
	require.Contains(t, out, "it stays in registry.db.moved-to-etcd")
	require.Contains(t, out, `kind=secret name="\"tok\\x00copy\""`)
	require.Contains(t, out, `kind=server name="\"broken\"" reason="its value does not decode as a registration"`)
	require.Contains(t, out, "skipped=2")
	require.NotContains(t, out, "canary-value")
}
