package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/audit"
)

func appendN(t testing.TB, s *Store, from, n int) {
	t.Helper()
	var recs []audit.Record
	for i := from; i < from+n; i++ {
		recs = append(recs, toolRec(call{tenant: "t", run: "r", server: "s", tool: "x"}, fmt.Sprint(i)))
		if len(recs) == MaxAppendRecords {
			appendAll(t, s, recs...)
			recs = recs[:0]
		}
	}
	if len(recs) > 0 {
		appendAll(t, s, recs...)
	}
}

// collect reads n entries from Watch(fromSeq) in a goroutine.
func collect(ctx context.Context, s *Store, fromSeq uint64, n int) <-chan []Entry {
	out := make(chan []Entry, 1)
	go func() {
		var got []Entry
		for e, err := range s.Watch(ctx, fromSeq) {
			if err != nil {
				break
			}
			got = append(got, e)
			if len(got) == n {
				break
			}
		}
		out <- got
	}()
	return out
}

func seqsOf(entries []Entry) []uint64 {
	out := make([]uint64, len(entries))
	for i, e := range entries {
		out[i] = e.Record.Seq
	}
	return out
}

func seqRange(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func TestWatchReplaysThenFollows(t *testing.T) {
	s, _ := newStore(t)
	appendN(t, s, 0, 10)

	got := collect(t.Context(), s, 4, 7+600)
	appendN(t, s, 10, 600) // more than one watch chunk, in several commits
	entries := <-got
	require.Equal(t, seqRange(4, 610), seqsOf(entries))
	for i := 1; i < len(entries); i++ {
		require.Equal(t, entries[i-1].Hash, entries[i].PrevHash)
	}

	// Resume after the last seen record, as a reconnecting client does.
	got = collect(t.Context(), s, 611, 5)
	appendN(t, s, 610, 5)
	require.Equal(t, seqRange(611, 615), seqsOf(<-got))

	// From zero means from the start.
	require.Equal(t, seqRange(1, 3), seqsOf(<-collect(t.Context(), s, 0, 3)))
}

func TestSlowWatcherDoesNotBlockAppends(t *testing.T) {
	s, _ := newStore(t)
	appendN(t, s, 0, 1)
	release := make(chan struct{})
	got := make(chan []Entry, 1)
	go func() {
		var all []Entry
		for e, err := range s.Watch(t.Context(), 1) {
			if err != nil {
				break
			}
			if len(all) == 0 {
				<-release // a consumer stuck on its first record
			}
			all = append(all, e)
			if len(all) == 5001 {
				break
			}
		}
		got <- all
	}()
	// Appends complete while the watcher is stuck; if the writer waited on watchers,
	// this would never return.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for i := 0; i < 5000; i += 500 {
		var recs []audit.Record
		for j := i; j < i+500; j++ {
			recs = append(recs, toolRec(call{tenant: "t", run: "r", server: "s", tool: "x"}, fmt.Sprint("n", j)))
		}
		_, err := s.Append(ctx, recs)
		require.NoError(t, err)
	}
	close(release)
	require.Equal(t, seqRange(1, 5001), seqsOf(<-got), "the slow watcher catches up without a gap")
}

func TestWatchEnds(t *testing.T) {
	t.Run("context", func(t *testing.T) {
		s, _ := newStore(t)
		ctx, cancel := context.WithCancel(t.Context())
		errs := make(chan error, 1)
		go func() {
			for _, err := range s.Watch(ctx, 1) {
				errs <- err
				return
			}
		}()
		cancel()
		require.ErrorIs(t, <-errs, context.Canceled)
	})
	t.Run("close", func(t *testing.T) {
		s, _ := newStore(t)
		errs := make(chan error, 1)
		go func() {
			for _, err := range s.Watch(t.Context(), 1) {
				errs <- err
				return
			}
		}()
		require.NoError(t, s.Close())
		require.ErrorIs(t, <-errs, ErrClosed)
	})
}
