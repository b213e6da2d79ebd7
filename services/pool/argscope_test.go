package pool

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/mcpgate/capability"
)

// TestArgumentScopeWorkIsBounded: a caller picks the arguments, so a scope shaped to make
// every comparison with a graph's wildcard revoke entries run to the end is refused once
// the per-call work limit is spent, instead of costing seconds of CPU; an ordinary scope
// under the same entries is decided as before, and a repeated requirement is compared once.
func TestArgumentScopeWorkIsBounded(t *testing.T) {
	// "*" never crosses "/", and these have one segment more than the hostile argument
	// below, so none overlaps it and each comparison runs to the end: ~1,300 units of work
	// each, against ~600 for an ordinary path. 8,192 of them put the hostile argument past
	// the limit and leave the ordinary one well inside it.
	var revoked []string
	for range 8192 {
		revoked = append(revoked, "fs.read:"+strings.Repeat("*/", 123)+"*")
	}
	eff := capability.Effective{Held: capability.MustParseSet([]string{"fs.read"}), Revoked: capability.MustParseSet(revoked)}
	reqs := []string{"fs.read:{path}"}

	err := checkArgumentScopes(reqs, map[string]any{"path": strings.Repeat("x/", 122) + "x"}, eff)
	var ref *RefusedError
	require.True(t, errors.As(err, &ref), "%v", err)
	require.Equal(t, reasonArgumentScope, ref.Reason)
	require.Contains(t, ref.Error(), "per-call limit")

	require.NoError(t, checkArgumentScopes(reqs, map[string]any{"path": "/srv/docs/a.md"}, eff))
	repeated := make([]string, 64)
	for i := range repeated {
		repeated[i] = "fs.read:{path}"
	}
	require.NoError(t, checkArgumentScopes(repeated, map[string]any{"path": "/srv/docs/a.md"}, eff))
}
