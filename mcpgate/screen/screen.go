// Package screen inspects MCP tool declarations before Ringfence trusts
// them: at discovery, at import and whenever the pool re-lists a server.
//
// A declaration is text written by whoever controls the server, and most of
// it is read by a model (notes/security.md lists the attacks). The screen
// has two outcomes. A hard failure means the declaration cannot be
// represented or pinned safely, and the import refuses it. A flag is a
// heuristic finding that a person should look at; the import proceeds.
// The screen never changes a declaration: what is pinned is what the
// server sent (package mcpdecl).
//
// # Hard failures
//
//   - invalid_name: the name is not 1 to MaxNameBytes characters of
//     [A-Za-z0-9_.-] (the MCP tool-name rule).
//   - input_schema_not_object: inputSchema is absent or is not a JSON object
//     whose "type" is the string "object". The MCP schema requires exactly
//     this, the go-sdk server enforces it, and a tool's arguments are always
//     an object, so any other schema cannot describe them.
//   - output_schema_not_object: outputSchema is present (not null) but is
//     not such an object; structuredContent is always an object too.
//   - annotations_not_object: annotations are present but not an object.
//   - invalid_json, duplicate_key: a schema or the annotations are not
//     I-JSON; duplicate keys are refused because parsers disagree on them.
//   - invalid_utf8: invalid UTF-8 or an escaped lone surrogate anywhere.
//   - schema_too_large: inputSchema or outputSchema over MaxSchemaBytes or
//     with more than MaxSchemaObjects JSON objects (checked before it is
//     compiled), or annotations over MaxAnnotationsBytes.
//   - schema_too_deep: arrays and objects nested deeper than MaxSchemaDepth.
//   - string_too_long: a title over MaxTitleBytes, or a string or object key
//     inside a schema or the annotations over MaxStringBytes.
//   - description_too_long: a description over MaxDescriptionBytes.
//   - remote_ref: a "$ref", "$dynamicRef" or "$recursiveRef" member with a
//     string value that is not a local "#…" fragment, anywhere in a schema.
//     Data keywords are not exempt: a schema-unaware walk cannot tell a
//     property named "default" from the keyword, and refusing a rare
//     "$ref" inside example data is the safe error.
//   - invalid_schema: inputSchema or outputSchema passed every check above
//     but does not compile with the pool's validator (package schemas),
//     so every call would fail: a keyword of the wrong type ("type":
//     "strng"), a pattern that is not a regular expression, a local $ref
//     to nothing, a "$schema" naming a meta-schema that is not built in.
//     The draft is the one "$schema" names (draft-04, -06, -07, 2019-09,
//     2020-12), and 2020-12 without one, as the validator reads it. There
//     is one finding per place, at most 8 per schema, each with the
//     compiler's message.
//
// Listing-level hard failures: too_many_tools (more than MaxTools),
// listing_too_large (more than MaxListingBytes in all, or more than
// MaxListingSchemaObjects JSON objects in all the schemas), duplicate_name (the
// same name twice; every occurrence is refused, since neither can be pinned
// unambiguously). When the listing is too many or too large, no tool is
// screened individually: the work stays bounded.
//
// # Flags
//
// Flags apply to the name (with '_', '-' and '.' read as spaces), title,
// description, every key and string inside both schemas (property names,
// nested descriptions, titles, enums, defaults, examples, patterns) and the
// annotations. Each string is scanned as it appears with hidden code points
// removed and after NFKC folding and lowercasing, so fullwidth letters and
// zero-width spaces do not hide a phrase. Text spelled with Unicode Tag
// characters is decoded to ASCII and scanned again; such findings say so.
//
//   - hidden_unicode: zero-width, BOM, soft hyphen, variation selectors,
//     other invisible format characters, and control characters other than
//     \n, \r and \t.
//   - tag_characters: Unicode Tag characters (U+E0000..U+E007F).
//   - bidi_override: bidi embeddings, overrides, isolates and marks.
//   - mixed_script: a word mixing letters of two scripts after NFKC folding
//     (Latin with Cyrillic, Greek look-alikes, Armenian, Cherokee, …).
//     Latin mixed with Han, Hiragana, Katakana or Hangul is normal text and
//     not flagged, nor are Greek letters that do not imitate Latin ones
//     (µs, Δt, π).
//   - instruction_tag: <IMPORTANT>, <SYSTEM>, <INSTRUCTIONS>, <HIDDEN>,
//     <SECRET>, <ADMIN>, <CRITICAL>, <PROMPT>, [HIDDEN …], [SYSTEM …],
//     HTML comments, chat-template tokens and __system__-style role markers.
//   - override_phrase: ignore/disregard/forget previous instructions,
//     "system prompt", "developer mode", "jailbreak", "you are now", "new
//     instructions:".
//   - concealment: "do not tell/mention/reveal/disclose", "do not show …
//     the user", "without informing the user", "secretly", "covertly",
//     "hide this from the user", "the user must not know", and "silently"
//     when it is followed by an action (send, upload, include, …);
//     "silently ignores missing files" is not flagged.
//   - coercion: "always call this tool first", "before using any other
//     tool", "must be called first", "do not use other tools", "instead of
//     using the X tool".
//   - cross_reference: a word equal to one of Context.OtherNames, or within
//     edit distance 2 of one when both have at least 5 characters (and
//     neither is a prefix of the other, so "searches" does not match
//     "search"). Names that are a single word of fewer than 5 letters
//     ("add", "echo") are too common to match. Names of the screened
//     listing itself are never "other".
//   - name_collision: the tool's own name equals one of OtherNames or is
//     within edit distance 2 of one (5+ characters).
//   - sensitive_target: a sensitive path or secret (.ssh, id_rsa, .env,
//     .aws/credentials, .netrc, kubeconfig, /etc/shadow, mcp.json, private
//     key, …) within four words of an action verb in the same sentence; the
//     weak targets (token, api key, password, secret, credentials, cookie)
//     need an exfiltration verb (read, send, upload, include, pass,
//     forward, …), so "returns the token count" is not flagged.
//   - exfiltration_parameter: a property named like a side channel
//     (sidenote, content_from_…, contents_of_…, conversation_history,
//     chat_history, previous_messages, system_prompt, …).
//   - shell_execution: claims to run shell commands, "sh -c", curl|sh,
//     download-and-execute, os.system, subprocess, eval(.
//   - url_or_email: a URL or an e-mail address (the json-schema.org
//     meta-schema URI in "$schema" is exempt).
//   - base64_run: MinBase64Run or more base64 characters in a row with
//     upper case, lower case and digits.
//   - embedded_secret: an AWS key id, GitHub, GitLab, Slack, npm, Stripe,
//     Google or sk- style key, a JWT or a PEM private key. The message
//     names the kind, never the value.
//   - annotation_mismatch: readOnlyHint true on a tool whose name, title or
//     leading description verb says write, delete, send, …; or readOnlyHint
//     and destructiveHint both true.
//   - annotation_invalid: a *Hint annotation that is not a boolean.
//   - findings_truncated: more than MaxFindingsPerTool findings; the rest
//     are dropped (ToolReport.Refused still counts every hard failure).
//
// A finding is reported once per code and location. Messages quote at most
// a short, escaped excerpt of the text and never an embedded secret.
//
// # Cost
//
// Work is linear in the size of the listing plus, for cross_reference, the
// number of distinct words times the number of other names of similar
// length and character set. Phrase patterns are RE2 (linear), each starts
// with a literal and runs only on text that holds its lead word, so
// ordinary text runs almost none; strings of up to 256 bytes are scanned
// once per call however often a schema repeats them. Compiling a schema
// (invalid_schema) is linear in its size too, and runs only on schemas
// within the bounds above; for small schemas it costs more than all the
// heuristics together (BenchmarkScreen200Tools). Screen keeps no state
// between calls and is safe for concurrent use.
package screen

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
)

// Bounds enforced as hard failures.
const (
	MaxTools            = 1000
	MaxListingBytes     = 16 << 20
	MaxNameBytes        = 128
	MaxTitleBytes       = 1 << 10
	MaxDescriptionBytes = 16 << 10
	MaxSchemaBytes      = 256 << 10
	MaxAnnotationsBytes = 16 << 10
	MaxSchemaDepth      = 32
	MaxStringBytes      = 16 << 10
	// MaxSchemaObjects and MaxListingSchemaObjects bound the JSON objects in
	// one schema and in all the schemas of a listing. Unlike every other
	// check, compiling a schema (invalid_schema) costs tens of microseconds
	// per object, and more per object as one schema grows.
	MaxSchemaObjects        = 1000
	MaxListingSchemaObjects = 20000
)

// Heuristic parameters.
const (
	// MaxFindingsPerTool bounds the findings one tool can produce.
	MaxFindingsPerTool = 100
	// MinBase64Run is the shortest run reported as base64_run.
	MinBase64Run = 64
	// MaxEditDistance and MinFuzzyLen govern cross_reference and
	// name_collision look-alikes.
	MaxEditDistance = 2
	MinFuzzyLen     = 5
)

// Severity says whether a finding refuses the declaration.
type Severity uint8

const (
	// Flag: reported; the import proceeds.
	Flag Severity = iota + 1
	// HardFailure: the declaration cannot be represented safely; the
	// import refuses it.
	HardFailure
)

func (s Severity) String() string {
	switch s {
	case Flag:
		return "flag"
	case HardFailure:
		return "hard_failure"
	}
	return "unknown"
}

// Finding codes. They are stable: stores, audit records and tests use them.
const (
	CodeInvalidName           = "invalid_name"
	CodeInputSchemaNotObject  = "input_schema_not_object"
	CodeOutputSchemaNotObject = "output_schema_not_object"
	CodeAnnotationsNotObject  = "annotations_not_object"
	CodeInvalidJSON           = "invalid_json"
	CodeDuplicateKey          = "duplicate_key"
	CodeInvalidUTF8           = "invalid_utf8"
	CodeSchemaTooLarge        = "schema_too_large"
	CodeSchemaTooDeep         = "schema_too_deep"
	CodeStringTooLong         = "string_too_long"
	CodeDescriptionTooLong    = "description_too_long"
	CodeRemoteRef             = "remote_ref"
	CodeInvalidSchema         = "invalid_schema"
	CodeTooManyTools          = "too_many_tools"
	CodeListingTooLarge       = "listing_too_large"
	CodeDuplicateName         = "duplicate_name"
	// CodeSecretInDeclaration: the declaration holds a value of the registration's secrets
	// (found by the pool, which alone knows them).
	CodeSecretInDeclaration = "secret_in_declaration"

	CodeHiddenUnicode         = "hidden_unicode"
	CodeTagCharacters         = "tag_characters"
	CodeBidiOverride          = "bidi_override"
	CodeMixedScript           = "mixed_script"
	CodeInstructionTag        = "instruction_tag"
	CodeOverridePhrase        = "override_phrase"
	CodeConcealment           = "concealment"
	CodeCoercion              = "coercion"
	CodeCrossReference        = "cross_reference"
	CodeNameCollision         = "name_collision"
	CodeSensitiveTarget       = "sensitive_target"
	CodeExfiltrationParameter = "exfiltration_parameter"
	CodeShellExecution        = "shell_execution"
	CodeURLOrEmail            = "url_or_email"
	CodeBase64Run             = "base64_run"
	CodeEmbeddedSecret        = "embedded_secret"
	CodeAnnotationMismatch    = "annotation_mismatch"
	CodeAnnotationInvalid     = "annotation_invalid"
	CodeFindingsTruncated     = "findings_truncated"
)

// Finding is one observation about a declaration.
type Finding struct {
	Code     string
	Severity Severity
	// Location is a path into the declaration: "name", "description",
	// "inputSchema.properties.path.description", "annotations.readOnlyHint",
	// with [i] for array elements and ["…"] for keys that are not plain
	// identifiers. Listing-level findings use "tools[i].name" or "tools".
	Location string
	Message  string
}

func (f Finding) String() string {
	return fmt.Sprintf("%s %s at %s: %s", f.Severity, f.Code, f.Location, f.Message)
}

// Context describes the rest of the registry for the cross-server checks.
type Context struct {
	// OtherNames are names of other registered servers and of their tools.
	// Names that also occur in the screened listing are ignored for
	// cross_reference.
	OtherNames []string
}

// ToolReport is the screen's verdict on one declaration.
type ToolReport struct {
	// Name is the declared name as the server sent it; it may be hostile.
	Name     string
	Findings []Finding
	// Refused is true when the tool must not be imported: it has a hard
	// failure, its name is duplicated, or the listing as a whole failed.
	Refused bool
}

// Report is the screen's verdict on a listing.
type Report struct {
	// Listing holds listing-level findings.
	Listing []Finding
	// Tools has one entry per input declaration, in input order.
	Tools []ToolReport
}

// Refused reports whether anything in the listing is refused.
func (r Report) Refused() bool {
	for _, f := range r.Listing {
		if f.Severity == HardFailure {
			return true
		}
	}
	for _, t := range r.Tools {
		if t.Refused {
			return true
		}
	}
	return false
}

// Screen checks a whole listing from one server.
func Screen(decls []mcpdecl.Declaration, ctx Context) Report {
	rep := Report{Tools: make([]ToolReport, len(decls))}
	for i, d := range decls {
		rep.Tools[i].Name = d.Name
	}
	total, objects := 0, 0
	for _, d := range decls {
		total += len(d.Name) + len(d.Title) + len(d.Description) +
			len(d.InputSchema) + len(d.OutputSchema) + len(d.Annotations)
		objects += jsonObjects(d.InputSchema) + jsonObjects(d.OutputSchema)
	}
	switch {
	case len(decls) > MaxTools:
		rep.Listing = append(rep.Listing, Finding{
			Code: CodeTooManyTools, Severity: HardFailure, Location: "tools",
			Message: fmt.Sprintf("%d tools, more than the bound of %d", len(decls), MaxTools),
		})
	case total > MaxListingBytes:
		rep.Listing = append(rep.Listing, Finding{
			Code: CodeListingTooLarge, Severity: HardFailure, Location: "tools",
			Message: fmt.Sprintf("%d bytes of declarations, more than the bound of %d", total, MaxListingBytes),
		})
	case objects > MaxListingSchemaObjects:
		rep.Listing = append(rep.Listing, Finding{
			Code: CodeListingTooLarge, Severity: HardFailure, Location: "tools",
			Message: fmt.Sprintf("%d JSON objects in the tools' schemas, more than the bound of %d", objects, MaxListingSchemaObjects),
		})
	}
	if len(rep.Listing) > 0 {
		for i := range rep.Tools {
			rep.Tools[i].Refused = true
		}
		return rep
	}

	first := make(map[string]int, len(decls))
	own := make(map[string]bool, len(decls))
	for i, d := range decls {
		own[strings.ToLower(d.Name)] = true
		j, dup := first[d.Name]
		if !dup {
			first[d.Name] = i
			continue
		}
		rep.Listing = append(rep.Listing, Finding{
			Code: CodeDuplicateName, Severity: HardFailure,
			Location: "tools[" + strconv.Itoa(i) + "].name",
			Message:  fmt.Sprintf("tool name %s is already used by tools[%d]", excerpt(d.Name), j),
		})
		rep.Tools[i].Refused = true
		rep.Tools[j].Refused = true
	}

	s := newSession(ctx, own)
	for i, d := range decls {
		t := s.tool(d)
		rep.Tools[i].Findings = t.findings
		rep.Tools[i].Refused = rep.Tools[i].Refused || t.hard > 0
	}
	return rep
}

// jsonObjects counts the objects of a JSON document: the '{' outside strings.
// It does not validate; a document that is not JSON is refused elsewhere.
func jsonObjects(raw []byte) int {
	n, inString := 0, false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case !inString && c == '{':
			n++
		}
	}
	return n
}

// ScreenTool checks one declaration on its own, as the pool does for a
// single re-listed tool. Listing-level checks need Screen.
func ScreenTool(d mcpdecl.Declaration, ctx Context) ToolReport {
	rep := Screen([]mcpdecl.Declaration{d}, ctx)
	return rep.Tools[0]
}
