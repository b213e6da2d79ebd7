package spawner

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEventsWindowCoversAClockStep: the window the OOM event is looked for in covers the
// container's life by the clock the engine stamps events with now, after the wall clock was
// set back or forward during that life.
func TestEventsWindowCoversAClockStep(t *testing.T) {
	created := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		now  time.Time // the wall clock when the container exited, two hours after its creation
	}{
		{"no step", created.Add(2 * time.Hour)},
		{"set back three hours", created.Add(-time.Hour)},
		{"set forward a day", created.Add(26 * time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			since, until := eventsWindow(created, 2*time.Hour, tc.now)
			s, err := strconv.ParseInt(since, 10, 64)
			require.NoError(t, err)
			u, err := strconv.ParseInt(until, 10, 64)
			require.NoError(t, err)
			oom := tc.now.Add(-time.Second).Unix() // stamped just before the exit, on the clock of now
			require.LessOrEqual(t, s, oom)
			require.Greater(t, u, oom)
		})
	}
}
