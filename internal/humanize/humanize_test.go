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
