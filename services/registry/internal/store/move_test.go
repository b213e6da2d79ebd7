package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
)

// boltToMove writes a registry.db as a registry on bbolt leaves it: a remote server with a
// sealed URL and a header naming a secret, a stdio server with env, secrets, keys (one
// revoked), and the audit records of those writes still in the outbox (nothing forwarded).
func boltToMove(t *testing.T, box *secretbox.Box) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "registry.db")
	s := openBolt(t, path, box)
	ctx := t.Context()
	record := func(action string) Hook {
		return func(rec audit.Recorder) error {
			return rec.Record(audit.NewAdminRecord("registry", "", audit.AdminEvent{Action: action, ResourceType: "mcp_server", ResourceID: action, ActorRole: audit.ActorRoleSystem}))
		}
	}
	remote := &mcpserver.Registration{Ref: "tickets", Transport: mcpserver.TransportStreamableHTTP,
		URL: "https://mcp.example.com/mcp?api_key=" + canary + "-url", Headers: map[string]string{"Authorization": "tickets-token"}, Grants: []string{"network"}}
	require.NoError(t, s.CreateServer(ctx, remote, record("create_tickets")))
	local := docs()
	local.Env = map[string]string{"APP_TOKEN": canary + "-env", "MODE": "ro"}
	require.NoError(t, s.CreateServer(ctx, local, record("create_docs")))
	_, err := s.UpdateServer(ctx, "docs", withGrant("process_spawn"), nil)
	require.NoError(t, err)
	for i, name := range []string{"tickets-token", "shared"} {
		_, err = s.PutSecret(ctx, name, canary+"-"+name, record(fmt.Sprintf("put_%d", i+1)))
		require.NoError(t, err)
	}
	require.NoError(t, s.CreateKey(ctx, Key{ID: "key_admin", Name: "admin", Role: "admin", Hash: "hash-admin", CreateTime: time.Now().UTC()}, record("key_admin")))
	require.NoError(t, s.CreateKey(ctx, Key{ID: "key_old", Name: "old", Role: "viewer", Hash: "hash-old", CreateTime: time.Now().UTC()}, nil))
	_, err = s.RevokeKey(ctx, "key_old", nil)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	return path
}

func openEtcdReplica(t *testing.T, cluster *etcdtest.Cluster, root string, box *secretbox.Box, sink audit.Sink) *Etcd {
	t.Helper()
	s, err := OpenEtcd(t.Context(), EtcdConfig{Client: cluster.Client(t, "registry"), Root: root, Box: box}, spoolConfig(t, sink))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestMoveBoltToEtcd: a registry.db's servers, secrets, keys and waiting audit records move to
// etcd as stored (sealed values open with the same key), over what etcd held already (which
// stands), and the file is renamed.
func TestMoveBoltToEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	box := testBox(t)
	path := boltToMove(t, box)

	// etcd already holds a server and a secret under names the file has, written on etcd
	// since: they stand.
	first := openEtcdReplica(t, cluster, root, box, testutil.NewAuditRecorder())
	ctx := t.Context()
	newer := docs()
	newer.Description = "registered on etcd"
	require.NoError(t, first.CreateServer(ctx, newer, nil))
	_, err := first.PutSecret(ctx, "shared", "etcd-value", nil)
	require.NoError(t, err)

	local, err := ReadBolt(path, box, "secrets.key")
	require.NoError(t, err)
	m, err := first.MoveBolt(ctx, local)
	require.NoError(t, err)
	require.Equal(t, Moved{ServersCopied: 1, ServersInEtcd: 1, SecretsCopied: 1, SecretsInEtcd: 1, KeysCopied: 2, AuditRecords: 5, RenamedTo: path + MovedSuffix}, m)
	require.NoFileExists(t, path)
	require.FileExists(t, path+MovedSuffix)

	// Another replica reads everything back.
	sink := testutil.NewAuditRecorder()
	s := openEtcdReplica(t, cluster, root, box, sink)
	tickets, err := s.GetServer(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, "https://mcp.example.com/mcp?api_key="+canary+"-url", tickets.URL, "the sealed URL opens")
	require.Equal(t, map[string]string{"Authorization": "tickets-token"}, tickets.Headers)
	require.Equal(t, int64(1), tickets.Revision)
	masked, err := s.GetServerMasked(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, "https://mcp.example.com/mcp?api_key=********", masked.URL)
	kept, err := s.GetServer(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, "registered on etcd", kept.Description, "the server etcd held stands")
	require.Empty(t, kept.Env)
	v, err := s.SecretValue(ctx, "tickets-token")
	require.NoError(t, err)
	require.Equal(t, canary+"-tickets-token", v)
	v, err = s.SecretValue(ctx, "shared")
	require.NoError(t, err)
	require.Equal(t, "etcd-value", v, "the secret etcd held stands")
	k, ok, err := s.KeyByHash(ctx, "hash-admin")
	require.NoError(t, err)
	require.True(t, ok, "the key authenticates by its hash")
	require.Equal(t, "key_admin", k.ID)
	require.False(t, k.Revoked)
	k, ok, err = s.KeyByHash(ctx, "hash-old")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, k.Revoked, "a revoked key stays revoked")
	require.ErrorIs(t, s.CreateKey(ctx, Key{ID: "key_other", Hash: "hash-admin"}, nil), ErrExists, "the hash is registered")

	// The records waiting in the file's outbox reach the audit log, in their order.
	fwd := s.Spool().StartForwarding()
	t.Cleanup(func() { fwd.Stop(time.Second) })
	require.NoError(t, s.Spool().Flush(ctx))
	var actions []string
	for _, rec := range sink.Records() {
		actions = append(actions, rec.Admin.Action)
	}
	require.Equal(t, []string{"create_tickets", "create_docs", "put_1", "put_2", "key_admin"}, actions)

	// A copy of the file put back (a start that stopped before its rename leaves it so)
	// copies nothing again, nor sends its audit records again (etcd marks its outbox moved),
	// and the file of the first move is kept beside it.
	raw, err := os.ReadFile(path + MovedSuffix)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	local, err = ReadBolt(path, box, "secrets.key")
	require.NoError(t, err)
	m, err = s.MoveBolt(ctx, local)
	require.NoError(t, err)
	require.Regexp(t, `^`+regexp.QuoteMeta(path+MovedSuffix)+`-\d{8}T`, m.RenamedTo)
	require.Equal(t, Moved{ServersInEtcd: 2, SecretsInEtcd: 2, KeysInEtcd: 2, RenamedTo: m.RenamedTo}, m)
	require.FileExists(t, path+MovedSuffix)
	require.FileExists(t, m.RenamedTo)
	require.NoFileExists(t, path)
}

// TestMoveBoltStoppedInTheMiddle: a move that stops after some items leaves the file in place;
// the next one copies the rest, finding the first in etcd, and every item is there once.
func TestMoveBoltStoppedInTheMiddle(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	box := testBox(t)
	path := boltToMove(t, box)
	s := openEtcdReplica(t, cluster, root, box, testutil.NewAuditRecorder())
	ctx := t.Context()

	steps := 0
	moveStep = func() error {
		if steps++; steps == 3 {
			return errors.New("crash")
		}
		return nil
	}
	t.Cleanup(func() { moveStep = nil })
	local, err := ReadBolt(path, box, "secrets.key")
	require.NoError(t, err)
	_, err = s.MoveBolt(ctx, local)
	require.ErrorContains(t, err, "the file stays, and the next start copies again")
	require.FileExists(t, path)
	require.NoFileExists(t, path+MovedSuffix)

	moveStep = nil
	local, err = ReadBolt(path, box, "secrets.key")
	require.NoError(t, err)
	m, err := s.MoveBolt(ctx, local)
	require.NoError(t, err)
	require.Equal(t, Moved{ServersInEtcd: 2, SecretsInEtcd: 1, SecretsCopied: 1, KeysCopied: 2, AuditRecords: 5, RenamedTo: path + MovedSuffix}, m)
	require.FileExists(t, path+MovedSuffix)
	servers, _, err := s.ListServers(ctx, "", 10)
	require.NoError(t, err)
	require.Equal(t, []string{"docs", "tickets"}, refs(servers))
	keys, err := s.ListKeys(ctx)
	require.NoError(t, err)
	require.Len(t, keys, 2)
	d, err := s.GetServer(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, canary+"-env", d.Env["APP_TOKEN"])
	require.Equal(t, int64(2), d.Revision)
}

// TestMoveBoltRefusesAnotherSecretsKey: a registry.db sealed with another key than this
// host's is not read into etcd: nothing is copied, the file stays, and the error names the
// file, the key file and the fix.
func TestMoveBoltRefusesAnotherSecretsKey(t *testing.T) {
	path := boltToMove(t, testBox(t))
	other, err := secretbox.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	_, err = ReadBolt(path, other, "/etc/ringfence/secrets.key")
	require.ErrorContains(t, err, path+" was not moved to etcd: 4 of its sealed values")
	require.ErrorContains(t, err, "do not open with this host's secrets key (/etc/ringfence/secrets.key)")
	require.ErrorContains(t, err, "Start with the key file registry.db was sealed with")
	require.FileExists(t, path)
}

// TestMoveBoltResealsUnderTheFirstKey: a registry.db sealed under key A, moved by a registry
// whose key file holds a new key B first and A after it, brings its values into etcd sealed
// under B: a replica with B alone opens every one, so A's line can go once the start's log
// says so.
func TestMoveBoltResealsUnderTheFirstKey(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	keyA, keyB := []byte("0123456789abcdef0123456789abcdef"), []byte("fedcba9876543210fedcba9876543210")
	boxA, err := secretbox.New(keyA)
	require.NoError(t, err)
	path := boltToMove(t, boxA)
	rotated, err := secretbox.NewKeys(keyB, keyA)
	require.NoError(t, err)

	local, err := ReadBolt(path, rotated, "secrets.key")
	require.NoError(t, err)
	ctx := t.Context()
	_, err = openEtcdReplica(t, cluster, root, rotated, testutil.NewAuditRecorder()).MoveBolt(ctx, local)
	require.NoError(t, err)

	boxB, err := secretbox.New(keyB)
	require.NoError(t, err)
	s := openEtcdReplica(t, cluster, root, boxB, testutil.NewAuditRecorder())
	tickets, err := s.GetServer(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, "https://mcp.example.com/mcp?api_key="+canary+"-url", tickets.URL)
	docs, err := s.GetServer(ctx, "docs")
	require.NoError(t, err)
	require.Equal(t, canary+"-env", docs.Env["APP_TOKEN"])
	for _, name := range []string{"tickets-token", "shared"} {
		v, err := s.SecretValue(ctx, name)
		require.NoError(t, err)
		require.Equal(t, canary+"-"+name, v)
	}
}

// TestMoveBoltRunAgainAfterItsImportBringsTheDropsOnce: a move that stopped after it brought the
// file's audit outbox into etcd (before its rename: a crash, a failed rename) and runs again
// brings neither the outbox's dropped count nor its records a second time: etcd holds the count
// the file held, once, and each record once; the second run says it brought none.
func TestMoveBoltRunAgainAfterItsImportBringsTheDropsOnce(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	box := testBox(t)

	// A registry.db whose outbox held 2 records and dropped 3 (ContinueAndAlarm, full).
	path := filepath.Join(t.TempDir(), "registry.db")
	cfg := spoolConfig(t, testutil.NewAuditRecorder())
	cfg.MaxPending, cfg.OnFull = 2, audit.ContinueAndAlarm
	b, err := OpenBolt(path, box, cfg)
	require.NoError(t, err)
	for i := range 5 {
		name := fmt.Sprintf("secret-%d", i)
		_, err := b.PutSecret(t.Context(), name, canary, func(rec audit.Recorder) error {
			return rec.Record(audit.NewAdminRecord("registry", "", audit.AdminEvent{Action: "put", ResourceType: "secret", ResourceID: name, ActorRole: audit.ActorRoleSystem}))
		})
		require.NoError(t, err)
	}
	require.NoError(t, b.Close())

	s := openEtcdReplica(t, cluster, root, box, testutil.NewAuditRecorder())
	ctx := t.Context()
	moveRenaming = func() error { return errors.New("crash") }
	t.Cleanup(func() { moveRenaming = nil })
	local, err := ReadBolt(path, box, "secrets.key")
	require.NoError(t, err)
	_, err = s.MoveBolt(ctx, local)
	require.ErrorContains(t, err, "the file stays, and the next start copies again")
	require.FileExists(t, path)

	moveRenaming = nil
	local, err = ReadBolt(path, box, "secrets.key")
	require.NoError(t, err)
	m, err := s.MoveBolt(ctx, local)
	require.NoError(t, err)
	require.Equal(t, Moved{SecretsInEtcd: 5, RenamedTo: path + MovedSuffix}, m, "the first run brought the outbox")

	outbox := s.space.Prefix(etcdOutbox)
	resp, err := cluster.Client(t, "registry").Get(ctx, outbox+"dropped/", clientv3.WithPrefix())
	require.NoError(t, err)
	var dropped uint64
	for _, kv := range resp.Kvs {
		n, err := strconv.ParseUint(string(kv.Value), 10, 64)
		require.NoError(t, err)
		dropped += n
	}
	require.Equal(t, uint64(3), dropped, "the count the file held, once")
	resp, err = cluster.Client(t, "registry").Get(ctx, outbox+"records/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Equal(t, int64(2), resp.Count, "each record the file held, once")
}

// TestAFileServedOnBboltAgainMovesItsNewRecords: a registry.db moved to etcd, renamed back and
// served on bbolt again (going back, as the docs say) holds records its first move did not
// bring: its next move brings them, with the rest of its outbox, rather than find the first
// move's mark and bring none.
func TestAFileServedOnBboltAgainMovesItsNewRecords(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	box := testBox(t)
	path := boltToMove(t, box)
	s := openEtcdReplica(t, cluster, cluster.Root(), box, testutil.NewAuditRecorder())
	ctx := t.Context()
	local, err := ReadBolt(path, box, "secrets.key")
	require.NoError(t, err)
	m, err := s.MoveBolt(ctx, local)
	require.NoError(t, err)
	require.Equal(t, 5, m.AuditRecords)

	require.NoError(t, os.Rename(path+MovedSuffix, path))
	b := openBolt(t, path, box)
	_, err = b.PutSecret(ctx, "later", canary, func(rec audit.Recorder) error {
		return rec.Record(audit.NewAdminRecord("registry", "", audit.AdminEvent{Action: "put_later", ResourceType: "secret", ResourceID: "later", ActorRole: audit.ActorRoleSystem}))
	})
	require.NoError(t, err)
	require.NoError(t, b.Close())

	local, err = ReadBolt(path, box, "secrets.key")
	require.NoError(t, err)
	m, err = s.MoveBolt(ctx, local)
	require.NoError(t, err)
	require.Equal(t, 1, m.SecretsCopied)
	require.Equal(t, 6, m.AuditRecords, "the record written on bbolt since, with those still waiting beside it")
}

// TestMoveBoltSkipsWhatTheRegistryNeverWrites: a registry.db damaged or altered to hold
// entries the registry never writes (a server named to climb out of its prefix, a secret whose
// name holds a NUL, a registration that does not decode, a secret of 16 MiB, a key kept under
// another name than its id) is moved without them: each is named with its reason and left in
// the renamed file, the rest is moved, nothing is written outside the registry's prefix, and a
// second start finds no file to move again. No value is named.
func TestMoveBoltSkipsWhatTheRegistryNeverWrites(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	box := testBox(t)
	path := boltToMove(t, box)

	huge := bytes.Repeat([]byte("h"), 16<<20)
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	goodServer, goodSecret, goodKey := []byte{}, []byte{}, []byte{}
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		goodServer = bytes.Clone(tx.Bucket(serversBucket).Get([]byte("docs")))
		goodSecret = bytes.Clone(tx.Bucket(secretsBucket).Get([]byte("shared")))
		goodKey = bytes.Clone(tx.Bucket(keysBucket).Get([]byte("key_admin")))
		for name, val := range map[string][]byte{"../../../escaped": goodServer, "broken": []byte(`{"ref": "broken", "env": [` + canary + `-broken`)} {
			if err := tx.Bucket(serversBucket).Put([]byte(name), val); err != nil {
				return err
			}
		}
		for name, val := range map[string][]byte{"nul\x00name": goodSecret, "huge": append([]byte(`{"sealed":"`), append(huge, `"}`...)...)} {
			if err := tx.Bucket(secretsBucket).Put([]byte(name), val); err != nil {
				return err
			}
		}
		return tx.Bucket(keysBucket).Put([]byte("key_alias"), goodKey)
	}))
	require.NoError(t, db.Close())

	local, err := ReadBolt(path, box, "secrets.key")
	require.NoError(t, err)
	s := openEtcdReplica(t, cluster, root, box, testutil.NewAuditRecorder())
	m, err := s.MoveBolt(t.Context(), local)
	require.NoError(t, err)
	require.Equal(t, 2, m.ServersCopied)
	require.Equal(t, 2, m.SecretsCopied)
	require.Equal(t, 2, m.KeysCopied)
	require.ElementsMatch(t, []Skipped{
		{Kind: "server", Name: `"../../../escaped"`, Reason: "its name is no server ref (" + ident.Ref.Pattern() + ")"},
		{Kind: "server", Name: `"broken"`, Reason: "its value does not decode as a registration"},
		{Kind: "secret", Name: `"nul\x00name"`, Reason: "its name is no secret name (" + ident.SecretName.Pattern() + ")"},
		{Kind: "secret", Name: `"huge"`, Reason: fmt.Sprintf("its value is %d bytes, more than etcd takes in one request (%d)", len(huge)+13, maxMovedValue)},
		{Kind: "key", Name: `"key_alias"`, Reason: `its id is not the name it is kept under, or holds a "/" or a NUL`},
	}, m.Skipped)
	for _, sk := range m.Skipped {
		require.NotContains(t, sk.Name+sk.Reason, canary)
	}
	require.FileExists(t, path+MovedSuffix, "the skipped entries stay in the renamed file")
	require.NoFileExists(t, path, "a second start finds nothing to move again")

	// The whole keyspace of the cluster, this test's own: every key is below the prefix, and
	// none is of a skipped entry.
	all, err := cluster.Client(t, "registry").Get(t.Context(), "\x00", clientv3.WithFromKey())
	require.NoError(t, err)
	require.NotEmpty(t, all.Kvs)
	for _, kv := range all.Kvs {
		k := string(kv.Key)
		require.True(t, strings.HasPrefix(k, root+"/"), "%q is outside the prefix %s", k, root)
		require.NotContains(t, k, "escaped")
		require.NotContains(t, k, "\x00")
		require.NotContains(t, k, "huge")
		require.NotContains(t, k, "key_alias")
	}
	servers, _, err := s.ListServers(t.Context(), "", 10)
	require.NoError(t, err)
	require.Equal(t, []string{"docs", "tickets"}, refs(servers))
}
