package gctune

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestApplyKeepsAnOperatorsGOGC(t *testing.T) {
	t.Setenv("GOGC", "50")
	_, applied := Apply()
	require.False(t, applied)
}

func TestApplySetsTheServerDefault(t *testing.T) {
	// t.Setenv then unsetting is not possible; run only where the environment leaves GOGC alone.
	if _, set := lookupGOGC(); set {
		t.Skip("GOGC is set in this environment")
	}
	prev, applied := Apply()
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	require.True(t, applied)
	require.Equal(t, Percent, debug.SetGCPercent(Percent))
}

func lookupGOGC() (string, bool) { return os.LookupEnv("GOGC") }
