package tests

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair: what is written to the controller reaches a reader of
// the terminal as typed input, one line per read.
func openPTY(t *testing.T) (controller, terminal *os.File) {
	t.Helper()
	controller, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { controller.Close() })
	fd := int(controller.Fd())
	require.NoError(t, unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0), "unlock the terminal")
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	require.NoError(t, err)
	terminal, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { terminal.Close() })
	return controller, terminal
}

// TestServersAddAsksForWhatIsMissingOnATerminal: on a terminal, servers add asks for a missing
// ref and command, each typed on its own line (both typed ahead, as a paste would); a script
// gets a usage error naming what is missing instead of a hang.
func TestServersAddAsksForWhatIsMissingOnATerminal(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	env := []string{"RINGFENCE_ADDR=" + d.GRPCAddr, "RINGFENCE_API_KEY=" + adminKey}

	controller, terminal := openPTY(t)
	_, err := controller.WriteString("docs-search\nmcp-server-filesystem /srv/docs\n")
	require.NoError(t, err)
	r := runCmd(t, terminal, env, bin("ringfence"), "servers", "add", "--grant", "process_spawn", "--grant", "external_api_call")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "server ref (e.g. docs-search): ")
	require.Contains(t, r.Stderr, "command to run inside the isolation image: ")
	require.Contains(t, r.Stdout, "docs-search")
	require.Contains(t, r.Stdout, "mcp-server-filesystem /srv/docs")

	r = runCmd(t, strings.NewReader("docs-search\n"), env, bin("ringfence"), "servers", "add")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "missing server ref (e.g. docs-search): pass it first: ringfence servers add REF ...")
}

// TestALongCallSaysWhatItWaitsForOnATerminal: a tool call that takes seconds says on a
// terminal what it waits for and for how long at most, rather than look hung; its answer
// follows as usual.
func TestALongCallSaysWhatItWaitsForOnATerminal(t *testing.T) {
	d, cli, _ := runsDaemon(t)
	r := cli("runs", "start", "--graph", "demo", "--run", "run-wait")
	require.Equal(t, 0, r.Code, r.Stderr)

	controller, terminal := openPTY(t)
	var seen bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		_, _ = io.Copy(&seen, controller) // ends with EIO once the terminal's last holder closes it
	}()
	cmd := exec.Command(bin("ringfence"), "runs", "call", "--run", "run-wait", "--agent", "researcher",
		"--tool", "fx__sleep", "--args", `{"ms":5000}`, "--call-id", "call-wait", "--timeout", "1m")
	cmd.Env = append(baseEnv(), "RINGFENCE_ADDR="+d.GRPCAddr, "RINGFENCE_API_KEY="+adminKey)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, terminal
	err := cmd.Run()
	require.NoError(t, terminal.Close())
	<-read // seen is the reader's until then
	require.NoError(t, err, seen.String())
	require.Contains(t, seen.String(), "waiting for the answer of fx__sleep, call call-wait (up to --timeout 1m0s)...")
	require.Contains(t, stdout.String(), "dispatched: succeeded")
	require.Equal(t, 0, cli("runs", "end", "--run", "run-wait").Code)
}
