package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLastUseAfterAClockStep: a key's last use is written again once older than
// lastUsedResolution, and also once more than lastUsedAhead in the clock's future (it was
// written while the clock ran ahead): a clock set back does not freeze it until it catches up.
func TestLastUseAfterAClockStep(t *testing.T) {
	now := time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		last  time.Time
		write bool
	}{
		{"just used", now.Add(-30 * time.Second), false},
		{"older than the resolution", now.Add(-2 * time.Minute), true},
		{"slightly ahead (a replica's clock)", now.Add(30 * time.Minute), false},
		{"written while the clock ran a day ahead", now.Add(24 * time.Hour), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tbl keyTable
			tbl.reset([]Key{{ID: "key_1", Hash: "h", LastUsed: tc.last}})
			got, write := tbl.stale("key_1", now)
			require.Equal(t, tc.write, write)
			if write {
				require.Equal(t, now, got.LastUsed)
			}
		})
	}
}
