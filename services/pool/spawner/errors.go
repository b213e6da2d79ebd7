package spawner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Class says why a spawn or a session failed, in terms an operator can act
// on. Classes are stable strings: the pool maps them to audit outcomes and
// API errors.
type Class string

const (
	// ClassIsolationRequired: a stdio server was asked for but no isolation
	// image is configured and unisolated development is not allowed.
	ClassIsolationRequired Class = "isolation_required"
	// ClassImageMissing: the engine does not have the isolation image.
	ClassImageMissing Class = "image_missing"
	// ClassImageRejected: the image exists but cannot be used (it declares
	// a VOLUME, or its reference is not pinned).
	ClassImageRejected Class = "image_rejected"
	// ClassRuntimeMissing: the engine has no OCI runtime of the configured name.
	ClassRuntimeMissing Class = "runtime_missing"
	// ClassInvalidSpec: the spec itself is refused before anything starts
	// (an environment key off the allowlist or one that steers the runtime,
	// a malformed URL or header, an unknown transport).
	ClassInvalidSpec Class = "invalid_spec"
	// ClassCommandNotFound: the command is not in the image (or on the
	// host's PATH in development), or is not executable.
	ClassCommandNotFound Class = "command_not_found"
	// ClassExitedBeforeHandshake: the server started and exited before
	// answering initialize.
	ClassExitedBeforeHandshake Class = "exited_before_handshake"
	// ClassNotMCPServer: the server wrote to stdout but nothing it wrote was
	// JSON-RPC, or its answer to initialize was not MCP.
	ClassNotMCPServer Class = "not_mcp_server"
	// ClassHandshakeTimeout: the server runs but never answered initialize,
	// or its first tools/list (Session.SetupListTools), within the handshake
	// timeout.
	ClassHandshakeTimeout Class = "handshake_timeout"
	// ClassCrashed: the server died after the handshake, including while
	// listing tools or running a call, or was killed by a limit.
	ClassCrashed Class = "crashed"
	// ClassProtocolViolation: the server is alive but broke the protocol or
	// a bound (a message over the size limit, too many tools, a repeating
	// cursor, an error answer to tools/list, an unsupported version, a
	// message or an answer the client cannot decode).
	ClassProtocolViolation Class = "protocol_violation"
	// ClassTimeout: the server is alive but did not answer a request
	// within the spawner's own bound (a caller's own deadline returns the
	// context's error instead).
	ClassTimeout Class = "timeout"
	// ClassConnectionRefused: nothing accepts connections at a remote URL.
	ClassConnectionRefused Class = "connection_refused"
	// ClassTLSFailure: the remote server's certificate is not trusted or the
	// TLS handshake failed.
	ClassTLSFailure Class = "tls_failure"
	// ClassSpawnFailed: anything else; the message is safe to show.
	ClassSpawnFailed Class = "spawn_failed"
)

// Error is every failure the spawner reports about a server. Message is safe
// to show to an operator: it never holds a secret value or a stack trace.
// StderrTail is the redacted end of the server's stderr (and of any stdout
// lines that were not JSON-RPC), for diagnostics.
type Error struct {
	Class      Class
	Message    string
	StderrTail string
	// TooLarge marks a message over its bound, which callers report as a result too large
	// rather than as misbehaviour: Limit is the bound (the registration's result cap for an
	// answer to tools/call, the message bound for anything else), Size the bytes the message
	// had when it was given up (at least Limit+1), and OverBudget says that the bound was the
	// pool's budget for results in flight, which had no room for it.
	TooLarge   bool
	Limit      int64
	Size       int64
	OverBudget bool
	// HTTPStatus is, for a remote server that refused the handshake's credentials, the
	// status it answered (401 or 403): a user's OAuth token it no longer takes.
	HTTPStatus int
	// InsufficientScope marks a remote server's refusal of a request for want of scope: HTTP
	// 403 with a Bearer error="insufficient_scope" challenge (RFC 6750 section 3.1), which the
	// server did not serve. Scope is the scope the challenge names: none when it names none,
	// or names it beyond mcpserver.ScopeList's bounds.
	InsufficientScope bool
	Scope             []string
}

func (e *Error) Error() string {
	return fmt.Sprintf("spawner: %s: %s", e.Class, e.Message)
}

// IsTooLarge reports whether err is the violation of a message over the size bound.
func IsTooLarge(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.TooLarge
}

func tooLarge(format string, args ...any) *Error {
	e := newError(ClassProtocolViolation, format, args...)
	e.TooLarge = true
	return e
}

// ClassOf returns the class of the first *Error in err's chain, or "".
func ClassOf(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return ""
}

func newError(class Class, format string, args ...any) *Error {
	return &Error{Class: class, Message: fmt.Sprintf(format, args...)}
}

// Process is a local server (a container, a host process, a pod) as the classification of its
// end sees it.
type Process interface {
	Server
	// WaitExited waits up to d for the exit status and reports whether the server has
	// exited.
	WaitExited(ctx context.Context, d time.Duration) bool
	// ExitStatus is the exit code, valid when exited is true.
	ExitStatus() (code int, exited bool)
	// DescribeExit says how it ended ("exited with status 3", "killed: memory limit …").
	DescribeExit(ctx context.Context) string
}

// Exit statuses of a command that could not be executed (shells and the
// container's init use the same convention).
const (
	exitNotExecutable = 126
	exitNotFound      = 127
)

// handshakeError classifies a failed initialize of a local server from what
// is known besides the error itself: whether and how the server exited, and
// what it wrote to stdout.
func handshakeError(ctx context.Context, err error, srv Process, f *stdoutFilter, t *tail, spec *Spec) error {
	if ctx.Err() != nil {
		return fmt.Errorf("spawner: handshake: %w", ctx.Err())
	}
	var e *Error
	if errors.As(err, &e) {
		// Already classified (the server broke a bound connect enforces).
		e.StderrTail = t.String()
		return e
	}
	timedOut := errors.Is(err, context.DeadlineExceeded)
	wait := deathGrace
	if timedOut {
		// It had the whole handshake timeout; only look, do not wait.
		wait = 0
	}
	switch {
	case f.tooLarge.Load():
		e = tooLarge("the server wrote a message larger than the limit during the handshake")
	case srv.WaitExited(ctx, wait):
		code, _ := srv.ExitStatus()
		switch {
		case code == exitNotFound:
			e = newError(ClassCommandNotFound, "command %s was not found (exit status %d): it must be on the image's PATH", clipQuote(spec.Command), code)
		case code == exitNotExecutable:
			e = newError(ClassCommandNotFound, "command %s is not executable (exit status %d)", clipQuote(spec.Command), code)
		case f.sawOnlyGarbage():
			e = newError(ClassNotMCPServer, "the command wrote %d lines to stdout, none of them JSON-RPC, and exited (%s): it is not an MCP server", f.otherLines.Load(), srv.DescribeExit(ctx))
		case unsupportedVersion(err):
			e = newError(ClassProtocolViolation, "the server answered initialize with a protocol version this client does not support, and exited (%s)", srv.DescribeExit(ctx))
		case answered(err):
			// It answered, and exited only after: `cat` echoes the client's request, the
			// client answers it, cat echoes that answer back as the answer to initialize, and
			// exits when the client gives up and closes its stdin.
			e = newError(ClassNotMCPServer, "the server's answer to initialize was not MCP, and it exited (%s): it is not an MCP server", srv.DescribeExit(ctx))
		case timedOut:
			// It ran the whole handshake timeout (an exit before it would have ended the
			// handshake at once) and exited when the client gave up and closed its stdin.
			e = newError(ClassHandshakeTimeout, "the server did not answer initialize within %s", spec.HandshakeTimeout)
		default:
			e = newError(ClassExitedBeforeHandshake, "the server exited before answering initialize (%s)", srv.DescribeExit(ctx))
		}
	case timedOut && f.sawOnlyGarbage():
		e = newError(ClassNotMCPServer, "the command wrote %d lines to stdout within %s, none of them JSON-RPC: it is not an MCP server", f.otherLines.Load(), spec.HandshakeTimeout)
	case timedOut:
		e = newError(ClassHandshakeTimeout, "the server did not answer initialize within %s", spec.HandshakeTimeout)
	case unsupportedVersion(err):
		e = newError(ClassProtocolViolation, "the server answered initialize with a protocol version this client does not support")
	default:
		e = newError(ClassNotMCPServer, "the server's answer to initialize was not MCP")
	}
	e.StderrTail = t.String()
	return e
}

// answered reports whether a failed initialize ended on the server's answer, not on the end of
// its stream or the handshake's deadline: an error answer, or a result that does not decode as
// the answer to initialize.
func answered(err error) bool {
	var rpcErr *jsonrpc.Error
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	return errors.As(err, &rpcErr) || errors.As(err, &typeErr) || errors.As(err, &syntaxErr)
}

func unsupportedVersion(err error) bool {
	return strings.Contains(err.Error(), "unsupported protocol version")
}

// deathError classifies a local server that went away after the handshake.
func deathError(ctx context.Context, srv Process, f *stdoutFilter, maxMessage int) *Error {
	if f.tooLarge.Load() {
		e := tooLarge("the server wrote a message larger than %d bytes", maxMessage)
		e.Limit = int64(maxMessage)
		return e
	}
	if !srv.WaitExited(ctx, deathGrace) {
		return newError(ClassCrashed, "the server's output stream ended")
	}
	return newError(ClassCrashed, "%s", srv.DescribeExit(ctx))
}
