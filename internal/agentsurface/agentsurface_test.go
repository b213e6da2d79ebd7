package agentsurface

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
)

// fixtureTool is one tool of the test graph: a server's tool, whether its annotations say
// read-only, and a confirmation rule on its binding.
type fixtureTool struct {
	server, tool string
	readOnly     bool
	rule         string
}

var fixtureTools = []fixtureTool{
	{server: "docs", tool: "read_file", readOnly: true},
	{server: "docs", tool: "write_file"},
	{server: "tickets", tool: "search_tickets", readOnly: true},
	{server: "tickets", tool: "delete_ticket"},
}

// agentGraph is a published graph whose agent "a" binds tools (each as <server>__<tool>) under
// settings.
func agentGraph(settings graph.ToolSettings, tools ...fixtureTool) *graph.Index {
	if tools == nil {
		tools = fixtureTools
	}
	a := &graph.AgentNode{ToolSettings: settings}
	g := &graph.Graph{ID: "g", Nodes: []graph.Node{{ID: "a", Kind: graph.KindAgent, Agent: a}}}
	for _, t := range tools {
		id := t.server + "__" + t.tool
		ann := json.RawMessage(`{"readOnlyHint":false}`)
		if t.readOnly {
			ann = json.RawMessage(`{"readOnlyHint":true}`)
		}
		g.Nodes = append(g.Nodes, graph.Node{ID: id, Kind: graph.KindMCPTool, MCPTool: &graph.MCPToolNode{
			ServerRef: t.server, ToolName: t.tool, Title: strings.ReplaceAll(t.tool, "_", " "),
			Description: "Tool " + t.tool + " of " + t.server + ".",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}}}`), Annotations: ann,
		}})
		a.ToolBindings = append(a.ToolBindings, graph.ToolBinding{Name: id, NodeID: id, Confirmation: t.rule})
	}
	// An opaque node bound by name is no tool of the surface.
	g.Nodes = append(g.Nodes, graph.Node{ID: "note", Kind: "note", Opaque: json.RawMessage(`{}`)})
	a.ToolBindings = append(a.ToolBindings, graph.ToolBinding{Name: "note", NodeID: "note"})
	return graph.NewIndex(g)
}

// registered is every fixture server registered, with filters by ref.
func registered(filters map[string]mcpserver.ToolFilter) map[string]mcpserver.Policy {
	out := map[string]mcpserver.Policy{}
	for _, ref := range []string{"docs", "tickets"} {
		out[ref] = mcpserver.Policy{Ref: ref, Description: "The " + ref + " server.", Filter: filters[ref]}
	}
	return out
}

func surface(t *testing.T, settings graph.ToolSettings, st State, tools ...fixtureTool) *Surface {
	t.Helper()
	a, err := ForAgent(agentGraph(settings, tools...), "a")
	require.NoError(t, err)
	if st.Policies == nil {
		st.Policies = registered(nil)
	}
	return a.Resolve(st)
}

func yes() *bool { b := true; return &b }
func no() *bool  { b := false; return &b }

// TestFilterLevels decides each fixture tool under each filter level alone and together: the
// expected outcome per tool is visible ("") or the level that removed it.
func TestFilterLevels(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings graph.ToolSettings
		state    State
		want     map[string]Level // tool → level; missing: visible
	}{
		{name: "no filters"},
		{name: "include_servers", settings: graph.ToolSettings{IncludeServers: []string{"docs"}},
			want: map[string]Level{"tickets__search_tickets": LevelProviderServers, "tickets__delete_ticket": LevelProviderServers}},
		{name: "exclude_servers", settings: graph.ToolSettings{ExcludeServers: []string{"docs"}},
			want: map[string]Level{"docs__read_file": LevelProviderServers, "docs__write_file": LevelProviderServers}},
		{name: "exclude_servers beats include_servers", settings: graph.ToolSettings{IncludeServers: []string{"docs", "tickets"}, ExcludeServers: []string{"docs"}},
			want: map[string]Level{"docs__read_file": LevelProviderServers, "docs__write_file": LevelProviderServers}},
		{name: "an include list of an unknown server hides everything", settings: graph.ToolSettings{IncludeServers: []string{"nope"}},
			want: map[string]Level{"docs__read_file": LevelProviderServers, "docs__write_file": LevelProviderServers,
				"tickets__search_tickets": LevelProviderServers, "tickets__delete_ticket": LevelProviderServers}},
		{name: "include_tools", settings: graph.ToolSettings{IncludeTools: []string{"docs__read_file"}},
			want: map[string]Level{"docs__write_file": LevelProviderTools, "tickets__search_tickets": LevelProviderTools, "tickets__delete_ticket": LevelProviderTools}},
		{name: "exclude_tools", settings: graph.ToolSettings{ExcludeTools: []string{"tickets__delete_ticket"}},
			want: map[string]Level{"tickets__delete_ticket": LevelProviderTools}},
		{name: "exclude_tools beats include_tools", settings: graph.ToolSettings{IncludeTools: []string{"docs__read_file", "docs__write_file"}, ExcludeTools: []string{"docs__write_file"}},
			want: map[string]Level{"docs__write_file": LevelProviderTools, "tickets__search_tickets": LevelProviderTools, "tickets__delete_ticket": LevelProviderTools}},
		{name: "registration tool_filter exclude", state: State{Policies: registered(map[string]mcpserver.ToolFilter{"docs": {Exclude: []string{"write_file"}}})},
			want: map[string]Level{"docs__write_file": LevelRegistration}},
		{name: "registration tool_filter include", state: State{Policies: registered(map[string]mcpserver.ToolFilter{"tickets": {Include: []string{"search_tickets"}}})},
			want: map[string]Level{"tickets__delete_ticket": LevelRegistration}},
		{name: "mount include", settings: graph.ToolSettings{Mounts: []graph.Mount{{Name: "tickets", IncludeTools: []string{"search_tickets"}}}},
			want: map[string]Level{"tickets__delete_ticket": LevelMount}},
		{name: "mount exclude beats mount include", settings: graph.ToolSettings{Mounts: []graph.Mount{{Name: "docs", IncludeTools: []string{"read_file", "write_file"}, ExcludeTools: []string{"read_file"}}}},
			want: map[string]Level{"docs__read_file": LevelMount}},
		{name: "selected_servers of the run", state: State{Selected: []string{"tickets"}},
			want: map[string]Level{"docs__read_file": LevelSelectedServers, "docs__write_file": LevelSelectedServers}},
		{name: "selected_servers of the agent", settings: graph.ToolSettings{SelectedServers: []string{"docs"}},
			want: map[string]Level{"tickets__search_tickets": LevelSelectedServers, "tickets__delete_ticket": LevelSelectedServers}},
		{name: "the run's selection replaces the agent's", settings: graph.ToolSettings{SelectedServers: []string{"docs"}}, state: State{Selected: []string{"tickets"}},
			want: map[string]Level{"docs__read_file": LevelSelectedServers, "docs__write_file": LevelSelectedServers}},
		{name: "a selection only narrows: an unknown name is ignored", state: State{Selected: []string{"tickets", "elsewhere"}},
			want: map[string]Level{"docs__read_file": LevelSelectedServers, "docs__write_file": LevelSelectedServers}},
		{name: "a selection of unknown names narrows nothing", state: State{Selected: []string{"elsewhere"}}},
		{name: "a selection never brings back an excluded server", settings: graph.ToolSettings{ExcludeServers: []string{"docs"}}, state: State{Selected: []string{"docs"}},
			want: map[string]Level{"docs__read_file": LevelProviderServers, "docs__write_file": LevelProviderServers,
				"tickets__search_tickets": LevelSelectedServers, "tickets__delete_ticket": LevelSelectedServers}},
		{name: "server filters run before tool filters",
			settings: graph.ToolSettings{ExcludeServers: []string{"tickets"}, ExcludeTools: []string{"tickets__delete_ticket", "docs__write_file"}},
			want:     map[string]Level{"docs__write_file": LevelProviderTools, "tickets__search_tickets": LevelProviderServers, "tickets__delete_ticket": LevelProviderServers}},
		{name: "all levels together",
			settings: graph.ToolSettings{
				IncludeServers: []string{"docs", "tickets"}, IncludeTools: []string{"docs__read_file", "docs__write_file", "tickets__search_tickets", "tickets__delete_ticket"},
				Mounts: []graph.Mount{{Name: "tickets", ExcludeTools: []string{"search_tickets"}}},
			},
			state: State{Policies: registered(map[string]mcpserver.ToolFilter{"docs": {Exclude: []string{"write_file"}}}), Selected: []string{"docs", "tickets"}},
			want:  map[string]Level{"docs__write_file": LevelRegistration, "tickets__search_tickets": LevelMount}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := surface(t, tc.settings, tc.state)
			ag, err := ForAgent(agentGraph(tc.settings), "a")
			require.NoError(t, err)
			policies := tc.state.Policies
			if policies == nil {
				policies = registered(nil)
			}
			for _, ft := range fixtureTools {
				name := ft.server + "__" + ft.tool
				d := s.Decide(name)
				// A call decides its one tool knowing only its own server's policy, and
				// decides it alike.
				own := State{Policies: map[string]mcpserver.Policy{ft.server: policies[ft.server]}, Selected: tc.state.Selected, Loaded: tc.state.Loaded}
				one := ag.DecideTool(name, own)
				require.Equal(t, []any{d.Outcome, d.Level, d.Message}, []any{one.Outcome, one.Level, one.Message}, name)
				if level, hidden := tc.want[name]; hidden {
					require.Equal(t, FilteredOut, d.Outcome, "%s: %s", name, d.Message)
					require.Equal(t, level, d.Level, "%s: %s", name, d.Message)
					require.NotEmpty(t, d.Message)
				} else {
					require.Equal(t, Visible, d.Outcome, "%s: %s", name, d.Message)
				}
			}
			// The listing holds exactly the visible tools, and hides the rest with the same
			// decision.
			l := s.Listing()
			require.Len(t, l.Tools, len(fixtureTools)-len(tc.want))
			require.Len(t, l.Hidden, len(tc.want))
			for _, h := range l.Hidden {
				require.Equal(t, tc.want[h.Tool.Name], h.Decision.Level)
			}
		})
	}
}

func TestFilterMessagesNameTheSetting(t *testing.T) {
	s := surface(t, graph.ToolSettings{ExcludeTools: []string{"docs__write_file"}, Mounts: []graph.Mount{{Name: "tickets", IncludeTools: []string{"search_tickets"}}}}, State{})
	require.Contains(t, s.Decide("docs__write_file").Message, `agent "a"'s exclude_tools lists docs__write_file`)
	require.Contains(t, s.Decide("tickets__delete_ticket").Message, `agent "a"'s mount of server "tickets" does not include tool "delete_ticket"`)
}

func TestUnknownToolsAndServers(t *testing.T) {
	s := surface(t, graph.ToolSettings{}, State{Policies: map[string]mcpserver.Policy{"docs": {Ref: "docs"}}})
	require.Equal(t, UnknownTool, s.Decide("nope").Outcome)
	require.Equal(t, UnknownTool, s.Decide("note").Outcome, "a binding to a node that is no mcp_tool is no tool of the surface")
	require.Nil(t, s.Decide("nope").Tool)
	d := s.Decide("tickets__search_tickets")
	require.Equal(t, UnknownServer, d.Outcome, "a server without a policy is not registered")
	require.Contains(t, d.Message, `server "tickets"`)
	require.Equal(t, Visible, s.Decide("docs__read_file").Outcome)
	require.Equal(t, UnknownTool, s.Decide(graph.ToolSearchName).Outcome, "no deferred server, no tool_search")

	a, err := ForAgent(agentGraph(graph.ToolSettings{DeferTools: true}), "a")
	require.NoError(t, err)
	st := State{Policies: registered(nil)}
	require.Equal(t, MetaTool, a.Resolve(st).Decide(graph.ToolSearchName).Outcome)
	require.Equal(t, UnknownTool, a.DecideTool(graph.ToolSearchName, st).Outcome, "tool_search is decided over every server, never as one tool")
	require.Equal(t, UnknownTool, a.DecideTool("note", st).Outcome)
	require.Equal(t, NotLoaded, a.DecideTool("docs__read_file", st).Outcome)
	require.Equal(t, UnknownServer, a.DecideTool("docs__read_file", State{}).Outcome)

	_, err = ForAgent(agentGraph(graph.ToolSettings{}), "b")
	require.ErrorIs(t, err, ErrUnknownAgent)
	require.Contains(t, err.Error(), "its agents: a")
}

// TestDeferral: a deferred server's tools are not loaded until tool_search loads them; the
// server is one entry, tool_search is listed, and a mount's defer_tools overrides the agent's.
func TestDeferral(t *testing.T) {
	for _, tc := range []struct {
		name          string
		settings      graph.ToolSettings
		loaded        []string
		wantNotLoaded []string
		wantDeferred  []DeferredServer
	}{
		{name: "not deferred"},
		{name: "every server deferred", settings: graph.ToolSettings{DeferTools: true},
			wantNotLoaded: []string{"docs__read_file", "docs__write_file", "tickets__search_tickets", "tickets__delete_ticket"},
			wantDeferred:  []DeferredServer{{Ref: "docs", Description: "The docs server.", Unloaded: 2}, {Ref: "tickets", Description: "The tickets server.", Unloaded: 2}}},
		{name: "a mount undefers its server", settings: graph.ToolSettings{DeferTools: true, Mounts: []graph.Mount{{Name: "docs", DeferTools: no()}}},
			wantNotLoaded: []string{"tickets__search_tickets", "tickets__delete_ticket"},
			wantDeferred:  []DeferredServer{{Ref: "tickets", Description: "The tickets server.", Unloaded: 2}}},
		{name: "a mount defers its server", settings: graph.ToolSettings{Mounts: []graph.Mount{{Name: "tickets", DeferTools: yes()}}},
			wantNotLoaded: []string{"tickets__search_tickets", "tickets__delete_ticket"},
			wantDeferred:  []DeferredServer{{Ref: "tickets", Description: "The tickets server.", Unloaded: 2}}},
		{name: "loaded tools are visible", settings: graph.ToolSettings{DeferTools: true}, loaded: []string{"docs__read_file", "docs__write_file", "tickets__delete_ticket"},
			wantNotLoaded: []string{"tickets__search_tickets"},
			wantDeferred:  []DeferredServer{{Ref: "docs", Description: "The docs server.", Unloaded: 0}, {Ref: "tickets", Description: "The tickets server.", Unloaded: 1}}},
		{name: "filters run before deferral", settings: graph.ToolSettings{DeferTools: true, ExcludeServers: []string{"docs"}, ExcludeTools: []string{"tickets__delete_ticket"}},
			loaded:        []string{"docs__read_file"},
			wantNotLoaded: []string{"tickets__search_tickets"},
			wantDeferred:  []DeferredServer{{Ref: "tickets", Description: "The tickets server.", Unloaded: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loaded := map[string]bool{}
			for _, n := range tc.loaded {
				loaded[n] = true
			}
			s := surface(t, tc.settings, State{Loaded: loaded})
			l := s.Listing()
			require.Equal(t, tc.wantDeferred, l.Deferred)
			var notLoaded []string
			for _, ft := range fixtureTools {
				name := ft.server + "__" + ft.tool
				d := s.Decide(name)
				if d.Outcome == NotLoaded {
					notLoaded = append(notLoaded, name)
					require.Contains(t, d.Message, "tool_search")
				}
			}
			require.Equal(t, tc.wantNotLoaded, notLoaded)
			search := s.Decide(graph.ToolSearchName)
			if tc.wantDeferred == nil {
				require.Equal(t, UnknownTool, search.Outcome)
				for _, tool := range l.Tools {
					require.NotEqual(t, graph.ToolSearchName, tool.Name)
				}
				return
			}
			require.Equal(t, MetaTool, search.Outcome)
			require.Equal(t, KindToolSearch, search.Tool.Kind)
			require.Contains(t, names(l.Tools), graph.ToolSearchName)
			for _, d := range tc.wantDeferred {
				require.Contains(t, search.Tool.Description, "- "+d.Ref+": "+d.Description)
			}
			for _, n := range tc.loaded {
				if d := s.Decide(n); d.Outcome == Visible {
					require.True(t, d.Tool.Loaded && d.Tool.Deferred, n)
				}
			}
		})
	}
}

func names(tools []Tool) []string {
	out := make([]string, len(tools))
	for i, t := range tools {
		out[i] = t.Name
	}
	return out
}

// TestListingOrderIsDeterministic: tools by name (tool_search among them), whatever the order
// of the bindings.
func TestListingOrderIsDeterministic(t *testing.T) {
	reversed := []fixtureTool{fixtureTools[3], fixtureTools[2], fixtureTools[1], fixtureTools[0]}
	settings := graph.ToolSettings{Mounts: []graph.Mount{{Name: "tickets", DeferTools: yes()}}}
	want := []string{"docs__read_file", "docs__write_file", "tool_search"}
	for _, tools := range [][]fixtureTool{fixtureTools, reversed} {
		l := surface(t, settings, State{}, tools...).Listing()
		require.Equal(t, want, names(l.Tools))
		require.Equal(t, []string{"tickets__delete_ticket", "tickets__search_tickets"}, hiddenNames(l))
	}
}

func hiddenNames(l Listing) []string {
	out := make([]string, len(l.Hidden))
	for i, h := range l.Hidden {
		out[i] = h.Tool.Name
	}
	return out
}

// TestConfirmation: the binding's rule wins; else confirmation_default, where non_read_only
// asks for every tool whose pinned annotations do not say readOnlyHint: true.
func TestConfirmation(t *testing.T) {
	rules := []fixtureTool{
		{server: "docs", tool: "read_file", readOnly: true, rule: graph.ConfirmAlways},
		{server: "docs", tool: "write_file", rule: graph.ConfirmNever},
		{server: "tickets", tool: "search_tickets", readOnly: true},
		{server: "tickets", tool: "delete_ticket"},
	}
	for _, tc := range []struct {
		name  string
		def   string
		tools []fixtureTool
		want  []string // the tools that ask
	}{
		{name: "default none", tools: fixtureTools},
		{name: "none", def: graph.ConfirmNone, tools: fixtureTools},
		{name: "all", def: graph.ConfirmAll, tools: fixtureTools, want: []string{"docs__read_file", "docs__write_file", "tickets__search_tickets", "tickets__delete_ticket"}},
		{name: "non_read_only by annotation", def: graph.ConfirmNonReadOnly, tools: fixtureTools, want: []string{"docs__write_file", "tickets__delete_ticket"}},
		{name: "rules win over none", def: graph.ConfirmNone, tools: rules, want: []string{"docs__read_file"}},
		{name: "rules win over all", def: graph.ConfirmAll, tools: rules, want: []string{"docs__read_file", "tickets__search_tickets", "tickets__delete_ticket"}},
		{name: "rules win over non_read_only", def: graph.ConfirmNonReadOnly, tools: rules, want: []string{"docs__read_file", "tickets__delete_ticket"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := surface(t, graph.ToolSettings{ConfirmationDefault: tc.def}, State{}, tc.tools...)
			var asks []string
			for _, ft := range tc.tools {
				if d := s.Decide(ft.server + "__" + ft.tool); d.Tool.RequiresConfirmation {
					asks = append(asks, d.Tool.Name)
				}
			}
			require.Equal(t, tc.want, asks)
		})
	}
	require.False(t, surface(t, graph.ToolSettings{DeferTools: true, ConfirmationDefault: graph.ConfirmAll}, State{}).Decide(graph.ToolSearchName).Tool.RequiresConfirmation,
		"tool_search asks nobody: it reaches no server")
}

func TestReadOnlyNeedsATrueHint(t *testing.T) {
	for raw, want := range map[string]bool{
		`{"readOnlyHint":true}`:                        true,
		`{"readOnlyHint":false}`:                       false,
		`{"readOnlyHint":"true"}`:                      false,
		`{"destructiveHint":false}`:                    false,
		`{"readOnlyHint":true,"destructiveHint":true}`: true,
		``:   false,
		`[]`: false,
	} {
		require.Equal(t, want, readOnly(json.RawMessage(raw)), raw)
	}
}

// TestStrictSchemasInTheListing: with convert_schemas_to_strict the listing carries the
// strict form, and Strict is set; without it the pinned schema is shown as it is.
func TestStrictSchemasInTheListing(t *testing.T) {
	s := surface(t, graph.ToolSettings{ConvertSchemasToStrict: true}, State{})
	d := s.Decide("docs__read_file")
	require.True(t, d.Tool.Strict)
	require.JSONEq(t, `{"type":"object","properties":{"q":{"type":["string","null"]}},"required":["q"],"additionalProperties":false}`, string(d.Tool.InputSchema))

	plain := surface(t, graph.ToolSettings{}, State{}).Decide("docs__read_file")
	require.False(t, plain.Tool.Strict)
	require.JSONEq(t, `{"type":"object","properties":{"q":{"type":"string"}}}`, string(plain.Tool.InputSchema))

	search := surface(t, graph.ToolSettings{ConvertSchemasToStrict: true, DeferTools: true}, State{}).Decide(graph.ToolSearchName)
	require.True(t, search.Tool.Strict, "tool_search's schema is strict too")
	require.JSONEq(t, `{"type":"object","properties":{
		"query":{"type":"string","minLength":1,"maxLength":512,"description":"Words to look for in the tools' names, titles and descriptions."},
		"server":{"type":["string","null"],"enum":["docs","tickets",null],"description":"Search only this server's tools."}},
		"required":["query","server"],"additionalProperties":false}`, string(search.Tool.InputSchema))
}

func TestStrict(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"optional properties become required and nullable",
			`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"required":["a"]}`,
			`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":["integer","null"]}},"required":["a","b"],"additionalProperties":false}`},
		{"nested objects and arrays",
			`{"type":"object","properties":{"filter":{"type":"object","properties":{"tag":{"type":"string"},"limit":{"type":"integer"}},"required":["tag"]},
			  "items":{"type":"array","items":{"type":"object","properties":{"id":{"type":"string"}}}}},"required":["filter","items"]}`,
			`{"type":"object","properties":{
			   "filter":{"type":"object","properties":{"tag":{"type":"string"},"limit":{"type":["integer","null"]}},"required":["limit","tag"],"additionalProperties":false},
			   "items":{"type":"array","items":{"type":"object","properties":{"id":{"type":["string","null"]}},"required":["id"],"additionalProperties":false}}},
			 "required":["filter","items"],"additionalProperties":false}`},
		{"an optional nested object is closed and nullable",
			`{"type":"object","properties":{"opts":{"type":"object","properties":{"x":{"type":"boolean"}}}}}`,
			`{"type":"object","properties":{"opts":{"type":["object","null"],"properties":{"x":{"type":["boolean","null"]}},"required":["x"],"additionalProperties":false}},"required":["opts"],"additionalProperties":false}`},
		{"an enum takes null too",
			`{"type":"object","properties":{"mode":{"type":"string","enum":["a","b"]}}}`,
			`{"type":"object","properties":{"mode":{"type":["string","null"],"enum":["a","b",null]}},"required":["mode"],"additionalProperties":false}`},
		{"a $ref or const becomes an alternative with null, its description kept outside",
			`{"type":"object","$defs":{"id":{"type":"object","properties":{"v":{"type":"string"}}}},
			  "properties":{"r":{"$ref":"#/$defs/id","description":"the id"},"c":{"const":3}}}`,
			`{"type":"object","$defs":{"id":{"type":"object","properties":{"v":{"type":["string","null"]}},"required":["v"],"additionalProperties":false}},
			  "properties":{"r":{"description":"the id","anyOf":[{"$ref":"#/$defs/id"},{"type":"null"}]},"c":{"anyOf":[{"const":3},{"type":"null"}]}},
			  "required":["c","r"],"additionalProperties":false}`},
		{"anyOf branches are made strict; one that takes null stays as it is",
			`{"type":"object","properties":{"v":{"anyOf":[{"type":"object","properties":{"a":{"type":"string"}}},{"type":"null"}]}}}`,
			`{"type":"object","properties":{"v":{"anyOf":[{"type":"object","properties":{"a":{"type":["string","null"]}},"required":["a"],"additionalProperties":false},{"type":"null"}]}},"required":["v"],"additionalProperties":false}`},
		{"a map keeps its additional properties; an allOf object stays open",
			`{"type":"object","properties":{"labels":{"type":"object","additionalProperties":{"type":"string"}},"both":{"allOf":[{"type":"object","properties":{"a":{"type":"string"}}}],"properties":{"b":{"type":"string"}}}},"required":["labels","both"]}`,
			`{"type":"object","properties":{"labels":{"type":"object","additionalProperties":{"type":"string"}},"both":{"allOf":[{"type":"object","properties":{"a":{"type":"string"}}}],"properties":{"b":{"type":["string","null"]}},"required":["b"]}},"required":["both","labels"],"additionalProperties":false}`},
		{"an object without properties is closed",
			`{"type":"object"}`,
			`{"type":"object","additionalProperties":false}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Strict(json.RawMessage(tc.in))
			require.NoError(t, err)
			require.JSONEq(t, tc.want, string(got))
			again, err := Strict(got)
			require.NoError(t, err)
			require.JSONEq(t, string(got), string(again), "strict form is a fixed point")
		})
	}
	got, err := Strict(json.RawMessage(`{"type":"object","properties":{"n":{"type":"number","maximum":1.0E2,"default":0.10}}}`))
	require.NoError(t, err)
	require.Contains(t, string(got), `"default":0.10,"maximum":1.0E2`, "numbers keep their form")
	_, err = Strict(json.RawMessage(`[1]`))
	require.Error(t, err)
}

func TestUnstrictDropsTheNullsThatStandForOmittedProperties(t *testing.T) {
	pinned := json.RawMessage(`{"type":"object","required":["a"],"properties":{
		"a":{"type":"string"},"b":{"type":"integer"},"n":{"type":["string","null"]},
		"opts":{"type":"object","properties":{"x":{"type":"boolean"}}},
		"list":{"type":"array","items":{"type":"object","properties":{"id":{"type":"string"},"tag":{"type":"string"}}}}}}`)
	args := map[string]any{"a": "v", "b": nil, "n": nil, "opts": map[string]any{"x": nil}, "list": []any{map[string]any{"id": "1", "tag": nil}}}
	got, err := Unstrict(pinned, args)
	require.NoError(t, err)
	require.Equal(t, map[string]any{"a": "v", "n": nil, "opts": map[string]any{}, "list": []any{map[string]any{"id": "1"}}}, got,
		"b, opts.x and list[0].tag were left out; n may be null")
}

// TestSearch ranks the deferred tools by name, then title, then description matches; ties
// go by name; the same query always answers the same.
func TestSearch(t *testing.T) {
	tools := []fixtureTool{
		{server: "docs", tool: "read_file", readOnly: true},
		{server: "docs", tool: "write_file"},
		{server: "docs", tool: "search"},
		{server: "tickets", tool: "search_tickets", readOnly: true},
		{server: "tickets", tool: "delete_ticket"},
	}
	settings := graph.ToolSettings{DeferTools: true, ExcludeTools: []string{"tickets__delete_ticket"}, Mounts: []graph.Mount{{Name: "docs", IncludeTools: []string{"read_file", "search", "write_file"}}}}
	s := surface(t, settings, State{Loaded: map[string]bool{"docs__read_file": true}}, tools...)
	matchNames := func(ms []Match) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Tool.Name)
		}
		return out
	}
	for _, tc := range []struct {
		name, query, server string
		limit               int
		want                []string
	}{
		{name: "the whole name first", query: "search", want: []string{"docs__search", "tickets__search_tickets"}},
		{name: "several words add up", query: "search tickets", want: []string{"tickets__search_tickets", "docs__search"}},
		{name: "part of a word counts less", query: "ticket", want: []string{"tickets__search_tickets"}},
		{name: "title and description match", query: "file", want: []string{"docs__read_file", "docs__write_file"}},
		{name: "loaded tools are found too", query: "read", want: []string{"docs__read_file"}},
		{name: "one server", query: "search", server: "tickets", want: []string{"tickets__search_tickets"}},
		{name: "filtered tools are never found", query: "delete", want: nil},
		{name: "case and punctuation do not matter", query: "WRITE-File!", want: []string{"docs__write_file", "docs__read_file"}},
		{name: "limit", query: "docs", limit: 2, want: []string{"docs__read_file", "docs__search"}},
		{name: "nothing", query: "  ", want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := s.Search(tc.query, tc.server, tc.limit)
			require.Equal(t, tc.want, matchNames(got))
			for i := 1; i < len(got); i++ {
				require.GreaterOrEqual(t, got[i-1].Score, got[i].Score)
			}
			require.Equal(t, got, s.Search(tc.query, tc.server, tc.limit), "deterministic")
		})
	}
	ms := s.Search("read", "", 0)
	require.True(t, ms[0].Tool.Loaded, "a loaded tool's entry says so")
	require.False(t, s.Search("write", "", 0)[0].Tool.Loaded)
	require.Nil(t, surface(t, graph.ToolSettings{}, State{}, tools...).Search("search", "", 0), "without deferral nothing is searchable")
}

func TestToolSearchDescriptionIsBounded(t *testing.T) {
	var deferred []DeferredServer
	for i := range maxListedServers + 3 {
		deferred = append(deferred, DeferredServer{Ref: fmt.Sprintf("s%03d", i), Description: strings.Repeat("é", 400)})
	}
	ts := toolSearch(deferred, false)
	require.Contains(t, ts.Description, "- and 3 more")
	require.LessOrEqual(t, len(ts.Description), (maxListedServers+1)*(maxServerDescription+16)+400)
	require.True(t, json.Valid(ts.InputSchema))
}

// TestSignIn decides the tools of a server that signs each user in: not connected, its tools
// are sign_in_required and its connect tool stands for them (a meta-tool Decide answers);
// connected, the tools the server declared to the user are visible and the others
// not_declared; filters still run first, and a server whose every tool is filtered out shows
// no connect tool.
func TestSignIn(t *testing.T) {
	signIn := func() map[string]mcpserver.Policy {
		p := registered(nil)
		tickets := p["tickets"]
		tickets.SignIn = "fp"
		p["tickets"] = tickets
		return p
	}
	for _, tc := range []struct {
		name        string
		settings    graph.ToolSettings
		connections map[string]Connection
		want        map[string]Outcome
		wantConnect bool
	}{
		{name: "not connected", wantConnect: true,
			want: map[string]Outcome{"docs__read_file": Visible, "tickets__search_tickets": SignInRequired, "tickets__delete_ticket": SignInRequired}},
		{name: "connected: only the user's tools", connections: map[string]Connection{"tickets": {Tools: map[string]bool{"search_tickets": true}}},
			want: map[string]Outcome{"docs__read_file": Visible, "tickets__search_tickets": Visible, "tickets__delete_ticket": NotDeclared}},
		{name: "filters first", settings: graph.ToolSettings{ExcludeServers: []string{"tickets"}},
			want: map[string]Outcome{"tickets__search_tickets": FilteredOut, "tickets__delete_ticket": FilteredOut}},
		{name: "deferred and not connected", settings: graph.ToolSettings{DeferTools: true}, wantConnect: true,
			want: map[string]Outcome{"docs__read_file": NotLoaded, "tickets__search_tickets": SignInRequired}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := surface(t, tc.settings, State{Policies: signIn(), Connections: tc.connections})
			for name, want := range tc.want {
				require.Equal(t, want, s.Decide(name).Outcome, name)
			}
			connect := s.Decide(ConnectToolName("tickets"))
			var listed []string
			for _, tool := range s.Listing().Tools {
				listed = append(listed, tool.Name)
			}
			if tc.wantConnect {
				require.Equal(t, MetaTool, connect.Outcome)
				require.Equal(t, KindConnect, connect.Tool.Kind)
				require.Contains(t, listed, "mcp_oauth_connect_tickets")
				require.NotContains(t, listed, "tickets__search_tickets")
			} else {
				require.Equal(t, UnknownTool, connect.Outcome)
				require.NotContains(t, listed, "mcp_oauth_connect_tickets")
			}
			require.NotContains(t, listed, "mcp_oauth_connect_docs")
		})
	}
}
