package store

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/ringfence/ringfence/internal/audit"
)

const crashEnv = "RINGFENCE_TEST_AUDIT_CRASH_DB"

// TestCrashChild is the child process of TestCrashLosesNoAcknowledgedRecord: it
// appends from many goroutines and prints "seq id" for every acknowledged record.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashEnv)
	if path == "" {
		t.Skip("helper process, run by TestCrashLosesNoAcknowledgedRecord")
	}
	s, err := Open(path, Options{})
	require.NoError(t, err)
	var out sync.Mutex
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1_000_000 {
				// Mix single appends with small batches, as producers' spools send.
				n := 1 + i%4
				recs := make([]audit.Record, n)
				for j := range recs {
					recs[j] = toolRec(call{tenant: "t", run: fmt.Sprint("run-", g), server: "s", tool: "x"}, fmt.Sprint(i, "-", j))
				}
				seqs, err := s.Append(context.Background(), recs)
				if err != nil {
					fmt.Fprintln(os.Stderr, "append:", err)
					os.Exit(3)
				}
				var b strings.Builder
				for j, seq := range seqs {
					fmt.Fprintf(&b, "%d %s\n", seq, recs[j].ID)
				}
				out.Lock()
				// One write per call, well under the pipe's atomic write size.
				_, _ = os.Stdout.WriteString(b.String())
				out.Unlock()
			}
		})
	}
	wg.Wait()
}

func TestCrashLosesNoAcknowledgedRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	path := filepath.Join(t.TempDir(), "audit.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.v=false")
	cmd.Env = append(os.Environ(), crashEnv+"="+path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	acked := make(map[uint64]string)
	sc := bufio.NewScanner(stdout)
	killed := false
	for sc.Scan() {
		var seq uint64
		var id string
		if _, err := fmt.Sscanf(sc.Text(), "%d %s", &seq, &id); err != nil {
			continue // test framework output
		}
		acked[seq] = id
		if len(acked) >= 5000 && !killed {
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			killed = true
		}
	}
	_ = cmd.Wait()
	require.True(t, killed, "child ended before 5000 acknowledgements\n%s", stderr.String())

	s := openStore(t, path)
	head, _ := s.Head()
	var maxAcked uint64
	for seq := range acked {
		maxAcked = max(maxAcked, seq)
	}
	require.GreaterOrEqual(t, head, maxAcked)
	require.NoError(t, s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		for seq, id := range acked {
			v := b.Get(seqKey(seq))
			require.NotNil(t, v, "acknowledged record %d lost", seq)
			e, err := decodeEntry(seqKey(seq), v)
			require.NoError(t, err)
			require.Equal(t, id, e.Record.ID, "record %d", seq)
		}
		return nil
	}))
	requireVerified(t, s, head)
	// The log keeps going where the killed process stopped.
	seqs := appendAll(t, s, toolRec(call{tenant: "t", run: "after", server: "s", tool: "x"}, "after"))
	require.Equal(t, []uint64{head + 1}, seqs)
	requireVerified(t, s, head+1)
}
