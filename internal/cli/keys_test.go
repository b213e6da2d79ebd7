package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/auth"
)

// TestKeysCreateHelpNamesEveryBuiltinRole: `keys create --role` lists every role a deployment
// has built in (approver was once left out), read from the roles themselves.
func TestKeysCreateHelpNamesEveryBuiltinRole(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, ExitOK, Execute([]string{"keys", "create", "--help"}, nil, &stdout, &stderr), stderr.String())
	var line string
	for l := range strings.Lines(stdout.String()) {
		if strings.Contains(l, "--role") {
			line = l
		}
	}
	require.NotEmpty(t, line, stdout.String())
	require.Contains(t, line, "or a custom role")
	for role := range auth.BuiltinRoles {
		require.Contains(t, line, role, "the --role help leaves out a built-in role")
	}
}
