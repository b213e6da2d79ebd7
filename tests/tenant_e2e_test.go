package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTheCLIAnswersAnotherTenantsIDsAsNone: every ringfence command that takes a graph, run,
// approval, token or document id, run with an admin key bound to acme against ringfenced, says
// of globex's ids exactly what it says of ids nothing has (exit code and output, the ids
// aside), and globex's things are left as they were.
func TestTheCLIAnswersAnotherTenantsIDsAsNone(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	as := func(key string) func(args ...string) result {
		return func(args ...string) result {
			return runCmd(t, nil, []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + key}, bin("ringfence"), args...)
		}
	}
	admin := as(adminKey)
	must := func(r result) result {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
		return r
	}
	var key struct {
		Secret string `json:"secret"`
	}
	require.NoError(t, json.Unmarshal([]byte(must(admin("keys", "create", "--name", "acme-admin", "--role", "admin", "--tenant", "acme", "-o", "json")).Stdout), &key))
	acme := as(key.Secret)

	must(admin("graphs", "create", "--graph", "theirs-graph", "--agent", "a", "--tenant", "globex"))
	must(admin("graphs", "publish", "--graph", "theirs-graph", "--tenant", "globex"))
	must(admin("runs", "start", "--graph", "theirs-graph", "--run", "nightly", "--tenant", "globex"))
	var tok struct {
		TokenID string `json:"token_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(must(admin("runs", "connect", "--run", "nightly", "--agent", "a", "--tenant", "globex", "-o", "json")).Stdout), &tok))
	require.NotEmpty(t, tok.TokenID)
	file := filepath.Join(t.TempDir(), "n.txt")
	require.NoError(t, os.WriteFile(file, []byte("globex's"), 0o600))
	var doc struct {
		DocumentID string `json:"document_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(must(admin("documents", "put", file, "--tenant", "globex", "-o", "json")).Stdout), &doc))
	require.NotEmpty(t, doc.DocumentID)

	ids := func(graph, run, token, document string) *strings.Replacer {
		return strings.NewReplacer("{graph}", graph, "{run}", run, "{token}", token, "{doc}", document)
	}
	theirs := ids("theirs-graph", "nightly", tok.TokenID, doc.DocumentID)
	none := ids("nothing-here", "run-nothing-here", "tok-0123456789abcdef", "doc-0123456789abcdef")
	hide := strings.NewReplacer("theirs-graph", "ID", "nothing-here", "ID", "run-nothing-here", "ID", "nightly", "ID",
		tok.TokenID, "ID", "tok-0123456789abcdef", "ID", doc.DocumentID, "ID", "doc-0123456789abcdef", "ID")
	for _, cmd := range []string{
		"graphs show --graph {graph}",
		"graphs validate --graph {graph}",
		"graphs publish --graph {graph}",
		"graphs versions --graph {graph}",
		"graphs delete --graph {graph}",
		"mcp-import --server docs --graph {graph} --agent a",
		"runs start --graph {graph}",
		"runs show --run {run}",
		"runs pause --run {run}",
		"runs resume --run {run}",
		"runs end --run {run}",
		"runs tools --run {run} --agent a",
		"runs call --run {run} --agent a --tool x --args {}",
		"runs approvals --run {run}",
		"runs approve --run {run} --approval apr-0123456789abcdef",
		"runs deny --run {run} --approval apr-0123456789abcdef",
		"runs connect --run {run} --agent a",
		"runs connections --run {run}",
		"runs disconnect --run {run} --token {token}",
		"documents get {doc}",
		"documents delete {doc}",
	} {
		t.Run(cmd, func(t *testing.T) {
			got := acme(strings.Fields(theirs.Replace(cmd))...)
			want := acme(strings.Fields(none.Replace(cmd))...)
			require.NotZero(t, want.Code, "an id nothing has: %s", want.Stderr)
			require.Equal(t, want.Code, got.Code, got.Stderr)
			// Each answer has ids of its own: its request's, and a call's attempt.
			own := regexp.MustCompile(`\b(cli|call)-[0-9a-f]+\b`)
			mask := func(s string) string { return own.ReplaceAllString(hide.Replace(s), "$1-ID") }
			require.Equal(t, mask(want.Stdout), mask(got.Stdout))
			require.Equal(t, mask(want.Stderr), mask(got.Stderr))
		})
	}

	var run struct {
		State string `json:"state"`
	}
	require.NoError(t, json.Unmarshal([]byte(must(admin("runs", "show", "--run", "nightly", "--tenant", "globex", "-o", "json")).Stdout), &run))
	require.Equal(t, "running", run.State, "acme's pause and end left globex's run")
	must(admin("graphs", "show", "--graph", "theirs-graph", "--tenant", "globex"))
	must(admin("documents", "get", doc.DocumentID, "--tenant", "globex"))
	require.Contains(t, must(admin("runs", "connections", "--run", "nightly", "--tenant", "globex")).Stdout, tok.TokenID)
}
