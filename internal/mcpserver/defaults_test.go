package mcpserver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTimeoutsDefault: a registration that sets no timeouts gets 2 s for the handshake
// (client_session_timeout) and 30 s per tool call, and one that sets them gets its own.
func TestTimeoutsDefault(t *testing.T) {
	var r Registration
	require.Equal(t, 2*time.Second, r.SessionTimeout())
	require.Equal(t, 30*time.Second, r.CallTimeout())
	r.ClientSessionTimeout, r.ToolCallTimeout = 5*time.Second, time.Minute
	require.Equal(t, 5*time.Second, r.SessionTimeout())
	require.Equal(t, time.Minute, r.CallTimeout())
}

// TestMaxResultBytes: a registration without max_result_bytes caps results at 16 MiB; one may
// set 1 KiB to 32 MiB, and anything else is refused naming the field and its bounds.
func TestMaxResultBytes(t *testing.T) {
	r := Registration{Ref: "docs", Command: "docs-mcp"}
	require.Equal(t, int64(16<<20), r.ResultCap())
	for _, ok := range []int64{0, 1 << 10, 4 << 20, 32 << 20} {
		r.MaxResultBytes = ok
		require.NoError(t, r.Validate(nil), "%d", ok)
	}
	require.Equal(t, int64(32<<20), r.ResultCap())
	for _, bad := range []int64{-1, 1023, 32<<20 + 1, 1 << 40} {
		r.MaxResultBytes = bad
		err := r.Validate(nil)
		require.ErrorContains(t, err, "max_result_bytes")
		require.ErrorContains(t, err, "between 1024 (1 KiB) and 33554432 (32 MiB)")
	}
}
