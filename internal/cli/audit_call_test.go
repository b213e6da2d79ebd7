package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/cli"
)

// TestAuditListAndExportByCall: audit list and export --call show that call's records and no
// other's: two refused attempts of call c-1 (attempts 1 and 2), beside call c-2 of the same run.
// A call id no call can have is a usage mistake the server names.
func TestAuditListAndExportByCall(t *testing.T) {
	s := agentServer(t)
	s.must("graphs", "publish", "--graph", "g")
	s.must("runs", "start", "--graph", "g", "--run", "r1")
	for _, id := range []string{"c-1", "c-2", "c-1"} {
		code, _, errOut := s.cli("runs", "call", "--run", "r1", "--agent", "researcher", "--tool", "nosuch__tool", "--call-id", id)
		require.Equal(t, cli.ExitRefused, code, errOut)
		require.Contains(t, errOut, "unknown_tool")
	}
	// The records reach the log through the pool's spool, a moment after the refusals.
	require.Eventually(t, func() bool {
		return strings.Count(s.must("audit", "list", "--run", "r1"), "call c-") == 3
	}, 10*time.Second, 20*time.Millisecond)

	out := s.must("audit", "list", "--call", "c-1")
	require.Contains(t, out, "call c-1#1")
	require.Contains(t, out, "call c-1#2")
	require.NotContains(t, out, "c-2", "another call of the same run")
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 3, "a header and two records:\n%s", out)

	out = s.must("audit", "export", "--call", "c-2")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 1, out)
	var rec struct {
		ToolCall struct {
			CallID  string `json:"call_id"`
			Attempt int    `json:"attempt"`
		} `json:"tool_call"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &rec))
	require.Equal(t, "c-2", rec.ToolCall.CallID)
	require.Equal(t, 1, rec.ToolCall.Attempt)

	code, _, errOut := s.cli("audit", "list", "--call", "c 1")
	require.Equal(t, cli.ExitFailure, code)
	require.Contains(t, errOut, `audit: invalid filter: call_id "c 1" holds a space, which is not allowed: use 1 to 512 of A-Z a-z 0-9 _ . : -, not only dots`)
}
