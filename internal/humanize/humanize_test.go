package humanize

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEditDistance(t *testing.T) {
	require.Equal(t, 0, EditDistance("process_spawn", "process_spawn"))
	require.Equal(t, 1, EditDistance("proces_spawn", "process_spawn"))
	require.Equal(t, 2, EditDistance("prcoess_spawn", "process_spawn"))
	require.Equal(t, 3, EditDistance("", "abc"))
	require.Equal(t, 3, EditDistance("abc", ""))
}

func TestList(t *testing.T) {
	require.Equal(t, "none", List(nil, 3, "none"))
	require.Equal(t, "a, b", List([]string{"a", "b"}, 3, "none"))
	require.Equal(t, "a, b, and 2 more", List([]string{"a", "b", "c", "d"}, 2, "none"))
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 bytes", 1000: "1000 bytes", 1 << 10: "1 KiB", 16 << 20: "16 MiB", 16_000_000: "15625 KiB", 16_000_001: "16000001 bytes"} {
		require.Equal(t, want, Bytes(n))
	}
}

// TestCut: text cut short stays within n bytes, mark included, and never splits a character.
func TestCut(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		mark string
		want string
	}{
		{"short", 5, "…", "short"},
		{"abcdefgh", 6, "...", "abc..."},
		{"abcdefgh", 4, "", "abcd"},
		{"ab€cd", 4, "", "ab"},      // € is 3 bytes: cut before it, not inside
		{"ab€cd", 6, "…", "ab…"},    // room for "…" (3 bytes) leaves 3 bytes, which would split €
		{"€€", 2, "…", "…"},         // no room for any of s: the mark alone
		{"abcdef", 1, "...", "..."}, // n smaller than the mark: the mark alone
	} {
		require.Equal(t, tc.want, Cut(tc.s, tc.n, tc.mark), "Cut(%q, %d, %q)", tc.s, tc.n, tc.mark)
	}
}
