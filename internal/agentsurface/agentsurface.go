// Package agentsurface decides what an agent's model sees of its tools: which of the tools it
// binds pass the three filter levels (the agent's provider settings, the registration's
// tool_filter, the agent's mount of the server) and the run's selected servers, which load on
// demand through the tool_search meta-tool, which ask the user before a call, and in which form
// the model reads each input schema. The same decision answers the listing a platform shows its
// model (the pool's ListAgentTools) and, for one tool name, whether a call may reach it.
//
// It is pure: it reads a published graph, the registry's policies and the run's state, and does
// no I/O, so the pool's gates and the listing cannot disagree, and every rule is tested
// table-driven without a server.
package agentsurface

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
)

// Outcome is what Decide says of one tool name.
type Outcome string

// Outcomes. FilteredOut, NotLoaded and the unknowns are refusals before dispatch; their values
// are the refusal reasons the pool records.
const (
	// Visible: the model sees the tool and a call may reach it (every other gate still
	// applies).
	Visible Outcome = "visible"
	// FilteredOut: a filter level removed the tool (Decision.Level names it).
	FilteredOut Outcome = "filtered_out"
	// NotLoaded: the tool's server is deferred and tool_search has not loaded the tool yet.
	NotLoaded Outcome = "not_loaded"
	// UnknownTool: the agent binds no mcp_tool by that name.
	UnknownTool Outcome = "unknown_tool"
	// UnknownServer: the tool's server is not registered (State.Policies has no entry for it).
	UnknownServer Outcome = "unknown_server"
	// MetaTool: the name is one of the surface's own tools (Tool.Kind says which), answered by
	// the pool itself rather than by a server.
	MetaTool Outcome = "meta_tool"
	// SignInRequired: the tool's server signs each user in, and the run's user has not
	// connected it (State.Connections): the server's connect tool stands for its tools.
	SignInRequired Outcome = "sign_in_required"
	// NotDeclared: the run's user connected the tool's server, which did not declare the tool
	// to that user: the server's tools differ per user, and this one is not the user's.
	NotDeclared Outcome = "not_declared"
)

// Level names the filter that removed a tool, in the order the filters run: server filters
// before tool filters.
type Level string

// Levels.
const (
	// LevelProviderServers: the agent's include_servers or exclude_servers.
	LevelProviderServers Level = "provider_servers"
	// LevelSelectedServers: the run's selected_servers, else the agent's.
	LevelSelectedServers Level = "selected_servers"
	// LevelProviderTools: the agent's include_tools or exclude_tools.
	LevelProviderTools Level = "provider_tools"
	// LevelRegistration: the registration's tool_filter.
	LevelRegistration Level = "registration"
	// LevelMount: the agent's mount of the server.
	LevelMount Level = "mount"
)

// Kinds of listing entry.
const (
	// KindTool is a server's tool.
	KindTool = "tool"
	// KindToolSearch is the meta-tool that finds deferred tools and loads them.
	KindToolSearch = graph.ToolSearchName
	// KindConnect is a server's connect tool (graph.ConnectToolPrefix + server), which stands
	// for a server the run's user has not connected (signed in to) yet. See Agent.Resolve.
	KindConnect = "connect"
)

// ConnectToolName is the name of server ref's connect tool.
func ConnectToolName(ref string) string { return graph.ConnectToolPrefix + ref }

// connectSchema is a connect tool's input schema: it takes nothing.
var connectSchema = json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)

// connectTool is server ref's connect tool.
func connectTool(ref, description string) Tool {
	d := fmt.Sprintf("Connect the %s server for the user this run acts for: it answers with an authorization URL the user opens to sign in, or, once the user has signed in, connects the server, whose tools then join the listing.", ref)
	if description != "" {
		d += " The server: " + description
	}
	return Tool{Name: ConnectToolName(ref), Kind: KindConnect, ServerRef: ref, Title: "Connect " + ref, Description: d, InputSchema: connectSchema}
}

// Tool is one entry of the model's listing, in the shape of an MCP tools/list entry.
type Tool struct {
	// Name is what the model calls: the agent's binding name, or a meta-tool's.
	Name string
	Kind string
	// NodeID is the mcp_tool node the binding names; ServerRef and ToolName its server and the
	// server's name for the tool (empty for meta-tools).
	NodeID    string
	ServerRef string
	ToolName  string
	// Title and Description are the pinned declaration's.
	Title       string
	Description string
	// InputSchema is the pinned input schema, or its strict form when Strict: the form the
	// model writes arguments to and a call is checked against.
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage
	Annotations  json.RawMessage
	// Strict says InputSchema is the strict form (convert_schemas_to_strict); Unstrict turns
	// a call's arguments back into the pinned form.
	Strict bool
	// RequiresConfirmation says a call asks the user first.
	RequiresConfirmation bool
	// Deferred says the tool's server loads on demand; Loaded that tool_search loaded it.
	Deferred bool
	Loaded   bool
}

// Decision is what the surface says of one tool name.
type Decision struct {
	Outcome Outcome
	// Level names the filter, for FilteredOut.
	Level Level
	// Message says why, naming the setting to change, for every outcome but Visible.
	Message string
	// Tool is the entry (nil for UnknownTool).
	Tool *Tool
}

// Hidden is one of the agent's tools the model does not see.
type Hidden struct {
	Tool     Tool
	Decision Decision
}

// DeferredServer is a server whose tools load on demand.
type DeferredServer struct {
	Ref         string
	Description string
	// Unloaded counts its tools that pass every filter and tool_search has not loaded.
	Unloaded int
}

// Listing is the model's view of the agent's tools.
type Listing struct {
	// Tools are the entries a call may reach, sorted by name.
	Tools []Tool
	// Deferred are the deferred servers with tools that pass every filter, sorted by ref.
	Deferred []DeferredServer
	// Hidden are the agent's other tools, sorted by name.
	Hidden []Hidden
	// Selected is the selection in effect (only names among the agent's servers).
	Selected []string
}

// Agent is one agent's tools and settings, read once from a published version: what does not
// change while its runs last.
type Agent struct {
	id       string
	settings graph.ToolSettings
	// tools are the agent's bindings to mcp_tool nodes, sorted by name.
	tools   []Tool
	byName  map[string]int
	servers []string
	// deferred says, by server ref, whether its tools load on demand.
	deferred map[string]bool
}

// ErrUnknownAgent is wrapped by ForAgent's error for an id that is no agent of the graph.
var ErrUnknownAgent = fmt.Errorf("agentsurface: no such agent")

// ForAgent reads agent id of an indexed published graph. Bindings to nodes that are not
// mcp_tool nodes are no tools of the surface (Decide answers UnknownTool for them).
func ForAgent(ix *graph.Index, id string) (*Agent, error) {
	a, ok := ix.Agent(id)
	if !ok {
		return nil, fmt.Errorf("%w %q in graph %s (its agents: %s)", ErrUnknownAgent, id, ix.Graph().ID, strings.Join(ix.AgentIDs(), ", "))
	}
	ag := &Agent{id: id, settings: a.ToolSettings, byName: make(map[string]int), deferred: make(map[string]bool)}
	for _, b := range a.ToolBindings {
		n, ok := ix.Node(b.NodeID)
		if !ok || n.MCPTool == nil {
			continue
		}
		if _, dup := ag.byName[b.Name]; dup {
			continue
		}
		ag.byName[b.Name] = -1
		ag.tools = append(ag.tools, ag.tool(b, n))
	}
	slices.SortFunc(ag.tools, func(x, y Tool) int { return strings.Compare(x.Name, y.Name) })
	for i, t := range ag.tools {
		ag.byName[t.Name] = i
		if !slices.Contains(ag.servers, t.ServerRef) {
			ag.servers = append(ag.servers, t.ServerRef)
		}
	}
	slices.Sort(ag.servers)
	for _, ref := range ag.servers {
		d := ag.settings.DeferTools
		if m, ok := ag.settings.Mount(ref); ok && m.DeferTools != nil {
			d = *m.DeferTools
		}
		ag.deferred[ref] = d
	}
	for i := range ag.tools {
		ag.tools[i].Deferred = ag.deferred[ag.tools[i].ServerRef]
	}
	return ag, nil
}

// tool builds the entry of binding b to node n: the pinned declaration, its strict form where
// the agent asks for it, and the confirmation rule.
func (a *Agent) tool(b graph.ToolBinding, n *graph.Node) Tool {
	m := n.MCPTool
	t := Tool{
		Name: b.Name, Kind: KindTool, NodeID: n.ID, ServerRef: m.ServerRef, ToolName: m.ToolName,
		Title: shown(m.Title), Description: shown(m.Description), InputSchema: shownSchema(m.InputSchema),
		OutputSchema: shownOutputSchema(m.OutputSchema), Annotations: shownAnnotations(m.Annotations),
		RequiresConfirmation: requiresConfirmation(b.Confirmation, a.settings.ConfirmationDefaultOrNone(), m.Annotations),
	}
	if a.settings.ConvertSchemasToStrict && len(m.InputSchema) > 0 {
		// A pinned schema that cannot be converted (publish checked it is a JSON object, so
		// this does not happen) is shown as pinned, and Strict stays false, so a call is
		// checked against the form the model saw.
		if s, err := Strict(t.InputSchema); err == nil {
			t.InputSchema, t.Strict = s, true
		}
	}
	return t
}

// requiresConfirmation is the confirmation rule: the binding's own rule wins; else the agent's
// default, where non_read_only means every tool whose pinned annotations do not say
// readOnlyHint: true.
func requiresConfirmation(rule, def string, annotations json.RawMessage) bool {
	switch rule {
	case graph.ConfirmAlways:
		return true
	case graph.ConfirmNever:
		return false
	}
	switch def {
	case graph.ConfirmAll:
		return true
	case graph.ConfirmNonReadOnly:
		return !readOnly(annotations)
	}
	return false
}

// readOnly reports whether annotations say readOnlyHint: true; anything else (absent, false,
// not a boolean, unreadable) is not read-only.
func readOnly(annotations json.RawMessage) bool {
	var a struct {
		ReadOnlyHint any `json:"readOnlyHint"`
	}
	if len(annotations) == 0 || json.Unmarshal(annotations, &a) != nil {
		return false
	}
	return a.ReadOnlyHint == true
}

// ID is the agent's node id.
func (a *Agent) ID() string { return a.id }

// Settings are the agent's tool surface settings.
func (a *Agent) Settings() graph.ToolSettings { return a.settings }

// Servers are the refs of the servers the agent's tools come from, sorted: the policies
// Resolve needs.
func (a *Agent) Servers() []string { return slices.Clone(a.servers) }

// State is what a run adds to the agent's settings.
type State struct {
	// Policies holds the registry's policy of each of Servers() by ref (its tool_filter is
	// the registration's filter level, its description a deferred server's entry); a server
	// missing here is not registered, and its tools are UnknownServer.
	Policies map[string]mcpserver.Policy
	// Selected is the run's selected_servers; empty falls back to the agent's setting.
	Selected []string
	// Loaded holds the binding names of the deferred tools tool_search loaded in the run.
	Loaded map[string]bool
	// Connections holds, by ref, what the run's user has of each server whose policy says it
	// signs each user in (Policy.SignIn): a server missing here is not connected.
	Connections map[string]Connection
}

// Connection is a user's stored listing of a server that signs each user in, taken under the
// server's current sign-in settings.
type Connection struct {
	// Tools are the names of the tools the server declared to the user.
	Tools map[string]bool
}

// Surface is an agent's surface in one run at one moment: Resolve it again when the state
// changes (a tool is loaded, a policy changes).
type Surface struct {
	agent     *Agent
	decisions []Decision // parallel to agent.tools
	selected  []string
	deferred  []DeferredServer
	search    *Tool // the tool_search entry, nil without deferred servers
	// connect are the connect tools of the servers the run's user has to connect, by name.
	connect map[string]*Tool
}

// Resolve decides every tool of the agent in state st. A server that signs each user in and
// that the run's user has not connected lists as one entry, its connect tool (KindConnect,
// ConnectToolName(ref)), in place of its tools, which are SignInRequired; it stands there
// when at least one of its tools passes every filter, so a filter never shows a server.
func (a *Agent) Resolve(st State) *Surface {
	s := &Surface{agent: a, decisions: make([]Decision, len(a.tools))}
	s.selected = a.selection(st.Selected)
	unloaded := make(map[string]int)
	filterable := make(map[string]bool)
	for i := range a.tools {
		t := &a.tools[i]
		d := a.decide(t, st, s.selected)
		if d.Outcome == Visible || d.Outcome == NotLoaded {
			if t.Deferred {
				filterable[t.ServerRef] = true
			}
			if d.Outcome == NotLoaded {
				unloaded[t.ServerRef]++
			}
		}
		s.decisions[i] = d
	}
	for _, ref := range a.servers {
		if filterable[ref] {
			s.deferred = append(s.deferred, DeferredServer{Ref: ref, Description: st.Policies[ref].Description, Unloaded: unloaded[ref]})
		}
	}
	for _, d := range s.decisions {
		if d.Outcome != SignInRequired {
			continue
		}
		ref := d.Tool.ServerRef
		if s.connect == nil {
			s.connect = make(map[string]*Tool)
		}
		if _, ok := s.connect[ConnectToolName(ref)]; !ok {
			t := connectTool(ref, st.Policies[ref].Description)
			s.connect[t.Name] = &t
		}
	}
	if len(s.deferred) > 0 {
		s.search = toolSearch(s.deferred, a.settings.ConvertSchemasToStrict)
	}
	return s
}

// selection is the selection in effect: the run's, else the agent's, keeping only the names
// of the agent's servers. An empty result narrows nothing: a name that is none of the agent's
// servers is ignored, as if it had not been given.
func (a *Agent) selection(run []string) []string {
	picked := run
	if len(picked) == 0 {
		picked = a.settings.SelectedServers
	}
	var out []string
	for _, ref := range picked {
		if slices.Contains(a.servers, ref) && !slices.Contains(out, ref) {
			out = append(out, ref)
		}
	}
	slices.Sort(out)
	return out
}

// decide runs the filters on one tool, in order: server filters (the provider's, then the
// selection), then tool filters (the provider's, the registration's, the mount's), then
// deferral. Within a filter an exclude wins over an include, and an include list, once set,
// hides everything not on it.
func (a *Agent) decide(t *Tool, st State, selected []string) Decision {
	s := &a.settings
	out := func(o Outcome, l Level, format string, args ...any) Decision {
		return Decision{Outcome: o, Level: l, Tool: t, Message: fmt.Sprintf(format, args...)}
	}
	policy, registered := st.Policies[t.ServerRef]
	namespaced := graph.Namespaced(t.ServerRef, t.ToolName)
	switch {
	case !registered:
		return out(UnknownServer, "", "server %q of tool %q is no longer registered: the agent's tools of it are unavailable until an operator registers it again", t.ServerRef, t.Name)
	case slices.Contains(s.ExcludeServers, t.ServerRef):
		return out(FilteredOut, LevelProviderServers, "agent %q's exclude_servers lists server %q (change it with ringfence graphs settings --exclude-servers)", a.id, t.ServerRef)
	case len(s.IncludeServers) > 0 && !slices.Contains(s.IncludeServers, t.ServerRef):
		return out(FilteredOut, LevelProviderServers, "agent %q's include_servers does not list server %q (change it with ringfence graphs settings --include-servers)", a.id, t.ServerRef)
	case len(selected) > 0 && !slices.Contains(selected, t.ServerRef):
		return out(FilteredOut, LevelSelectedServers, "the selected servers in effect (%s: the run's, else the agent's selected_servers) do not include server %q", strings.Join(selected, ", "), t.ServerRef)
	case slices.Contains(s.ExcludeTools, namespaced):
		return out(FilteredOut, LevelProviderTools, "agent %q's exclude_tools lists %s (change it with ringfence graphs settings --exclude-tools)", a.id, namespaced)
	case len(s.IncludeTools) > 0 && !slices.Contains(s.IncludeTools, namespaced):
		return out(FilteredOut, LevelProviderTools, "agent %q's include_tools does not list %s (change it with ringfence graphs settings --include-tools)", a.id, namespaced)
	case !policy.Filter.Allows(t.ToolName):
		return out(FilteredOut, LevelRegistration, "server %q's tool_filter excludes tool %q (an operator changes it with ringfence servers update)", t.ServerRef, t.ToolName)
	}
	if m, ok := s.Mount(t.ServerRef); ok {
		switch {
		case slices.Contains(m.ExcludeTools, t.ToolName):
			return out(FilteredOut, LevelMount, "agent %q's mount of server %q excludes tool %q (change it with ringfence graphs mount)", a.id, t.ServerRef, t.ToolName)
		case len(m.IncludeTools) > 0 && !slices.Contains(m.IncludeTools, t.ToolName):
			return out(FilteredOut, LevelMount, "agent %q's mount of server %q does not include tool %q (change it with ringfence graphs mount)", a.id, t.ServerRef, t.ToolName)
		}
	}
	if policy.SignIn != "" {
		conn, ok := st.Connections[t.ServerRef]
		switch {
		case !ok:
			return out(SignInRequired, "", "server %q signs each user in, and the user this run acts for has not connected it: call %s first, which answers with the URL the user opens to sign in", t.ServerRef, ConnectToolName(t.ServerRef))
		case !conn.Tools[t.ToolName]:
			return out(NotDeclared, "", "server %q does not declare tool %q to the user this run acts for: it was not in the tools the server last listed to them (its tools differ per user)", t.ServerRef, t.ToolName)
		}
	}
	if t.Deferred && !st.Loaded[t.Name] {
		return out(NotLoaded, "", "tool %q of server %q loads on demand and is not loaded in this run: find it with %s first", t.Name, t.ServerRef, graph.ToolSearchName)
	}
	d := Decision{Outcome: Visible, Tool: t}
	if t.Deferred {
		loaded := *t
		loaded.Loaded = true
		d.Tool = &loaded
	}
	return d
}

// DecideTool decides the tool the agent binds as name in state st, as Resolve(st).Decide(name)
// does for it, reading only the policy of the tool's own server: a call to one tool asks the
// registry for that server alone. It never answers MetaTool (tool_search is decided over
// every server: Resolve); a name the agent binds no tool by is UnknownTool.
func (a *Agent) DecideTool(name string, st State) Decision {
	i, ok := a.byName[name]
	if !ok {
		return Decision{Outcome: UnknownTool, Message: fmt.Sprintf("agent %q binds no mcp_tool named %q", a.id, name)}
	}
	return a.decide(&a.tools[i], st, a.selection(st.Selected))
}

// Decide says what a call to name meets: the tool_search meta-tool when the agent has
// deferred servers, else the tool the agent binds by name, decided.
func (s *Surface) Decide(name string) Decision {
	if s.search != nil && name == s.search.Name {
		return Decision{Outcome: MetaTool, Tool: s.search}
	}
	if t, ok := s.connect[name]; ok {
		return Decision{Outcome: MetaTool, Tool: t}
	}
	i, ok := s.agent.byName[name]
	if !ok {
		return Decision{Outcome: UnknownTool, Message: fmt.Sprintf("agent %q binds no mcp_tool named %q", s.agent.id, name)}
	}
	return s.decisions[i]
}

// Listing returns the model's view: the visible tools and tool_search sorted by name, the
// deferred servers, and the hidden tools with why.
func (s *Surface) Listing() Listing {
	l := Listing{Deferred: slices.Clone(s.deferred), Selected: slices.Clone(s.selected)}
	for i, d := range s.decisions {
		if d.Outcome == Visible {
			l.Tools = append(l.Tools, *d.Tool)
		} else {
			l.Hidden = append(l.Hidden, Hidden{Tool: s.agent.tools[i], Decision: d})
		}
	}
	if s.search != nil {
		l.Tools = append(l.Tools, *s.search)
	}
	for _, t := range s.connect {
		l.Tools = append(l.Tools, *t)
	}
	slices.SortStableFunc(l.Tools, func(x, y Tool) int { return strings.Compare(x.Name, y.Name) })
	return l
}

// Selected is the selection in effect.
func (s *Surface) Selected() []string { return slices.Clone(s.selected) }
