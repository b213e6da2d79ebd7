package spawner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// hostWaitDelay bounds how long an exited process's output pipes may stay
// open (held by a child it left behind) before they are closed.
const hostWaitDelay = 2 * time.Second

// spawnHost runs the command as a host process: development only. The
// process gets no inherited environment, only the allowlisted keys and a
// minimal PATH, a private working directory removed on close, and its own
// process group so that Close ends whatever it started.
func (r *Router) spawnHost(ctx context.Context, spec *Spec) (*Session, error) {
	env, err := checkEnv(spec.Env, r.cfg.AllowedEnvKeys)
	if err != nil {
		return nil, err
	}
	path, err := lookHostCommand(spec.Command, r.cfg.HostPATH)
	if err != nil {
		return nil, err
	}
	r.log.Warn("spawner: starting an MCP server UNISOLATED on the host (development only): it runs with this service's user and can reach everything it can",
		"server", spec.ServerRef, "command", path)

	dir, err := os.MkdirTemp("", "ringfence-mcp-"+spec.ServerRef+"-")
	if err != nil {
		return nil, newError(ClassSpawnFailed, "create a working directory: %v", err)
	}
	secrets := secretsOf(spec)
	p := &hostServer{
		dir:    dir,
		tail:   newTail(r.cfg.StderrTailBytes, secrets),
		exited: make(chan struct{}),
		cfg:    &r.cfg,
	}
	pr, pw := io.Pipe()
	p.stdout = pr
	p.filter = newStdoutFilter(pw, p.tail, r.cfg.MaxMessageBytes)

	cmd := &exec.Cmd{
		Path:        path,
		Args:        append([]string{spec.Command}, spec.Args...),
		Env:         append([]string{"PATH=" + r.cfg.HostPATH}, env...),
		Dir:         dir,
		Stdout:      p.filter,
		Stderr:      p.tail,
		WaitDelay:   hostWaitDelay,
		SysProcAttr: hostSysProcAttr(),
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, newError(ClassSpawnFailed, "create stdin: %v", err)
	}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		p.filter.finish(nil)
		if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.ENOEXEC) {
			return nil, newError(ClassCommandNotFound, "command %s is not an executable program", clipQuote(spec.Command))
		}
		return nil, newError(ClassSpawnFailed, "start %s: %s", clipQuote(spec.Command), clip(redactString(err.Error(), secrets), 300))
	}
	p.cmd = cmd
	p.stdin = stdin
	go p.wait()

	guard := newTrafficGuard()
	cs, err := connect(ctx, spec, &mcp.IOTransport{Reader: pr, Writer: stdin, MaxLineLength: r.cfg.MaxMessageBytes}, guard)
	if err != nil {
		e := handshakeError(ctx, err, p, p.filter, p.tail, spec)
		_ = p.stop(context.WithoutCancel(ctx), nil)
		return nil, e
	}
	return newSession(r, spec, p, cs, guard, p.tail), nil
}

// lookHostCommand resolves command the way the container would: through
// the given PATH only, never the service's own.
func lookHostCommand(command, pathList string) (string, error) {
	if strings.Contains(command, "/") {
		if !filepath.IsAbs(command) {
			return "", newError(ClassInvalidSpec, "command %s must be a name on PATH or an absolute path", clipQuote(command))
		}
		if err := isExecutable(command); err != nil {
			return "", newError(ClassCommandNotFound, "command %s: %v", clipQuote(command), err)
		}
		return command, nil
	}
	for _, dir := range filepath.SplitList(pathList) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, command)
		if isExecutable(p) == nil {
			return p, nil
		}
	}
	return "", newError(ClassCommandNotFound, "command %s was not found on the host PATH %s", clipQuote(command), pathList)
}

func isExecutable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return errors.New("no such file")
	}
	if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
		return errors.New("not an executable file")
	}
	return nil
}

// hostServer is one host process.
type hostServer struct {
	cmd    *exec.Cmd
	dir    string
	stdin  io.WriteCloser
	stdout *io.PipeReader
	filter *stdoutFilter
	tail   *tail
	cfg    *Config

	exited  chan struct{}
	waitErr error
	state   *os.ProcessState
	killMu  sync.Mutex
}

func (p *hostServer) wait() {
	err := p.cmd.Wait()
	p.state = p.cmd.ProcessState
	p.waitErr = err
	p.filter.finish(nil)
	close(p.exited)
}

func (p *hostServer) gone() <-chan struct{} { return p.exited }

func (p *hostServer) waitExited(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.exited:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return isClosed(p.exited)
}

func (p *hostServer) exitStatus() (int, bool) {
	if !isClosed(p.exited) || p.state == nil {
		return 0, false
	}
	return p.state.ExitCode(), true
}

func (p *hostServer) describeExit(context.Context) string {
	if p.state == nil {
		return "ended"
	}
	if ws, ok := p.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("killed by signal %d", int(ws.Signal()))
	}
	return fmt.Sprintf("exited with status %d", p.state.ExitCode())
}

func (p *hostServer) death(ctx context.Context) *Error {
	return deathError(ctx, p, p.filter, p.cfg.MaxMessageBytes)
}

func (p *hostServer) stop(ctx context.Context, cs *mcp.ClientSession) error {
	var clientDone <-chan struct{}
	if cs != nil {
		clientDone = closeClient(cs, p.cfg.CloseTimeout)
	} else {
		_ = p.stdin.Close()
	}
	if !p.waitExited(ctx, p.cfg.CloseTimeout) {
		p.killGroup()
		p.waitExited(context.Background(), hostWaitDelay+time.Second)
	}
	// Whatever the server left in its group goes too.
	p.killGroup()
	_ = p.stdout.Close()
	<-p.exited
	if clientDone != nil {
		<-clientDone
	}
	if err := os.RemoveAll(p.dir); err != nil {
		return fmt.Errorf("spawner: remove the working directory: %w", err)
	}
	return nil
}

func (p *hostServer) killGroup() {
	p.killMu.Lock()
	defer p.killMu.Unlock()
	if p.cmd.Process == nil {
		return
	}
	killProcessGroup(p.cmd.Process.Pid)
}
