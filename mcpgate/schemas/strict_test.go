package schemas

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStrictRefusesUndeclaredPropertiesWherePlainlyDeclared(t *testing.T) {
	raw := json.RawMessage(`{
		"type": "object",
		"properties": {
			"path": {"type": "string"},
			"opts": {"type": "object", "properties": {"depth": {"type": "integer"}}},
			"tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
			"meta": {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}},
			"either": {"anyOf": [{"type": "object", "properties": {"x": {}}}, {"type": "string"}]},
			"mixed": {"allOf": [{"properties": {"p": {}}}], "properties": {"q": {}}}
		},
		"required": ["path"]
	}`)
	strict, err := Strict(raw)
	require.NoError(t, err)
	sch, err := Compile(strict)
	require.NoError(t, err)
	loose, err := Compile(raw)
	require.NoError(t, err)

	valid := func(s *Schema, doc string) error {
		v, err := Decode([]byte(doc))
		require.NoError(t, err)
		return s.Validate(v)
	}
	for _, ok := range []string{
		`{"path": "/a"}`,
		`{"path": "/a", "opts": {"depth": 2}, "tags": [{"k": "v"}]}`,
		`{"path": "/a", "meta": {"a": 1, "free": "x"}}`,
		`{"path": "/a", "either": "s"}`,
		`{"path": "/a", "mixed": {"p": 1, "q": 2, "r": 3}}`,
	} {
		require.NoError(t, valid(sch, ok), ok)
	}
	for bad, where := range map[string]string{
		`{"path": "/a", "recursive": true}`:            "recursive",
		`{"path": "/a", "opts": {"follow": true}}`:     "follow",
		`{"path": "/a", "tags": [{"k": "v", "z": 1}]}`: "z",
		`{"path": "/a", "either": {"x": 1, "y": 2}}`:   "either",
	} {
		require.NoError(t, valid(loose, bad), "the declared schema alone accepts %s", bad)
		require.ErrorContains(t, valid(sch, bad), where, bad)
	}
}
