package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOnlineBackupRestoresWhileCallsGoOn: `ringfence backup --out DIR` against a running
// ringfenced, while tool calls go on, writes a data_dir without the secrets key; ringfenced
// stopped and started on DIR with the key put beside it serves the registration, the graph's
// version, the keys and the run of before, takes calls on that run, holds the audit records of
// every call that ended before the backup began, and `ringfence audit verify` passes on it.
func TestOnlineBackupRestoresWhileCallsGoOn(t *testing.T) {
	d, cli, _ := runsDaemon(t)
	must := func(r result) string {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
		return r.Stdout
	}
	var key struct {
		Secret string `json:"secret"`
	}
	require.NoError(t, json.Unmarshal([]byte(must(cli("keys", "create", "--name", "nightly-runner", "--role", "runner", "-o", "json"))), &key))
	must(cli("runs", "start", "--graph", "demo", "--run", "run-backup"))
	// Ended before the pool's containers are looked for, however the test ends (the last step
	// ends it already, and this one is refused then).
	// (t.Context is done by then: not runCmd.)
	t.Cleanup(func() {
		cmd := exec.Command(bin("ringfence"), "runs", "end", "--run", "run-backup")
		cmd.Env = append(baseEnv(), "RINGFENCE_ADDR="+d.GRPCAddr, "RINGFENCE_API_KEY="+adminKey)
		_ = cmd.Run()
	})
	for range 3 {
		must(cli("runs", "call", "--run", "run-backup", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"before"}`))
	}

	// Calls go on all through the backup, each a CLI process of its own.
	var calls atomic.Int64
	stop, stopped := make(chan struct{}), make(chan string, 1)
	go func() {
		for {
			select {
			case <-stop:
				stopped <- ""
				return
			default:
			}
			cmd := exec.Command(bin("ringfence"), "runs", "call", "--run", "run-backup", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"during"}`)
			cmd.Env = append(baseEnv(), "RINGFENCE_ADDR="+d.GRPCAddr, "RINGFENCE_API_KEY="+adminKey)
			if out, err := cmd.CombinedOutput(); err != nil {
				stopped <- string(out) + err.Error()
				return
			}
			calls.Add(1)
		}
	}()
	for calls.Load() < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	// Every call that ended so far has its records in the spool or the log: they must be in
	// the copy.
	ended := 3 + calls.Load()
	out := filepath.Join(t.TempDir(), "backup")
	stdout := must(cli("backup", "--out", out))
	atBackupEnd := calls.Load()
	for calls.Load() == atBackupEnd { // one more call after the copy, so they overlapped
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	require.Empty(t, <-stopped, "every call during the backup succeeds")

	for _, f := range []string{"registry.db", "publisher.db", "pool.db", "audit.db", "pool-audit-spool/acked"} {
		require.Contains(t, stdout, f)
		require.FileExists(t, filepath.Join(out, filepath.FromSlash(f)))
	}
	keyFile := filepath.Join(d.DataDir, "secrets.key")
	require.Contains(t, stdout, "the secrets key is not in the backup: keep "+keyFile+" apart")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Contains(t, lines[len(lines)-1], "to restore: stop ringfenced, point its data_dir (RINGFENCE_DATA_DIR) at "+out)
	require.NoFileExists(t, filepath.Join(out, "secrets.key"))

	// Restore as the last line says: stop, data_dir at the copy, the key beside it, start.
	d.stop()
	k, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(out, "secrets.key"), k, 0o600))
	d.env = append(d.env, "RINGFENCE_DATA_DIR="+out)
	d.start()

	require.Contains(t, must(cli("servers", "list")), "fx")
	require.Contains(t, must(cli("graphs", "versions", "--graph", "demo")), "1")
	require.Contains(t, must(cli("keys", "list")), "nightly-runner")
	runner := runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + key.Secret}, bin("ringfence"), "runs", "show", "--run", "run-backup")
	require.Equal(t, 0, runner.Code, "the runner key of before authenticates: %s", runner.Stderr)
	require.Contains(t, must(cli("runs", "call", "--run", "run-backup", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"after"}`)), "after")

	var list struct {
		Records []struct {
			ToolCall struct {
				Result string `json:"result"`
			} `json:"tool_call"`
			Admin struct {
				Action string `json:"action"`
			} `json:"admin"`
		} `json:"records"`
	}
	require.Eventually(t, func() bool {
		r := cli("audit", "list", "--kind", "tool_call", "--limit", "10000", "-o", "json")
		if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &list) != nil {
			return false
		}
		succeeded := 0
		for _, rec := range list.Records {
			if rec.ToolCall.Result == "succeeded" {
				succeeded++
			}
		}
		// The calls that ended before the backup, and the one after the restore.
		return int64(succeeded) >= ended+1
	}, 15*time.Second, 100*time.Millisecond, "the outcome of every call that ended before the backup is in the restored log")
	r := cli("audit", "list", "--kind", "admin", "--limit", "10000", "-o", "json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, `"action": "backup"`, "the record of the backup it was restored from")
	verify := cli("audit", "verify")
	require.Equal(t, 0, verify.Code, "stdout: %s\nstderr: %s", verify.Stdout, verify.Stderr)
	must(cli("runs", "end", "--run", "run-backup"))
}
