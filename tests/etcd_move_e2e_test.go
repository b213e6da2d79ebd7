package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// TestMoveFromBboltToEtcd: ringfenced ran on bbolt (a server with an env secret, a minted
// key, a graph published twice) and was killed; started with store.backend=etcd over the same
// data_dir, it copies registry.db and publisher.db into etcd before it serves, renames them,
// and says so in one log line with the counts and no secret: the server (its env opening), the
// key (it authenticates), the graph's versions are there, the next publish is version 3, and
// every audit record of before is in the log once, whether it was forwarded before the kill
// or waited in an outbox. A second start copies nothing and says nothing of it.
func TestMoveFromBboltToEtcd(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	cli := func(key string, args ...string) result {
		return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + key}, bin("ringfence"), args...)
	}
	must := func(r result) string {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
		return r.Stdout
	}
	must(cli(adminKey, "servers", "add", "docs", "--command", "mcpfixture", "--env", "APP_TOKEN="+canary, "--grant", "process_spawn"))
	var key struct {
		Secret string `json:"secret"`
	}
	require.NoError(t, json.Unmarshal([]byte(must(cli(adminKey, "keys", "create", "--name", "ops", "--role", "admin", "-o", "json"))), &key))
	must(cli(key.Secret, "graphs", "create", "--graph", "desk", "--agent", "a"))
	must(cli(key.Secret, "graphs", "publish", "--graph", "desk"))
	must(cli(key.Secret, "graphs", "settings", "--graph", "desk", "--agent", "a", "--confirmation-default", "non_read_only"))
	must(cli(key.Secret, "graphs", "publish", "--graph", "desk"))
	// Killed: the last records may still wait in the outboxes of registry.db and publisher.db.
	d.kill()

	cluster := etcdtest.Start(t, 1)
	d.env = append(d.env, etcdEnv(cluster, cluster.Root(), "registry")...)
	d.start()
	d.requireLogged(t, `moved the registry's state kept in registry.db to etcd, and renamed the file to registry.db.moved-to-etcd.* servers_copied=1 servers_already_in_etcd=0 secrets_copied=0 secrets_already_in_etcd=0 keys_copied=2 keys_already_in_etcd=0 audit_records_moved=\d+`)
	d.requireLogged(t, `moved the publisher's state kept in publisher.db to etcd, and renamed the file to publisher.db.moved-to-etcd.* graphs_copied=1 graphs_already_in_etcd=0 versions_copied=2 audit_records_moved=\d+`)
	require.NotContains(t, d.Logs.String(), canary)
	for _, name := range []string{"registry.db", "publisher.db"} {
		require.NoFileExists(t, filepath.Join(d.DataDir, name))
		require.FileExists(t, filepath.Join(d.DataDir, name+".moved-to-etcd"))
	}

	// The minted key authenticates; the server and the graph's versions are there.
	out := must(cli(key.Secret, "servers", "show", "docs", "-o", "json"))
	require.Contains(t, out, "APP_TOKEN")
	require.NotContains(t, out, canary)
	var versions struct {
		Versions []struct {
			Version string `json:"version"`
		} `json:"versions"`
	}
	require.NoError(t, json.Unmarshal([]byte(must(cli(key.Secret, "graphs", "versions", "--graph", "desk", "-o", "json"))), &versions))
	require.Len(t, versions.Versions, 2)
	require.Contains(t, must(cli(key.Secret, "graphs", "show", "--graph", "desk", "--version", "1")), "published by")
	require.Contains(t, must(cli(key.Secret, "graphs", "publish", "--graph", "desk", "-o", "json")), `"version": "3"`)

	// Every record of before is in the audit log once.
	var list struct {
		Records []struct {
			Admin struct {
				Action       string `json:"action"`
				ResourceType string `json:"resource_type"`
				ResourceID   string `json:"resource_id"`
			} `json:"admin"`
		} `json:"records"`
	}
	count := func() map[string]int {
		r := cli(key.Secret, "audit", "list", "--kind", "admin", "-o", "json")
		if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &list) != nil {
			return nil
		}
		got := map[string]int{}
		for _, rec := range list.Records {
			got[rec.Admin.Action+" "+rec.Admin.ResourceType]++
		}
		return got
	}
	var got map[string]int
	require.Eventually(t, func() bool {
		got = count()
		return got["publish graph"] == 3
	}, 30*time.Second, 100*time.Millisecond, "audit records: %v", got)
	for _, rec := range []string{"create mcp_server", "create graph"} {
		require.Equal(t, 1, got[rec], "%s: %v", rec, got)
	}
	require.Equal(t, 2, got["key_create api_key"], "the bootstrap key's and the minted key's: %v", got)

	// A second start finds the files moved: it copies nothing and refuses nothing.
	d.restart()
	require.Equal(t, 1, strings.Count(d.Logs.String(), "moved the registry's state"), d.Logs.String())
	must(cli(key.Secret, "servers", "show", "docs"))
	_, err := os.Stat(filepath.Join(d.DataDir, "registry.db"))
	require.True(t, os.IsNotExist(err))
}

// TestMoveFromBboltNeedsTheKeyOfTheFile: ringfenced moved to etcd with another secrets key
// than the one its registry.db was sealed with refuses to start, naming the file, the key file
// and the fix; nothing reaches etcd (not even the key's check) and the file stays. With the
// file's key, the next start moves it.
func TestMoveFromBboltNeedsTheKeyOfTheFile(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	r := runCmd(t, strings.NewReader(canarySecret), []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey},
		bin("ringfence"), "secrets", "set", "tickets-token")
	require.Equal(t, 0, r.Code, r.Stderr)
	d.stop()

	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	wrongKey := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(wrongKey, []byte(strings.Repeat("cd", 32)+"\n"), 0o600))
	env := append(append([]string{"RINGFENCE_DATA_DIR=" + d.DataDir, "RINGFENCE_GRPC_ADDR=" + d.GRPCAddr, "RINGFENCE_HTTP_ADDR=" + d.HTTPAddr},
		etcdEnv(cluster, root, "registry")...), registryEnv()...)
	r = runCmd(t, nil, append(env, "RINGFENCE_SECRETS_KEY_FILE="+wrongKey), bin("ringfenced"))
	require.NotEqual(t, 0, r.Code, r.Stderr)
	db := filepath.Join(d.DataDir, "registry.db")
	require.Contains(t, r.Stderr, db+` was not moved to etcd: 1 of its sealed values (the first: secret \"tickets-token\") do not open with this host's secrets key (`+wrongKey+`)`)
	require.Contains(t, r.Stderr, "Start with the key file registry.db was sealed with")
	require.NotContains(t, r.Stderr, canarySecret)
	require.FileExists(t, db)
	resp, err := cluster.Client(t, "registry").Get(t.Context(), root+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, resp.Count, "nothing reached etcd")

	d.env = append(d.env, etcdEnv(cluster, root, "registry")...)
	d.start()
	d.requireLogged(t, `moved the registry's state kept in registry.db to etcd.* secrets_copied=1`)
	out := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}, bin("ringfence"), "secrets", "list")
	require.Equal(t, 0, out.Code, out.Stderr)
	require.Contains(t, out.Stdout, "tickets-token")
}
