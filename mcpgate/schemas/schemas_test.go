package schemas

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidateNamesTheField(t *testing.T) {
	s, err := Compile(json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"n":{"type":"integer","minimum":1}},"required":["path"],"additionalProperties":false}`))
	require.NoError(t, err)
	ok, _ := Decode([]byte(`{"path":"/srv/a","n":2}`))
	require.NoError(t, s.Validate(ok))
	for in, want := range map[string]string{
		`{"n":2}`:                   "missing property 'path'",
		`{"path":3}`:                "/path",
		`{"path":"x","n":0}`:        "/n",
		`{"path":"x","extra":true}`: "extra",
		`"not an object"`:           "want object",
	} {
		v, err := Decode([]byte(in))
		require.NoError(t, err)
		err = s.Validate(v)
		require.Error(t, err, in)
		require.Contains(t, err.Error(), want, in)
	}
}

// TestValidateSaysEachProblemOnce: two branches that fail at the same place for the same
// reason (here anyOf and else, both missing email) are one problem in the message.
func TestValidateSaysEachProblemOnce(t *testing.T) {
	s, err := Compile(json.RawMessage(`{"type":"object","properties":{"contactMethod":{"enum":["phone","email"]}},
		"allOf":[{"anyOf":[{"required":["phone"]},{"required":["email"]}]}],
		"if":{"properties":{"contactMethod":{"const":"phone"}},"required":["contactMethod"]},
		"then":{"required":["phone"]},"else":{"required":["email"]}}`))
	require.NoError(t, err)
	v, err := Decode([]byte(`{}`))
	require.NoError(t, err)
	require.EqualError(t, s.Validate(v), "/: missing property 'email'; /: missing property 'phone'")
}

func TestExternalReferencesAreNeverLoaded(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.json")
	require.NoError(t, os.WriteFile(secret, []byte(`{"type":"string"}`), 0o600))
	for _, ref := range []string{"file://" + secret, "https://example.com/schema.json", "http://169.254.169.254/latest"} {
		_, err := Compile(json.RawMessage(`{"type":"object","properties":{"a":{"$ref":"` + ref + `"}}}`))
		require.Error(t, err, ref)
		require.Contains(t, err.Error(), "never loaded", ref)
	}
	s, err := Compile(json.RawMessage(`{"$defs":{"p":{"type":"string"}},"type":"object","properties":{"a":{"$ref":"#/$defs/p"}}}`))
	require.NoError(t, err, "local references work")
	v, _ := Decode([]byte(`{"a":1}`))
	require.ErrorContains(t, s.Validate(v), "/a")
}

func TestCacheCompilesOnce(t *testing.T) {
	c := NewCache()
	a, err := c.Get("k", json.RawMessage(`{"type":"object"}`))
	require.NoError(t, err)
	b, err := c.Get("k", json.RawMessage(`{"type":"object"}`))
	require.NoError(t, err)
	require.Same(t, a, b)
	_, err = c.Get("bad", json.RawMessage(`{"type": 5}`))
	require.Error(t, err)
}

func TestCompileErrorNamesEachPlace(t *testing.T) {
	_, err := Compile(json.RawMessage(`{"type":"object","properties":{"b":{"pattern":"(("},"a":{"type":"strng"},"c":{"minimum":"x"}}}`))
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	var where []string
	for _, p := range ce.Problems {
		where = append(where, p.Where())
	}
	require.Equal(t, []string{"/properties/a/type", "/properties/b/pattern", "/properties/c/minimum"}, where, "sorted by place, whatever order the compiler found them in")
	require.Contains(t, ce.Problems[0].Message, "value must be one of 'array', 'boolean', 'integer', 'null', 'number', 'object', 'string'")
	require.Contains(t, ce.Problems[1].Message, "not valid regex")
	require.Contains(t, err.Error(), "does not compile: at /properties/a/type: ")
	require.NotContains(t, err.Error(), "urn:ringfence", "the internal document URL is not the author's business")

	for range 20 {
		_, again := Compile(json.RawMessage(`{"type":"object","properties":{"b":{"pattern":"(("},"a":{"type":"strng"},"c":{"minimum":"x"}}}`))
		require.Equal(t, err.Error(), again.Error(), "the same schema, the same message")
	}
}

func TestCompileErrorOtherCauses(t *testing.T) {
	for schema, want := range map[string]struct{ where, msg string }{
		`{"type":"object","properties":{"a":{"$ref":"#/$defs/missing"}}}`:            {"", `json-pointer in "#/$defs/missing" not found`},
		`{"$schema":"https://example.com/meta#","type":"object"}`:                    {"/$schema", `"https://example.com/meta" names a meta-schema that is not built in`},
		`{"type":"object","properties":{"a":{"$ref":"https://example.com/x.json"}}}`: {"", "never loaded"},
	} {
		_, err := Compile(json.RawMessage(schema))
		var ce *CompileError
		require.ErrorAs(t, err, &ce, schema)
		require.Len(t, ce.Problems, 1, schema)
		require.Equal(t, want.where, ce.Problems[0].Where(), schema)
		require.Contains(t, ce.Problems[0].Message, want.msg, schema)
	}
}

func TestCompileErrorIsBounded(t *testing.T) {
	props := map[string]any{}
	for i := range 30 {
		props[fmt.Sprintf("p%02d", i)] = map[string]any{"type": "strng"}
	}
	raw, err := json.Marshal(map[string]any{"type": "object", "properties": props})
	require.NoError(t, err)
	_, err = Compile(raw)
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	require.Len(t, ce.Problems, maxProblems)
	require.Equal(t, 30-maxProblems, ce.More)
	require.Contains(t, err.Error(), fmt.Sprintf("and %d more", 30-maxProblems))
}

// A declared draft is honoured: draft-07's array form of "items" compiles and validates as a
// tuple, while the same schema without "$schema" is read as 2020-12, where it is invalid.
func TestDeclaredDraftIsHonoured(t *testing.T) {
	const body = `"type":"object","properties":{"pair":{"type":"array","items":[{"type":"string"},{"type":"number"}]}}`
	for _, meta := range []string{"http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft-07/schema", "http://json-schema.org/draft-04/schema#"} {
		s, err := Compile(json.RawMessage(`{"$schema":"` + meta + `",` + body + `}`))
		require.NoError(t, err, meta)
		ok, _ := Decode([]byte(`{"pair":["a",1]}`))
		require.NoError(t, s.Validate(ok), meta)
		bad, _ := Decode([]byte(`{"pair":["a","b"]}`))
		require.ErrorContains(t, s.Validate(bad), "/pair/1", meta)
	}
	_, err := Compile(json.RawMessage(`{` + body + `}`))
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "/properties/pair/items", ce.Problems[0].Where())
}
