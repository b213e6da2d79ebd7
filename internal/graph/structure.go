package graph

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/mcpgate/capability"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
	"github.com/ringfence/ringfence/mcpgate/screen"
)

// Bounds on a graph, stated so clients can check before they send. The declaration bounds are
// the screen's, so every declaration an import accepts fits a node.
const (
	MaxNodes              = 10000
	MaxEdges              = 50000
	MaxPolicies           = 256
	MaxCapabilityBindings = 64
	MaxToolBindings       = 1000
	MaxInlineServers      = 16
	MaxPolicyAgents       = 1000
	MaxRevoke             = 64
	MaxOpaqueBytes        = 64 << 10
	MaxFlags              = screen.MaxFindingsPerTool
	MaxFlagText           = 2048
	MaxTitleBytes         = screen.MaxTitleBytes
	MaxDescriptionBytes   = screen.MaxDescriptionBytes
	MaxSchemaBytes        = screen.MaxSchemaBytes
	MaxAnnotationsBytes   = screen.MaxAnnotationsBytes
	MaxInlineCommand      = 1024
	MaxInlineArgs         = 64
	MaxInlineArg          = 4096
	MaxInlineEnv          = 64
	MaxInlineEnvValue     = 8192
	// MaxEncodedBytes bounds a whole graph as stored (imports can grow a graph past what one
	// request may carry).
	MaxEncodedBytes = 64 << 20
	// maxReported bounds how many structural problems one check collects.
	maxReported = 50
)

// ValidateGraphID checks a graph id: ident.Ref, like server refs and tenants.
func ValidateGraphID(field, id string) error { return ident.Ref.Check(field, id) }

// ValidateTenant checks a tenant name: ident.Ref.
func ValidateTenant(tenant string) error { return ident.Ref.Check("tenant", tenant) }

// ValidateNodeID checks a node id: ident.Node.
func ValidateNodeID(field, id string) error { return ident.Node.Check(field, id) }

// ValidateMode checks a capability mode ("" means enforce).
func ValidateMode(mode string) error {
	switch mode {
	case "", ModeEnforce, ModeAdvisory:
		return nil
	}
	return fielderr.New("capability_mode", "%s is not a mode: use enforce (the default) or advisory", fielderr.Quote(mode))
}

// Validate checks the graph's shape and returns the first problem, naming the node and field.
func (g *Graph) Validate() error {
	if errs := Structure(g); len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// Structure checks the graph's shape: ids, kinds and payloads, references, edges, bindings,
// policies and bounds. It returns up to 50 problems, each a *fielderr.Error naming the node
// and field.
func Structure(g *Graph) []error {
	c := &checker{caps: newCapCache(), deep: true}
	c.check(g)
	return c.errs
}

// structure is Structure for the validator: graphs it reads were checked in full when they
// were written, so it skips re-scanning raw JSON payloads and checks what the rules rely on.
func structure(g *Graph, cc *capCache) ([]error, map[string]int) {
	c := &checker{caps: cc}
	c.check(g)
	return c.errs, c.ids
}

type checker struct {
	errs []error
	caps *capCache
	// deep scans raw JSON payloads for validity.
	deep bool
	g    *Graph
	// ids maps each node id to its index (the first, when an id repeats).
	ids map[string]int
}

func (c *checker) kindOf(id string) (string, bool) {
	i, ok := c.ids[id]
	if !ok {
		return "", false
	}
	return c.g.Nodes[i].Kind, true
}

// path names a field, e.g. nodes[3].agent.tool_bindings[0].name. It is a value built without
// allocating and formatted only when a problem is reported, so a clean 10,000-node graph costs
// no formatting at all.
type path struct {
	parts [6]pathPart
	n     int
}

type pathPart struct {
	name  string
	index int // -1: not indexed
}

func root(name string, index int) path { return path{}.at(name, index) }

func (p path) at(name string, index int) path {
	if p.n < len(p.parts) {
		p.parts[p.n] = pathPart{name, index}
		p.n++
	}
	return p
}

func (p path) dot(name string) path { return p.at(name, -1) }

func (p path) String() string {
	var b strings.Builder
	for i := 0; i < p.n; i++ {
		if i > 0 && p.parts[i].name != "" {
			b.WriteByte('.')
		}
		b.WriteString(p.parts[i].name)
		if p.parts[i].index >= 0 {
			fmt.Fprintf(&b, "[%d]", p.parts[i].index)
		}
	}
	return b.String()
}

func (c *checker) add(field path, format string, args ...any) {
	if len(c.errs) < maxReported {
		c.errs = append(c.errs, fielderr.New(field.String(), format, args...))
	}
}

func (c *checker) full() bool { return len(c.errs) >= maxReported }

func (c *checker) check(g *Graph) {
	if err := ValidateGraphID("id", g.ID); err != nil {
		c.errs = append(c.errs, err)
	}
	if g.Tenant != "" {
		if err := ValidateTenant(g.Tenant); err != nil {
			c.errs = append(c.errs, err)
		}
	}
	if err := ValidateMode(g.CapabilityMode); err != nil {
		c.errs = append(c.errs, err)
	}
	switch {
	case len(g.Nodes) > MaxNodes:
		c.add(root("nodes", -1), "has %d nodes; at most %d", len(g.Nodes), MaxNodes)
		return
	case len(g.Edges) > MaxEdges:
		c.add(root("edges", -1), "has %d edges; at most %d", len(g.Edges), MaxEdges)
		return
	case len(g.Policies) > MaxPolicies:
		c.add(root("policies", -1), "has %d policies; at most %d", len(g.Policies), MaxPolicies)
		return
	}
	c.g = g
	c.ids = make(map[string]int, len(g.Nodes))
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if p := ident.Node.Problem(n.ID); p != "" {
			c.add(root("nodes", i).dot("id"), "%s", p)
			continue
		}
		if _, dup := c.ids[n.ID]; dup {
			c.add(root("nodes", i).dot("id"), "node %q appears twice; node ids are unique in a graph", n.ID)
			continue
		}
		c.ids[n.ID] = i
	}
	for i := range g.Nodes {
		if c.full() {
			return
		}
		c.node(root("nodes", i), &g.Nodes[i])
	}
	// Edges are deduplicated by (from, to) index pairs per kind: integer keys hash faster than
	// three strings, which matters at tens of thousands of edges.
	seen := make(map[string]map[uint64]bool, 2)
	for i, e := range g.Edges {
		if c.full() {
			return
		}
		field := root("edges", i)
		if !isKind(e.Kind) {
			c.add(field.dot("kind"), "%s is not an edge kind: use a lower-case word such as tool", fielderr.Quote(e.Kind))
			continue
		}
		fromKind, okFrom := c.kindOf(e.From)
		toKind, okTo := c.kindOf(e.To)
		byKind := seen[e.Kind]
		if byKind == nil {
			byKind = make(map[uint64]bool, len(g.Edges))
			seen[e.Kind] = byKind
		}
		key := uint64(c.ids[e.From])<<32 | uint64(c.ids[e.To])
		switch {
		case !okFrom:
			c.add(field.dot("from"), "%s is not a node of this graph", fielderr.Quote(e.From))
		case !okTo:
			c.add(field.dot("to"), "%s is not a node of this graph", fielderr.Quote(e.To))
		case e.From == e.To:
			c.add(field, "edge from %q to itself", e.From)
		case byKind[key]:
			c.add(field, "the %s edge from %q to %q appears twice", e.Kind, e.From, e.To)
		case e.Kind == EdgeTool && fromKind != KindAgent:
			c.add(field.dot("from"), "a tool edge starts at an agent; %q is a %s node", e.From, fromKind)
		case e.Kind == EdgeTool && toKind == KindAgent:
			c.add(field.dot("to"), "a tool edge ends at a tool node; %q is an agent", e.To)
		}
		if okFrom && okTo {
			byKind[key] = true
		}
	}
	policyIDs := make(map[string]bool, len(g.Policies))
	for i, p := range g.Policies {
		if c.full() {
			return
		}
		field := root("policies", i)
		if problem := ident.Node.Problem(p.ID); problem != "" {
			c.add(field.dot("id"), "%s", problem)
			continue
		}
		if policyIDs[p.ID] {
			c.add(field.dot("id"), "policy %q appears twice", p.ID)
			continue
		}
		policyIDs[p.ID] = true
		if len(p.Agents) > MaxPolicyAgents {
			c.add(field.dot("agents"), "policy %q names %d agents; at most %d", p.ID, len(p.Agents), MaxPolicyAgents)
			continue
		}
		for j, a := range p.Agents {
			if k, _ := c.kindOf(a); k != KindAgent {
				c.add(field.at("agents", j), "policy %q applies to %s, which is not an agent node of this graph", p.ID, fielderr.Quote(a))
			}
		}
		if len(p.Revoke) == 0 || len(p.Revoke) > MaxRevoke {
			c.add(field.dot("revoke"), "policy %q must revoke 1 to %d capabilities", p.ID, MaxRevoke)
			continue
		}
		for j, r := range p.Revoke {
			if _, err := c.caps.parse(r); err != nil {
				c.add(field.at("revoke", j), "policy %q: %v", p.ID, err)
			}
		}
	}
}

func (c *checker) node(field path, n *Node) {
	if !isKind(n.Kind) {
		c.add(field.dot("kind"), "node %q: %s is not a kind: use agent, mcp_tool or another lower-case word", n.ID, fielderr.Quote(n.Kind))
		return
	}
	payloads := 0
	for _, set := range [3]bool{n.Agent != nil, n.MCPTool != nil, n.Opaque != nil} {
		if set {
			payloads++
		}
	}
	if payloads > 1 {
		c.add(field, "node %q carries more than one payload; set only the one its kind %q names", n.ID, n.Kind)
		return
	}
	switch n.Kind {
	case KindAgent:
		if n.Agent == nil {
			c.add(field.dot("agent"), "node %q is an agent but has no agent payload", n.ID)
			return
		}
		c.agent(field.dot("agent"), n.ID, n.Agent)
	case KindMCPTool:
		if n.MCPTool == nil {
			c.add(field.dot("mcp_tool"), "node %q is an mcp_tool but has no mcp_tool payload", n.ID)
			return
		}
		c.mcpTool(field.dot("mcp_tool"), n.ID, n.MCPTool)
	default:
		if n.Agent != nil || n.MCPTool != nil {
			c.add(field, "node %q has kind %q, which carries an opaque payload, not an agent or mcp_tool one", n.ID, n.Kind)
			return
		}
		if n.Opaque != nil {
			if len(n.Opaque) > MaxOpaqueBytes {
				c.add(field.dot("opaque"), "node %q: the payload is %d bytes; at most %d", n.ID, len(n.Opaque), MaxOpaqueBytes)
			} else if !c.isObject(n.Opaque) {
				c.add(field.dot("opaque"), "node %q: the payload must be a JSON object", n.ID)
			}
		}
	}
}

func (c *checker) agent(field path, id string, a *AgentNode) {
	c.bindings(field.dot("capability_bindings"), id, a.CapabilityBindings)
	if len(a.ToolBindings) > MaxToolBindings {
		c.add(field.dot("tool_bindings"), "agent %q has %d tool bindings; at most %d", id, len(a.ToolBindings), MaxToolBindings)
	} else {
		names := make(map[string]bool, len(a.ToolBindings))
		for i, b := range a.ToolBindings {
			bf := field.at("tool_bindings", i)
			switch kind, ok := c.kindOf(b.NodeID); {
			case !isBindingName(b.Name):
				c.add(bf.dot("name"), "agent %q: %s is not a tool name the model can call: use 1 to 256 of A-Z a-z 0-9 _ . -", id, fielderr.Quote(b.Name))
			case isReservedToolName(b.Name):
				c.add(bf.dot("name"), "agent %q: %q is reserved for the agent surface's own tools (%s, %s<server>); bind the tool by another name, e.g. <server>__<tool>", id, b.Name, ToolSearchName, ConnectToolPrefix)
			case names[b.Name]:
				c.add(bf.dot("name"), "agent %q binds the name %q twice; each name calls one tool", id, b.Name)
			case !ok:
				c.add(bf.dot("node_id"), "agent %q binds %q to %s, which is not a node of this graph", id, b.Name, fielderr.Quote(b.NodeID))
			case kind == KindAgent:
				c.add(bf.dot("node_id"), "agent %q binds %q to agent %q; a tool binding names a tool node", id, b.Name, b.NodeID)
			}
			names[b.Name] = true
		}
	}
	c.toolSettings(field, id, a)
	if len(a.MCPServers) > MaxInlineServers {
		c.add(field.dot("mcp_servers"), "agent %q has %d inline servers; at most %d", id, len(a.MCPServers), MaxInlineServers)
		return
	}
	names := make(map[string]bool, len(a.MCPServers))
	for i, s := range a.MCPServers {
		sf := field.at("mcp_servers", i)
		switch {
		case !isInlineName(s.Name):
			c.add(sf.dot("name"), "agent %q: %s is not a server name: use 1 to 64 of A-Z a-z 0-9 _ . -", id, fielderr.Quote(s.Name))
		case names[s.Name]:
			c.add(sf.dot("name"), "agent %q names the inline server %q twice", id, s.Name)
		case s.Command == "" || !isText(s.Command, MaxInlineCommand):
			c.add(sf.dot("command"), "agent %q, inline server %q: the command must be 1 to %d bytes of UTF-8 text", id, s.Name, MaxInlineCommand)
		case len(s.Args) > MaxInlineArgs:
			c.add(sf.dot("args"), "agent %q, inline server %q: %d arguments; at most %d", id, s.Name, len(s.Args), MaxInlineArgs)
		case len(s.Env) > MaxInlineEnv:
			c.add(sf.dot("env"), "agent %q, inline server %q: %d env keys; at most %d", id, s.Name, len(s.Env), MaxInlineEnv)
		}
		names[s.Name] = true
		for j, arg := range s.Args {
			if !isText(arg, MaxInlineArg) {
				c.add(sf.at("args", j), "agent %q, inline server %q: an argument must be at most %d bytes of UTF-8 text", id, s.Name, MaxInlineArg)
			}
		}
		for k, v := range s.Env {
			// Env values are secrets by convention: the problem never quotes one.
			if !isEnvKey(k) {
				c.add(sf.dot("env"), "agent %q, inline server %q: %s is not an environment variable name", id, s.Name, fielderr.Quote(k))
			} else if !isText(v, MaxInlineEnvValue) {
				c.add(sf.dot("env."+k), "agent %q, inline server %q: the value must be at most %d bytes of UTF-8 text", id, s.Name, MaxInlineEnvValue)
			}
		}
	}
}

func (c *checker) mcpTool(field path, id string, m *MCPToolNode) {
	if p := ident.Ref.Problem(m.ServerRef); p != "" {
		c.add(field.dot("server_ref"), "node %q: server_ref %s", id, p)
	}
	if !isToolName(m.ToolName) {
		c.add(field.dot("tool_name"), "node %q: %s is not a tool name ([A-Za-z0-9_.-]{1,128})", id, fielderr.Quote(m.ToolName))
	}
	if !isText(m.Title, MaxTitleBytes) {
		c.add(field.dot("title"), "node %q: the title must be at most %d bytes of UTF-8 text", id, MaxTitleBytes)
	}
	if !isText(m.Description, MaxDescriptionBytes) {
		c.add(field.dot("description"), "node %q: the description must be at most %d bytes of UTF-8 text", id, MaxDescriptionBytes)
	}
	c.schema(field.dot("input_schema"), id, m.InputSchema, MaxSchemaBytes, m.SchemaHash != "")
	c.schema(field.dot("output_schema"), id, m.OutputSchema, MaxSchemaBytes, false)
	c.schema(field.dot("annotations"), id, m.Annotations, MaxAnnotationsBytes, false)
	if m.SchemaHash != "" && !isPin(m.SchemaHash) {
		c.add(field.dot("schema_hash"), "node %q: %s is not a pin (v1:sha256:<64 lower-case hex>); re-import the tool to pin it", id, fielderr.Quote(m.SchemaHash))
	}
	c.bindings(field.dot("capability_bindings"), id, m.CapabilityBindings)
	if len(m.Flags) > MaxFlags {
		c.add(field.dot("flags"), "node %q has %d flags; at most %d", id, len(m.Flags), MaxFlags)
		return
	}
	for i, f := range m.Flags {
		ff := field.at("flags", i)
		switch {
		case !isKind(f.Code):
			c.add(ff.dot("code"), "node %q: %s is not a finding code", id, fielderr.Quote(f.Code))
		case f.Severity != discovery.SeverityFlag && f.Severity != discovery.SeverityHardFailure:
			c.add(ff.dot("severity"), "node %q: %s is not a severity (flag or hard_failure)", id, fielderr.Quote(f.Severity))
		case !isText(f.Location, MaxFlagText) || !isText(f.Message, MaxFlagText):
			c.add(ff, "node %q: location and message must be at most %d bytes of UTF-8 text", id, MaxFlagText)
		}
	}
}

func (c *checker) schema(field path, id string, raw json.RawMessage, max int, required bool) {
	switch {
	case raw == nil && required:
		c.add(field, "node %q: a pinned declaration has an input schema", id)
	case raw == nil:
	case len(raw) > max:
		c.add(field, "node %q: %d bytes; at most %d", id, len(raw), max)
	case !c.isObject(raw):
		c.add(field, "node %q: must be a JSON object", id)
	}
}

func (c *checker) isObject(raw json.RawMessage) bool {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return false
	}
	return !c.deep || json.Valid(raw)
}

func (c *checker) bindings(field path, id string, caps []string) {
	if len(caps) > MaxCapabilityBindings {
		c.add(field, "node %q has %d capability bindings; at most %d", id, len(caps), MaxCapabilityBindings)
		return
	}
	for i, s := range caps {
		if _, err := c.caps.parse(s); err != nil {
			c.add(field.at("", i), "node %q: %v", id, err)
		}
	}
}

// VerifyPins checks that every pinned mcp_tool node's declaration still hashes to its
// schema_hash. A pinned declaration is what the model sees and what the pool compares the
// live server against; editing it by hand would make the two differ, so the only way to
// change it is a re-import.
func VerifyPins(g *Graph) error {
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Kind != KindMCPTool || n.MCPTool == nil || n.MCPTool.SchemaHash == "" {
			continue
		}
		if err := mcpdecl.Verify(n.MCPTool.Declaration(), n.MCPTool.SchemaHash); err != nil {
			return fielderr.New(fmt.Sprintf("nodes[%d].mcp_tool", i),
				"node %q: the declaration no longer hashes to its schema_hash, so it is not the one that was pinned; "+
					"pinned declarations are not edited by hand: re-import the tool (ringfence mcp-import --server %s --tool %s) to take the server's current one",
				n.ID, n.MCPTool.ServerRef, n.MCPTool.ToolName)
		}
	}
	return nil
}

// Declaration returns the pinned declaration in the form mcpdecl hashes.
func (m *MCPToolNode) Declaration() mcpdecl.Declaration {
	return mcpdecl.Declaration{
		Name: m.ToolName, Title: m.Title, Description: m.Description,
		InputSchema: m.InputSchema, OutputSchema: m.OutputSchema, Annotations: m.Annotations,
	}
}

// capCache parses each distinct capability string once per validation.
type capCache struct {
	m map[string]capEntry
}

type capEntry struct {
	c   capability.Capability
	err error
}

func newCapCache() *capCache { return &capCache{m: make(map[string]capEntry)} }

func (cc *capCache) parse(s string) (capability.Capability, error) {
	if e, ok := cc.m[s]; ok {
		return e.c, e.err
	}
	c, err := capability.Parse(s)
	if len(cc.m) < 1<<16 {
		cc.m[s] = capEntry{c, err}
	}
	return c, err
}

// set parses a binding list whose entries were already checked; invalid ones are skipped.
func (cc *capCache) set(ss []string) capability.Set {
	out := make(capability.Set, 0, len(ss))
	for _, s := range ss {
		if c, err := cc.parse(s); err == nil {
			out = append(out, c)
		}
	}
	return out
}

func isToolName(s string) bool { return isNameChars(s, 128, "") }

func isBindingName(s string) bool { return isNameChars(s, 256, "") }

func isInlineName(s string) bool { return isNameChars(s, 64, "") }

// isNameChars reports whether s is 1 to max of A-Z a-z 0-9 _ . - and the extra bytes.
func isNameChars(s string, max int, extra string) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' {
			continue
		}
		if extra != "" && strings.IndexByte(extra, c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// isKind reports whether s is a lower-case word: ^[a-z][a-z0-9_]{0,63}$.
func isKind(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func isEnvKey(s string) bool {
	if len(s) == 0 || len(s) > 128 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func isText(s string, max int) bool {
	return len(s) <= max && utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// isPin is mcpdecl.ParseHash's shape check without decoding.
func isPin(s string) bool {
	hexPart, ok := strings.CutPrefix(s, mcpdecl.HashPrefix)
	if !ok || len(hexPart) != 64 {
		return false
	}
	for i := 0; i < len(hexPart); i++ {
		if c := hexPart[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}
