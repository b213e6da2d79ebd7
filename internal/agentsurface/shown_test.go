package agentsurface

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
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
