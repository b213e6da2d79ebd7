package graph

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/humanize"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/internal/mcpserver"
)

// ToolSettings are an agent's tool surface settings, under the names of the agent runtime's
// MCP tools provider: which servers and tools its model sees (three filter levels: these
// provider filters, the registration's tool_filter, and the agent's mount of the server), which
// load on demand through tool search, and which ask the user before a call. The decisions are
// internal/agentsurface's; this package holds and checks the settings.
type ToolSettings struct {
	// IncludeServers, when set, is the only servers whose tools the agent sees; ExcludeServers
	// hides servers and wins over IncludeServers. Server refs.
	IncludeServers []string `json:"include_servers,omitempty"`
	ExcludeServers []string `json:"exclude_servers,omitempty"`
	// IncludeTools, when set, is the only tools the agent sees; ExcludeTools hides tools and
	// wins over IncludeTools. Namespaced names, <server>__<tool>.
	IncludeTools []string `json:"include_tools,omitempty"`
	ExcludeTools []string `json:"exclude_tools,omitempty"`
	// DeferTools loads the servers' tools on demand: the model sees each server by name and
	// description and loads its tools through tool_search. A mount's DeferTools overrides it.
	DeferTools bool `json:"defer_tools,omitempty"`
	// ConfirmationDefault says which tools ask the user first where no binding rule decides:
	// ConfirmNone (also ""), ConfirmNonReadOnly or ConfirmAll.
	ConfirmationDefault string `json:"confirmation_default,omitempty"`
	// ConvertSchemasToStrict shows the model each input schema in strict form (every object
	// closed, every property required, optional ones nullable).
	ConvertSchemasToStrict bool `json:"convert_schemas_to_strict,omitempty"`
	// SelectedServers is the selection a run of the agent uses when the run names none
	// (StartRun's selected_servers replaces it): it only narrows the agent's servers, and a
	// name that is none of them is ignored. Empty selects nothing, so narrows nothing.
	SelectedServers []string `json:"selected_servers,omitempty"`
	// Mounts narrow one server for this agent.
	Mounts []Mount `json:"mounts,omitempty"`
	// DocumentResolver replaces my-documents://<id> arguments with the document's content in
	// calls to the servers it names.
	DocumentResolver *DocumentResolver `json:"document_resolver,omitempty"`
}

// Mount is an agent's own narrowing of one server: tool names are the server's own, as the
// registration's tool_filter writes them, not the namespaced ones.
type Mount struct {
	// Name is the server ref.
	Name         string   `json:"name"`
	IncludeTools []string `json:"include_tools,omitempty"`
	ExcludeTools []string `json:"exclude_tools,omitempty"`
	// DeferTools, when set, overrides the agent's defer_tools for this server.
	DeferTools *bool `json:"defer_tools,omitempty"`
}

// DocumentResolver is the agent's my-documents:// argument resolver setting.
type DocumentResolver struct {
	Enabled bool `json:"enabled,omitempty"`
	// ServerNames are the servers whose calls may receive document content.
	ServerNames []string `json:"server_names,omitempty"`
}

// Confirmation defaults (ToolSettings.ConfirmationDefault) and binding rules
// (ToolBinding.Confirmation).
const (
	ConfirmNone        = "none"
	ConfirmNonReadOnly = "non_read_only"
	ConfirmAll         = "all"
	ConfirmAlways      = "always"
	ConfirmNever       = "never"
)

// Names the agent surface gives tools of its own, which no binding may take.
const (
	// ToolSearchName is the meta-tool that loads deferred tools.
	ToolSearchName = "tool_search"
	// ConnectToolPrefix starts the name of a server's connect tool, mcp_oauth_connect_<server>,
	// which stands for a server the run's user has not connected yet.
	ConnectToolPrefix = "mcp_oauth_connect_"
)

// Bounds on the settings.
const (
	MaxSettingEntries = 256
	MaxMounts         = 256
)

// Mount returns the agent's mount of server, if it has one.
func (s *ToolSettings) Mount(server string) (*Mount, bool) {
	for i := range s.Mounts {
		if s.Mounts[i].Name == server {
			return &s.Mounts[i], true
		}
	}
	return nil, false
}

// ConfirmationDefaultOrNone is ConfirmationDefault with "" read as ConfirmNone.
func (s *ToolSettings) ConfirmationDefaultOrNone() string {
	if s.ConfirmationDefault == "" {
		return ConfirmNone
	}
	return s.ConfirmationDefault
}

// ValidateConfirmationDefault checks a confirmation_default value ("" means none).
func ValidateConfirmationDefault(field, v string) error {
	switch v {
	case "", ConfirmNone, ConfirmNonReadOnly, ConfirmAll:
		return nil
	}
	return fielderr.New(field, "%q is not a confirmation default: use none, non_read_only (every tool not annotated readOnlyHint: true) or all", clip(v))
}

// ValidateConfirmationRule checks a binding's confirmation rule ("" leaves the default).
func ValidateConfirmationRule(field, v string) error {
	switch v {
	case "", ConfirmAlways, ConfirmNever:
		return nil
	}
	return fielderr.New(field, "%q is not a confirmation rule: use always or never (or leave it empty for the agent's confirmation_default)", clip(v))
}

// Namespaced returns the name an agent's settings call a server's tool by: <server>__<tool>.
func Namespaced(server, tool string) string { return server + mcpserver.NamespaceSeparator + tool }

// SplitNamespaced splits <server>__<tool> at the first separator.
func SplitNamespaced(name string) (server, tool string, ok bool) {
	server, tool, ok = strings.Cut(name, mcpserver.NamespaceSeparator)
	return server, tool, ok && server != "" && tool != ""
}

// problemOf is a field error's problem without its field, for a checker that names the
// field itself.
func problemOf(err error) string {
	if fe, ok := fielderr.As(err); ok {
		return fe.Problem
	}
	return err.Error()
}

// isReservedToolName reports whether a binding name is one the agent surface gives its own
// tools.
func isReservedToolName(name string) bool {
	return name == ToolSearchName || strings.HasPrefix(name, ConnectToolPrefix)
}

// toolSettings checks an agent's settings and its bindings' confirmation rules.
func (c *checker) toolSettings(field path, id string, a *AgentNode) {
	s := &a.ToolSettings
	c.serverList(field.dot("include_servers"), id, s.IncludeServers)
	c.serverList(field.dot("exclude_servers"), id, s.ExcludeServers)
	c.serverList(field.dot("selected_servers"), id, s.SelectedServers)
	c.namespacedList(field.dot("include_tools"), id, s.IncludeTools)
	c.namespacedList(field.dot("exclude_tools"), id, s.ExcludeTools)
	if err := ValidateConfirmationDefault(field.dot("confirmation_default").String(), s.ConfirmationDefault); err != nil {
		c.add(field.dot("confirmation_default"), "agent %q: %s", id, problemOf(err))
	}
	if len(s.Mounts) > MaxMounts {
		c.add(field.dot("mounts"), "agent %q has %d mounts; at most %d", id, len(s.Mounts), MaxMounts)
	} else {
		seen := make(map[string]bool, len(s.Mounts))
		for i, m := range s.Mounts {
			mf := field.at("mounts", i)
			switch {
			case !ident.Ref.Valid(m.Name):
				c.add(mf.dot("name"), "agent %q: %q is not a server ref (^[a-z0-9_-]{1,64}$)", id, clip(m.Name))
				continue
			case seen[m.Name]:
				c.add(mf.dot("name"), "agent %q mounts server %q twice; put its settings in one mount", id, m.Name)
				continue
			}
			seen[m.Name] = true
			c.mountTools(mf.dot("include_tools"), id, m.Name, m.IncludeTools)
			c.mountTools(mf.dot("exclude_tools"), id, m.Name, m.ExcludeTools)
		}
	}
	if r := s.DocumentResolver; r != nil {
		c.serverList(field.dot("document_resolver").dot("server_names"), id, r.ServerNames)
	}
	for i, b := range a.ToolBindings {
		if err := ValidateConfirmationRule("", b.Confirmation); err != nil {
			c.add(field.at("tool_bindings", i).dot("confirmation"), "agent %q, tool %q: %s", id, clip(b.Name), problemOf(err))
		}
	}
}

func (c *checker) serverList(field path, id string, refs []string) {
	if len(refs) > MaxSettingEntries {
		c.add(field, "agent %q: %d entries; at most %d", id, len(refs), MaxSettingEntries)
		return
	}
	for i, r := range refs {
		if !ident.Ref.Valid(r) {
			c.add(field.at("", i), "agent %q: %q is not a server ref (^[a-z0-9_-]{1,64}$)", id, clip(r))
		}
	}
}

func (c *checker) namespacedList(field path, id string, names []string) {
	if len(names) > MaxSettingEntries {
		c.add(field, "agent %q: %d entries; at most %d", id, len(names), MaxSettingEntries)
		return
	}
	for i, n := range names {
		if server, tool, ok := SplitNamespaced(n); !ok || !ident.Ref.Valid(server) || !isToolName(tool) {
			c.add(field.at("", i), "agent %q: %q is not a namespaced tool name: write <server>__<tool>, e.g. docs__read_file (a mount's lists take the server's own names)", id, clip(n))
		}
	}
}

func (c *checker) mountTools(field path, id, server string, tools []string) {
	if len(tools) > MaxSettingEntries {
		c.add(field, "agent %q, mount %q: %d entries; at most %d", id, server, len(tools), MaxSettingEntries)
		return
	}
	for i, t := range tools {
		switch bare, namespaced := strings.CutPrefix(t, server+mcpserver.NamespaceSeparator); {
		case namespaced && bare != "":
			c.add(field.at("", i), "agent %q, mount %q: %q is the namespaced name; a mount names the server's own tools: write %q", id, server, t, bare)
		case !isToolName(t):
			c.add(field.at("", i), "agent %q, mount %q: %q is not a tool name ([A-Za-z0-9_.-]{1,128})", id, server, clip(t))
		}
	}
}

// settingsWarnings names the entries of an agent's settings that match none of its tools, and
// a document resolver that reaches no server: they are no error (a server may be imported
// later), but a setting that silently does nothing is most often a typo. ids maps node ids to
// their index in g.
func settingsWarnings(g *Graph, ids map[string]int, n *Node) []string {
	a := n.Agent
	s := &a.ToolSettings
	if !s.hasNames() {
		return nil
	}
	servers := make(map[string]bool)
	tools := make(map[string]bool)
	for _, b := range a.ToolBindings {
		i, ok := ids[b.NodeID]
		if !ok || g.Nodes[i].MCPTool == nil {
			continue
		}
		m := g.Nodes[i].MCPTool
		servers[m.ServerRef] = true
		tools[Namespaced(m.ServerRef, m.ToolName)] = true
	}
	known := humanize.List(sortedKeys(servers), 10, "none")
	var out []string
	unknownServers := func(setting string, refs []string) {
		for _, r := range refs {
			if !servers[r] {
				out = append(out, fmt.Sprintf("agent %q: %s names server %q, which none of the agent's tools comes from (its servers: %s); the entry has no effect",
					n.ID, setting, r, known))
			}
		}
	}
	unknownTools := func(setting string, names []string) {
		for _, t := range names {
			if !tools[t] {
				out = append(out, fmt.Sprintf("agent %q: %s names %q, which is none of the agent's tools (they are named <server>__<tool>, as mcp-import binds them); the entry has no effect",
					n.ID, setting, t))
			}
		}
	}
	unknownServers("include_servers", s.IncludeServers)
	unknownServers("exclude_servers", s.ExcludeServers)
	unknownServers("selected_servers", s.SelectedServers)
	unknownTools("include_tools", s.IncludeTools)
	unknownTools("exclude_tools", s.ExcludeTools)
	for _, m := range s.Mounts {
		if !servers[m.Name] {
			unknownServers("mounts", []string{m.Name})
			continue
		}
		for _, t := range slices.Concat(m.IncludeTools, m.ExcludeTools) {
			if !tools[Namespaced(m.Name, t)] {
				out = append(out, fmt.Sprintf("agent %q: the mount of server %q names tool %q, which is none of the agent's tools of that server; the entry has no effect",
					n.ID, m.Name, t))
			}
		}
	}
	if r := s.DocumentResolver; r != nil {
		unknownServers("document_resolver.server_names", r.ServerNames)
		if r.Enabled && len(r.ServerNames) == 0 {
			out = append(out, fmt.Sprintf("agent %q: document_resolver is enabled but names no server in server_names, so no call receives a document's content", n.ID))
		}
	}
	return out
}

func (s *ToolSettings) hasNames() bool {
	return len(s.IncludeServers)+len(s.ExcludeServers)+len(s.SelectedServers)+len(s.IncludeTools)+len(s.ExcludeTools)+len(s.Mounts) > 0 ||
		s.DocumentResolver != nil && (s.DocumentResolver.Enabled || len(s.DocumentResolver.ServerNames) > 0)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
