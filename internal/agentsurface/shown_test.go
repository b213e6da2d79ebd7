package agentsurface

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/mcpgate/schemas"
)

// TestShownSchemaCleansTextAndKeepsValues: the title and description keywords of every
// schema in a pinned schema lose their hidden code points and role markers; property names,
// values (enum, const, default, examples) and numbers stay as pinned, and a schema with
// nothing to clean is returned as it is, byte for byte.
func TestShownSchemaCleansTextAndKeepsValues(t *testing.T) {
	in := `{"type":"object","description":"Top\u200b.","properties":{` +
		`"description":{"type":"string","description":"A\u202e."},` +
		`"enum":{"type":"object","const":{"description":"kept\u200b"},"default":{"title":"kept\u200b"}},` +
		`"list":{"type":"array","items":[{"title":"\u2066one"}],"examples":[{"description":"kept\u200b"}]}},` +
		`"$defs":{"d":{"anyOf":[{"description":"<|im_start|>x"}],"maximum":1.50}}}`
	want := `{"type":"object","description":"Top.","properties":{` +
		`"description":{"type":"string","description":"A."},` +
		`"enum":{"type":"object","const":{"description":"kept\u200b"},"default":{"title":"kept\u200b"}},` +
		`"list":{"type":"array","items":[{"title":"one"}],"examples":[{"description":"kept\u200b"}]}},` +
		`"$defs":{"d":{"anyOf":[{"description":"x"}],"maximum":1.50}}}`
	got := shownSchema(json.RawMessage(in))
	require.JSONEq(t, want, string(got))
	require.Contains(t, string(got), "1.50", "numbers as written")

	plain := json.RawMessage(`{"type":"object",  "properties":{"a":{"description":"<b>plain</b>"}}}`)
	require.Equal(t, string(plain), string(shownSchema(plain)), "nothing to clean: as pinned")
	require.Nil(t, shownSchema(nil))
}

// TestShownAnnotationsCleanTheTitleAlone: the annotations' title loses its hidden code points;
// the hints, and annotations with nothing to clean, stay as pinned.
func TestShownAnnotationsCleanTheTitleAlone(t *testing.T) {
	got := shownAnnotations(json.RawMessage(`{"title":"Read\u200b\u202e","readOnlyHint":true,"x":1.50}`))
	require.JSONEq(t, `{"title":"Read","readOnlyHint":true,"x":1.50}`, string(got))
	plain := json.RawMessage(`{"title":"Read",  "readOnlyHint":true}`)
	require.Equal(t, string(plain), string(shownAnnotations(plain)))
	require.Equal(t, `{"readOnlyHint":true}`, string(shownAnnotations(json.RawMessage(`{"readOnlyHint":true}`))))
	require.Nil(t, shownAnnotations(nil))
}

// TestAShownOutputSchemaAcceptsWhatThePoolEscaped: the pool checks a result against the pinned
// output schema, then escapes its markup; a client checking the escaped result against the
// output schema it was shown must accept it, so the shown one drops what escaping can break,
// at every depth, and keeps the rest. An input schema keeps them all.
func TestAShownOutputSchemaAcceptsWhatThePoolEscaped(t *testing.T) {
	pinned := json.RawMessage(`{"type":"object","required":["v","items"],"properties":{` +
		`"v":{"type":"string","maxLength":3,"pattern":"^<","enum":["<b>"],"description":"a tag\u200b"},` +
		`"link":{"type":"string","format":"uri","const":"https://x.example/?a=1&b=2"},` +
		`"items":{"type":"array","minItems":1,"items":{"type":"object","propertyNames":{"maxLength":3},"additionalProperties":{"type":"string","maxLength":4}}}}}`)
	original := `{"v":"<b>","link":"https://x.example/?a=1&b=2","items":[{"<k>":"a&b"}]}`
	escaped := `{"v":"&lt;b&gt;","link":"https://x.example/?a=1&amp;b=2","items":[{"&lt;k&gt;":"a&amp;b"}]}`

	valid := func(schema json.RawMessage, instance string) error {
		s, err := schemas.Compile(schema)
		require.NoError(t, err)
		v, err := schemas.Decode([]byte(instance))
		require.NoError(t, err)
		return s.Validate(v)
	}
	require.NoError(t, valid(pinned, original), "the pool's check, before escaping")
	require.Error(t, valid(pinned, escaped), "what a client checking the escaped result against the pinned schema would refuse")

	shown := shownOutputSchema(pinned)
	require.NoError(t, valid(shown, escaped))
	for _, gone := range []string{"maxLength", "pattern", "format", "enum", "const", "propertyNames", "\u200b"} {
		require.NotContains(t, string(shown), gone)
	}
	for _, kept := range []string{`"required":["v","items"]`, `"minItems":1`, `"additionalProperties"`, `"type":"string"`} {
		require.Contains(t, string(shown), kept)
	}
	require.Error(t, valid(shown, `{"v":1,"items":[]}`), "the rest of the schema still holds")

	// Keys are cleaned too, and escaped unless the registration keeps markup: a result's
	// property may come under either name, and the schema a client is shown accepts both.
	named := json.RawMessage(`{"type":"object","additionalProperties":false,"required":["a&b","x\u200by","n"],"properties":{` +
		`"a&b":{"type":"object","additionalProperties":false,"required":["<i>"],"properties":{"<i>":{"type":"integer"}}},` +
		`"x\u200by":{"type":"string"},"n":{"type":"integer"}}}`)
	require.NoError(t, valid(named, `{"a&b":{"<i>":1},"x\u200by":"s","n":1}`), "the pool's check, before cleaning")
	shown = shownOutputSchema(named)
	for _, result := range []string{
		`{"a&amp;b":{"&lt;i&gt;":1},"xy":"s","n":1}`, // escaped
		`{"a&b":{"<i>":1},"xy":"s","n":1}`,           // keep_markup
	} {
		require.Error(t, valid(named, result), "the pinned schema refuses the cleaned result")
		require.NoError(t, valid(shown, result), result)
	}
	require.Error(t, valid(shown, `{"a&b":{"<i>":1},"n":1}`), "a property cleaning only rids of hidden characters stays required, under its cleaned name")
	require.Error(t, valid(shown, `{"xy":"s"}`), "a property whose name cleaning keeps stays required")
	require.Error(t, valid(shown, `{"xy":"s","n":1,"other":1}`), "additionalProperties still holds")

	input := json.RawMessage(`{"type":"object","properties":{"v":{"type":"string","maxLength":3}}}`)
	require.Equal(t, string(input), string(shownSchema(input)), "an input schema is checked by the pool as shown")
}
