package spawner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
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

// Host is the back end of stdio servers as host processes: development only, behind
// AllowUnisolated (production refuses it at start). A process gets no inherited environment,
// only the allowlisted keys and a minimal PATH, a private working directory removed on close,
// and its own process group so that closing ends whatever it started.
type Host struct {
	cfg Config
	log *slog.Logger
}

var _ Backend = (*Host)(nil)

// NewHost returns the host back end; cfg must allow unisolated servers.
func NewHost(cfg Config) (*Host, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	if !cfg.AllowUnisolated {
		return nil, errors.New("spawner: the host back end runs MCP servers unisolated and needs AllowUnisolated (development only)")
	}
	return &Host{cfg: cfg, log: cfg.Logger}, nil
}

// Name is "host".
func (h *Host) Name() string { return "host" }

// Serves stdio servers.
func (h *Host) Serves(transport string) bool { return transport == TransportStdio }

// Preflight warns that servers will run unisolated.
func (h *Host) Preflight(context.Context) (Report, error) {
	h.log.Warn("spawner: no isolation image; stdio MCP servers will run UNISOLATED on the host (development only)")
	return Report{Isolation: "unisolated"}, nil
}

// Sweep has nothing to remove: a host process does not outlive the pool's process group.
func (h *Host) Sweep(context.Context) (int, error) { return 0, nil }

// Close has nothing to release.
func (h *Host) Close(context.Context) error { return nil }

// Spawn runs the command as a host process and connects over its stdio.
func (h *Host) Spawn(ctx context.Context, spec *Spec, kit *Kit) (*Session, error) {
	cfg := &h.cfg
	env, err := checkEnv(spec.Env, cfg.AllowedEnvKeys)
	if err != nil {
		return nil, err
	}
	path, err := lookHostCommand(spec.Command, cfg.HostPATH)
	if err != nil {
		return nil, err
	}
	h.log.Warn("spawner: starting an MCP server UNISOLATED on the host (development only): it runs with this service's user and can reach everything it can",
		"server", spec.ServerRef, "command", path)

	dir, err := os.MkdirTemp("", "ringfence-mcp-"+spec.ServerRef+"-")
	if err != nil {
		return nil, newError(ClassSpawnFailed, "create a working directory: %v", err)
	}
	p := &hostServer{
		dir:    dir,
		st:     kit.NewStdio(spec),
		exited: make(chan struct{}),
		cfg:    cfg,
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        append([]string{spec.Command}, spec.Args...),
		Env:         append([]string{"PATH=" + cfg.HostPATH}, env...),
		Dir:         dir,
		Stdout:      p.st.Stdout(),
		Stderr:      p.st.Stderr(),
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
		p.st.EndStdout(nil)
		if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.ENOEXEC) {
			return nil, newError(ClassCommandNotFound, "command %s is not an executable program", clipQuote(spec.Command))
		}
		return nil, newError(ClassSpawnFailed, "start %s: %s", clipQuote(spec.Command), clip(redactString(err.Error(), secretsOf(spec)), 300))
	}
	p.cmd = cmd
	p.stdin = stdin
	go p.wait()
	return kit.ConnectStdio(ctx, spec, p, p.st, stdin)
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
	cmd   *exec.Cmd
	dir   string
	stdin io.WriteCloser
	st    *Stdio
	cfg   *Config

	exited  chan struct{}
	waitErr error
	state   *os.ProcessState
	killMu  sync.Mutex
}

func (p *hostServer) wait() {
	err := p.cmd.Wait()
	p.state = p.cmd.ProcessState
	p.waitErr = err
	p.st.EndStdout(nil)
	close(p.exited)
}

func (p *hostServer) Gone() <-chan struct{} { return p.exited }

func (p *hostServer) WaitExited(ctx context.Context, d time.Duration) bool {
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

func (p *hostServer) ExitStatus() (int, bool) {
	if !isClosed(p.exited) || p.state == nil {
		return 0, false
	}
	return p.state.ExitCode(), true
}

func (p *hostServer) DescribeExit(context.Context) string {
	if p.state == nil {
		return "ended"
	}
	if ws, ok := p.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("killed by signal %d", int(ws.Signal()))
	}
	return fmt.Sprintf("exited with status %d", p.state.ExitCode())
}

func (p *hostServer) Death(ctx context.Context) *Error {
	return p.st.Death(ctx, p)
}

func (p *hostServer) Stop(ctx context.Context, cs *mcp.ClientSession) error {
	var clientDone <-chan struct{}
	if cs != nil {
		clientDone = closeClient(cs, p.cfg.CloseTimeout)
	} else {
		_ = p.stdin.Close()
	}
	if !p.WaitExited(ctx, p.cfg.CloseTimeout) {
		p.killGroup()
		p.WaitExited(context.Background(), hostWaitDelay+time.Second)
	}
	// Whatever the server left in its group goes too.
	p.killGroup()
	_ = p.st.Close()
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
