package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestABackupPathStaysUnderOut: a path a server sends is written under --out only when it is a
// plain relative path there; anything that could land elsewhere is refused, naming it.
func TestABackupPathStaysUnderOut(t *testing.T) {
	for _, p := range []string{"registry.db", "pool-audit-spool/acked", "pool-audit-spool/0000000000000001.seg"} {
		require.NoError(t, safeBackupPath(p), p)
	}
	for _, p := range []string{"", ".", "..", "../registry.db", "/etc/passwd", "a/../../b", "a//b", "./a", `a\b`, "a/"} {
		err := safeBackupPath(p)
		require.Error(t, err, p)
		require.Contains(t, err.Error(), "is not a plain path under the data_dir: refused", p)
	}
}
