package cli

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	adminv1 "github.com/ringfence/ringfence/gen/go/ringfence/admin/v1"
)

// TestABackupPathStaysUnderOut: a path a server sends is written under --out only when it is a
// plain relative path there; anything that could land elsewhere is refused, naming it.
func TestABackupPathStaysUnderOut(t *testing.T) {
	for _, p := range []string{"registry.db", "pool-audit-spool/acked", "pool-audit-spool/0000000000000001.seg"} {
		require.NoError(t, safeBackupPath(p), p)
	}
	for _, p := range []string{"", ".", "..", "../registry.db", "/etc/passwd", "a/../../b", "a//b", "./a", `a\b`, "a/"} {
		err := safeBackupPath(p)
		require.Error(t, err, p)
		require.Contains(t, err.Error(), "is not a plain path under the data_dir: refused", p)
	}
}

// TestABackupOfNoFileSaysItRestoresNothing: a binary that keeps no file in its data_dir (a
// registry on etcd) sends no file: the output says the copy restores nothing and where the
// state is, rather than how to restore the empty directory.
func TestABackupOfNoFileSaysItRestoresNothing(t *testing.T) {
	var out bytes.Buffer
	w := &backupWriter{dir: "/backups/registry", stdout: &out}
	require.NoError(t, w.finish(&adminv1.BackupSummary{
		Binary: "ringfence-registry", StoreBackend: "etcd", SecretsKeyFile: "/data/secrets.key",
		NotIncluded: []string{"with store.backend=etcd, the registrations, secrets and API keys are kept in etcd: take them with `etcdctl snapshot save`"},
	}))
	require.Contains(t, out.String(), "backed up 0 files (0 bytes) of ringfence-registry into /backups/registry")
	require.Contains(t, out.String(), "not in the backup: with store.backend=etcd")
	require.Contains(t, out.String(), "/backups/registry is empty: ringfence-registry keeps none of its state in its data_dir, so this copy restores nothing")
	require.NotContains(t, out.String(), "to restore:")
}

// TestABackupAsJSONListsNoFileAsAnEmptyList: with -o json a copy of no file (a registry on
// etcd) and a binary with nothing left out (a publisher on bbolt) print empty lists, never
// null, which a script would have to tell apart; the hint of a copy that restores nothing
// names the JSON field that says where the state is, not lines a script never sees.
func TestABackupAsJSONListsNoFileAsAnEmptyList(t *testing.T) {
	var out bytes.Buffer
	w := &backupWriter{dir: "/backups/registry", stdout: &out, json: true}
	require.NoError(t, w.finish(&adminv1.BackupSummary{
		Binary: "ringfence-registry", StoreBackend: "etcd", SecretsKeyFile: "/data/secrets.key",
		NotIncluded: []string{"with store.backend=etcd, the registrations, secrets and API keys are kept in etcd: take them with `etcdctl snapshot save`"},
	}))
	var got map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
	require.Equal(t, []any{}, got["files"], out.String())
	require.Equal(t, float64(0), got["bytes"])
	require.Contains(t, got["restore"], "/backups/registry is empty: ringfence-registry keeps none of its state in its data_dir, so this copy restores nothing; back up what not_included names")
	require.NotContains(t, got["restore"], "lines above")

	out.Reset()
	w = &backupWriter{dir: "/backups/publisher", stdout: &out, json: true}
	w.files = []backupFileOut{{Path: "publisher.db", Size: 4096, SHA256: "ab"}}
	require.NoError(t, w.finish(&adminv1.BackupSummary{Binary: "ringfence-publisher", StoreBackend: "bbolt", Files: 1}))
	got = nil
	require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
	require.Equal(t, []any{}, got["not_included"], out.String())
	require.Equal(t, "", got["secrets_key_file"])
}
