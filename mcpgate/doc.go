// Package mcpgate binds an MCP server's tool catalogue as typed tool specs and gates every
// call to it. It is the library the Ringfence pool itself runs on, made to be embedded by any
// Go service that calls MCP tools: it needs no Docker engine, no gRPC and no database.
//
// Bind initializes a session, lists every page of its tools and turns each into a ToolSpec
// (namespace "mcp", version "1", side effects "external", replay policy "must_stub") with the
// declaration's pin (an RFC 8785 SHA-256 hash, the same Ringfence's publisher pins), the
// permissions the options give it, and the declaration screen's findings.
//
// Calls are default-deny: a tool the binder gives no permissions (BindOptions.Permissions does
// not name it and BindOptions.Required is empty) is refused every call, whatever the caller
// holds. A tool that needs none is mapped to an empty list in BindOptions.Permissions, which
// Bind records on its spec as ToolSpec.NoPermissionNeeded.
//
// CallTool gates one call, in an order that is load-bearing:
//
//  1. capability gate: every permission of the spec (with {argument} placeholders expanded
//     by the call's arguments) must be covered by a Claim of the caller's Capabilities, and a
//     spec with none must say it needs none (NoPermissionNeeded); otherwise
//     *CapabilityError, and the session is never invoked;
//  2. input validation: the arguments against the input schema (JSON Schema 2020-12), and
//     the output schema must compile; otherwise *ValidationError naming the field;
//  3. (WithDrift) the session's live declaration of the tool must hash to the pin;
//     otherwise *DriftError;
//  4. invoke: tools/call on the session;
//  5. output validation: structured content against the output schema; a non-object where
//     an object is required is a *ValidationError; (WithMaxResultBytes) a result over the cap
//     is a *TooLargeError;
//  6. sanitization: every string leaf (and key) of the result is HTML-escaped, stripped of
//     control and invisible characters, and cleared of role markers and chat-template tokens.
//
// Check, CheckDrift and ProcessResult are those steps on their own, for a caller that must do
// its own work between them (the pool records the attempt durably before it invokes).
//
// Adapters are servers a program binds at start-up: packages register AdapterSpecs from an
// init function (RegisterAdapter), the program collects them (CollectAdapters, adding any its
// configuration names), and a Host binds them all when it starts and closes their sessions
// when it stops.
package mcpgate
