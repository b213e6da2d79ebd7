package agentsurface

import (
	"encoding/json"

	"github.com/ringfence/ringfence/mcpgate/sanitize"
)

// The model is shown a pinned declaration's text as the reviewer who published it saw it:
// without the code points that hide text from a reader (Tags spelling ASCII, zero-width and
// bidi characters, controls other than \n and \t) and without chat role markers. The screen
// flags them at import; an author who publishes anyway cannot publish text only the model
// reads. Markup stays (a description is no HTML), and the pin stays over the declaration as
// the server sent it.

// shown is a pinned title or description as the model is shown it.
func shown(s string) string { return sanitize.String(s, sanitize.Options{KeepMarkup: true}) }

// shownSchema is a pinned schema as the model is shown it: the text of every title and
// description keyword shown, nothing else changed (what a call is checked against, enum,
// const, default and examples values, and property names stay as pinned). A schema with no
// such text to change is returned as it is.
func shownSchema(raw json.RawMessage) json.RawMessage {
	return rewriteSchema(raw, showText)
}

// shownOutputSchema is a pinned output schema as a client is shown it: as shownSchema, and
// without the keywords a result's strings may no longer meet once the pool has escaped their
// markup (maxLength, pattern, format, enum, const, propertyNames: "<b>" becomes "&lt;b&gt;"),
// and with its property names as the result's cleaned keys come (showPropertyNames).
// The pool checks every result against the pinned schema before it escapes it; a client that
// checks the escaped result again (MCP clients should, and the TypeScript SDK's does) checks it
// against what it is shown, which must accept it.
func shownOutputSchema(raw json.RawMessage) json.RawMessage {
	return rewriteSchema(raw, func(s map[string]any) bool {
		changed := showText(s)
		for _, k := range escapeBreaks {
			if _, ok := s[k]; ok {
				delete(s, k)
				changed = true
			}
		}
		return showPropertyNames(s) || changed
	})
}

// showPropertyNames makes schema s's properties the names a result's keys have once the pool
// cleaned them: a key is cleaned as every string is, and escaped unless the registration keeps
// markup ("a&b" becomes "a&amp;b"), which the listing does not know. A property whose name
// cleaning changes is declared under each name it may come as, each with its own copy of the
// schema, and is no longer required (one of two names may come): a client checking the
// cleaned result, with additionalProperties false too, accepts it. It reports whether s changed.
func showPropertyNames(s map[string]any) bool {
	props, ok := s["properties"].(map[string]any)
	if !ok {
		return false
	}
	renamed := map[string][]string{}
	for name := range props {
		escaped, kept := sanitize.String(name, sanitize.Options{}), shown(name)
		if escaped != name || kept != name {
			renamed[name] = []string{escaped, kept}
		}
	}
	if len(renamed) == 0 {
		return false
	}
	for name, as := range renamed {
		sub := props[name]
		delete(props, name)
		for _, n := range as {
			if _, taken := props[n]; !taken {
				props[n] = copyJSON(sub)
			}
		}
	}
	if req, ok := s["required"].([]any); ok {
		kept := req[:0:0]
		for _, r := range req {
			if name, ok := r.(string); ok {
				if as, ok := renamed[name]; ok {
					if as[0] != as[1] {
						continue
					}
					r = as[0]
				}
			}
			kept = append(kept, r)
		}
		s["required"] = kept
	}
	return true
}

// copyJSON is a deep copy of a decoded JSON value.
func copyJSON(v any) any {
	switch v := v.(type) {
	case map[string]any:
		c := make(map[string]any, len(v))
		for k, e := range v {
			c[k] = copyJSON(e)
		}
		return c
	case []any:
		c := make([]any, len(v))
		for i, e := range v {
			c[i] = copyJSON(e)
		}
		return c
	}
	return v
}

// escapeBreaks are the keywords an escaped string may fail where the original met them.
var escapeBreaks = []string{"maxLength", "pattern", "format", "enum", "const", "propertyNames"}

// rewriteSchema applies visit to raw's schema and every schema inside it, and returns the
// result, or raw as it is when visit changed nothing (or raw is no JSON object: publish checked
// it is one).
func rewriteSchema(raw json.RawMessage, visit func(map[string]any) bool) json.RawMessage {
	if len(raw) == 0 {
		return raw
	}
	root, err := decodeSchema(raw)
	if err != nil || !eachSchema(root, 0, visit) {
		return raw
	}
	out, err := json.Marshal(root)
	if err != nil {
		return raw
	}
	return out
}

// showText cleans the text of schema s's title and description, and reports whether it changed.
func showText(s map[string]any) bool {
	changed := false
	for _, k := range []string{"title", "description"} {
		if text, ok := s[k].(string); ok {
			if c := shown(text); c != text {
				s[k], changed = c, true
			}
		}
	}
	return changed
}

// shownAnnotations is pinned annotations as the model is shown them: the text of their title
// shown, the hints as pinned.
func shownAnnotations(raw json.RawMessage) json.RawMessage {
	var a map[string]json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &a) != nil {
		return raw
	}
	var title string
	if json.Unmarshal(a["title"], &title) != nil || shown(title) == title {
		return raw
	}
	a["title"], _ = json.Marshal(shown(title))
	out, err := json.Marshal(a)
	if err != nil {
		return raw
	}
	return out
}

// eachSchema applies visit to schema s and to every schema inside it, and reports whether any
// visit changed something.
func eachSchema(s map[string]any, depth int, visit func(map[string]any) bool) bool {
	if depth > maxDepth {
		return false
	}
	changed := visit(s)
	for k, v := range s {
		switch k {
		case "enum", "const", "default", "examples":
			// Values, not schemas.
		case "properties", "patternProperties", "$defs", "definitions", "dependentSchemas":
			// Maps of names (kept) to schemas.
			if m, ok := v.(map[string]any); ok {
				for _, sub := range m {
					changed = eachSubschema(sub, depth+1, visit) || changed
				}
			}
		default:
			changed = eachSubschema(v, depth+1, visit) || changed
		}
	}
	return changed
}

// eachSubschema applies eachSchema to v when it is a schema, or to each schema of a list.
func eachSubschema(v any, depth int, visit func(map[string]any) bool) bool {
	switch v := v.(type) {
	case map[string]any:
		return eachSchema(v, depth, visit)
	case []any:
		changed := false
		for _, e := range v {
			if m, ok := e.(map[string]any); ok {
				changed = eachSchema(m, depth+1, visit) || changed
			}
		}
		return changed
	}
	return false
}
