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
