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
