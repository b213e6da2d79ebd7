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
	if len(raw) == 0 {
		return raw
	}
	root, err := decodeSchema(raw)
	if err != nil {
		return raw // publish checked it is a JSON object; shown as pinned otherwise
	}
	if !showSchema(root, 0) {
		return raw
	}
	out, err := json.Marshal(root)
	if err != nil {
		return raw
	}
	return out
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

// showSchema cleans the title and description text of schema s and of every schema inside it,
// and reports whether anything changed.
func showSchema(s map[string]any, depth int) bool {
	if depth > maxDepth {
		return false
	}
	changed := false
	for k, v := range s {
		switch k {
		case "title", "description":
			if text, ok := v.(string); ok {
				if c := shown(text); c != text {
					s[k], changed = c, true
				}
			}
		case "enum", "const", "default", "examples":
			// Values, not schemas: what the server accepts or suggests stays as pinned.
		case "properties", "patternProperties", "$defs", "definitions", "dependentSchemas":
			// Maps of names (kept) to schemas.
			if m, ok := v.(map[string]any); ok {
				for _, sub := range m {
					changed = showSubschemas(sub, depth+1) || changed
				}
			}
		default:
			changed = showSubschemas(v, depth+1) || changed
		}
	}
	return changed
}

// showSubschemas applies showSchema to v when it is a schema, or to each schema of a list.
func showSubschemas(v any, depth int) bool {
	switch v := v.(type) {
	case map[string]any:
		return showSchema(v, depth)
	case []any:
		changed := false
		for _, e := range v {
			if m, ok := e.(map[string]any); ok {
				changed = showSchema(m, depth+1) || changed
			}
		}
		return changed
	}
	return false
}
