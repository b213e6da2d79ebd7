package tests

import (
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
)

// TestMoveTheSplitBinariesFromBboltToEtcd: ringfence-registry and ringfence-publisher of a
// split deployment ran on bbolt (a server with an env secret, a named secret, a minted key, a
// graph published twice) and were killed; each started with store.backend=etcd over its own
// data_dir copies its registry.db or publisher.db into etcd before it serves, renames it, and
// says so in one log line with the counts and no secret. Through the public API: the server
// (its env key, the value masked), the secret, the key (it authenticates at the registry and,
// through it, at the publisher), the graph's two versions and the next publish, version 3; every
// audit record of before is in the log once. A second start copies nothing.
func TestMoveTheSplitBinariesFromBboltToEtcd(t *testing.T) {
	certs, addr, internal := splitPlan(t)
	started := startSplit(t, certs, addr, internal, map[string][]string{
		"registry": {"RINGFENCE_BOOTSTRAP_ADMIN_KEY=" + adminKey, `RINGFENCE_SANDBOX__MCP_ISOLATION_ALLOWED_ENVIRONMENT_KEYS=["APP_TOKEN"]`},
	})
	registry, publisher := started["registry"], started["publisher"]
	cli := func(svc, key string, stdin io.Reader, args ...string) result {
		return runCmd(t, stdin, []string{"RINGFENCE_ADDR=" + addr[svc], "RINGFENCE_API_KEY=" + key,
			"RINGFENCE_CA_FILE=" + filepath.Join(certs, "ca.pem"), "RINGFENCE_SERVER_IDENTITY=" + svc}, bin("ringfence"), args...)
	}
	must := func(r result) string {
		t.Helper()
		return mustSucceed(t, r).Stdout
	}
	must(cli("registry", adminKey, nil, "servers", "add", "docs", "--command", "mcpfixture", "--env", "APP_TOKEN="+canary, "--grant", "process_spawn"))
	must(cli("registry", adminKey, strings.NewReader(canarySecret), "secrets", "set", "tickets-token"))
	var key struct {
		Secret string `json:"secret"`
	}
	require.NoError(t, json.Unmarshal([]byte(must(cli("registry", adminKey, nil, "keys", "create", "--name", "ops", "--role", "admin", "-o", "json"))), &key))
	must(cli("publisher", key.Secret, nil, "graphs", "create", "--graph", "desk", "--agent", "a"))
	must(cli("publisher", key.Secret, nil, "graphs", "publish", "--graph", "desk"))
	must(cli("publisher", key.Secret, nil, "graphs", "settings", "--graph", "desk", "--agent", "a", "--confirmation-default", "non_read_only"))
	must(cli("publisher", key.Secret, nil, "graphs", "publish", "--graph", "desk"))
	// Killed: the last records may still wait in the outboxes of registry.db and publisher.db.
	registry.kill()
	publisher.kill()

	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	registry.env = append(registry.env, etcdEnv(cluster, root, "registry")...)
	publisher.env = append(publisher.env, etcdEnv(cluster, root, "publisher")...)
	registry.start()
	publisher.start()
	registry.requireLogged(t, `moved the registry's state kept in registry.db to etcd, and renamed the file to registry.db.moved-to-etcd.* servers_copied=1 servers_already_in_etcd=0 secrets_copied=1 secrets_already_in_etcd=0 keys_copied=2 keys_already_in_etcd=0 audit_records_moved=\d+`)
	publisher.requireLogged(t, `moved the publisher's state kept in publisher.db to etcd, and renamed the file to publisher.db.moved-to-etcd.* graphs_copied=1 graphs_already_in_etcd=0 versions_copied=2 audit_records_moved=\d+`)
	for _, d := range []*daemon{registry, publisher} {
		require.NotContains(t, d.Logs.String(), canary)
		require.NotContains(t, d.Logs.String(), canarySecret)
	}
	require.NoFileExists(t, filepath.Join(registry.DataDir, "registry.db"))
	require.FileExists(t, filepath.Join(registry.DataDir, "registry.db.moved-to-etcd"))
	require.NoFileExists(t, filepath.Join(publisher.DataDir, "publisher.db"))
	require.FileExists(t, filepath.Join(publisher.DataDir, "publisher.db.moved-to-etcd"))

	// The minted key authenticates; the server, the secret and the graph's versions are there.
	out := must(cli("registry", key.Secret, nil, "servers", "show", "docs", "-o", "json"))
	require.Contains(t, out, "APP_TOKEN")
	require.NotContains(t, out, canary)
	require.Contains(t, must(cli("registry", key.Secret, nil, "secrets", "list")), "tickets-token")
	require.Len(t, versionsOf(t, must(cli("publisher", key.Secret, nil, "graphs", "versions", "--graph", "desk", "-o", "json"))), 2)
	require.Contains(t, must(cli("publisher", key.Secret, nil, "graphs", "show", "--graph", "desk", "--version", "1")), "published by")
	require.Contains(t, must(cli("publisher", key.Secret, nil, "graphs", "publish", "--graph", "desk", "-o", "json")), `"version": "3"`)

	// Every record of before is in the audit log once.
	var list struct {
		Records []struct {
			Admin struct {
				Action       string `json:"action"`
				ResourceType string `json:"resource_type"`
			} `json:"admin"`
		} `json:"records"`
	}
	var got map[string]int
	require.Eventually(t, func() bool {
		r := cli("audit", key.Secret, nil, "audit", "list", "--kind", "admin", "-o", "json")
		if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &list) != nil {
			return false
		}
		got = map[string]int{}
		for _, rec := range list.Records {
			got[rec.Admin.Action+" "+rec.Admin.ResourceType]++
		}
		return got["publish graph"] == 3
	}, 30*time.Second, 100*time.Millisecond, "audit records: %v", got)
	for _, rec := range []string{"create mcp_server", "create graph"} {
		require.Equal(t, 1, got[rec], "%s: %v", rec, got)
	}
	require.Equal(t, 2, got["key_create api_key"], "the bootstrap key's and the minted key's: %v", got)

	// A second start finds the files moved: it copies nothing and refuses nothing.
	registry.restart()
	publisher.restart()
	require.Equal(t, 1, strings.Count(registry.Logs.String(), "moved the registry's state"), registry.Logs.String())
	require.Equal(t, 1, strings.Count(publisher.Logs.String(), "moved the publisher's state"), publisher.Logs.String())
	must(cli("registry", key.Secret, nil, "servers", "show", "docs"))
	require.Len(t, versionsOf(t, must(cli("publisher", key.Secret, nil, "graphs", "versions", "--graph", "desk", "-o", "json"))), 3)
}

// versionsOf is the versions `graphs versions -o json` lists.
func versionsOf(t *testing.T, out string) []string {
	t.Helper()
	var v struct {
		Versions []struct {
			Version string `json:"version"`
		} `json:"versions"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	var got []string
	for _, x := range v.Versions {
		got = append(got, x.Version)
	}
	return got
}
