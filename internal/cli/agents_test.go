package cli_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/app"
	"github.com/ringfence/ringfence/internal/cli"
	"github.com/ringfence/ringfence/internal/config"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/pinned"
)

const adminKey = "cli-test-admin-key-0123456789"

// server is ringfenced in-process, without an isolation image (nothing is started: the agent
// surface is decided from pinned declarations), and a CLI that talks to it.
type server struct {
	t    *testing.T
	addr string
}

func (s *server) cli(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = cli.Execute(append(args, "--addr", s.addr, "--api-key", adminKey), strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

func (s *server) must(args ...string) string {
	s.t.Helper()
	code, out, errOut := s.cli(args...)
	require.Equal(s.t, cli.ExitOK, code, "%v\nstdout: %s\nstderr: %s", args, out, errOut)
	return out
}

// agentServer registers servers docs and tickets and drafts graph g: agent researcher binds
// docs__read_file (read-only), docs__write_file, tickets__search and tickets__delete.
func agentServer(t *testing.T) *server {
	t.Helper()
	cfg, err := config.Load("test", nil, []string{
		"RINGFENCE_DATA_DIR=" + t.TempDir(), "RINGFENCE_GRPC_ADDR=127.0.0.1:0", "RINGFENCE_HTTP_ADDR=127.0.0.1:0",
		"RINGFENCE_BOOTSTRAP_ADMIN_KEY=" + adminKey,
	}, io.Discard)
	require.NoError(t, err)
	a, err := app.NewAllInOne(t.Context(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	conn, _ := testutil.Serve(t, a.Server)
	t.Cleanup(func() { a.Close() })
	ctx := testutil.WithKey(t.Context(), adminKey)
	reg := registryv1.NewRegistryServiceClient(conn)
	for ref, desc := range map[string]string{"docs": "The company handbook.", "tickets": "The support team's ticket system."} {
		_, err := reg.CreateServer(ctx, &registryv1.CreateServerRequest{Ref: ref, Command: "mcp-server", Description: desc, Grants: []string{"process_spawn", "external_api_call"}})
		require.NoError(t, err)
	}
	pub := publisherv1.NewPublisherServiceClient(conn)
	created, err := pub.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"researcher"}})
	require.NoError(t, err)
	draft := created.GetDraft()
	pinned.Add(t, draft, "researcher",
		pinned.Tool{Server: "docs", Tool: "read_file", Description: "Read a handbook page.", Annotations: `{"readOnlyHint":true}`},
		pinned.Tool{Server: "docs", Tool: "write_file", Description: "Write a handbook page.\x1b]0;pwned\x07"},
		pinned.Tool{Server: "tickets", Tool: "search", Description: "Search tickets.", Annotations: `{"readOnlyHint":true}`},
		pinned.Tool{Server: "tickets", Tool: "delete", Description: "Delete a ticket."},
	)
	_, err = pub.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: draft})
	require.NoError(t, err)
	return &server{t: t, addr: conn.Target()}
}

// TestAgentSettingsCommands: graphs settings shows the effective settings and changes them,
// graphs mount narrows one server, graphs confirm sets a binding's rule; each change lands in
// the draft, mistakes are usage errors (exit 2) that change nothing, and the server's
// refusals name the field.
func TestAgentSettingsCommands(t *testing.T) {
	s := agentServer(t)
	g := []string{"--graph", "g", "--agent", "researcher"}

	out := s.must(append([]string{"graphs", "settings"}, g...)...)
	for _, want := range []string{"include_servers:", "- (every server)", "confirmation_default:", "none", "defer_tools:", "false", "document_resolver:", "off"} {
		require.Contains(t, out, want)
	}

	out = s.must(append([]string{"graphs", "settings", "--exclude-tools", "tickets__delete", "--include-servers", "docs,tickets",
		"--defer-tools", "--confirmation-default", "non_read_only", "--strict-schemas", "--selected-servers", "docs",
		"--document-resolver", "--document-servers", "docs"}, g...)...)
	require.Contains(t, out, "tickets__delete")
	require.Contains(t, out, "non_read_only")
	require.Contains(t, out, "on, for docs")

	s.must(append([]string{"graphs", "mount", "--server", "docs", "--include-tool", "read_file", "--include-tool", "write_file", "--defer-tools=false"}, g...)...)
	s.must(append([]string{"graphs", "confirm", "--tool", "docs__read_file", "--rule", "always"}, g...)...)
	out = s.must(append([]string{"graphs", "settings", "-o", "json"}, g...)...)
	var shown struct {
		Graph, Agent string
		Revision     int64
		Settings     map[string]any
	}
	require.NoError(t, json.Unmarshal([]byte(out), &shown), out)
	require.Equal(t, "g", shown.Graph)
	require.Equal(t, "researcher", shown.Agent)
	set := shown.Settings
	require.Equal(t, []any{"docs", "tickets"}, set["include_servers"])
	require.Equal(t, []any{"tickets__delete"}, set["exclude_tools"])
	require.Equal(t, true, set["defer_tools"])
	require.Equal(t, true, set["convert_schemas_to_strict"])
	require.Equal(t, "non_read_only", set["confirmation_default"])
	require.Equal(t, []any{"docs"}, set["selected_servers"])
	require.Equal(t, map[string]any{"enabled": true, "server_names": []any{"docs"}}, set["document_resolver"])
	require.Equal(t, []any{map[string]any{"name": "docs", "include_tools": []any{"read_file", "write_file"}, "exclude_tools": []any{}, "defer_tools": false}}, set["mounts"])
	require.Equal(t, "always", set["tool_bindings"].([]any)[0].(map[string]any)["confirmation"])
	require.NotContains(t, set, "capability_bindings", "what the agent holds is no setting of its tools")
	require.Contains(t, s.must("graphs", "show", "--graph", "g"), "tool settings (graphs settings --agent researcher)")

	// Clearing a list, a mount, a rule.
	out = s.must(append([]string{"graphs", "settings", "--include-servers", "", "-o", "json"}, g...)...)
	require.Contains(t, out, `"include_servers": []`)
	s.must(append([]string{"graphs", "mount", "--server", "docs", "--remove"}, g...)...)
	out = s.must(append([]string{"graphs", "confirm", "--tool", "docs__read_file", "--rule", "default", "-o", "json"}, g...)...)
	require.Contains(t, out, `"mounts": []`)
	require.NotContains(t, out, `"always"`)

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"graphs", "settings", "--confirmation-default", "sometimes"}, cli.ExitUsage, `--confirmation-default: "sometimes" is not a confirmation default`},
		{[]string{"graphs", "confirm", "--tool", "docs__read_file", "--rule", "maybe"}, cli.ExitUsage, "--rule must be always, never or default"},
		{[]string{"graphs", "confirm", "--tool", "nope", "--rule", "always"}, cli.ExitUsage, `agent researcher binds no tool named "nope"; it binds: docs__read_file`},
		{[]string{"graphs", "mount", "--server", "wiki", "--remove"}, cli.ExitUsage, "agent researcher has no mount of server wiki"},
		{[]string{"graphs", "mount", "--server", "docs", "--remove", "--include-tool", "x"}, cli.ExitUsage, "--remove deletes the mount of docs: give it alone"},
		{[]string{"graphs", "settings", "--include-tools", "read_file"}, cli.ExitFailure, "draft.nodes[0].agent.include_tools[0]"},
		{[]string{"graphs", "mount", "--server", "docs", "--exclude-tool", "docs__read_file"}, cli.ExitFailure, `write "read_file"`},
	} {
		t.Run(strings.Join(tc.args[:2], " "), func(t *testing.T) {
			before := s.must(append([]string{"graphs", "settings", "-o", "json"}, g...)...)
			code, _, errOut := s.cli(append(tc.args, g...)...)
			require.Equal(t, tc.code, code, errOut)
			require.Contains(t, errOut, tc.want)
			require.Equal(t, before, s.must(append([]string{"graphs", "settings", "-o", "json"}, g...)...), "nothing changed")
		})
	}
	code, _, errOut := s.cli("graphs", "settings", "--graph", "g", "--agent", "nobody")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, errOut, "its agents: researcher")
}

// TestRunsToolsCommand: runs tools lists what the agent's model sees after publish, with a
// run's selection, the deferred servers and the hidden tools; server-written text cannot drive
// the terminal; -o json is the REST shape.
func TestRunsToolsCommand(t *testing.T) {
	s := agentServer(t)
	g := []string{"--graph", "g", "--agent", "researcher"}
	s.must(append([]string{"graphs", "settings", "--confirmation-default", "non_read_only"}, g...)...)
	s.must(append([]string{"graphs", "mount", "--server", "tickets", "--defer-tools"}, g...)...)
	s.must("graphs", "publish", "--graph", "g")

	code, _, errOut := s.cli("runs", "start", "--graph", "g", "--run", "r1")
	require.Equal(t, cli.ExitOK, code, errOut)
	out := s.must("runs", "tools", "--run", "r1", "--agent", "researcher")
	require.Regexp(t, `docs__read_file\s+docs\s+-\s+Read a handbook page\.`, out)
	require.Regexp(t, `docs__write_file\s+docs\s+asks first\s+Write a handbook page\.`, out)
	require.Regexp(t, `tool_search\s+-\s+-\s+Tool search`, out)
	require.Regexp(t, `tickets\s+2\s+The support team's ticket system\.`, out)
	require.Regexp(t, `tickets__delete\s+not_loaded\s+`, out)
	require.NotContains(t, out, "\x1b", "a description cannot drive the terminal")
	require.NotContains(t, out, "\x07")
	require.Contains(t, out, "page.]0;pwned", "the pool shows the model the text without its control characters, and the CLI shows what the model sees")

	code, _, errOut = s.cli("runs", "start", "--graph", "g", "--run", "r2", "--selected-server", "tickets", "--selected-server", "wiki")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Contains(t, errOut, `warning: no agent of graph g uses "wiki", so the run ignores it`)
	out = s.must("runs", "tools", "--run", "r2", "--agent", "researcher", "-o", "json")
	var listing struct {
		Tools []struct {
			Name                 string `json:"name"`
			RequiresConfirmation bool   `json:"requires_confirmation"`
		} `json:"tools"`
		Hidden []struct {
			Name, Reason, Level string
		} `json:"hidden"`
		SelectedServers []string `json:"selected_servers"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &listing), out)
	require.Len(t, listing.Tools, 1)
	require.Equal(t, "tool_search", listing.Tools[0].Name)
	require.Equal(t, []string{"tickets"}, listing.SelectedServers)
	require.Equal(t, "docs__read_file", listing.Hidden[0].Name)
	require.Equal(t, "selected_servers", listing.Hidden[0].Level)
	out = s.must("runs", "show", "--run", "r2")
	require.Regexp(t, `selected servers:\s+tickets`, out)

	code, _, errOut = s.cli("runs", "tools", "--run", "r2", "--agent", "nobody")
	require.Equal(t, cli.ExitFailure, code)
	require.Contains(t, errOut, `no agent node "nobody" (its agents: researcher)`)
	code, _, errOut = s.cli("runs", "tools", "--run", "r2")
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, errOut, "--agent")
}
