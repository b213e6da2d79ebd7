package mcpgate

import (
	"fmt"
	"strings"
)

// CapabilityError refuses a call whose permissions the caller's Capabilities do not cover.
// It comes before anything else: the session is never invoked.
type CapabilityError struct {
	Tool string
	// Missing are the requirements no claim covers (or a revoke entry takes away), with the
	// call's arguments substituted, sorted.
	Missing []string
	// Problem, when set, says why the requirements could not be decided at all: an argument
	// a placeholder names is missing, not a string or not a canonical path, or the expanded
	// requirement is not a capability; or, with Unpermissioned, that there are none.
	Problem string
	// Unpermissioned: the tool has no permissions (none in its spec, none given per call)
	// and its spec does not say it needs none (ToolSpec.NoPermissionNeeded). Calls are
	// default-deny, so it is refused whatever the caller holds; Problem says how to fix it.
	Unpermissioned bool
	// Malformed lists the caller's claims that are not capabilities, each with why: they
	// cover nothing, and may be why Missing is not covered.
	Malformed []string
	// WorkLimit, when positive, is the limit on comparison work the call exceeded (wildcard
	// revoke entries against a wildcard argument): it is refused rather than decided.
	WorkLimit int64
}

func (e *CapabilityError) Error() string {
	switch {
	case e.WorkLimit > 0:
		return fmt.Sprintf("mcpgate: tool %q: comparing its permissions with the caller's claims and revoke entries needs more than the per-call limit of %d units of work: simplify the wildcard revoke entries, or call with a plainer argument", e.Tool, e.WorkLimit)
	case e.Problem != "":
		return fmt.Sprintf("mcpgate: tool %q: %s", e.Tool, e.Problem)
	}
	msg := fmt.Sprintf("mcpgate: tool %q requires permissions not granted: %s; add a Claim whose namespace and scope glob cover them", e.Tool, strings.Join(e.Missing, ", "))
	if len(e.Malformed) > 0 {
		msg += " (these claims cover nothing, not being capabilities: " + strings.Join(e.Malformed, "; ") + ")"
	}
	return msg
}

// Stages a ValidationError names.
const (
	// StageDeclaration: the tool's declaration cannot be used (Bind: a schema that is not a
	// JSON object; CallTool: a spec the screen refused).
	StageDeclaration = "declaration"
	// StageInput: the arguments (or the schemas, before anything is sent).
	StageInput = "input"
	// StageOutput: what the tool returned. The call reached the server: it may have taken
	// effect.
	StageOutput = "output"
)

// ValidationError is a declaration, a call's arguments or a tool's result that does not
// validate. Message says what is wrong, naming the field ("/path: missing property"), without
// the tool's name (Error adds it).
type ValidationError struct {
	Tool    string
	Stage   string
	Message string
	// SchemaUnusable marks a schema that cannot be compiled: the declaration's fault, not the
	// caller's. It is found before anything is sent, the output schema included.
	SchemaUnusable bool
}

func (e *ValidationError) Error() string {
	switch e.Stage {
	case StageDeclaration:
		return fmt.Sprintf("mcpgate: MCP tool %q has an unusable declaration: %s", e.Tool, e.Message)
	case StageOutput:
		return fmt.Sprintf("mcpgate: MCP tool %q returned an invalid result: %s", e.Tool, e.Message)
	}
	return fmt.Sprintf("mcpgate: MCP tool %q input schema validation failed: %s", e.Tool, e.Message)
}

// DriftError refuses a call whose tool the server now declares differently from the pinned
// declaration: a changed description or schema is a changed tool, whatever its name.
type DriftError struct {
	Tool string
	// Pinned is the spec's pin; Live the hash of the live declaration, or "(absent)" when the
	// server no longer lists the tool.
	Pinned, Live string
}

func (e *DriftError) Error() string {
	return fmt.Sprintf("mcpgate: the server's live declaration of tool %q does not hash to its pin (pinned %s, live %s): bind it again and review the change before trusting it", e.Tool, e.Pinned, e.Live)
}

// TooLargeError is a result over a bound (WithMaxResultBytes, or MaxContentItems). The call
// reached the server: it may have taken effect.
type TooLargeError struct {
	Tool string
	// What is over the bound: "bytes" or "content items".
	What  string
	Size  int
	Limit int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("mcpgate: MCP tool %q returned a result of %d %s, more than the %d a result may carry", e.Tool, e.Size, e.What, e.Limit)
}

// ProtocolError is an answer to tools/call that is not an MCP tool result: not a result
// object, or a content item of a type MCP does not define (ProcessRawResult), or no result at
// all from a session that returned no error either. The server broke the
// protocol, not the tool's declaration; the call reached it and may have taken effect.
type ProtocolError struct {
	Tool    string
	Message string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("mcpgate: MCP tool %q answered with what is not an MCP tool result: %s", e.Tool, e.Message)
}
