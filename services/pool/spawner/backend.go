package spawner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Backend starts the servers of the transports it serves: Docker (stdio servers in the
// isolation image), Host (stdio servers as host processes, development only) and Remote
// (streamable HTTP and SSE). Another kind (a Kubernetes pod, another sandbox) is a package of
// its own implementing Backend with the Kit, handed to NewRouter by the binary's wiring;
// nothing in the Router changes.
type Backend interface {
	// Name names it in reports and logs ("docker", "host", "remote").
	Name() string
	// Serves reports whether it starts servers of transport (TransportStdio, …).
	Serves(transport string) bool
	// Preflight checks that it can serve (an image, a runtime, a cluster) and removes what an
	// earlier instance of this pool left behind. A back end of stdio servers reports how it
	// isolates them (Report.Isolation); one of remote servers returns a zero Report.
	Preflight(ctx context.Context) (Report, error)
	// Spawn starts spec's server and returns its connected session, built with kit. On
	// failure nothing it started is left running. spec has been checked.
	Spawn(ctx context.Context, spec *Spec, kit *Kit) (*Session, error)
	// Sweep removes everything any instance of this pool left with it, returning how many
	// (0 for a back end that leaves nothing behind).
	Sweep(ctx context.Context) (int, error)
	// Close releases the back end once the Router's sessions are closed: what this instance
	// still left, and the clients it created.
	Close(ctx context.Context) error
}

// Kit is what the Router lends a back end to turn what it started into a Session: the
// operator's bounds, and the machinery every session shares (the bounds on what a server may
// send unasked, the stdout filter and stderr tail of a local server, the classification of a
// failed handshake and of a death).
type Kit struct{ r *Router }

// Config is the operator's configuration the Router runs with, defaults applied. It must not
// be changed.
func (k *Kit) Config() *Config { return &k.r.cfg }

// Logger is the spawner's logger.
func (k *Kit) Logger() *slog.Logger { return k.r.log }

// Connect runs the MCP handshake over transport, under the traffic bounds every session
// has, and returns the session; srv is the back end's handle on what it started, stopped when
// the session closes (and at once when the handshake fails).
func (k *Kit) Connect(ctx context.Context, spec *Spec, transport mcp.Transport, srv Server) (*Session, error) {
	guard := newTrafficGuard()
	cs, err := connect(ctx, spec, transport, guard)
	if err != nil {
		_ = srv.Stop(context.WithoutCancel(ctx), nil)
		var e *Error
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("spawner: handshake: %w", ctx.Err())
		case errors.As(err, &e):
			return nil, e
		case errors.Is(err, context.DeadlineExceeded):
			return nil, newError(ClassHandshakeTimeout, "the server did not answer initialize within %s", spec.HandshakeTimeout)
		}
		return nil, newError(ClassNotMCPServer, "the server's answer to initialize was not MCP: %s", safeText(err.Error(), secretsOf(spec), 200))
	}
	return newSession(k.r, spec, srv, cs, guard, nil), nil
}

// Stdio is a local server's standard streams as the spawner reads them: only the JSON-RPC
// lines of its stdout reach the MCP client (anything else is diverted to the tail), each held
// to its bound, and the end of its stderr is kept, bounded and with every secret masked, for
// diagnostics.
type Stdio struct {
	filter   *stdoutFilter
	tail     *tail
	messages chan inMessage
	requests *openRequests
	// life ends when the client's side closes (Close).
	life    context.Context
	endLife context.CancelFunc
	general int
	callCap int
}

// NewStdio returns the streams of one local server of spec.
func (k *Kit) NewStdio(spec *Spec) *Stdio {
	cfg := &k.r.cfg
	t := newTail(cfg.StderrTailBytes, secretsOf(spec))
	life, end := context.WithCancel(context.Background())
	st := &Stdio{tail: t, messages: make(chan inMessage), requests: &openRequests{}, life: life, endLife: end,
		general: cfg.MaxMessageBytes, callCap: resultCap(spec)}
	st.filter = newStdoutFilter(st.messages, life, t, st.requests, cfg.ResultBudget, st.general, st.callCap)
	return st
}

// Stdout is where the back end copies the server's standard output.
func (s *Stdio) Stdout() io.Writer { return s.filter }

// Stderr is where the back end copies the server's standard error.
func (s *Stdio) Stderr() io.Writer { return s.tail }

// EndStdout tells the client the server's output ended: err is nil at the end of the stream.
func (s *Stdio) EndStdout(err error) { s.filter.finish(err) }

// Close closes the client's side of the output; the back end calls it as it stops the server.
func (s *Stdio) Close() error {
	s.closeClient()
	return nil
}

// closeClient ends the client's side: what the filter still has to deliver is dropped, and a
// wait for the budget gives up.
func (s *Stdio) closeClient() { s.endLife() }

// Tail is the end of the server's stderr, masked and made safe to show.
func (s *Stdio) Tail() string { return s.tail.String() }

// Death classifies a local server that went away after the handshake, for Server.Death.
func (s *Stdio) Death(ctx context.Context, p Process) *Error {
	return deathError(ctx, p, s.filter, s.general)
}

// ConnectStdio runs the MCP handshake with a local server p over its stdio (its output copied
// into st, its input stdin) and returns the session. A failed handshake is classified from
// what is known of the server besides the error (command not found, exited, not an MCP server,
// timed out), and p is stopped.
func (k *Kit) ConnectStdio(ctx context.Context, spec *Spec, p Process, st *Stdio, stdin io.WriteCloser) (*Session, error) {
	guard := newTrafficGuard()
	transport := &stdioTransport{st: st, stdin: stdin, g: guard, secrets: secretsOf(spec), callCap: st.callCap}
	cs, err := connect(ctx, spec, transport, guard)
	if err != nil {
		e := handshakeError(ctx, err, p, st.filter, st.tail, spec)
		_ = p.Stop(context.WithoutCancel(ctx), nil)
		return nil, e
	}
	return newSession(k.r, spec, p, cs, guard, st.tail), nil
}
