package mcpgate

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ringfence/ringfence/mcpgate/capability"
	"github.com/ringfence/ringfence/mcpgate/schemas"
	"github.com/ringfence/ringfence/mcpgate/screen"
)

// The fixed parts of every ToolSpec Bind makes.
const (
	// Namespace is the namespace of every MCP tool.
	Namespace = "mcp"
	// Version is the spec format's version.
	Version = "1"
	// SideEffectsExternal: an MCP tool acts outside the caller's process, where nothing can
	// undo it.
	SideEffectsExternal = "external"
	// ReplayMustStub: a replay of a recorded run must not call the tool again; it must be
	// given the recorded result.
	ReplayMustStub = "must_stub"
)

// ToolSpec is one bound tool: its declaration as the server sent it, its pin, and what a call
// needs. Bind makes them; a caller with a declaration of its own (pinned elsewhere) may fill
// one in, and CallTool compiles its schemas on use (WithSchemaCache keeps them by pin). A
// spec Bind made keeps the schemas it compiled from the declaration: changing its
// InputSchema or OutputSchema afterwards changes nothing the gates check (build a ToolSpec
// of your own for that); its Permissions may be changed, or added per call
// (WithPermissions). A spec is only read by the gates: one may serve concurrent calls.
type ToolSpec struct {
	Namespace   string
	Name        string
	Version     string
	Title       string
	Description string
	// InputSchema and OutputSchema are the JSON Schemas as the server declared them; a nil
	// OutputSchema means the tool declares none.
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage
	Annotations  *mcp.ToolAnnotations
	// Pin is the declaration's hash ("v1:sha256:…"), over name, title, description, both
	// schemas and the annotations (package mcpdecl).
	Pin string
	// Permissions are the capabilities a call needs, "name" or "name:scope"; a scope may name
	// the call's arguments in braces ("fs.read:{path}"), expanded per call.
	Permissions []string
	// NoPermissionNeeded says explicitly that a call needs no permission. Calls are
	// default-deny: a call of a spec with no Permissions, given none with WithPermissions
	// either, is refused with a *CapabilityError (Unpermissioned) unless it is set, so a tool
	// nobody gave permissions is never callable by accident. Bind sets it for a tool that
	// BindOptions.Permissions maps to an empty list while BindOptions.Required is empty. It
	// changes nothing while the spec or the call has requirements.
	NoPermissionNeeded bool
	SideEffects        string
	ReplayPolicy       string
	// Findings are the declaration screen's findings about this tool (and about its listing
	// as a whole, located at "tools"). Refused is set when one of them is a hard failure: the
	// declaration cannot be represented safely, and CallTool refuses every call to it.
	Findings []screen.Finding
	Refused  bool

	compiled *compiledSchemas
}

// compiledSchemas are a bound spec's schemas, compiled once at Bind.
type compiledSchemas struct {
	input, strict, output       *schemas.Schema
	inputErr, strictErr, outErr error
}

// Claim is one capability a caller holds: Namespace is the capability's name ("fs.read") and
// Scope a glob over what it covers ("/srv/**": "*" stays within one path segment, "**"
// crosses them). An empty Scope covers every scope of the namespace.
type Claim struct {
	Namespace string
	Scope     string
}

func (c Claim) String() string {
	if c.Scope == "" {
		return c.Namespace
	}
	return c.Namespace + ":" + c.Scope
}

// ParseClaim reads "name" or "name:scope".
func ParseClaim(s string) (Claim, error) {
	c, err := capability.Parse(s)
	if err != nil {
		return Claim{}, fmt.Errorf("mcpgate: %w", err)
	}
	return Claim{Namespace: c.Name, Scope: c.Scope}, nil
}

// ParseClaims reads every entry, reporting the first that is not a capability.
func ParseClaims(ss ...string) ([]Claim, error) {
	out := make([]Claim, 0, len(ss))
	for _, s := range ss {
		c, err := ParseClaim(s)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Capabilities is what a caller may exercise: every requirement a Claim covers, except what
// a Revoked entry takes away. A revoke entry takes a requirement away when any scope the
// requirement may name is withdrawn (a policy that revokes fs.read:/srv/secret/* leaves no
// fs.read:/srv/** to exercise). The zero value holds nothing: every call that needs a
// permission is refused, and so is every call of a tool that has none and does not say it
// needs none (ToolSpec.NoPermissionNeeded).
type Capabilities struct {
	Claims  []Claim
	Revoked []Claim
}

// CapabilitiesOf is the capability package's effective set as Capabilities.
func CapabilitiesOf(e capability.Effective) Capabilities {
	return Capabilities{Claims: claimsOf(e.Held), Revoked: claimsOf(e.Revoked)}
}

func claimsOf(s capability.Set) []Claim {
	if len(s) == 0 {
		return nil
	}
	out := make([]Claim, len(s))
	for i, c := range s {
		out[i] = Claim{Namespace: c.Name, Scope: c.Scope}
	}
	return out
}

// effective is c in the capability package's terms; nothing is parsed, so a malformed claim
// simply covers nothing a parsed requirement names.
func (c Capabilities) effective() capability.Effective {
	return capability.Effective{Held: setOf(c.Claims), Revoked: setOf(c.Revoked)}
}

func setOf(cs []Claim) capability.Set {
	if len(cs) == 0 {
		return nil
	}
	out := make(capability.Set, len(cs))
	for i, c := range cs {
		out[i] = capability.Capability{Name: c.Namespace, Scope: c.Scope}
	}
	return out
}

func (c Capabilities) String() string {
	parts := make([]string, 0, len(c.Claims)+len(c.Revoked))
	for _, cl := range c.Claims {
		parts = append(parts, cl.String())
	}
	for _, r := range c.Revoked {
		parts = append(parts, "-"+r.String())
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
