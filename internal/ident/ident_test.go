package ident

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/fielderr"
)

func TestSets(t *testing.T) {
	for _, tc := range []struct {
		set     Set
		pattern string
		ok, bad []string
	}{
		{Ref, "^[a-z0-9_-]{1,64}$", []string{"docs-search", "a_b", "0", strings.Repeat("a", 64)},
			[]string{"", "Docs", "a.b", ".", "a b", strings.Repeat("a", 65), "é"}},
		{Node, "^[A-Za-z0-9_.:-]{1,128}$", []string{"researcher", "docs__read_file", "call_abc:1", "a.b", ".a", "..a"},
			[]string{"", ".", "..", "...", "a/b", "a b", "a\u202eb", strings.Repeat("a", 129)}},
		{Run, "^[A-Za-z0-9_.-]{1,128}$", []string{"run-0123", "r.1"}, []string{".", "..", "r:1", "r/1"}},
		{CallID, "^[A-Za-z0-9_.:-]{1,512}$", []string{"call_abc123", "toolu_01A", "0f8fad5b-d9cb-469f-a165-70867728950e", strings.Repeat("c", 512)},
			[]string{".", "..", "c/1", "c 1", strings.Repeat("c", 513)}},
		{KeyName, "^[A-Za-z0-9_.@-]{1,64}$", []string{"ci", "ops@example.com"}, []string{".", "..", "a b"}},
		{SecretName, "^[A-Za-z0-9_.-]{1,128}$", []string{"tickets-token", "v1.2"}, []string{".", "..", "a:b"}},
		{AgentToken, "^[a-z0-9-]{1,64}$", []string{"tok-0123456789abcdef"}, []string{".", "tok_1", "Tok-1", "rfat_x"}},
	} {
		t.Run(tc.pattern, func(t *testing.T) {
			require.Equal(t, tc.pattern, tc.set.Pattern())
			for _, v := range tc.ok {
				require.NoError(t, tc.set.Check("id", v), v)
			}
			for _, v := range tc.bad {
				err := tc.set.Check("run_id", v)
				require.Error(t, err, v)
				fe, ok := fielderr.As(err)
				require.True(t, ok)
				require.Equal(t, "run_id", fe.Field)
				require.Contains(t, fe.Problem, tc.set.Allowed(), "the refusal names the set")
			}
		})
	}
}

func TestOnlyDotsSaysSo(t *testing.T) {
	err := Run.Check("run_id", "..")
	require.EqualError(t, err, `run_id: ".." is only dots, which a path reads as a directory or its parent: use 1 to 128 of A-Z a-z 0-9 _ . -, not only dots`)
	require.EqualError(t, Ref.Check("graph_id", "Support Triage"), `graph_id: "Support Triage" holds 'S', which is not allowed: use 1 to 64 of a-z 0-9 _ -`)
	require.EqualError(t, Node.Check("agent", "a b"), `agent: "a b" holds a space, which is not allowed: use 1 to 128 of A-Z a-z 0-9 _ . : -, not only dots`)
}

func TestALongValueIsQuotedBounded(t *testing.T) {
	err := Node.Check("call_id", strings.Repeat("x", 1<<20))
	require.Less(t, len(err.Error()), 512)
	require.Contains(t, err.Error(), "(1048576 bytes)")
}
