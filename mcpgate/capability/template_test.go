package capability

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExpandRefusesValuesTheServerWouldResolveElsewhere(t *testing.T) {
	args := func(v string) func(string) (string, bool) {
		return func(string) (string, bool) { return v, true }
	}
	for _, ok := range []string{"/srv/docs/a.md", "/srv/docs/.hidden", "/srv/docs/a..b", "relative/x", "/srv//docs"} {
		got, err := Expand("fs.read:{path}", args(ok))
		require.NoError(t, err, ok)
		require.Equal(t, "fs.read:"+ok, got)
	}
	for bad, want := range map[string]string{
		"/srv/docs/../../etc/shadow": `".." segment`,
		"/srv/docs/..":               `".." segment`,
		`C:\srv\docs\..\..\x`:        `".." segment`,
		"/srv/docs/%2e%2e/x":         `".." segment`,
		"/srv/docs%2f..%2fx":         `".." segment`,
		"/srv/docs/./a":              `"." segment`,
		"/srv/docs/a\x00.png":        "control character",
	} {
		_, err := Expand("fs.read:{path}", args(bad))
		require.ErrorContains(t, err, want, bad)
		require.ErrorContains(t, err, `argument "path"`, bad)
	}
	_, err := Expand("fs.read:{path}", func(string) (string, bool) { return "", false })
	require.ErrorContains(t, err, "missing or not a string")
}

func TestCheckTemplate(t *testing.T) {
	require.NoError(t, CheckTemplate("fs.read:{path}"))
	require.NoError(t, CheckTemplate("db.kb_facts:read"))
	require.ErrorIs(t, CheckTemplate("fs.read:{path"), ErrMalformedPlaceholder)
	require.ErrorIs(t, CheckTemplate("fs.read:{a}}"), ErrMalformedPlaceholder)
	require.Error(t, CheckTemplate("FS:{path}"), "the name must still parse")
	require.Equal(t, []string{"a", "b.c"}, Placeholders("x:{a}/{b.c}"))
}
