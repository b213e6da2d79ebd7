package audit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	spoolCrashEnv     = "RINGFENCE_TEST_SPOOL_CRASH_DB"
	spoolCrashKindEnv = "RINGFENCE_TEST_SPOOL_CRASH_KIND"
)

// crashSpool opens the spool of the crash test: kind "files" keeps it in path+".spool".
func crashSpool(t *testing.T, kind, path string, sink Sink) *Spool {
	cfg := SpoolConfig{Sink: sink, Producer: "pool", MaxPending: 1 << 20}
	if kind == "files" {
		cfg.Dir = path + ".spool"
	} else {
		db := openBolt(t, path)
		t.Cleanup(func() { _ = db.Close() })
		cfg.DB, cfg.Bucket = db, "outbox"
	}
	s, err := NewSpool(cfg)
	require.NoError(t, err)
	return s
}

type downSink struct{}

func (downSink) Append(context.Context, []Record) error { return errors.New("audit service down") }

// TestSpoolCrashChild is the child process of TestSpoolCrashKeepsAcknowledgedRecords:
// it enqueues from several goroutines and prints each record once Enqueue returned.
func TestSpoolCrashChild(t *testing.T) {
	path := os.Getenv(spoolCrashEnv)
	if path == "" {
		t.Skip("helper process, run by TestSpoolCrashKeepsAcknowledgedRecords")
	}
	s := crashSpool(t, os.Getenv(spoolCrashKindEnv), path, downSink{})
	var out sync.Mutex
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200_000 {
				r := toolRecord(i, fmt.Sprint(g))
				if err := s.Enqueue(context.Background(), r); err != nil {
					fmt.Fprintln(os.Stderr, "enqueue:", err)
					os.Exit(3)
				}
				out.Lock()
				// One write per line: a pipe write this small is atomic, so a kill
				// never leaves half an acknowledgement.
				fmt.Fprintf(os.Stdout, "%d %s\n", g, r.ID)
				out.Unlock()
			}
		})
	}
	wg.Wait()
}

func TestSpoolCrashKeepsAcknowledgedRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	forEachKind(t, testSpoolCrashKeepsAcknowledgedRecords)
}

func testSpoolCrashKeepsAcknowledgedRecords(t *testing.T, kind string) {
	path := filepath.Join(t.TempDir(), "producer.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestSpoolCrashChild$", "-test.v=false")
	cmd.Env = append(os.Environ(), spoolCrashEnv+"="+path, spoolCrashKindEnv+"="+kind)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	acked := make([][]string, 4)
	sc := bufio.NewScanner(stdout)
	n := 0
	killed := false
	for sc.Scan() {
		var g int
		var id string
		if _, err := fmt.Sscanf(sc.Text(), "%d %s", &g, &id); err != nil || g < 0 || g >= 4 {
			continue // test framework output
		}
		acked[g] = append(acked[g], id)
		n++
		if n == 400 && !killed {
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			killed = true
		}
	}
	err = cmd.Wait()
	require.True(t, killed, "child ended before 400 acknowledgements: %v\n%s", err, stderr.String())

	sink := newFakeSink()
	s := crashSpool(t, kind, path, sink)
	require.GreaterOrEqual(t, s.Pending(), n)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	require.NoError(t, s.Flush(t.Context()))
	cancel()
	require.NoError(t, <-done)

	// Every acknowledged record arrives, each goroutine's in its order; records that
	// committed after the last printed line may arrive too.
	pos := make(map[string]int)
	for i, r := range sink.records() {
		pos[r.ID] = i
	}
	for g, list := range acked {
		last := -1
		for _, id := range list {
			p, ok := pos[id]
			require.True(t, ok, "acknowledged record %s of goroutine %d lost", id, g)
			require.Greater(t, p, last, "goroutine %d out of order", g)
			last = p
		}
	}
}
