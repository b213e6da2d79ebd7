package store

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/audit"
)

// TestAClockStepNeitherBreaksNorHidesTheLog: the log's clock set back three hours, then
// forward a day, between appends: receive times go back and forth in sequence order, the chain
// verifies (also after a reopen), and a time filter finds each record by its own time. A record
// made before a step back of more than audit.MaxClockSkew is refused, which its producer
// quarantines.
func TestAClockStepNeitherBreaksNorHidesTheLog(t *testing.T) {
	var mu sync.Mutex
	noon := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	clock := noon
	set := func(at time.Time) { mu.Lock(); clock = at; mu.Unlock() }
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	path := filepath.Join(t.TempDir(), "audit.db")
	s, err := Open(path, Options{Now: now})
	require.NoError(t, err)
	made := func(at time.Time) audit.Record {
		r := adminRec("acme", audit.ActionPublish)
		r.Time = at
		return r
	}

	times := []time.Time{noon, noon.Add(-3 * time.Hour), noon.Add(24 * time.Hour)}
	for _, at := range times {
		set(at)
		appendAll(t, s, made(at))
	}
	set(times[1])
	_, err = s.Append(t.Context(), []audit.Record{made(noon)})
	require.ErrorIs(t, err, audit.ErrInvalidRecord, "made three hours ahead of the log's clock")

	requireVerified(t, s, 3)
	page, err := s.List(t.Context(), Filter{}, 10, "")
	require.NoError(t, err)
	require.Len(t, page.Entries, 3)
	for i, e := range page.Entries {
		require.Equal(t, times[i], e.Record.Time)
		require.Equal(t, times[i], e.Record.ReceiveTime)
	}
	page, err = s.List(t.Context(), Filter{Since: times[1].Add(-time.Minute), Until: times[1].Add(time.Minute)}, 10, "")
	require.NoError(t, err)
	require.Len(t, page.Entries, 1)
	require.Equal(t, times[1], page.Entries[0].Record.Time)

	require.NoError(t, s.Close())
	s = openStore(t, path)
	requireVerified(t, s, 3)
}
