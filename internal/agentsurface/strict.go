package agentsurface

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// Strict returns an input schema in the strict form convert_schemas_to_strict shows the
// model: every object schema closed ("additionalProperties": false) and every one of its
// properties required, the properties that were optional made nullable (so the model writes
// null for a value it leaves out), in nested objects, array items and the branches of anyOf
// and oneOf alike.
//
// Two kinds of object are left open, because closing them would refuse calls the tool
// accepts: one beside allOf or $ref, which may gain properties from them, and one that says
// what its other properties are (additionalProperties as a schema, patternProperties,
// unevaluatedProperties: a map). Their listed properties are still all required.
//
// A call is checked against this form; Unstrict then takes out the nulls that stand for
// omitted properties before the call goes to the server, which declared the original.
func Strict(schema json.RawMessage) (json.RawMessage, error) {
	root, err := decodeSchema(schema)
	if err != nil {
		return nil, err
	}
	strictify(root, 0)
	return json.Marshal(root)
}

// maxDepth bounds the walks; pinned schemas are bounded far below it by the screen.
const maxDepth = 64

// decodeSchema reads an input schema, numbers as written.
func decodeSchema(raw json.RawMessage) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("agentsurface: the schema is not JSON: %w", err)
	}
	root, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("agentsurface: the input schema is not a JSON object")
	}
	return root, nil
}

// requiredSet is a schema's "required" list as a set.
func requiredSet(s map[string]any) map[string]bool {
	out := map[string]bool{}
	list, _ := s["required"].([]any)
	for _, r := range list {
		if name, ok := r.(string); ok {
			out[name] = true
		}
	}
	return out
}

// strictify makes s and every schema under it strict, in place.
func strictify(s map[string]any, depth int) {
	if depth > maxDepth {
		return
	}
	for _, key := range []string{"$defs", "definitions", "patternProperties"} {
		if m, ok := s[key].(map[string]any); ok {
			for _, sub := range m {
				strictifyAny(sub, depth+1)
			}
		}
	}
	// Only schemas a value must match on its own are walked: anyOf and oneOf branches are
	// alternatives, each complete. An allOf branch, a then or an else adds to its parent's
	// properties, and closing it would refuse the parent's others; not and if invert or
	// condition, so closing them would widen.
	for _, key := range []string{"items", "additionalProperties"} {
		strictifyAny(s[key], depth+1)
	}
	for _, key := range []string{"items", "prefixItems", "anyOf", "oneOf"} {
		if list, ok := s[key].([]any); ok {
			for _, sub := range list {
				strictifyAny(sub, depth+1)
			}
		}
	}
	props, hasProps := s["properties"].(map[string]any)
	if !hasProps && !isObjectType(s) {
		return
	}
	required := requiredSet(s)
	names := slices.Sorted(maps.Keys(props))
	for _, name := range names {
		sub, ok := props[name].(map[string]any)
		if !ok {
			continue // a boolean schema: true takes null already, false takes nothing
		}
		strictify(sub, depth+1)
		if !required[name] {
			props[name] = nullable(sub)
		}
	}
	all := make([]any, len(names))
	for i, n := range names {
		all[i] = n
	}
	if hasProps {
		s["required"] = all
	}
	composed := s["allOf"] != nil || s["$ref"] != nil || s["$dynamicRef"] != nil
	open := s["additionalProperties"] != nil || s["patternProperties"] != nil || s["unevaluatedProperties"] != nil
	if !composed && !open {
		s["additionalProperties"] = false
	}
}

func strictifyAny(v any, depth int) {
	if m, ok := v.(map[string]any); ok {
		strictify(m, depth)
	}
}

// isObjectType reports whether a schema says it is an object.
func isObjectType(s map[string]any) bool {
	switch t := s["type"].(type) {
	case string:
		return t == "object"
	case []any:
		return slices.Contains(t, any("object"))
	}
	return false
}

// nullable returns s widened to take null too.
func nullable(s map[string]any) map[string]any {
	if acceptsNull(s) {
		return s
	}
	if _, isConst := s["const"]; !isConst {
		switch t := s["type"].(type) {
		case string:
			s["type"] = []any{t, "null"}
			addNullToEnum(s)
			return s
		case []any:
			s["type"] = append(t, "null")
			addNullToEnum(s)
			return s
		}
	}
	// No type to widen (a $ref, a const, a composition): null becomes one more alternative,
	// with the title and description kept where the model reads them.
	out := map[string]any{"anyOf": []any{s, map[string]any{"type": "null"}}}
	for _, k := range []string{"title", "description"} {
		if v, ok := s[k]; ok {
			out[k] = v
			delete(s, k)
		}
	}
	return out
}

// acceptsNull reports whether a schema plainly takes null: an empty schema, a type naming
// null, or an anyOf or oneOf branch that does.
func acceptsNull(s map[string]any) bool {
	if len(s) == 0 {
		return true
	}
	switch t := s["type"].(type) {
	case string:
		return t == "null"
	case []any:
		return slices.Contains(t, any("null"))
	}
	for _, key := range []string{"anyOf", "oneOf"} {
		list, _ := s[key].([]any)
		for _, b := range list {
			if m, ok := b.(map[string]any); ok && m["type"] == "null" {
				return true
			}
		}
	}
	return false
}

func addNullToEnum(s map[string]any) {
	if e, ok := s["enum"].([]any); ok && !slices.Contains(e, nil) {
		s["enum"] = append(e, nil)
	}
}

// Unstrict returns a call's arguments as the tool's pinned schema expects them: each null
// that stands for a property the strict form made nullable, but the pinned schema neither
// requires nor lets be null, is removed (in nested objects and array items too). args was
// checked against the strict form; pinned is the tool's own input schema. args is changed in
// place and returned.
func Unstrict(pinned json.RawMessage, args map[string]any) (map[string]any, error) {
	root, err := decodeSchema(pinned)
	if err != nil {
		return nil, err
	}
	dropNulls(root, args, 0)
	return args, nil
}

func dropNulls(schema map[string]any, value any, depth int) {
	if depth > maxDepth {
		return
	}
	switch v := value.(type) {
	case map[string]any:
		props, _ := schema["properties"].(map[string]any)
		required := requiredSet(schema)
		for name, x := range v {
			sub, _ := props[name].(map[string]any)
			if x == nil {
				if !required[name] && sub != nil && !acceptsNull(sub) {
					delete(v, name)
				}
				continue
			}
			if sub != nil {
				dropNulls(sub, x, depth+1)
			}
		}
	case []any:
		if items, ok := schema["items"].(map[string]any); ok {
			for _, x := range v {
				dropNulls(items, x, depth+1)
			}
		}
	}
}
