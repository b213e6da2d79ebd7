package mcpgate

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/mcpgate/sanitize"
	"github.com/ringfence/ringfence/mcpgate/schemas"
	"github.com/ringfence/ringfence/mcpgate/screen"
)

// stubSpec is a spec for the stub session: a tool taking a path, with an output schema.
func stubSpec() *ToolSpec {
	return &ToolSpec{
		Namespace: Namespace, Name: "read-secret", Version: Version,
		InputSchema:  json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"n":{"type":"integer"}},"required":["path"]}`),
		OutputSchema: json.RawMessage(`{"type":"object","properties":{"value":{"type":"string"}},"required":["value"]}`),
		Pin:          "v1:sha256:" + strings.Repeat("a", 64),
		Permissions:  []string{"fs.read:{path}"},
	}
}

func okResult() *mcp.CallToolResult {
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: "<script>x</script>__system__ hi\u200b\x1b[31m"}},
		StructuredContent: map[string]any{"value": "<b>v</b>", "nested": map[string]any{"list": []any{"__assistant__ok", 1.0}}, "<k>": "x"},
	}
}

// TestANonObjectResultIsRefusedWithoutAnOutputSchema: structured content that is not a JSON
// object is refused (seed 004's "returned non-object output") also for a tool that declares no
// output schema, where no schema check would catch it; the call did reach the server.
func TestANonObjectResultIsRefusedWithoutAnOutputSchema(t *testing.T) {
	spec := stubSpec()
	spec.OutputSchema = nil
	s := &stubSession{result: &mcp.CallToolResult{StructuredContent: []any{"x"}}}
	_, err := CallTool(t.Context(), s, spec, map[string]any{"path": "/secrets/a"}, claims(t, "fs.read"))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, StageOutput, ve.Stage)
	require.Contains(t, ve.Message, "not a JSON object")
	require.EqualValues(t, 1, s.calls.Load(), "refused after dispatch: the call reached the server")
}

// TestCallToolOrder: every step refuses in its place, and a refusal before invoke never
// reaches the session (counted).
func TestCallToolOrder(t *testing.T) {
	live := Listing{"read-secret": stubSpec().Pin}
	for _, tc := range []struct {
		name   string
		args   map[string]any
		caps   []string
		opts   []CallOption
		result *mcp.CallToolResult
		// want is the error type expected (nil: success); calls how often the session was
		// invoked.
		want  any
		stage string
		calls int64
	}{
		{name: "allowed", args: map[string]any{"path": "/secrets/api-key"}, caps: []string{"fs.read:/secrets/*"}, calls: 1},
		{name: "no claim", args: map[string]any{"path": "/secrets/api-key"}, caps: nil, want: &CapabilityError{}, calls: 0},
		{name: "claim elsewhere", args: map[string]any{"path": "/etc/shadow"}, caps: []string{"fs.read:/secrets/*"}, want: &CapabilityError{}, calls: 0},
		{name: "capability before input", args: map[string]any{"path": "/etc/x", "n": "not a number"}, caps: []string{"fs.read:/secrets/*"}, want: &CapabilityError{}, calls: 0},
		{name: "input invalid", args: map[string]any{"path": "/secrets/a", "n": "x"}, caps: []string{"fs.read"}, want: &ValidationError{}, stage: StageInput, calls: 0},
		{name: "input before drift", args: map[string]any{"path": "/secrets/a", "n": "x"}, caps: []string{"fs.read"}, opts: []CallOption{WithDrift(Listing{})}, want: &ValidationError{}, stage: StageInput, calls: 0},
		{name: "drift", args: map[string]any{"path": "/secrets/a"}, caps: []string{"fs.read"}, opts: []CallOption{WithDrift(Listing{"read-secret": "v1:sha256:" + strings.Repeat("b", 64)})}, want: &DriftError{}, calls: 0},
		{name: "no drift", args: map[string]any{"path": "/secrets/a"}, caps: []string{"fs.read"}, opts: []CallOption{WithDrift(live)}, calls: 1},
		{name: "output invalid", args: map[string]any{"path": "/secrets/a"}, caps: []string{"fs.read"}, result: &mcp.CallToolResult{StructuredContent: map[string]any{"value": 3}}, want: &ValidationError{}, stage: StageOutput, calls: 1},
		{name: "output missing", args: map[string]any{"path": "/secrets/a"}, caps: []string{"fs.read"}, result: &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "x"}}}, want: &ValidationError{}, stage: StageOutput, calls: 1},
		{name: "output not an object", args: map[string]any{"path": "/secrets/a"}, caps: []string{"fs.read"}, result: &mcp.CallToolResult{StructuredContent: []any{"x"}}, want: &ValidationError{}, stage: StageOutput, calls: 1},
		{name: "too large", args: map[string]any{"path": "/secrets/a"}, caps: []string{"fs.read"}, opts: []CallOption{WithMaxResultBytes(64)}, want: &TooLargeError{}, calls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &stubSession{result: tc.result}
			if s.result == nil {
				s.result = okResult()
			}
			res, err := CallTool(t.Context(), s, stubSpec(), tc.args, claims(t, tc.caps...), tc.opts...)
			require.Equal(t, tc.calls, s.calls.Load(), "calls that reached the session")
			switch want := tc.want.(type) {
			case nil:
				require.NoError(t, err)
				require.NotNil(t, res)
			case *CapabilityError:
				require.ErrorAs(t, err, &want)
			case *ValidationError:
				require.ErrorAs(t, err, &want)
				require.Equal(t, tc.stage, want.Stage, "%v", err)
			case *DriftError:
				require.ErrorAs(t, err, &want)
			case *TooLargeError:
				require.ErrorAs(t, err, &want)
			}
		})
	}
}

// TestSanitizationOfEveryStringLeaf: HTML escaping, control and invisible characters
// stripped, role markers removed, in content, structured content and keys alike.
func TestSanitizationOfEveryStringLeaf(t *testing.T) {
	s := &stubSession{result: okResult()}
	res, err := CallTool(t.Context(), s, stubSpec(), map[string]any{"path": "/secrets/a"}, claims(t, "fs.read"))
	require.NoError(t, err)
	require.Equal(t, "&lt;script&gt;x&lt;/script&gt; hi[31m", text(res, 0))
	require.Equal(t, "&lt;b&gt;v&lt;/b&gt;", res.StructuredContent["value"])
	require.Equal(t, "ok", res.StructuredContent["nested"].(map[string]any)["list"].([]any)[0])
	require.Contains(t, res.StructuredContent, "&lt;k&gt;")
	require.Positive(t, res.Size)

	kept, err := CallTool(t.Context(), s, stubSpec(), map[string]any{"path": "/secrets/a"}, claims(t, "fs.read"),
		WithSanitize(sanitize.Options{KeepMarkup: true, Redact: func(s string) string { return strings.ReplaceAll(s, "hi", "[masked]") }}))
	require.NoError(t, err)
	require.Equal(t, "<script>x</script> [masked][31m", text(kept, 0), "markup kept, secrets masked, markers still removed")
}

// TestAContentItemMaskingBreaksIsRefused: a secret masked inside an image's or an embedded
// resource's base64 data leaves an item no MCP client can read (the mask is not base64): the
// result is refused as invalid output, whichever way it was answered, rather than passed on as
// something one caller (a gRPC one) receives and another (an MCP client) cannot. A secret
// masked in an image's MIME type, which stays a string, still passes, masked.
func TestAContentItemMaskingBreaksIsRefused(t *testing.T) {
	spec := &ToolSpec{Name: "img"} // no output schema: content alone
	redact := sanitize.Options{Redact: func(s string) string { return strings.ReplaceAll(s, "s3cretKey", "********") }}
	for _, item := range []string{
		`{"type":"image","mimeType":"image/png","data":"AAAAs3cretKeyAAA"}`,
		`{"type":"resource","resource":{"uri":"file:///a","blob":"AAAAs3cretKeyAAA"}}`,
	} {
		raw := json.RawMessage(`{"content":[{"type":"text","text":"ok"},` + item + `]}`)
		var decoded mcp.CallToolResult
		require.NoError(t, json.Unmarshal(raw, &decoded))
		for how, process := range map[string]func() (*Result, error){
			"raw":     func() (*Result, error) { return ProcessRawResult(spec, slices.Clone(raw), WithSanitize(redact)) },
			"decoded": func() (*Result, error) { return ProcessResult(spec, &decoded, WithSanitize(redact)) },
		} {
			_, err := process()
			var ve *ValidationError
			require.ErrorAs(t, err, &ve, "%s: %s", how, item)
			require.Equal(t, StageOutput, ve.Stage)
			require.Contains(t, ve.Message, "content item 1")
			require.Contains(t, ve.Message, "left what is no MCP content item")
			require.NotContains(t, err.Error(), "s3cretKey")
		}
	}
	res, err := ProcessRawResult(spec, json.RawMessage(`{"content":[{"type":"image","mimeType":"image/s3cretKey","data":"AAAA"}]}`), WithSanitize(redact))
	require.NoError(t, err)
	require.Equal(t, "image/********", res.Content[0]["mimeType"])
}

func TestValidationErrorsNameTheField(t *testing.T) {
	s := &stubSession{result: okResult()}
	_, err := CallTool(t.Context(), s, stubSpec(), map[string]any{"n": 1}, claims(t, "fs.read"), WithPermissions())
	var ce *CapabilityError
	require.ErrorAs(t, err, &ce, "the placeholder's argument is missing: refused at the capability gate")
	require.Contains(t, ce.Problem, `argument "path"`)

	spec := stubSpec()
	spec.Permissions, spec.NoPermissionNeeded = nil, true
	_, err = CallTool(t.Context(), s, spec, map[string]any{"n": 1}, Capabilities{})
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Contains(t, ve.Message, "missing property")
	require.Contains(t, ve.Message, "path")
	require.Contains(t, err.Error(), `"read-secret" input schema validation failed`)
	require.Zero(t, s.calls.Load())

	_, err = CallTool(t.Context(), s, spec, map[string]any{"path": "/a", "n": 1.5}, Capabilities{})
	require.ErrorAs(t, err, &ve)
	require.Contains(t, ve.Message, "/n")
}

// TestInputErrorsCarryNoControlCharacters: an input error names where the arguments fail, by
// their keys (the caller's) and the schema's property names (the server's), and quotes values
// of both; a terminal escape or an invisible character in any of them must not reach the
// refusal (the agent, a log line, an audit record, an operator's terminal), while the
// message's own quotes stay as they are.
func TestInputErrorsCarryNoControlCharacters(t *testing.T) {
	for name, tc := range map[string]struct {
		schema string
		args   map[string]any
	}{
		"an argument's key":   {`{"type":"object","additionalProperties":{"type":"integer"}}`, map[string]any{"k\x1b[2Jz\u202e": "s"}},
		"a schema's property": {`{"type":"object","properties":{"p\u001b]0;t\u0007\u200b":{"type":"integer"}}}`, map[string]any{"p\x1b]0;t\x07\u200b": "s"}},
		"an enum value":       {`{"type":"object","properties":{"path":{"enum":["a\u001b[31mred"]}},"required":["path"]}`, map[string]any{"path": "b\x1b[0m"}},
	} {
		t.Run(name, func(t *testing.T) {
			spec := stubSpec()
			spec.Permissions, spec.NoPermissionNeeded = nil, true
			spec.InputSchema = json.RawMessage(tc.schema)
			s := &stubSession{result: okResult()}
			_, err := CallTool(t.Context(), s, spec, tc.args, Capabilities{})
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, StageInput, ve.Stage)
			for _, r := range ve.Message {
				require.False(t, r < 0x20 || r == 0x7f || r == 0x200b || r == 0x202e, "control or invisible character %U in %q", r, ve.Message)
			}
			require.NotContains(t, ve.Message, "&#39;", "the message's own quotes are not escaped")
			require.Zero(t, s.calls.Load())
		})
	}
}

func TestArgumentScopedPermissions(t *testing.T) {
	spec := stubSpec()
	spec.Permissions = []string{"process_spawn"}
	s := &stubSession{result: okResult()}
	caps := claims(t, "process_spawn", "fs.read:/srv/docs/**")
	call := func(path string, opts ...CallOption) error {
		_, err := CallTool(t.Context(), s, spec, map[string]any{"path": path}, caps, opts...)
		return err
	}
	scoped := WithPermissions("fs.read:{path}")
	require.NoError(t, call("/etc/passwd"), "without the call's permissions, the spec's alone")
	require.NoError(t, call("/srv/docs/a/b.md", scoped))

	var ce *CapabilityError
	require.ErrorAs(t, call("/etc/passwd", scoped), &ce)
	require.Equal(t, []string{"fs.read:/etc/passwd"}, ce.Missing)
	require.ErrorContains(t, ce, "requires permissions not granted: fs.read:/etc/passwd")

	require.ErrorAs(t, call("/srv/docs/../../etc/shadow", scoped), &ce)
	require.Contains(t, ce.Problem, `".." segment`)

	revoked := caps
	revoked.Revoked = []Claim{{Namespace: "fs.read", Scope: "/srv/docs/private/*"}}
	_, err := CallTool(t.Context(), s, spec, map[string]any{"path": "/srv/docs/private/x"}, revoked, scoped)
	require.ErrorAs(t, err, &ce, "a revoke entry takes coverage away")

	// Revoke entries a wildcard argument must be compared with to their ends.
	wild := Capabilities{Claims: []Claim{{Namespace: "process_spawn"}, {Namespace: "fs.read"}}}
	for range 256 {
		wild.Revoked = append(wild.Revoked, Claim{Namespace: "fs.read", Scope: strings.Repeat("*/", 123) + "*"})
	}
	_, err = CallTool(t.Context(), s, spec, map[string]any{"path": strings.Repeat("*/", 122) + "*"}, wild, scoped, WithWorkLimit(10_000))
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int64(10_000), ce.WorkLimit)
	require.ErrorContains(t, err, "per-call limit")
	require.Equal(t, int64(2), s.calls.Load(), "only the two allowed calls reached the session")
}

func TestStrictInputs(t *testing.T) {
	spec := stubSpec()
	spec.Permissions, spec.NoPermissionNeeded = nil, true
	s := &stubSession{result: okResult()}
	args := map[string]any{"path": "/a", "smuggled": "x"}
	_, err := CallTool(t.Context(), s, spec, args, Capabilities{})
	require.NoError(t, err, "undeclared arguments pass an open schema")
	_, err = CallTool(t.Context(), s, spec, args, Capabilities{}, WithStrictInputs(true))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Contains(t, ve.Message, "smuggled")
}

// TestUnusableSchemasAreRefusedBeforeInvoke: an output schema that does not compile would
// only be found after the call took effect; it is a refusal before.
func TestUnusableSchemasAreRefusedBeforeInvoke(t *testing.T) {
	for which, edit := range map[string]func(*ToolSpec){
		"input":  func(s *ToolSpec) { s.InputSchema = json.RawMessage(`{"type":"nonsense"}`) },
		"output": func(s *ToolSpec) { s.OutputSchema = json.RawMessage(`{"type":"nonsense"}`) },
	} {
		spec := stubSpec()
		spec.Permissions, spec.NoPermissionNeeded = nil, true
		edit(spec)
		s := &stubSession{result: okResult()}
		_, err := CallTool(t.Context(), s, spec, map[string]any{"path": "/a"}, Capabilities{})
		var ve *ValidationError
		require.ErrorAs(t, err, &ve, which)
		require.True(t, ve.SchemaUnusable, which)
		require.Contains(t, ve.Message, "the "+which+" schema")
		require.Zero(t, s.calls.Load())
	}
}

func TestARefusedDeclarationIsNeverCalled(t *testing.T) {
	spec := stubSpec()
	spec.Permissions, spec.NoPermissionNeeded = nil, true
	spec.Refused = true
	spec.Findings = []screen.Finding{{Code: screen.CodeInvalidSchema, Severity: screen.HardFailure, Location: "inputSchema", Message: "broken"}}
	s := &stubSession{result: okResult()}
	_, err := CallTool(t.Context(), s, spec, map[string]any{"path": "/a"}, Capabilities{})
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, StageDeclaration, ve.Stage)
	require.Contains(t, ve.Message, "invalid_schema")
	require.Zero(t, s.calls.Load())
}

func TestResultBounds(t *testing.T) {
	spec := stubSpec()
	spec.Permissions, spec.OutputSchema, spec.NoPermissionNeeded = nil, nil, true
	many := &mcp.CallToolResult{}
	for range MaxContentItems + 1 {
		many.Content = append(many.Content, &mcp.TextContent{})
	}
	_, err := CallTool(t.Context(), &stubSession{result: many}, spec, map[string]any{"path": "/a"}, Capabilities{})
	var tl *TooLargeError
	require.ErrorAs(t, err, &tl)
	require.Equal(t, "content items", tl.What)

	deep := any("x")
	for range sanitize.MaxDepth + 2 {
		deep = []any{deep}
	}
	_, err = CallTool(t.Context(), &stubSession{result: &mcp.CallToolResult{StructuredContent: map[string]any{"d": deep}}}, spec, map[string]any{"path": "/a"}, Capabilities{})
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Contains(t, ve.Message, "nested too deeply: more than 128 levels of arrays and objects")

	// An error result's structured content is not an object: left out, the error stays.
	res, err := CallTool(t.Context(), &stubSession{result: &mcp.CallToolResult{IsError: true, StructuredContent: "no", Content: []mcp.Content{&mcp.TextContent{Text: "failed"}}}}, stubSpec(), map[string]any{"path": "/a"}, claims(t, "fs.read"))
	require.NoError(t, err)
	require.True(t, res.IsError)
	require.Nil(t, res.StructuredContent)
	require.Equal(t, "failed", text(res, 0))
}

func TestSessionFailuresAreWrapped(t *testing.T) {
	boom := errors.New("connection reset")
	spec := stubSpec()
	spec.Permissions, spec.NoPermissionNeeded = nil, true
	_, err := CallTool(t.Context(), &stubSession{err: boom}, spec, map[string]any{"path": "/a"}, Capabilities{})
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, `tools/call of "read-secret" failed`)
}

// TestSchemaCacheKeysByPin: a spec built per call compiles its schemas once through the
// cache, and a spec without a real pin is compiled for itself.
func TestSchemaCacheKeysByPin(t *testing.T) {
	cache := schemas.NewCache()
	spec := stubSpec()
	spec.Permissions, spec.NoPermissionNeeded = nil, true
	s := &stubSession{result: okResult()}
	_, err := CallTool(t.Context(), s, spec, map[string]any{"path": "/a"}, Capabilities{}, WithSchemaCache(cache))
	require.NoError(t, err)
	again := stubSpec()
	again.Permissions, again.NoPermissionNeeded = nil, true
	again.InputSchema = json.RawMessage(`{"type":"object","required":["other"]}`)
	_, err = CallTool(t.Context(), s, again, map[string]any{"path": "/a"}, Capabilities{}, WithSchemaCache(cache))
	require.NoError(t, err, "same pin: the cached schema (a pin is the hash of its declaration)")
	again.Pin = ListedTwice
	_, err = CallTool(t.Context(), s, again, map[string]any{"path": "/a"}, Capabilities{}, WithSchemaCache(cache))
	require.Error(t, err, "no real pin: compiled for itself")
}
