package store

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/boltdb"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
)

// api is what the registry asks of a store (registry.Store), for the behaviours below.
type api interface {
	CreateServer(ctx context.Context, r *mcpserver.Registration, hook Hook) error
	GetServer(ctx context.Context, ref string) (*mcpserver.Registration, error)
	GetServerMasked(ctx context.Context, ref string) (*mcpserver.Registration, error)
	ServerView(ctx context.Context, ref string, build func(*mcpserver.Registration) any) (any, error)
	ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error)
	WarmTargets(ctx context.Context) ([]mcpserver.WarmTarget, error)
	ListServers(ctx context.Context, pageToken string, limit int) ([]*mcpserver.Registration, string, error)
	ClosestRef(ref string) string
	UpdateServer(ctx context.Context, ref string, mutate func(*mcpserver.Registration) (*mcpserver.Registration, error), hook UpdateHook) (*mcpserver.Registration, error)
	DeleteServer(ctx context.Context, ref string, hook Hook) error
	PutSecret(ctx context.Context, name, value string, hook Hook) (Secret, error)
	SecretValue(ctx context.Context, name string) (string, error)
	ListSecrets(ctx context.Context) ([]Secret, error)
	DeleteSecret(ctx context.Context, name string, hook Hook) error
	CreateKey(ctx context.Context, k Key, hook Hook) error
	KeyByHash(ctx context.Context, hash string) (Key, bool, error)
	KeyByID(ctx context.Context, id string) (Key, bool, error)
	ListKeys(ctx context.Context) ([]Key, error)
	RevokeKey(ctx context.Context, id string, hook Hook) (Key, error)
	Spool() *audit.Spool
	Close() error
}

var (
	_ api = (*Bolt)(nil)
	_ api = (*Etcd)(nil)
)

func testBox(t *testing.T) *secretbox.Box {
	box, err := secretbox.New(make([]byte, 32))
	require.NoError(t, err)
	return box
}

func spoolConfig(t *testing.T, sink audit.Sink) SpoolConfig {
	return SpoolConfig{Sink: sink, Producer: "registry", Logger: slog.New(slog.DiscardHandler),
		QuarantinePath: filepath.Join(t.TempDir(), "quarantine.jsonl")}
}

func openBolt(t *testing.T, path string, box *secretbox.Box) *Bolt {
	t.Helper()
	s, err := OpenBolt(path, box, spoolConfig(t, testutil.NewAuditRecorder()))
	require.NoError(t, err)
	return s
}

// backend is one implementation under test: open gives a fresh store (a second call on the
// same backend gives another replica of it, for etcd) and its sink; raw is every byte it
// keeps at rest.
type backend struct {
	name string
	open func(t *testing.T) (api, *testutil.AuditRecorder)
	raw  func(t *testing.T) string
}

// backends returns bbolt and etcd, each over fresh storage. Tests that share one etcd cluster
// call it with that cluster.
func backends(t *testing.T, cluster *etcdtest.Cluster) []backend {
	path := filepath.Join(t.TempDir(), "registry.db")
	root := cluster.Root()
	return []backend{
		{
			name: "bbolt",
			open: func(t *testing.T) (api, *testutil.AuditRecorder) {
				sink := testutil.NewAuditRecorder()
				s, err := OpenBolt(path, testBox(t), spoolConfig(t, sink))
				require.NoError(t, err)
				t.Cleanup(func() { _ = s.Close() })
				return s, sink
			},
			raw: func(t *testing.T) string {
				b, err := os.ReadFile(path)
				require.NoError(t, err)
				return string(b)
			},
		},
		{
			name: "etcd",
			open: func(t *testing.T) (api, *testutil.AuditRecorder) {
				sink := testutil.NewAuditRecorder()
				s, err := OpenEtcd(t.Context(), EtcdConfig{Client: cluster.Client(t, "registry"), Root: root, Box: testBox(t)}, spoolConfig(t, sink))
				require.NoError(t, err)
				t.Cleanup(func() { _ = s.Close() })
				return s, sink
			},
			raw: func(t *testing.T) string {
				resp, err := cluster.Client(t, "registry").Get(t.Context(), root+"/", clientv3.WithPrefix())
				require.NoError(t, err)
				var sb strings.Builder
				for _, kv := range resp.Kvs {
					sb.Write(kv.Key)
					sb.Write(kv.Value)
				}
				return sb.String()
			},
		},
	}
}

// behaviours is the one table every back end passes.
var behaviours = map[string]func(t *testing.T, b backend){
	"ServersLifeCycle":         testServersLifeCycle,
	"SecretsStaySealedAtRest":  testSecretsStaySealedAtRest,
	"KeysAreUniqueAndRevoke":   testKeysAreUniqueAndRevoke,
	"HooksCommitWithTheChange": testHooksCommitWithTheChange,
	"WarmTargets":              testWarmTargets,
	"ListingOpensNoSeal":       testListingOpensNoSeal,
}

// TestBehaviours runs the table against bbolt and against a three-member etcd cluster.
func TestBehaviours(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	for name, f := range behaviours {
		t.Run(name, func(t *testing.T) {
			for _, b := range backends(t, cluster) {
				t.Run(b.name, func(t *testing.T) { f(t, b) })
			}
		})
	}
}

func docs() *mcpserver.Registration {
	return &mcpserver.Registration{Ref: "docs", Transport: "stdio", Command: "x", Grants: []string{"network_egress"}}
}

func withGrant(g string) func(*mcpserver.Registration) (*mcpserver.Registration, error) {
	return func(cur *mcpserver.Registration) (*mcpserver.Registration, error) {
		next := *cur
		next.Grants = append([]string{g}, cur.Grants...)
		return &next, nil
	}
}

func testServersLifeCycle(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	require.NoError(t, s.CreateServer(ctx, docs(), nil))
	require.ErrorIs(t, s.CreateServer(ctx, docs(), nil), ErrExists)
	for _, ref := range []string{"tickets", "search", "wiki"} {
		r := docs()
		r.Ref = ref
		require.NoError(t, s.CreateServer(ctx, r, nil))
	}
	got, err := s.GetServer(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, int64(1), got.Revision)
	_, err = s.GetServer(ctx, "nope")
	require.ErrorIs(t, err, ErrNotFound)
	require.Equal(t, "docs", s.ClosestRef("dosc"))

	updated, err := s.UpdateServer(ctx, "docs", withGrant("process_spawn"), nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), updated.Revision)
	p, err := s.ServerPolicy(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, []string{"process_spawn", "network_egress"}, p.Grants)
	require.Equal(t, int64(2), p.Revision)
	view, err := s.ServerView(ctx, "docs", func(r *mcpserver.Registration) any { return r.Revision })
	require.NoError(t, err)
	require.Equal(t, int64(2), view)

	refuse := errors.New("refused")
	_, err = s.UpdateServer(ctx, "docs", func(*mcpserver.Registration) (*mcpserver.Registration, error) { return nil, refuse }, nil)
	require.ErrorIs(t, err, refuse)
	_, err = s.UpdateServer(ctx, "nope", withGrant("x"), nil)
	require.ErrorIs(t, err, ErrNotFound)
	p, err = s.ServerPolicy(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, int64(2), p.Revision, "a refused update writes nothing")

	page, next, err := s.ListServers(ctx, "", 3)
	require.NoError(t, err)
	require.Equal(t, []string{"docs", "search", "tickets"}, refs(page))
	page, next, err = s.ListServers(ctx, next, 3)
	require.NoError(t, err)
	require.Equal(t, []string{"wiki"}, refs(page))
	require.Empty(t, next)
	_, _, err = s.ListServers(ctx, "bogus", 3)
	require.ErrorIs(t, err, ErrBadPageToken)

	require.NoError(t, s.DeleteServer(ctx, "docs", nil))
	require.ErrorIs(t, s.DeleteServer(ctx, "docs", nil), ErrNotFound)
	_, err = s.ServerPolicy(ctx, "docs")
	require.ErrorIs(t, err, ErrNotFound)
}

func refs(rs []*mcpserver.Registration) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Ref
	}
	return out
}

const canary = "canary-secret-e41b"

// testSecretsStaySealedAtRest: env values, a URL's credential and named secrets are readable
// through the store and appear nowhere in what it keeps at rest (every key and value of etcd,
// the audit outbox included; the whole bbolt file).
func testSecretsStaySealedAtRest(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	r := docs()
	r.Env = map[string]string{"APP_TOKEN": canary + "-env"}
	require.NoError(t, s.CreateServer(ctx, r, nil))
	remote := &mcpserver.Registration{Ref: "tickets", Transport: mcpserver.TransportStreamableHTTP, URL: "https://mcp.example.com/mcp?api_key=" + canary + "-url"}
	require.NoError(t, s.CreateServer(ctx, remote, nil))
	_, err := s.PutSecret(ctx, "tickets-token", canary+"-secret", nil)
	require.NoError(t, err)

	got, err := s.GetServer(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, canary+"-env", got.Env["APP_TOKEN"])
	masked, err := s.GetServerMasked(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, "https://mcp.example.com/mcp?api_key=********", masked.URL)
	v, err := s.SecretValue(ctx, "tickets-token")
	require.NoError(t, err)
	require.Equal(t, canary+"-secret", v)
	secrets, err := s.ListSecrets(ctx)
	require.NoError(t, err)
	require.Len(t, secrets, 1)
	require.Equal(t, "tickets-token", secrets[0].Name)

	raw := b.raw(t)
	require.Contains(t, raw, "APP_TOKEN", "env keys stay readable")
	require.NotContains(t, raw, canary, "no secret is kept in clear")

	require.NoError(t, s.DeleteSecret(ctx, "tickets-token", nil))
	require.ErrorIs(t, s.DeleteSecret(ctx, "tickets-token", nil), ErrNotFound)
	_, err = s.SecretValue(ctx, "tickets-token")
	require.ErrorIs(t, err, ErrNotFound)
}

func testKeysAreUniqueAndRevoke(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	now := time.Now().UTC()
	first := Key{ID: "key_01", Name: "ops", Role: "operator", Hash: "h1", CreateTime: now}
	second := Key{ID: "key_02", Name: "ci", Role: "runner", Tenant: "acme", Hash: "h2", CreateTime: now.Add(time.Second)}
	require.NoError(t, s.CreateKey(ctx, second, nil))
	require.NoError(t, s.CreateKey(ctx, first, nil))
	require.ErrorIs(t, s.CreateKey(ctx, Key{ID: "key_03", Hash: "h1"}, nil), ErrExists, "a hash is registered once")
	require.ErrorIs(t, s.CreateKey(ctx, Key{ID: "key_01", Hash: "h3"}, nil), ErrExists, "an id is registered once")

	k, ok, err := s.KeyByHash(ctx, "h2")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "acme", k.Tenant)
	_, ok, err = s.KeyByHash(ctx, "h3")
	require.NoError(t, err)
	require.False(t, ok)
	keys, err := s.ListKeys(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"key_01", "key_02"}, []string{keys[0].ID, keys[1].ID}, "by creation time")

	revokedKey, err := s.RevokeKey(ctx, "key_02", nil)
	require.NoError(t, err)
	require.True(t, revokedKey.Revoked)
	k, ok, err = s.KeyByHash(ctx, "h2")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, k.Revoked, "refused from the next read on")
	k, _, err = s.KeyByID(ctx, "key_02")
	require.NoError(t, err)
	require.True(t, k.Revoked)
	_, err = s.RevokeKey(ctx, "key_99", nil)
	require.ErrorIs(t, err, ErrNotFound)
}

// testHooksCommitWithTheChange: every write's hook records in the write's transaction: the
// records reach the audit log, and a hook's error leaves neither the change nor a record.
func testHooksCommitWithTheChange(t *testing.T, b backend) {
	s, sink := b.open(t)
	ctx := t.Context()
	record := func(action string) Hook {
		return func(rec audit.Recorder) error {
			return rec.Record(audit.NewAdminRecord("registry", "", audit.AdminEvent{Action: action, ResourceType: "mcp_server", ResourceID: "docs", ActorRole: audit.ActorRoleSystem}))
		}
	}
	failing := func(audit.Recorder) error { return errors.New("outbox full") }
	require.NoError(t, s.CreateServer(ctx, docs(), record("create")))
	_, err := s.UpdateServer(ctx, "docs", withGrant("g"), func(rec audit.Recorder, before, after *mcpserver.Registration) error {
		require.Equal(t, before.Revision+1, after.Revision)
		return record("update")(rec)
	})
	require.NoError(t, err)
	_, err = s.PutSecret(ctx, "tok", "v", record("put"))
	require.NoError(t, err)
	require.NoError(t, s.CreateKey(ctx, Key{ID: "key_1", Hash: "h"}, record("key_create")))
	_, err = s.RevokeKey(ctx, "key_1", record("key_revoke"))
	require.NoError(t, err)
	require.NoError(t, s.DeleteSecret(ctx, "tok", record("delete_secret")))

	r := docs()
	r.Ref = "other"
	require.ErrorContains(t, s.CreateServer(ctx, r, failing), "outbox full")
	_, err = s.GetServer(ctx, "other")
	require.ErrorIs(t, err, ErrNotFound, "no change without its record")
	_, err = s.UpdateServer(ctx, "docs", withGrant("h"), func(rec audit.Recorder, _, _ *mcpserver.Registration) error { return failing(rec) })
	require.ErrorContains(t, err, "outbox full")
	p, err := s.ServerPolicy(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, int64(2), p.Revision)
	require.ErrorContains(t, s.DeleteServer(ctx, "docs", failing), "outbox full")
	require.NoError(t, s.DeleteServer(ctx, "docs", record("delete")))

	fwd := s.Spool().StartForwarding()
	t.Cleanup(func() { fwd.Stop(time.Second) })
	require.NoError(t, s.Spool().Flush(ctx))
	var actions []string
	for _, rec := range sink.Records() {
		actions = append(actions, rec.Admin.Action)
	}
	require.Equal(t, []string{"create", "update", "put", "key_create", "key_revoke", "delete_secret", "delete"}, actions)
}

func testWarmTargets(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	for i, ref := range []string{"b", "a", "c"} {
		r := docs()
		r.Ref, r.Prewarm, r.Grants = ref, i, []string{"process_spawn", "external_api_call"}
		require.NoError(t, s.CreateServer(ctx, r, nil))
	}
	// Stored before the registry refused prewarm on grants that miss the floor, which deny
	// every call to it: no warm container of it would ever be taken, so none is asked for.
	for ref, grants := range map[string][]string{"d": nil, "e": {"process_spawn"}} {
		r := docs()
		r.Ref, r.Prewarm, r.Grants = ref, 1, grants
		require.NoError(t, s.CreateServer(ctx, r, nil))
	}
	w, err := s.WarmTargets(ctx)
	require.NoError(t, err)
	require.Equal(t, []mcpserver.WarmTarget{{Ref: "a", Prewarm: 1, Revision: 1}, {Ref: "c", Prewarm: 2, Revision: 1}}, w)
	_, err = s.UpdateServer(ctx, "a", func(cur *mcpserver.Registration) (*mcpserver.Registration, error) {
		next := *cur
		next.Prewarm = 0
		return &next, nil
	}, nil)
	require.NoError(t, err)
	w, err = s.WarmTargets(ctx)
	require.NoError(t, err)
	require.Equal(t, []mcpserver.WarmTarget{{Ref: "c", Prewarm: 2, Revision: 1}}, w)
}

// testListingOpensNoSeal: a listing and a masked read show the masked URL and env keys
// without opening a seal, so they work (and cost no decryption) even for values sealed under
// another key; a full read cannot open them.
func testListingOpensNoSeal(t *testing.T, b backend) {
	s, _ := b.open(t)
	ctx := t.Context()
	other := make([]byte, 32)
	other[0] = 1
	wrong, err := secretbox.New(other)
	require.NoError(t, err)
	// Sealed under another key, as a value restored from another deployment would be.
	st, err := sealServer(wrong, &mcpserver.Registration{Ref: "docs", Transport: "stdio", Command: "x", Env: map[string]string{"APP_TOKEN": canary}})
	require.NoError(t, err)
	require.NoError(t, s.CreateServer(ctx, &mcpserver.Registration{Ref: "docs", Transport: "stdio", Command: "x", Env: map[string]string{"APP_TOKEN": "v"}}, nil))
	_, err = s.UpdateServer(ctx, "docs", func(cur *mcpserver.Registration) (*mcpserver.Registration, error) { return cur, nil }, nil)
	require.NoError(t, err)
	forceStored(t, s, st)

	list, _, err := s.ListServers(ctx, "", 10)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"APP_TOKEN": ""}, list[0].Env, "keys without values")
	_, err = s.GetServer(ctx, "docs")
	require.ErrorIs(t, err, secretbox.ErrOpen)
}

// forceStored writes st in place of the stored registration, below the store's API.
func forceStored(t *testing.T, s api, st *storedServer) {
	t.Helper()
	val, err := json.Marshal(st)
	require.NoError(t, err)
	switch s := s.(type) {
	case *Bolt:
		require.NoError(t, s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(serversBucket).Put([]byte(st.Ref), val) }))
		s.forgetServer(st.Ref)
	case *Etcd:
		_, err := s.cli.Put(t.Context(), s.space.Key(etcdServers, st.Ref), string(val))
		require.NoError(t, err)
	}
}

// TestCacheFollowsTheFileWhenWritesFinishOutOfOrder: writes commit in order but return
// in any order. Here the first update commits and then stalls (in a commit handler, after
// bbolt has released the file) while a second update commits and returns; reads must then
// answer the second, also after the first returns. A cache updated after each commit
// ended on the first: the pool enforced grants the stored registration no longer had, and
// an update carrying the read revision was refused forever.
func TestCacheFollowsTheFileWhenWritesFinishOutOfOrder(t *testing.T) {
	s := openBolt(t, filepath.Join(t.TempDir(), "registry.db"), testBox(t))
	t.Cleanup(func() { _ = s.Close() })
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
		_, err := s.UpdateServer(ctx, "docs", grant("first"), func(rec audit.Recorder, _, _ *mcpserver.Registration) error {
			rec.(boltRecorder).tx.OnCommit(func() {
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
	box := testBox(t)
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

	s := openBolt(t, path, box)
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
	s = openBolt(t, path, box)
	got, err = s.GetServer(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, remote, got.URL)
	require.NoError(t, s.Close())
}

// TestEtcdReplicasSeeEachOthersWrites: two replicas of the store on one cluster; whatever one
// writes, the other's next read sees, with no wait in between: registrations, policies,
// secrets, a revoked key.
func TestEtcdReplicasSeeEachOthersWrites(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	b := backends(t, cluster)[1]
	a, _ := b.open(t)
	other, _ := b.open(t)
	ctx := t.Context()
	require.NoError(t, a.CreateKey(ctx, Key{ID: "key_1", Hash: "h1"}, nil))
	for i := range 20 {
		if i == 0 {
			require.NoError(t, a.CreateServer(ctx, docs(), nil))
		} else {
			_, err := a.UpdateServer(ctx, "docs", withGrant(fmt.Sprintf("g%d", i)), nil)
			require.NoError(t, err)
		}
		p, err := other.ServerPolicy(ctx, "docs")
		require.NoError(t, err)
		require.Equal(t, int64(i+1), p.Revision, "the other replica's next read sees the write")
		_, err = other.PutSecret(ctx, "tok", fmt.Sprint(i), nil)
		require.NoError(t, err)
		v, err := a.SecretValue(ctx, "tok")
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(i), v)
	}
	k, ok, err := other.KeyByHash(ctx, "h1")
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, k.Revoked)
	_, err = a.RevokeKey(ctx, "key_1", nil)
	require.NoError(t, err)
	k, _, err = other.KeyByHash(ctx, "h1")
	require.NoError(t, err)
	require.True(t, k.Revoked, "a key revoked on one replica is refused by the other's next check")
	require.NoError(t, other.DeleteServer(ctx, "docs", nil))
	_, err = a.GetServer(ctx, "docs")
	require.ErrorIs(t, err, ErrNotFound)
}

// TestEtcdConcurrentUpdatesLoseNothing: replicas updating one registration at once each
// commit on the revision they read (a transaction comparing it), so every update lands, each
// revision is written once, and none is lost.
func TestEtcdConcurrentUpdatesLoseNothing(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	b := backends(t, cluster)[1]
	replicas := []api{}
	for range 2 {
		s, _ := b.open(t)
		replicas = append(replicas, s)
	}
	ctx := t.Context()
	require.NoError(t, replicas[0].CreateServer(ctx, &mcpserver.Registration{Ref: "docs", Transport: "stdio", Command: "x"}, nil))
	var mu sync.Mutex
	revisions := map[int64]string{}
	var wg sync.WaitGroup
	for w := range 8 {
		s := replicas[w%2]
		wg.Go(func() {
			for i := range 5 {
				g := fmt.Sprintf("w%d-%d", w, i)
				r, err := s.UpdateServer(ctx, "docs", withGrant(g), nil)
				require.NoError(t, err)
				mu.Lock()
				require.Empty(t, revisions[r.Revision], "revision %d written twice", r.Revision)
				revisions[r.Revision] = g
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	p, err := replicas[1].ServerPolicy(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, int64(41), p.Revision)
	require.Len(t, p.Grants, 40, "no update was lost")
}

// TestEtcdRefusesAnotherSecretsKey: a replica whose secrets key differs from the one the data
// was sealed with refuses to start, rather than write secrets the others cannot open.
func TestEtcdRefusesAnotherSecretsKey(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t, "registry")
	root := cluster.Root()
	s, err := OpenEtcd(t.Context(), EtcdConfig{Client: cli, Root: root, Box: testBox(t)}, spoolConfig(t, testutil.NewAuditRecorder()))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	other := make([]byte, 32)
	other[0] = 7
	box, err := secretbox.New(other)
	require.NoError(t, err)
	_, err = OpenEtcd(t.Context(), EtcdConfig{Client: cli, Root: root, Box: box}, spoolConfig(t, testutil.NewAuditRecorder()))
	require.ErrorContains(t, err, "every registry replica needs the same key file")

	// One host whose key file lost the old line too soon after a rotation is told the way
	// back, naming the file.
	keyFile := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(keyFile, []byte(hex.EncodeToString(other)+"\n"), 0o600))
	fromFile, err := secretbox.LoadOrCreate(keyFile)
	require.NoError(t, err)
	_, err = OpenEtcd(t.Context(), EtcdConfig{Client: cli, Root: root, Box: fromFile}, spoolConfig(t, testutil.NewAuditRecorder()))
	require.ErrorContains(t, err, "this replica's secrets key ("+keyFile+", RINGFENCE_SECRETS_KEY_FILE)")
	require.ErrorContains(t, err, "After `secrets-key rotate`, the old key's line may have gone before a start re-sealed under the new one: put that line back after the first")
}

// TestBoltRefusesAnotherSecretsKey: a registry file opened with a key that does not open what
// it holds sealed (a data directory restored without its secrets.key, which then gets a new
// one) refuses to open, naming the key file, instead of failing every secret at its first
// use; a file with nothing sealed takes any key.
func TestBoltRefusesAnotherSecretsKey(t *testing.T) {
	other := make([]byte, 32)
	other[0] = 7
	wrong, err := secretbox.New(other)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		put  func(*Bolt) error
	}{
		{"secret", func(s *Bolt) error {
			_, err := s.PutSecret(t.Context(), "tickets-token", canary, nil)
			return err
		}},
		{"env", func(s *Bolt) error {
			return s.CreateServer(t.Context(), &mcpserver.Registration{Ref: "docs", Transport: "stdio", Command: "x", Env: map[string]string{"APP_TOKEN": canary}}, nil)
		}},
		{"url", func(s *Bolt) error {
			require.NoError(t, s.CreateServer(t.Context(), &mcpserver.Registration{Ref: "a", Transport: "stdio", Command: "x"}, nil))
			return s.CreateServer(t.Context(), &mcpserver.Registration{Ref: "b", Transport: "streamable_http", URL: "https://mcp.example/?k=" + canary}, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "registry.db")
			s := openBolt(t, path, testBox(t))
			require.NoError(t, tc.put(s))
			require.NoError(t, s.Close())
			_, err := OpenBolt(path, wrong, spoolConfig(t, testutil.NewAuditRecorder()))
			require.ErrorContains(t, err, "the secrets key does not open what "+path+" holds sealed")
			require.ErrorContains(t, err, "RINGFENCE_SECRETS_KEY_FILE")
			require.NotContains(t, err.Error(), canary)
			require.NoError(t, openBolt(t, path, testBox(t)).Close(), "the right key opens it")
		})
	}
	// A key file whose old line went before a start re-sealed under the new one (after a
	// rotation) is named, with the way back.
	t.Run("rotated too soon", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "registry.db")
		s := openBolt(t, path, testBox(t))
		_, err := s.PutSecret(t.Context(), "tickets-token", canary, nil)
		require.NoError(t, err)
		require.NoError(t, s.Close())
		keyFile := filepath.Join(t.TempDir(), "secrets.key")
		require.NoError(t, os.WriteFile(keyFile, []byte(hex.EncodeToString(other)+"\n"), 0o600))
		newOnly, err := secretbox.LoadOrCreate(keyFile)
		require.NoError(t, err)
		_, err = OpenBolt(path, newOnly, spoolConfig(t, testutil.NewAuditRecorder()))
		require.ErrorContains(t, err, "After `secrets-key rotate`, the key file, "+keyFile+", may have lost the old key's line before a start re-sealed under the new one: put that line back after the first")
	})
	path := filepath.Join(t.TempDir(), "registry.db")
	s := openBolt(t, path, testBox(t))
	require.NoError(t, s.CreateServer(t.Context(), &mcpserver.Registration{Ref: "plain", Transport: "stdio", Command: "x"}, nil))
	require.NoError(t, s.Close())
	require.NoError(t, openBolt(t, path, wrong).Close(), "nothing sealed: any key")
}
