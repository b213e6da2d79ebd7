package graph

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/fielderr"
)

// TestToolSettingsAreCheckedOnEveryWrite: each malformed setting is refused naming the field
// path, as every other structural problem is.
func TestToolSettingsAreCheckedOnEveryWrite(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(a *AgentNode)
		field   string
		problem string
	}{
		{"include_servers not a ref", func(a *AgentNode) { a.IncludeServers = []string{"docs", "Docs!"} },
			"nodes[0].agent.include_servers[1]", `"Docs!" is not a server ref`},
		{"exclude_servers not a ref", func(a *AgentNode) { a.ExcludeServers = []string{""} },
			"nodes[0].agent.exclude_servers[0]", "is not a server ref"},
		{"selected_servers not a ref", func(a *AgentNode) { a.SelectedServers = []string{"a b"} },
			"nodes[0].agent.selected_servers[0]", "is not a server ref"},
		{"include_tools not namespaced", func(a *AgentNode) { a.IncludeTools = []string{"read_file"} },
			"nodes[0].agent.include_tools[0]", "write <server>__<tool>"},
		{"exclude_tools with a bad tool", func(a *AgentNode) { a.ExcludeTools = []string{"docs__"} },
			"nodes[0].agent.exclude_tools[0]", "is not a namespaced tool name"},
		{"confirmation_default", func(a *AgentNode) { a.ConfirmationDefault = "sometimes" },
			"nodes[0].agent.confirmation_default", `"sometimes" is not a confirmation default: use none, non_read_only`},
		{"binding confirmation", func(a *AgentNode) { a.ToolBindings[0].Confirmation = "none" },
			"nodes[0].agent.tool_bindings[0].confirmation", `"none" is not a confirmation rule: use always or never`},
		{"mount name", func(a *AgentNode) { a.Mounts = []Mount{{Name: "Docs"}} },
			"nodes[0].agent.mounts[0].name", "is not a server ref"},
		{"mount twice", func(a *AgentNode) { a.Mounts = []Mount{{Name: "docs"}, {Name: "docs"}} },
			"nodes[0].agent.mounts[1].name", `mounts server "docs" twice`},
		{"mount tool namespaced", func(a *AgentNode) { a.Mounts = []Mount{{Name: "docs", IncludeTools: []string{"docs__read_file"}}} },
			"nodes[0].agent.mounts[0].include_tools[0]", `write "read_file"`},
		{"mount tool malformed", func(a *AgentNode) { a.Mounts = []Mount{{Name: "docs", ExcludeTools: []string{"read file"}}} },
			"nodes[0].agent.mounts[0].exclude_tools[0]", "is not a tool name"},
		{"document_resolver server", func(a *AgentNode) {
			a.DocumentResolver = &DocumentResolver{Enabled: true, ServerNames: []string{"docs", "../x"}}
		}, "nodes[0].agent.document_resolver.server_names[1]", "is not a server ref"},
		{"too many entries", func(a *AgentNode) { a.ExcludeTools = make([]string, MaxSettingEntries+1) },
			"nodes[0].agent.exclude_tools", "at most 256"},
		{"reserved binding name", func(a *AgentNode) { a.ToolBindings[0].Name = ToolSearchName },
			"nodes[0].agent.tool_bindings[0].name", "reserved for the agent surface's own tools"},
		{"reserved connect prefix", func(a *AgentNode) { a.ToolBindings[0].Name = ConnectToolPrefix + "docs" },
			"nodes[0].agent.tool_bindings[0].name", "reserved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := sample(t)
			tc.edit(g.Nodes[0].Agent)
			errs := Structure(g)
			require.NotEmpty(t, errs)
			fe, ok := fielderr.As(errs[0])
			require.True(t, ok, "%v", errs[0])
			require.Equal(t, tc.field, fe.Field)
			require.Contains(t, fe.Problem, tc.problem)
			require.Contains(t, fe.Problem, `agent "researcher"`)
		})
	}

	g := sample(t)
	no := false
	g.Nodes[0].Agent.ToolSettings = ToolSettings{
		IncludeServers: []string{"docs"}, ExcludeServers: []string{"tickets"}, IncludeTools: []string{"docs__read_file"},
		ExcludeTools: []string{"docs__write_file"}, DeferTools: true, ConfirmationDefault: ConfirmNonReadOnly,
		ConvertSchemasToStrict: true, SelectedServers: []string{"docs"},
		Mounts:           []Mount{{Name: "docs", IncludeTools: []string{"read_file"}, ExcludeTools: []string{"write_file"}, DeferTools: &no}},
		DocumentResolver: &DocumentResolver{Enabled: true, ServerNames: []string{"docs"}},
	}
	g.Nodes[0].Agent.ToolBindings[0].Confirmation = ConfirmAlways
	require.Empty(t, Structure(g), "every setting well formed")
}

// TestSettingsThatMatchNothingAreAPublishWarning: an entry naming a server or tool the agent
// has none of is stored with the version as a warning, not refused and not silent.
func TestSettingsThatMatchNothingAreAPublishWarning(t *testing.T) {
	g := sample(t)
	g.Nodes[0].Agent.ToolSettings = ToolSettings{
		IncludeServers: []string{"docs", "tickets"}, ExcludeTools: []string{"docs__read_file", "docs__delete"},
		Mounts:           []Mount{{Name: "docs", IncludeTools: []string{"read_file", "reed_file"}}, {Name: "wiki"}},
		DocumentResolver: &DocumentResolver{Enabled: true, ServerNames: []string{"files"}},
		SelectedServers:  []string{"docs"},
	}
	res, err := NewContractOnlyValidator().Validate(t.Context(), g)
	require.NoError(t, err)
	require.True(t, res.OK(), "%v", res.Violations)
	var settings []string
	for _, w := range res.Warnings {
		if strings.Contains(w, "has no effect") {
			settings = append(settings, w)
		}
	}
	require.Equal(t, []string{
		`agent "researcher": include_servers names server "tickets", which none of the agent's tools comes from (its servers: docs); the entry has no effect`,
		`agent "researcher": exclude_tools names "docs__delete", which is none of the agent's tools (they are named <server>__<tool>, as mcp-import binds them); the entry has no effect`,
		`agent "researcher": the mount of server "docs" names tool "reed_file", which is none of the agent's tools of that server; the entry has no effect`,
		`agent "researcher": mounts names server "wiki", which none of the agent's tools comes from (its servers: docs); the entry has no effect`,
		`agent "researcher": document_resolver.server_names names server "files", which none of the agent's tools comes from (its servers: docs); the entry has no effect`,
	}, settings)
}

func TestSettingsWarningsAreBounded(t *testing.T) {
	g := sample(t)
	for i := range 60 {
		g.Nodes[0].Agent.ExcludeServers = append(g.Nodes[0].Agent.ExcludeServers, "s"+strings.Repeat("x", i%5)+string(rune('a'+i%26)))
	}
	res, err := NewContractOnlyValidator().Validate(t.Context(), g)
	require.NoError(t, err)
	require.Len(t, res.Warnings, maxSettingsWarnings+2, "the bound, its summary, and the contract-only warning")
	require.Contains(t, res.Warnings[maxSettingsWarnings], "and 10 more entries of agent settings")
}

func TestADocumentResolverThatReachesNoServerIsAPublishWarning(t *testing.T) {
	g := sample(t)
	g.Nodes[0].Agent.DocumentResolver = &DocumentResolver{Enabled: true}
	res, err := NewContractOnlyValidator().Validate(t.Context(), g)
	require.NoError(t, err)
	require.Contains(t, res.Warnings, `agent "researcher": document_resolver is enabled but names no server in server_names, so no call receives a document's content`)
}
