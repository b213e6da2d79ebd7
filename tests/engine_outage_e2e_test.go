package tests

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil/dockertest"
)

// engineLink stands between the pool and the Docker engine's socket, so that a test can cut
// the engine off (as an engine restart or a lost socket does) without touching the engine
// that other tests share.
type engineLink struct {
	t      *testing.T
	path   string // the socket the pool dials
	engine string // the engine's socket
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
	// cut is set by down before it closes anything: from then on the relays of that link pass
	// nothing on, so a request the pool sends while down closes the connections (a removal as
	// a session's attach ends, say) never reaches the engine.
	cut *atomic.Bool
}

func newEngineLink(t *testing.T) *engineLink {
	engine := "/var/run/docker.sock"
	if h, ok := strings.CutPrefix(os.Getenv("DOCKER_HOST"), "unix://"); ok {
		engine = h
	}
	// A short directory: a unix socket's path is limited to about 100 bytes.
	dir, err := os.MkdirTemp("", "rf-engine-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	l := &engineLink{t: t, path: filepath.Join(dir, "docker.sock"), engine: engine, conns: map[net.Conn]bool{}}
	l.up()
	t.Cleanup(l.down)
	return l
}

// host is the DOCKER_HOST value of the link.
func (l *engineLink) host() string { return "unix://" + l.path }

// up listens again and relays every connection to the engine.
func (l *engineLink) up() {
	_ = os.Remove(l.path)
	ln, err := net.Listen("unix", l.path)
	require.NoError(l.t, err)
	cut := new(atomic.Bool)
	l.mu.Lock()
	l.ln, l.cut = ln, cut
	l.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e, err := net.Dial("unix", l.engine)
			if err != nil {
				c.Close()
				continue
			}
			l.mu.Lock()
			if l.ln != ln {
				l.mu.Unlock()
				c.Close()
				e.Close()
				return
			}
			l.conns[c], l.conns[e] = true, true
			l.mu.Unlock()
			go relay(cutWriter{c, cut}, c, e)
			go relay(cutWriter{e, cut}, e, c)
		}
	}()
}

// cutWriter writes to its connection until its link is cut.
type cutWriter struct {
	net.Conn
	cut *atomic.Bool
}

func (w cutWriter) Write(p []byte) (int, error) {
	if w.cut.Load() {
		return 0, net.ErrClosed
	}
	return w.Conn.Write(p)
}

// relay copies src to dst (through w, which stops at the cut).
func relay(w io.Writer, dst, src net.Conn) {
	_, err := io.Copy(w, src)
	if err == nil || errors.Is(err, net.ErrClosed) {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
			return
		}
	}
	dst.Close()
	src.Close()
}

// down closes the socket and every connection through it: the engine is gone for the pool.
func (l *engineLink) down() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut != nil {
		l.cut.Store(true)
	}
	if l.ln != nil {
		_ = l.ln.Close()
		l.ln = nil
	}
	for c := range l.conns {
		_ = c.Close()
	}
	clear(l.conns)
}

// TestTheEngineGoesAwayWhileARunHoldsASession cuts the pool off the Docker engine (through a
// relay of its socket, not by restarting the engine other tests share) while a run holds a
// session and a warm container waits: calls are refused before dispatch with an error that
// names the engine's socket and that it may not be running; once it is back, the next call
// starts a fresh session and the warm container is refilled, and no container of before the
// outage is left behind.
func TestTheEngineGoesAwayWhileARunHoldsASession(t *testing.T) {
	link := newEngineLink(t)
	d, cli, poolID := runsDaemon(t, "RINGFENCE_SANDBOX__DOCKER_HOST="+link.host())
	require.Equal(t, 0, cli("servers", "update", "fx", "--prewarm", "1").Code)
	warmReady := func() bool { return strings.Contains(cli("servers", "show", "fx").Stdout, "1 (ready 1, starting 0)") }
	require.Eventually(t, warmReady, 60*time.Second, 200*time.Millisecond, "the warm container is ready")
	require.Equal(t, 0, cli("runs", "start", "--graph", "demo", "--run", "run-engine").Code)
	call := func(text string) result {
		return cli("runs", "call", "--run", "run-engine", "--agent", "researcher", "--tool", "fx__echo", "--args", `{"text":"`+text+`"}`)
	}
	r := call("before")
	require.Equal(t, 0, r.Code, r.Stderr)
	// The call took the warm container and the pool refills it: a session and a warm one.
	require.Eventually(t, func() bool { return warmReady() && len(poolContainers(t, poolID)) == 2 }, 60*time.Second, 200*time.Millisecond)
	before := poolContainers(t, poolID)

	link.down()
	for _, text := range []string{"while down", "again"} {
		r = call(text)
		require.Equal(t, 3, r.Code, "refused before dispatch: %s%s", r.Stdout, r.Stderr)
		require.Contains(t, r.Stderr, "refused before dispatch (spawn_failed)")
		require.Contains(t, r.Stderr, "failed to connect to the docker API at "+link.host()+"; check if the path is correct and if the daemon is running")
		require.Contains(t, r.Stderr, "nothing reached the server")
	}

	link.up()
	r = call("after")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "after")
	var now []string
	if !assert.Eventually(t, func() bool {
		now = poolContainers(t, poolID)
		for _, c := range before {
			if slices.Contains(now, c) {
				return false
			}
		}
		return warmReady() && len(now) == 2
	}, 60*time.Second, 200*time.Millisecond) {
		// Seen once in CI, under load, not reproduced since: what the pool said is the lead.
		t.Fatalf("a container of before the outage is left, or the warm one is not refilled: before %v, now %v, %s\npool log:\n%s",
			before, now, cli("servers", "show", "fx").Stdout, d.Logs.String())
	}
	require.Equal(t, 0, cli("runs", "end", "--run", "run-engine").Code)
	require.Equal(t, 0, cli("servers", "update", "fx", "--prewarm", "0").Code)
}

// TestAContainerTheOutageLeftIsRemovedOnceTheEngineIsBack: a session's server that outlives the
// end of its input (--linger) dies for the pool when the engine is cut off, and the pool's
// removal of its container fails, so the container keeps running (with its memory and CPU
// limits). Once the engine answers again the pool removes it by itself, with no call and no
// restart, and says so.
func TestAContainerTheOutageLeftIsRemovedOnceTheEngineIsBack(t *testing.T) {
	link := newEngineLink(t)
	d, cli, poolID := runsDaemon(t, "RINGFENCE_SANDBOX__DOCKER_HOST="+link.host())
	t.Cleanup(func() {
		// A failure while the link is down leaves a server that ignores its input, which the
		// pool cannot reach to remove: the test removes it on the engine itself.
		if t.Failed() {
			docker := dockertest.RequireEngine(t)
			for _, id := range poolContainers(t, poolID) {
				_, _ = docker.ContainerRemove(context.Background(), id, client.ContainerRemoveOptions{Force: true})
			}
		}
	})
	must := func(r result) {
		t.Helper()
		require.Equal(t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	}
	must(cli("servers", "add", "lg", "--command", "mcpfixture --linger", "--grant", "process_spawn", "--grant", "external_api_call"))
	must(cli("mcp-import", "--server", "lg", "--graph", "demo", "--agent", "researcher", "--tool", "echo"))
	must(cli("graphs", "publish", "--graph", "demo"))
	must(cli("runs", "start", "--graph", "demo", "--run", "run-linger"))
	r := cli("runs", "call", "--run", "run-linger", "--agent", "researcher", "--tool", "lg__echo", "--args", `{"text":"before"}`)
	require.Equal(t, 0, r.Code, r.Stderr)
	before := poolContainers(t, poolID)
	require.Len(t, before, 1, "the run's session of lg")

	link.down()
	d.requireLogged(t, `msg="spawner: could not remove a container; .*container=`+before[0][:12],
		"the pool saw the session die and could not remove its container")
	require.Equal(t, before, poolContainers(t, poolID), "the server outlives its input: the container is still there")

	link.up()
	if !assert.Eventually(t, func() bool { return len(poolContainers(t, poolID)) == 0 }, 60*time.Second, 200*time.Millisecond) {
		t.Fatalf("the container the outage left is still there: %v\npool log:\n%s", poolContainers(t, poolID), d.Logs.String())
	}
	d.requireLogged(t, `msg="spawner: removed a container this pool no longer holds" .*container=`+before[0][:12]+` server=lg reason="its removal failed"`)
	page := scrape(t, d)
	require.Contains(t, page, "\nringfence_pool_leftover_containers_removed_total 1\n", metricLines(page, "ringfence_pool_leftover"))
	must(cli("runs", "end", "--run", "run-linger"))
}
