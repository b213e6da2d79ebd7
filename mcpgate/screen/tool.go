package screen

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl/jcs"
	"github.com/ringfence/ringfence/mcpgate/schemas"
)

// toolScan collects the findings for one declaration. The location of the
// string being looked at is kept as a stack of path segments and only
// joined into a string when a finding is recorded.
type toolScan struct {
	s        *session
	path     []pathElem
	findings []Finding
	seen     map[string]bool
	hard     int // hard failures so far, dropped ones included
	dropped  int
	tooDeep  bool
}

// pathElem is a raw path part, an object key or an array index.
type pathElem struct {
	kind byte // 'r' raw, 'k' key, 'i' index
	s    string
	i    int
}

func (t *toolScan) loc() string {
	var b strings.Builder
	for _, e := range t.path {
		switch e.kind {
		case 'r':
			b.WriteString(e.s)
		case 'k':
			b.WriteString(segment(e.s))
		case 'i':
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(e.i))
			b.WriteByte(']')
		}
	}
	return b.String()
}

func (t *toolScan) add(code string, sev Severity, msg string) {
	if sev == HardFailure {
		t.hard++
	}
	loc := t.loc()
	key := code + "\x00" + loc
	if t.seen[key] {
		return
	}
	t.seen[key] = true
	if len(t.findings) >= MaxFindingsPerTool {
		t.dropped++
		return
	}
	t.findings = append(t.findings, Finding{Code: code, Severity: sev, Location: loc, Message: msg})
}

func (t *toolScan) hardf(code, format string, args ...any) {
	t.add(code, HardFailure, fmt.Sprintf(format, args...))
}

func (t *toolScan) at(raw string, f func()) {
	t.path = append(t.path, pathElem{kind: 'r', s: raw})
	f()
	t.path = t.path[:len(t.path)-1]
}

func (s *session) tool(d mcpdecl.Declaration) *toolScan {
	t := &toolScan{s: s, seen: map[string]bool{}, path: make([]pathElem, 0, 16)}
	t.at("name", func() { t.name(d.Name) })
	t.at("title", func() { t.plain("title", d.Title, MaxTitleBytes, CodeStringTooLong) })
	t.at("description", func() { t.plain("description", d.Description, MaxDescriptionBytes, CodeDescriptionTooLong) })

	t.at("inputSchema", func() {
		input, ok := t.raw("inputSchema", d.InputSchema, MaxSchemaBytes)
		switch {
		case !ok:
		case input == nil:
			t.hardf(CodeInputSchemaNotObject, "input schema is missing")
		default:
			hard := t.hard
			t.objectSchema("inputSchema", input, CodeInputSchemaNotObject)
			t.walk(input, 1, "")
			if t.hard == hard {
				t.compiles("input schema", d.InputSchema, input)
			}
		}
	})
	t.at("outputSchema", func() {
		if output, ok := t.raw("outputSchema", d.OutputSchema, MaxSchemaBytes); ok && output != nil {
			hard := t.hard
			t.objectSchema("outputSchema", output, CodeOutputSchemaNotObject)
			t.walk(output, 1, "")
			if t.hard == hard {
				t.compiles("output schema", d.OutputSchema, output)
			}
		}
	})
	var annotations *node
	t.at("annotations", func() {
		if a, ok := t.raw("annotations", d.Annotations, MaxAnnotationsBytes); ok && a != nil {
			if a.kind == '{' {
				annotations = a
			} else {
				t.hardf(CodeAnnotationsNotObject, "annotations are a JSON %s, not an object", a.kindName())
			}
			t.walk(a, 1, "")
		}
	})
	t.at("annotations", func() { t.annotations(d, annotations) })

	if t.dropped > 0 {
		// Appended past the bound on purpose: the reader must learn that
		// the list is incomplete.
		t.findings = append(t.findings, Finding{
			Code: CodeFindingsTruncated, Severity: Flag, Location: "",
			Message: fmt.Sprintf("%d more findings were dropped after the first %d", t.dropped, MaxFindingsPerTool),
		})
	}
	return t
}

func (t *toolScan) name(name string) {
	switch {
	case !utf8.ValidString(name):
		t.hardf(CodeInvalidUTF8, "name is not valid UTF-8")
		t.hardf(CodeInvalidName, "name must be 1 to %d characters of [A-Za-z0-9_.-]", MaxNameBytes)
		return
	case !validName(name):
		t.hardf(CodeInvalidName, "name %s must be 1 to %d characters of [A-Za-z0-9_.-]", excerpt(name), MaxNameBytes)
		if len(name) > MaxStringBytes {
			return
		}
	}
	for _, h := range t.s.nameCollisions(name) {
		t.add(h.code, Flag, h.msg)
	}
	// Read the identifier as words, so ignore_previous_instructions or
	// send-ssh-keys is seen as a phrase.
	spaced := strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || r == '.' {
			return ' '
		}
		return r
	}, name)
	for _, h := range t.s.scan(spaced, scanName) {
		t.add(h.code, Flag, h.msg)
	}
}

func validName(name string) bool {
	if len(name) == 0 || len(name) > MaxNameBytes {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// plain checks the title or the description.
func (t *toolScan) plain(what, s string, limit int, tooLong string) {
	if s == "" {
		return
	}
	if !utf8.ValidString(s) {
		t.hardf(CodeInvalidUTF8, "%s is not valid UTF-8", what)
		return
	}
	if len(s) > limit {
		t.hardf(tooLong, "%s is %d bytes, more than the bound of %d", what, len(s), limit)
		return
	}
	for _, h := range t.s.scan(s, scanText) {
		t.add(h.code, Flag, h.msg)
	}
}

// raw validates one raw JSON field and decodes it. It returns (nil, true)
// for an absent field and ok=false after a hard failure.
func (t *toolScan) raw(what string, raw json.RawMessage, limit int) (*node, bool) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, true
	}
	if len(raw) > limit {
		t.hardf(CodeSchemaTooLarge, "%s is %d bytes, more than the bound of %d", what, len(raw), limit)
		return nil, false
	}
	canonical, err := jcs.Canonicalize(raw)
	if err != nil {
		var je *jcs.Error
		offset := -1
		if errors.As(err, &je) {
			offset = je.Offset
		}
		switch {
		case errors.Is(err, jcs.ErrInvalidUTF8):
			t.hardf(CodeInvalidUTF8, "%s holds invalid UTF-8 or a lone surrogate near byte %d", what, offset)
		case errors.Is(err, jcs.ErrDuplicateKey):
			t.hardf(CodeDuplicateKey, "%s repeats an object key near byte %d", what, offset)
		case errors.Is(err, jcs.ErrTooDeep):
			t.hardf(CodeSchemaTooDeep, "%s is nested too deeply: more than %d levels of arrays and objects", what, MaxSchemaDepth)
		default:
			t.hardf(CodeInvalidJSON, "%s is not valid JSON near byte %d", what, offset)
		}
		return nil, false
	}
	n, err := decodeCanonical(canonical)
	if err != nil {
		// jcs produced it, so this cannot happen; refuse anyway.
		t.hardf(CodeInvalidJSON, "%s could not be decoded", what)
		return nil, false
	}
	if n.kind == 'n' {
		return nil, true
	}
	return n, true
}

func (t *toolScan) objectSchema(what string, n *node, code string) {
	if n.kind != '{' {
		t.hardf(code, "%s is a JSON %s, not an object schema", what, n.kindName())
		return
	}
	switch typ := n.member("type"); {
	case typ == nil:
		t.hardf(code, `%s has no "type": "object"`, what)
	case typ.kind != '"':
		t.hardf(code, `%s has a "type" that is a JSON %s, not "object"`, what, typ.kindName())
	case typ.str != "object":
		t.hardf(code, `%s has "type" %s, not "object"`, what, excerpt(typ.str))
	}
}

// maxCompileMessage bounds the compiler's text in one finding.
const maxCompileMessage = 300

// compiles refuses a schema that the pool's validator cannot use: the pool compiles the pinned
// schema with the same compiler before every call, so a schema that does not compile would
// fail every call after it was imported and published. It runs only on a schema that passed
// every other check: those bound the compiler's work, and a refused schema needs no second
// reason. The draft is the one the schema's "$schema" names, 2020-12 without one.
func (t *toolScan) compiles(what string, raw json.RawMessage, n *node) {
	if objects := jsonObjects(raw); objects > MaxSchemaObjects {
		t.hardf(CodeSchemaTooLarge, "%s holds %d JSON objects, more than the bound of %d", what, objects, MaxSchemaObjects)
		return
	}
	_, err := schemas.Compile(raw)
	if err == nil {
		return
	}
	var draft string
	if n.member("$schema") == nil {
		draft = ` as JSON Schema 2020-12 (it declares no "$schema")`
	}
	var ce *schemas.CompileError
	if !errors.As(err, &ce) {
		t.hardf(CodeInvalidSchema, "%s does not compile%s: %s", what, draft, printable(visible(err.Error(), maxCompileMessage)))
		return
	}
	for i, p := range ce.Problems {
		msg := p.Message
		if i == len(ce.Problems)-1 && ce.More > 0 {
			msg += fmt.Sprintf(" (and problems at %d more places)", ce.More)
		}
		pushed := t.pushPointer(n, p.Pointer)
		t.hardf(CodeInvalidSchema, "%s does not compile%s: %s", what, draft, printable(visible(msg, maxCompileMessage)))
		t.path = t.path[:len(t.path)-pushed]
	}
}

// pushPointer appends a JSON Pointer into n to the location, reading each token as an array
// index or an object key as the document has it, so the location reads like every other
// ("inputSchema.properties.a.type"). It returns how many elements it appended.
func (t *toolScan) pushPointer(n *node, tokens []string) int {
	for _, tok := range tokens {
		e := pathElem{kind: 'k', s: tok}
		switch {
		case n != nil && n.kind == '[':
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(n.items) {
				n = nil
				break
			}
			e, n = pathElem{kind: 'i', i: i}, n.items[i]
		case n != nil && n.kind == '{':
			n = n.member(tok)
		default:
			n = nil
		}
		t.path = append(t.path, e)
	}
	return len(tokens)
}

var refKeywords = map[string]bool{"$ref": true, "$dynamicRef": true, "$recursiveRef": true}

// walk visits every key and string of a decoded schema or annotations
// object. depth counts the arrays and objects entered so far.
func (t *toolScan) walk(n *node, depth int, parentKey string) {
	switch n.kind {
	case '{':
		if t.deep(depth) {
			return
		}
		for i, k := range n.keys {
			v := n.items[i]
			t.path = append(t.path, pathElem{kind: 'k', s: k})
			t.key(k, parentKey == "properties")
			if refKeywords[k] && v.kind == '"' && !strings.HasPrefix(v.str, "#") {
				t.hardf(CodeRemoteRef, "%s %s is not a local #fragment", k, excerpt(v.str))
			}
			t.walk(v, depth+1, k)
			t.path = t.path[:len(t.path)-1]
		}
	case '[':
		if t.deep(depth) {
			return
		}
		for i, e := range n.items {
			t.path = append(t.path, pathElem{kind: 'i', i: i})
			t.walk(e, depth+1, parentKey)
			t.path = t.path[:len(t.path)-1]
		}
	case '"':
		t.value(n.str, parentKey)
	}
}

func (t *toolScan) deep(depth int) bool {
	if depth <= MaxSchemaDepth {
		return false
	}
	if !t.tooDeep {
		t.tooDeep = true
		t.hardf(CodeSchemaTooDeep, "nested too deeply: more than %d levels of arrays and objects", MaxSchemaDepth)
	}
	return true
}

func (t *toolScan) key(k string, property bool) {
	if len(k) > MaxStringBytes {
		t.hardf(CodeStringTooLong, "key is %d bytes, more than the bound of %d", len(k), MaxStringBytes)
		return
	}
	for _, h := range t.s.scan(k, scanText) {
		t.add(h.code, Flag, "key: "+h.msg)
	}
	if property {
		if why := exfiltrationParameter(k); why != "" {
			t.add(CodeExfiltrationParameter, Flag, fmt.Sprintf("parameter %s %s", excerpt(k), why))
		}
	}
}

func (t *toolScan) value(s, parentKey string) {
	if len(s) > MaxStringBytes {
		t.hardf(CodeStringTooLong, "string is %d bytes, more than the bound of %d", len(s), MaxStringBytes)
		return
	}
	if parentKey == "$schema" && isMetaSchema(s) {
		return
	}
	for _, h := range t.s.scan(s, scanText) {
		t.add(h.code, Flag, h.msg)
	}
}

// isMetaSchema recognises the JSON Schema meta-schema URIs that generated
// schemas carry in "$schema".
func isMetaSchema(s string) bool {
	rest, ok := strings.CutPrefix(s, "https://json-schema.org/")
	if !ok {
		rest, ok = strings.CutPrefix(s, "http://json-schema.org/")
	}
	if !ok || len(rest) > 40 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '/' || c == '#') {
			return false
		}
	}
	return true
}

var hintKeys = []string{"destructiveHint", "idempotentHint", "openWorldHint", "readOnlyHint"}

// writeVerbs are words that say a tool changes something.
var writeVerbs = map[string]bool{
	"write": true, "delete": true, "remove": true, "rm": true, "del": true, "send": true,
	"post": true, "create": true, "update": true, "modify": true, "edit": true, "move": true,
	"rename": true, "upload": true, "put": true, "patch": true, "insert": true, "drop": true,
	"truncate": true, "overwrite": true, "append": true, "set": true, "kill": true,
	"terminate": true, "destroy": true, "purge": true, "publish": true, "push": true,
	"commit": true, "merge": true, "deploy": true, "share": true, "email": true, "transfer": true,
	"erase": true, "wipe": true, "revoke": true, "grant": true, "approve": true, "pay": true,
}

// readVerbs start the names of tools that only look.
var readVerbs = map[string]bool{
	"get": true, "list": true, "read": true, "search": true, "find": true, "fetch": true,
	"query": true, "describe": true, "show": true, "view": true, "check": true, "count": true,
	"lookup": true, "inspect": true, "info": true, "status": true, "browse": true,
}

func (t *toolScan) annotations(d mcpdecl.Declaration, a *node) {
	if a == nil {
		return
	}
	for _, k := range hintKeys {
		if v := a.member(k); v != nil && v.kind != 't' && v.kind != 'f' {
			t.at("."+k, func() {
				t.add(CodeAnnotationInvalid, Flag,
					fmt.Sprintf("%s is a JSON %s, not a boolean; it will be treated as absent", k, v.kindName()))
			})
		}
	}
	if ro := a.member("readOnlyHint"); ro == nil || ro.kind != 't' {
		return
	}
	t.path = append(t.path, pathElem{kind: 'r', s: ".readOnlyHint"})
	defer func() { t.path = t.path[:len(t.path)-1] }()
	if ds := a.member("destructiveHint"); ds != nil && ds.kind == 't' {
		t.add(CodeAnnotationMismatch, Flag, "readOnlyHint and destructiveHint are both true")
	}
	var annTitle string
	if at := a.member("title"); at != nil && at.kind == '"' {
		annTitle = at.str
	}
	// Names are verb_noun ("delete_file") or, less often, noun_verb
	// ("file_delete"). A trailing plural is read as a noun ("list_posts").
	var words []string
	if nw := identifierWords(d.Name); len(nw) > 0 {
		words = append(words, nw[0])
		if last := nw[len(nw)-1]; len(nw) > 1 && !readVerbs[nw[0]] && writeVerbs[last] {
			words = append(words, last)
		}
	}
	words = append(words, firstWord(d.Title), firstWord(annTitle), firstWord(d.Description))
	for _, w := range words {
		if v := writeVerb(w); v != "" {
			t.add(CodeAnnotationMismatch, Flag, fmt.Sprintf("readOnlyHint is true but the tool says %q", v))
			return
		}
	}
}

// identifierWords splits a tool name on separators and camelCase humps.
func identifierWords(name string) []string {
	var words []string
	start := 0
	flush := func(end int) {
		if end > start {
			words = append(words, strings.ToLower(name[start:end]))
		}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_' || c == '-' || c == '.' || c == ' ':
			flush(i)
			start = i + 1
		case c >= 'A' && c <= 'Z' && i > start && name[i-1] >= 'a' && name[i-1] <= 'z':
			flush(i)
			start = i
		}
	}
	flush(len(name))
	return words
}

// firstWord returns the first run of ASCII letters in s, lowercased.
func firstWord(s string) string {
	start := -1
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		switch {
		case letter && start < 0:
			start = i
		case !letter && start >= 0:
			return strings.ToLower(s[start:i])
		}
	}
	if start >= 0 {
		return strings.ToLower(s[start:])
	}
	return ""
}

// writeVerb returns the verb that w is a form of, or "".
func writeVerb(w string) string {
	if w == "" {
		return ""
	}
	if writeVerbs[w] {
		return w
	}
	for _, suffix := range []string{"s", "es", "d", "ed", "ing"} {
		if stem, ok := strings.CutSuffix(w, suffix); ok && writeVerbs[stem] {
			return stem
		}
	}
	// Doubled final consonant and e-drop: dropped, deleting.
	for _, suffix := range []string{"ped", "ping"} {
		if stem, ok := strings.CutSuffix(w, suffix); ok && writeVerbs[stem+"p"] {
			return stem + "p"
		}
	}
	if stem, ok := strings.CutSuffix(w, "ing"); ok && writeVerbs[stem+"e"] {
		return stem + "e"
	}
	return ""
}

// segment renders one key of a Location path; a key shaped like a secret
// is not repeated.
func segment(k string) string {
	if len(k) > 512 {
		k = k[:512] // only the first 64 bytes are shown; bound the redaction
	}
	k = redactSecrets(k)
	if isIdent(k) {
		return "." + k
	}
	if len(k) > 64 {
		// The ellipsis sits outside the quotes: the key does not end so.
		return "[" + strconv.QuoteToASCII(strings.ToValidUTF8(k[:64], "")) + "...]"
	}
	return "[" + strconv.QuoteToASCII(k) + "]"
}

func isIdent(k string) bool {
	if k == "" || len(k) > 64 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '$' ||
			i > 0 && (c >= '0' && c <= '9' || c == '-')) {
			return false
		}
	}
	return true
}
