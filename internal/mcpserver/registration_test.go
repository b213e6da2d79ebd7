package mcpserver

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExpandRequirementRefusesValuesTheServerWouldResolveElsewhere(t *testing.T) {
	args := func(v string) func(string) (string, bool) {
		return func(string) (string, bool) { return v, true }
	}
	for _, ok := range []string{"/srv/docs/a.md", "/srv/docs/.hidden", "/srv/docs/a..b", "relative/x", "/srv//docs"} {
		got, err := ExpandRequirement("fs.read:{path}", args(ok))
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
		_, err := ExpandRequirement("fs.read:{path}", args(bad))
		require.ErrorContains(t, err, want, bad)
		require.ErrorContains(t, err, `argument "path"`, bad)
	}
	_, err := ExpandRequirement("fs.read:{path}", func(string) (string, bool) { return "", false })
	require.ErrorContains(t, err, "missing or not a string")
}

func TestNewRefsMayNotHoldTheNamespaceSeparator(t *testing.T) {
	require.NoError(t, ValidateNewRef("docs_search"))
	err := ValidateNewRef("a__b")
	require.ErrorContains(t, err, `contains "__"`)
	require.NoError(t, ValidateRef("a__b"), "a ref stored before the rule stays readable")
}

func TestRegistrationNamesItsOwnToolsNotTheNamespacedOnes(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Registration)
	}{
		{"exclude", func(r *Registration) { r.Filter.Exclude = []string{"tickets__delete_ticket"} }},
		{"include", func(r *Registration) { r.Filter.Include = []string{"tickets__read"} }},
		{"tool permissions", func(r *Registration) {
			r.ToolPermissions = map[string][]string{"tickets__read": {"fs.read:{path}"}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Registration{Ref: "tickets", Command: "tickets-mcp"}
			tc.edit(r)
			err := r.Validate(nil)
			require.ErrorContains(t, err, "the name agents call the tool by")
			require.ErrorContains(t, err, `write "`)
		})
	}
	r := &Registration{Ref: "tickets", Command: "tickets-mcp", Filter: ToolFilter{Exclude: []string{"other__x"}}}
	require.NoError(t, r.Validate(nil), "another prefix is just a tool name")
}

func TestExcludeWinsOverInclude(t *testing.T) {
	f := ToolFilter{Include: []string{"read", "delete"}, Exclude: []string{"delete"}}
	require.True(t, f.Allows("read"))
	require.False(t, f.Allows("delete"))
	require.False(t, f.Allows("write"), "an include list hides everything not on it")
	require.True(t, ToolFilter{}.Allows("anything"))
}
