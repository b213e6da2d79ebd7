package cli_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/cli"
)

// lockedBuffer is a buffer a running command writes while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestATailSaysItFollowsOnlyOnceAdmitted: audit tail says it is following the log once the
// watch is admitted, which an idle log says at once, and a refused watch (a filter the server
// refuses) prints the refusal alone, never a line saying the log is followed before it.
func TestATailSaysItFollowsOnlyOnceAdmitted(t *testing.T) {
	// Registered before the server, so it runs after the server's cleanup, which ends the
	// admitted watch below: the tail then returns.
	done := make(chan int, 1)
	started := false
	t.Cleanup(func() {
		if started {
			<-done
		}
	})
	s := agentServer(t)

	code, out, errOut := s.cli("audit", "tail", "--call", "c 1")
	require.Equal(t, cli.ExitFailure, code, errOut)
	require.Contains(t, errOut, `audit: invalid filter: call_id "c 1" holds a space`)
	require.NotContains(t, errOut, "following", "the watch was refused, so nothing was followed")
	require.Empty(t, out)

	// An admitted watch of an idle log says so without a record to show; it ends as the
	// server closes (the test's cleanup).
	var stdout, stderr lockedBuffer
	started = true
	go func() {
		done <- cli.Execute([]string{"audit", "tail", "--addr", s.addr, "--api-key", adminKey}, strings.NewReader(""), &stdout, &stderr)
	}()
	require.Eventually(t, func() bool {
		return strings.Contains(stderr.String(), "following the audit log: new records print as they land")
	}, 10*time.Second, 10*time.Millisecond, "stderr: %s", stderr.String())
	require.Equal(t, "SEQ TIME KIND TENANT WHAT OUTCOME\n", stdout.String())
}
