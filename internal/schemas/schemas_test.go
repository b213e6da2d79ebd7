package schemas

import (
	"encoding/json"
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
