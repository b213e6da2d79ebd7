package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Strict returns raw with undeclared properties refused: every object schema that lists its
// "properties" and says nothing of other ones (no additionalProperties, patternProperties or
// unevaluatedProperties) gets "additionalProperties": false. It is what a registration's
// strict_inputs asks of a tool's arguments, so a call cannot smuggle an argument the tool
// never declared (and that nothing screened) past the pinned schema.
//
// It is deliberately conservative where a schema is composed: an object schema beside allOf
// or $ref may be given more properties by them, so it is left as it is; anyOf and oneOf
// branches are alternatives, each complete, so each is made strict.
func Strict(raw json.RawMessage) (json.RawMessage, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schemas: the schema is not JSON: %w", err)
	}
	tighten(doc, 0)
	return json.Marshal(doc)
}

// CompileStrict compiles Strict(raw).
func CompileStrict(raw json.RawMessage) (*Schema, error) {
	strict, err := Strict(raw)
	if err != nil {
		return nil, err
	}
	return Compile(strict)
}

// maxStrictDepth bounds the walk; pinned schemas are bounded far below it by the screen.
const maxStrictDepth = 64

func tighten(node any, depth int) {
	s, ok := node.(map[string]any)
	if !ok || depth > maxStrictDepth {
		return
	}
	_, hasProps := s["properties"].(map[string]any)
	composed := s["allOf"] != nil || s["$ref"] != nil || s["$dynamicRef"] != nil
	open := s["additionalProperties"] != nil || s["patternProperties"] != nil || s["unevaluatedProperties"] != nil
	if hasProps && !composed && !open {
		s["additionalProperties"] = false
	}
	for _, key := range []string{"properties", "$defs", "definitions"} {
		if m, ok := s[key].(map[string]any); ok {
			for _, sub := range m {
				tighten(sub, depth+1)
			}
		}
	}
	for _, key := range []string{"items", "additionalProperties"} {
		tighten(s[key], depth+1)
	}
	for _, key := range []string{"items", "prefixItems", "anyOf", "oneOf"} {
		if list, ok := s[key].([]any); ok {
			for _, sub := range list {
				tighten(sub, depth+1)
			}
		}
	}
}
