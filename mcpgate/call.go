package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ringfence/ringfence/mcpgate/capability"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
	"github.com/ringfence/ringfence/mcpgate/sanitize"
	"github.com/ringfence/ringfence/mcpgate/schemas"
	"github.com/ringfence/ringfence/mcpgate/screen"
)

// Bounds of one call.
const (
	// DefaultWorkLimit bounds the capability comparisons of one call, in capability.Meter
	// units (tens of milliseconds of CPU at most): arguments are the caller's to choose, and
	// a scope shaped against wildcard revoke entries could otherwise cost seconds.
	DefaultWorkLimit = 1 << 23
	// MaxContentItems bounds the content items of one result: each becomes a map the result
	// is sanitized through, so a 15 MiB message of empty items would cost ~400 MiB.
	MaxContentItems = 10_000
	// maxSafeText bounds text quoted from a schema or a result in a message.
	maxSafeText = 512
)

// CallOption adds an optional step to a call, or tunes one.
type CallOption func(*callConfig)

type callConfig struct {
	permissions    []string
	workLimit      int64
	strict         bool
	drift          bool
	live           Listing
	maxResultBytes int
	sanitize       sanitize.Options
	safe           func(string) string
	cache          *schemas.Cache
}

func configure(opts []CallOption) callConfig {
	cfg := callConfig{workLimit: DefaultWorkLimit, safe: safeText}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return cfg
}

// WithPermissions adds requirements to the spec's own for this call, e.g. a deployment's
// current per-tool permissions; like the spec's, they may name arguments ("fs.read:{path}").
func WithPermissions(reqs ...string) CallOption {
	return func(c *callConfig) { c.permissions = append(c.permissions, reqs...) }
}

// WithWorkLimit sets the bound on the capability gate's comparison work (DefaultWorkLimit).
func WithWorkLimit(units int64) CallOption {
	return func(c *callConfig) { c.workLimit = units }
}

// WithStrictInputs, when on, refuses arguments the input schema does not declare: every
// object schema that lists its properties and says nothing of others is read as closed.
func WithStrictInputs(on bool) CallOption {
	return func(c *callConfig) { c.strict = on }
}

// WithDrift adds the drift check before invoke: the tool's declaration in live (the session's
// current listing, see ListingOf) must hash to the spec's Pin.
func WithDrift(live Listing) CallOption {
	return func(c *callConfig) { c.drift, c.live = true, live }
}

// WithMaxResultBytes caps a result: content and structured content together, as JSON, may not
// exceed n bytes (0: no cap).
func WithMaxResultBytes(n int) CallOption {
	return func(c *callConfig) { c.maxResultBytes = n }
}

// WithSanitize sets how results are sanitized: KeepMarkup skips only the HTML escaping, for
// a server whose output is markup on purpose; Redact masks secret values.
func WithSanitize(o sanitize.Options) CallOption {
	return func(c *callConfig) { c.sanitize = o }
}

// WithSafeText sets how text a schema or a server chose is cleaned before an error quotes it
// (by default: bounded and sanitized).
func WithSafeText(f func(string) string) CallOption {
	return func(c *callConfig) { c.safe = f }
}

// WithSchemaCache compiles the schemas of specs Bind did not make through cache, keyed by
// their Pin, so a spec rebuilt for every call does not recompile them. A Pin must then be the
// hash of the spec's own declaration.
func WithSchemaCache(cache *schemas.Cache) CallOption {
	return func(c *callConfig) { c.cache = cache }
}

// Result is a tool's sanitized result.
type Result struct {
	// Content is the MCP content list, each item as its JSON object.
	Content []map[string]any
	// StructuredContent is the structured result; nil when there is none (or when an error
	// result carried one that is not an object). Its numbers are as the session decoded them
	// (a go-sdk session: float64).
	StructuredContent map[string]any
	// IsError is the tool's own report of failure; its content says what went wrong.
	IsError bool
	// Size is the bytes of the content and structured content as JSON, before sanitization
	// (a text item's text counted as it is, unescaped).
	Size int
}

// CallTool calls a tool through every gate, in order: capability gate, input validation, the
// drift check (WithDrift), invoke, output validation, sanitization. A refusal before invoke
// (*CapabilityError, *ValidationError, *DriftError) means nothing reached the session; a
// *ValidationError of StageOutput or a *TooLargeError means the call reached the server and
// may have taken effect. A failure of the session itself is returned wrapped (errors.Is and
// errors.As find it), its text cleaned as WithSafeText says: it is the server's to choose.
// A nil spec or session is an error, not a panic.
func CallTool(ctx context.Context, session Session, spec *ToolSpec, args map[string]any, caps Capabilities, opts ...CallOption) (*Result, error) {
	if session == nil {
		return nil, errNilSession
	}
	cfg := configure(opts)
	if err := check(spec, args, caps, &cfg); err != nil {
		return nil, err
	}
	if cfg.drift {
		if err := CheckDrift(spec, cfg.live); err != nil {
			return nil, err
		}
	}
	if args == nil {
		args = map[string]any{}
	}
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: spec.Name, Arguments: args})
	if err != nil {
		return nil, &invokeError{tool: spec.Name, err: err, text: cfg.safe(err.Error())}
	}
	return processResult(spec, res, nil, &cfg)
}

// invokeError is a failure of the session's tools/call. Its text is cleaned, since a server
// chooses the message of a JSON-RPC error (markup, role markers, invisible characters); the
// session's error itself stays reachable through Unwrap.
type invokeError struct {
	tool, text string
	err        error
}

func (e *invokeError) Error() string {
	return fmt.Sprintf("mcpgate: tools/call of %q failed: %s", e.tool, e.text)
}

func (e *invokeError) Unwrap() error { return e.err }

// Errors of calls that pass no spec or no session: the caller's mistake, reported rather than
// a nil dereference.
var (
	errNilSpec    = errors.New("mcpgate: the ToolSpec is nil: pass one Bind returned (&specs[i])")
	errNilSession = errors.New("mcpgate: the Session is nil: pass the session the specs were bound on")
)

// Check runs the gates before invoke, in order: the declaration is usable (else
// *ValidationError, StageDeclaration), the capability gate (*CapabilityError), and input
// validation (*ValidationError, StageInput), which also requires the output schema to compile,
// so that a broken one is a refusal now rather than a failure after the call took effect
// (SchemaUnusable). A nil error means the call may be sent.
func Check(spec *ToolSpec, args map[string]any, caps Capabilities, opts ...CallOption) error {
	cfg := configure(opts)
	return check(spec, args, caps, &cfg)
}

func check(spec *ToolSpec, args map[string]any, caps Capabilities, cfg *callConfig) error {
	if spec == nil {
		return errNilSpec
	}
	if spec.Refused {
		return &ValidationError{Tool: spec.Name, Stage: StageDeclaration, Message: "the declaration screen refused it: " + cfg.safe(hardFindings(spec.Findings))}
	}
	if err := checkCapabilities(spec, args, caps, cfg); err != nil {
		return err
	}
	return checkInput(spec, args, cfg)
}

func hardFindings(fs []screen.Finding) string {
	var out []string
	for _, f := range fs {
		if f.Severity == screen.HardFailure {
			out = append(out, fmt.Sprintf("%s at %s: %s", f.Code, f.Location, f.Message))
		}
	}
	return strings.Join(out, "; ")
}

// unpermissioned is the fix for a call refused because its tool was given no permissions.
const unpermissioned = "it was given no permissions, and calls are default-deny: list the capabilities a call needs in BindOptions.Permissions (or AdapterSpec.Permissions, BindOptions.Required, WithPermissions), or say it needs none by mapping it to an empty list in BindOptions.Permissions (ToolSpec.NoPermissionNeeded)"

// checkCapabilities expands each requirement with the call's arguments (e.g. "fs.read:{path}"
// with path "/srv/a") and demands a covering claim that no revoke entry takes away.
func checkCapabilities(spec *ToolSpec, args map[string]any, caps Capabilities, cfg *callConfig) error {
	reqs := spec.Permissions
	if len(cfg.permissions) > 0 {
		reqs = append(slices.Clip(reqs), cfg.permissions...)
	}
	if len(reqs) == 0 {
		if spec.NoPermissionNeeded {
			return nil
		}
		// Default-deny: a tool nobody gave permissions is not open to every caller.
		return &CapabilityError{Tool: spec.Name, Unpermissioned: true, Problem: unpermissioned}
	}
	// A revoke entry that is not a capability would withdraw nothing: refuse rather than
	// allow what its author meant to take away.
	for _, r := range caps.Revoked {
		if err := claimProblem(r); err != nil {
			return &CapabilityError{Tool: spec.Name, Problem: fmt.Sprintf("revoke entry %q is not a capability, so it would withdraw nothing and every call is refused: %v", truncate(r.String(), 80), err)}
		}
	}
	eff := caps.effective()
	meter := &capability.Meter{Limit: cfg.workLimit}
	var missing, checked []string
	for _, req := range reqs {
		expanded := req
		if strings.IndexByte(req, '{') >= 0 {
			var err error
			expanded, err = capability.Expand(req, func(arg string) (string, bool) {
				v, ok := args[arg].(string)
				return v, ok
			})
			if err != nil {
				return &CapabilityError{Tool: spec.Name, Problem: err.Error()}
			}
		}
		if slices.Contains(checked, expanded) {
			continue
		}
		checked = append(checked, expanded)
		c, err := capability.Parse(expanded)
		if err != nil {
			return &CapabilityError{Tool: spec.Name, Problem: fmt.Sprintf("requirement %q with these arguments is %q, which is not a capability: %v", req, expanded, err)}
		}
		if !eff.CoversMetered(c, meter) {
			missing = append(missing, expanded)
		}
		if meter.Exceeded() {
			return &CapabilityError{Tool: spec.Name, WorkLimit: cfg.workLimit}
		}
	}
	if len(missing) > 0 {
		var malformed []string
		for _, c := range caps.Claims {
			if err := claimProblem(c); err != nil {
				malformed = append(malformed, fmt.Sprintf("%q: %v", truncate(c.String(), 80), err))
			}
		}
		return &CapabilityError{Tool: spec.Name, Missing: missing, Malformed: malformed}
	}
	return nil
}

// claimProblem says why c is not a capability (and so covers nothing), or nil.
func claimProblem(c Claim) error {
	p, err := capability.Parse(c.String())
	switch {
	case err != nil:
		return err
	case p.Name != c.Namespace:
		return fmt.Errorf("its Namespace holds ':': put what follows it in Scope (Claim{Namespace: %q, Scope: %q}, or ParseClaim)", p.Name, p.Scope)
	}
	return nil
}

// Which of a spec's schemas.
const (
	schemaInput = iota
	schemaStrict
	schemaOutput
)

var schemaKeys = [...]string{schemaInput: "/input", schemaStrict: "/input-strict", schemaOutput: "/output"}

// schema compiles one of the spec's schemas: the ones Bind compiled, else through the cache
// by pin, else now.
func (s *ToolSpec) schema(which int, cfg *callConfig) (*schemas.Schema, error) {
	if c := s.compiled; c != nil {
		switch which {
		case schemaInput:
			return c.input, c.inputErr
		case schemaStrict:
			return c.strict, c.strictErr
		}
		return c.output, c.outErr
	}
	raw := s.InputSchema
	if which == schemaOutput {
		raw = s.OutputSchema
	}
	if cfg.cache != nil && isPin(s.Pin) {
		if which == schemaStrict {
			return cfg.cache.GetStrict(s.Pin+schemaKeys[which], raw)
		}
		return cfg.cache.Get(s.Pin+schemaKeys[which], raw)
	}
	if which == schemaStrict {
		return schemas.CompileStrict(raw)
	}
	return schemas.Compile(raw)
}

func isPin(s string) bool {
	_, err := mcpdecl.ParseHash(s)
	return err == nil
}

// compile compiles every schema of a spec Bind made, once.
func (s *ToolSpec) compile() {
	c := &compiledSchemas{}
	c.input, c.inputErr = schemas.Compile(s.InputSchema)
	c.strict, c.strictErr = schemas.CompileStrict(s.InputSchema)
	if len(s.OutputSchema) > 0 {
		c.output, c.outErr = schemas.Compile(s.OutputSchema)
	}
	s.compiled = c
}

func checkInput(spec *ToolSpec, args map[string]any, cfg *callConfig) error {
	unusable := func(which string, err error) error {
		return &ValidationError{Tool: spec.Name, Stage: StageInput, SchemaUnusable: true,
			Message: fmt.Sprintf("the %s schema of tool %q cannot be compiled: %s", which, spec.Name, cfg.safe(err.Error()))}
	}
	if spec.compiled == nil && len(spec.InputSchema) == 0 {
		return &ValidationError{Tool: spec.Name, Stage: StageInput, SchemaUnusable: true,
			Message: fmt.Sprintf("tool %q has no input schema (ToolSpec.InputSchema is empty): MCP requires one; a tool without arguments declares {\"type\":\"object\"}", spec.Name)}
	}
	in, err := spec.schema(schemaInput, cfg)
	if err != nil {
		return unusable("input", err)
	}
	if len(spec.OutputSchema) > 0 {
		if _, err := spec.schema(schemaOutput, cfg); err != nil {
			return unusable("output", err)
		}
	}
	if cfg.strict {
		if in, err = spec.schema(schemaStrict, cfg); err != nil {
			return unusable("input", err)
		}
	}
	// The validator quotes values, but names where the arguments fail by their keys (the
	// caller's) and the schema's property names (the server's) as they are: control and
	// invisible characters are stripped from the whole message, which is not escaped (it goes
	// back to the caller whose arguments these are, and quotes them).
	invalid := func(format string, args ...any) error {
		return &ValidationError{Tool: spec.Name, Stage: StageInput, Message: sanitize.String(fmt.Sprintf(format, args...), sanitize.Options{KeepMarkup: true})}
	}
	var v any = map[string]any{}
	if args != nil {
		if v, _, err = jsonValue(args); err != nil {
			return invalid("the arguments cannot be encoded as JSON: %v", err)
		}
	}
	var tooMuch *schemas.BudgetError
	if err := in.Validate(v); errors.As(err, &tooMuch) {
		return invalid("the arguments cannot be checked against the tool's input schema with bounded work, so they are refused: %v", err)
	} else if err != nil {
		return invalid("the arguments do not match the tool's input schema: %v", err)
	}
	return nil
}

// CheckDrift refuses a call with a *DriftError when live, the session's current listing
// (ListingOf), does not declare the tool exactly as pinned: absent, changed, listed twice or
// unreadable are all drift.
func CheckDrift(spec *ToolSpec, live Listing) error {
	if spec == nil {
		return errNilSpec
	}
	got, ok := live[spec.Name]
	if !ok {
		return &DriftError{Tool: spec.Name, Pinned: spec.Pin, Live: "(absent)"}
	}
	if got != spec.Pin {
		return &DriftError{Tool: spec.Name, Pinned: spec.Pin, Live: got}
	}
	return nil
}

// ProcessResult runs the gates after invoke on what tools/call answered: output validation
// (structured content against the output schema, unless the result is the tool's own error;
// a non-object where an object is required is an error: *ValidationError, StageOutput), the
// bounds on a result (*TooLargeError), and sanitization of every string leaf and key. A nil
// result is a *ProtocolError. Every error means the call reached the server and may have
// taken effect; a tool's own failure is not an error but a Result with IsError.
func ProcessResult(spec *ToolSpec, res *mcp.CallToolResult, opts ...CallOption) (*Result, error) {
	if spec == nil {
		return nil, errNilSpec
	}
	cfg := configure(opts)
	return processResult(spec, res, nil, &cfg)
}

// processResult checks and sanitizes a result. owned, when set, holds beside each plain text
// item of res.Content its text, decoded into a buffer of its own that sanitization may
// overwrite (ProcessRawResult); the item's own Text is then not read.
func processResult(spec *ToolSpec, res *mcp.CallToolResult, owned [][]byte, cfg *callConfig) (*Result, error) {
	if res == nil {
		// A session that answers neither a result nor an error.
		return nil, &ProtocolError{Tool: spec.Name, Message: "the session returned no result and no error"}
	}
	out := &Result{IsError: res.IsError}
	// msg is the package's own words; what it quotes of the result or the schema is cleaned
	// where it is put in (cfg.safe), so the words themselves are never escaped.
	invalid := func(msg string) error {
		return &ValidationError{Tool: spec.Name, Stage: StageOutput, Message: msg}
	}
	// The structured content is read once, as the validator reads JSON (numbers exact), and
	// what is validated is what is passed on.
	var structured any
	if res.StructuredContent != nil {
		var err error
		if structured, out.Size, err = jsonValue(res.StructuredContent); err != nil {
			return nil, invalid("the structured content is not JSON: " + cfg.safe(err.Error()))
		}
	}
	if !res.IsError && len(spec.OutputSchema) > 0 {
		if err := validateOutput(spec, structured, cfg); err != nil {
			return nil, invalid(err.Error())
		}
	}
	if len(res.Content) > MaxContentItems {
		return nil, &TooLargeError{Tool: spec.Name, What: "content items", Size: len(res.Content), Limit: MaxContentItems}
	}
	overCap := func() error {
		if cfg.maxResultBytes > 0 && out.Size > cfg.maxResultBytes {
			return &TooLargeError{Tool: spec.Name, What: "bytes", Size: out.Size, Limit: cfg.maxResultBytes}
		}
		return nil
	}
	if err := overCap(); err != nil {
		return nil, err
	}
	// A value nested deeper than the sanitizer (and the schema check) goes is refused, not
	// passed on with its deep parts cut off.
	tooDeep := func(what string) error {
		return invalid(fmt.Sprintf("%s is %v: results are checked and sanitized no deeper, so it is not passed on", what, sanitize.ErrTooDeep))
	}
	if len(res.Content) > 0 {
		out.Content = make([]map[string]any, 0, len(res.Content))
	}
	var changed *noLongerContent
	for i, c := range res.Content {
		var item map[string]any
		var size int
		var err error
		if i < len(owned) && owned[i] != nil {
			size = textItemSize + len(owned[i])
			item = map[string]any{"type": "text", "text": sanitize.Owned(owned[i], cfg.sanitize)}
			owned[i] = nil
		} else {
			item, size, err = contentItem(c, cfg.sanitize)
		}
		switch {
		case errors.Is(err, sanitize.ErrTooDeep):
			return nil, tooDeep(fmt.Sprintf("content item %d", i))
		case errors.As(err, &changed):
			return nil, invalid(fmt.Sprintf("content item %d: %s: %s", i, noLongerContentWords, cfg.safe(changed.err.Error())))
		case err != nil:
			return nil, invalid(cfg.safe(err.Error()))
		}
		out.Size += size
		if err := overCap(); err != nil {
			return nil, err
		}
		out.Content = append(out.Content, item)
	}
	if structured != nil {
		obj, isObj := structured.(map[string]any)
		switch {
		case !isObj && res.IsError:
			// An error result needs no structured content and no schema applies to it: one
			// that is not an object cannot be carried, so it is left out, and the result stays
			// the tool's error (its content says what went wrong).
		case !isObj:
			return nil, invalid("the structured content is not a JSON object")
		default:
			clean, err := sanitize.ValueWithin(obj, cfg.sanitize)
			if err != nil {
				return nil, tooDeep("the structured content")
			}
			out.StructuredContent = clean.(map[string]any)
		}
	}
	return out, nil
}

// textItemSize is what a text item's JSON adds to its text: {"type":"text","text":""}.
const textItemSize = len(`{"type":"text","text":""}`)

// contentItem turns one MCP content item into its JSON object form, sanitized, and its size
// as JSON. A plain text item (the common case) is built directly; any other goes through its
// JSON encoding.
func contentItem(c mcp.Content, o sanitize.Options) (map[string]any, int, error) {
	if t, ok := c.(*mcp.TextContent); ok && len(t.Meta) == 0 && t.Annotations == nil {
		return map[string]any{"type": "text", "text": sanitize.String(t.Text, o)}, textItemSize + len(t.Text), nil
	}
	raw, err := json.Marshal(c)
	if err != nil {
		return nil, 0, fmt.Errorf("a content item cannot be encoded: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, 0, fmt.Errorf("a content item is not an object: %v", err)
	}
	clean, err := sanitize.ValueWithin(m, o)
	if err != nil {
		return nil, 0, err
	}
	item := clean.(map[string]any)
	// Sanitizing may leave an item MCP cannot carry (a secret masked inside base64 data): one
	// that changed is read again as MCP content, and refused if it no longer is one, rather
	// than passed on as what a caller holding JSON receives and an MCP client cannot read.
	if !reflect.DeepEqual(item, m) {
		if err := isContent(item); err != nil {
			return nil, 0, &noLongerContent{err}
		}
	}
	return item, len(raw), nil
}

// noLongerContent: a content item is no MCP content item once sanitized; err says why.
type noLongerContent struct{ err error }

func (e *noLongerContent) Error() string { return noLongerContentWords + ": " + e.err.Error() }

const noLongerContentWords = "sanitizing it (a secret masked in it, markup escaped) left what is no MCP content item, so the result is not passed on"

// isContent says why item, a content item as JSON decodes it, is not one the MCP SDK reads;
// nil when it is.
func isContent(item map[string]any) error {
	raw, err := json.Marshal(map[string]any{"content": []any{item}})
	if err != nil {
		return err
	}
	var res mcp.CallToolResult
	return json.Unmarshal(raw, &res)
}

// validateOutput checks structured content (decoded; nil when there is none) against the
// output schema.
// validateOutput's errors are messages as a ValidationError carries them: what they quote of
// the schema or the value is cleaned (cfg.safe).
func validateOutput(spec *ToolSpec, structured any, cfg *callConfig) error {
	if structured == nil {
		return errors.New("the tool declares an output schema but returned no structured content")
	}
	sch, err := spec.schema(schemaOutput, cfg)
	if err != nil {
		return errors.New("the tool's output schema cannot be compiled: " + cfg.safe(err.Error()))
	}
	var tooMuch *schemas.BudgetError
	if err := sch.Validate(structured); errors.As(err, &tooMuch) {
		return errors.New("the structured content cannot be checked against the tool's output schema with bounded work, so it is not passed on: " + cfg.safe(err.Error()))
	} else if err != nil {
		return errors.New("the structured content does not match the tool's output schema: " + cfg.safe(err.Error()))
	}
	return nil
}

// jsonValue returns v as the validator reads JSON, and its size as JSON (strings counted
// unescaped): v itself when it holds only what encoding/json decodes into (nil, bool, finite
// float64, json.Number, string, []any, map[string]any), as a session's results and decoded
// arguments do; otherwise its JSON encoding, decoded with numbers kept exact.
func jsonValue(v any) (any, int, error) {
	if size, ok := jsonSize(v, 0); ok {
		return v, size, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, 0, err
	}
	d, err := schemas.Decode(raw)
	return d, len(raw), err
}

// jsonSize is the size of v as JSON when v is already JSON-shaped (ok), with strings counted
// unescaped. A value nested deeper than the validator reads is left to the decoding path.
func jsonSize(v any, depth int) (size int, ok bool) {
	if depth > schemas.MaxDepth+1 {
		return 0, false
	}
	switch v := v.(type) {
	case nil:
		return 4, true
	case bool:
		if v {
			return 4, true
		}
		return 5, true
	case string:
		return len(v) + 2, true
	case float64:
		if math.IsInf(v, 0) || math.IsNaN(v) {
			return 0, false
		}
		var buf [32]byte
		return len(strconv.AppendFloat(buf[:0], v, 'g', -1, 64)), true
	case json.Number:
		if _, err := strconv.ParseFloat(string(v), 64); err != nil {
			return 0, false
		}
		return len(v), true
	case []any:
		size = 2 + max(len(v)-1, 0)
		for _, e := range v {
			n, ok := jsonSize(e, depth+1)
			if !ok {
				return 0, false
			}
			size += n
		}
		return size, true
	case map[string]any:
		size = 2 + max(len(v)-1, 0)
		for k, e := range v {
			n, ok := jsonSize(e, depth+1)
			if !ok {
				return 0, false
			}
			size += len(k) + 3 + n
		}
		return size, true
	}
	return 0, false
}

// safeText is the default cleaning of quoted text: at most maxSafeText bytes, sanitized.
func safeText(s string) string {
	return sanitize.String(truncate(s, maxSafeText), sanitize.Options{})
}

// truncate bounds s to n bytes, cutting at a character boundary and marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
