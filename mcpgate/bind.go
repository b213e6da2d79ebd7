package mcpgate

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ringfence/ringfence/mcpgate/capability"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
	"github.com/ringfence/ringfence/mcpgate/screen"
)

// Session is an MCP client session as the gate uses it. go-sdk's *mcp.ClientSession has the
// last two methods; ClientSession adds the first. Anything else with these methods works as
// well: an in-memory stub in a test, a pooled connection.
type Session interface {
	// Initialize returns the server's answer to initialize (a go-sdk session has it from
	// connecting).
	Initialize(ctx context.Context) (*mcp.InitializeResult, error)
	// ListTools returns one page of tools/list.
	ListTools(ctx context.Context, params *mcp.ListToolsParams) (*mcp.ListToolsResult, error)
	// CallTool sends tools/call.
	CallTool(ctx context.Context, params *mcp.CallToolParams) (*mcp.CallToolResult, error)
}

// BindOptions says what the bound tools need.
type BindOptions struct {
	// Permissions maps a tool's name to the capabilities a call of it needs; a scope may name
	// the call's arguments ("fs.read:{path}"). Calls are default-deny: a tool given no
	// permissions (not named here, and Required empty) is refused every call, whatever the
	// caller holds. Map a tool that needs none to an empty list ("ping": {}) to say so (the
	// entry says it, so a nil list does too): its spec then has NoPermissionNeeded, and any
	// caller may call it.
	Permissions map[string][]string
	// Required are capabilities every tool of the server needs (an adapter's
	// RequiredCapabilities).
	Required []string
	// OtherNames are the names of other servers and their tools, for the screen's
	// cross-reference and look-alike checks.
	OtherNames []string
}

// maxCursorLen bounds a tools/list cursor a server may hand back.
const maxCursorLen = 4 << 10

// ListAll returns every tool the session lists, following every page. It refuses more than
// screen.MaxTools tools, a cursor that repeats and an oversized one.
func ListAll(ctx context.Context, session Session) ([]*mcp.Tool, error) {
	var tools []*mcp.Tool
	var seen []string
	params := &mcp.ListToolsParams{}
	for {
		res, err := session.ListTools(ctx, params)
		if err != nil {
			return nil, fmt.Errorf("mcpgate: tools/list: %w", err)
		}
		tools = append(tools, res.Tools...)
		switch next := res.NextCursor; {
		case len(tools) > screen.MaxTools:
			return nil, fmt.Errorf("mcpgate: the server lists more than %d tools", screen.MaxTools)
		case next == "":
			return tools, nil
		case len(next) > maxCursorLen:
			return nil, fmt.Errorf("mcpgate: tools/list returned a cursor longer than %d bytes", maxCursorLen)
		case slices.Contains(seen, next):
			return nil, fmt.Errorf("mcpgate: tools/list returned a cursor it had returned before")
		default:
			seen = append(seen, next)
			params = &mcp.ListToolsParams{Cursor: next}
		}
	}
}

// Bind initializes session, lists every page of its tools, and turns each into a ToolSpec:
// namespace "mcp", version "1", the declaration as sent, its pin, the permissions opts give
// it (none given: every call refused, see BindOptions.Permissions), side effects "external",
// replay policy "must_stub", and the declaration screen's findings. A tool whose input or
// output schema is not a JSON object is refused with a *ValidationError (StageDeclaration)
// naming it; nothing is bound then.
func Bind(ctx context.Context, session Session, opts BindOptions) ([]ToolSpec, error) {
	if session == nil {
		return nil, errNilSession
	}
	if err := checkPermissions("Required", opts.Required); err != nil {
		return nil, err
	}
	for name, reqs := range opts.Permissions {
		if err := checkPermissions(fmt.Sprintf("Permissions[%q]", name), reqs); err != nil {
			return nil, err
		}
	}
	if _, err := session.Initialize(ctx); err != nil {
		return nil, fmt.Errorf("mcpgate: initialize: %w", err)
	}
	tools, err := ListAll(ctx, session)
	if err != nil {
		return nil, err
	}
	decls := make([]mcpdecl.Declaration, len(tools))
	for i, t := range tools {
		if decls[i], err = declaration(t); err != nil {
			return nil, err
		}
	}
	report := screen.Screen(decls, screen.Context{OtherNames: opts.OtherNames})
	specs := make([]ToolSpec, len(tools))
	for i, t := range tools {
		d := decls[i]
		pin, err := mcpdecl.Hash(d)
		if err != nil {
			return nil, &ValidationError{Tool: safeText(d.Name), Stage: StageDeclaration, Message: "it cannot be pinned: " + safeText(err.Error())}
		}
		perms, named := opts.Permissions[d.Name]
		spec := ToolSpec{
			Namespace: Namespace, Name: d.Name, Version: Version, Title: d.Title, Description: d.Description,
			InputSchema: d.InputSchema, OutputSchema: d.OutputSchema, Annotations: t.Annotations, Pin: pin,
			Permissions:  append(slices.Clone(opts.Required), perms...),
			SideEffects:  SideEffectsExternal,
			ReplayPolicy: ReplayMustStub,
			Findings:     append(slices.Clone(report.Tools[i].Findings), report.Listing...),
			Refused:      report.Tools[i].Refused,
		}
		// Named with no requirements, and none for every tool: the binder said it needs none.
		spec.NoPermissionNeeded = named && len(spec.Permissions) == 0
		spec.compile()
		specs[i] = spec
	}
	return specs, nil
}

func checkPermissions(field string, reqs []string) error {
	for i, req := range reqs {
		if err := capability.CheckTemplate(req); err != nil {
			return fmt.Errorf("mcpgate: BindOptions.%s[%d] (%q): %w", field, i, req, err)
		}
	}
	return nil
}

// declaration reads a listed tool as pinned, refusing schemas that are not JSON objects.
func declaration(t *mcp.Tool) (mcpdecl.Declaration, error) {
	name := "(nil)"
	if t != nil {
		name = t.Name
	}
	d, err := mcpdecl.FromTool(t)
	if err != nil {
		return d, &ValidationError{Tool: safeText(name), Stage: StageDeclaration, Message: "it cannot be read: " + safeText(err.Error())}
	}
	for _, s := range []struct {
		which    string
		raw      []byte
		required bool
	}{{"input", d.InputSchema, true}, {"output", d.OutputSchema, false}} {
		if (s.required || len(s.raw) > 0) && !isObject(s.raw) {
			return d, &ValidationError{Tool: safeText(name), Stage: StageDeclaration,
				Message: fmt.Sprintf("its %s schema is not a JSON object; the server must declare one (file a bug against it)", s.which)}
		}
	}
	return d, nil
}

func isObject(raw []byte) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	return len(raw) > 0 && raw[0] == '{'
}

// Values of a Listing that are never pins.
const (
	// NotHashable starts the live "hash" of a declaration that cannot be hashed.
	NotHashable = "unhashable: "
	// ListedTwice is the live "hash" of a tool name the server lists more than once: it has
	// no one live declaration, so neither copy may pass for the pin.
	ListedTwice = "listed more than once"
)

// Listing maps each tool a server lists to the pin of its live declaration: what the drift
// check compares a spec's Pin with.
type Listing map[string]string

// ListingOf hashes every live declaration exactly as Bind pins them.
func ListingOf(tools []*mcp.Tool) Listing {
	live := make(Listing, len(tools))
	var repeated []string
	for _, t := range tools {
		if _, seen := live[t.Name]; seen {
			repeated = append(repeated, t.Name)
		}
		live[t.Name] = LiveHash(t)
	}
	for _, name := range repeated {
		live[name] = ListedTwice
	}
	return live
}

// LiveHash is the pin of a live declaration; one that cannot be hashed gets a value that
// starts with NotHashable and never equals a pin.
func LiveHash(t *mcp.Tool) string {
	d, err := mcpdecl.FromTool(t)
	if err != nil {
		return NotHashable + err.Error()
	}
	h, err := mcpdecl.Hash(d)
	if err != nil {
		return NotHashable + err.Error()
	}
	return h
}
