package spawner

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate/sanitize"
)

// Mask replaces every secret value (environment values, header values) in diagnostics.
const Mask = mcpserver.SecretMask

// errMessageTooLarge ends a session whose server wrote a JSON-RPC message
// larger than the bound: the client could not read it, and buffering it
// further would let one server take the pool's memory.
var errMessageTooLarge = errors.New("spawner: the server wrote a message larger than the limit")

// maxDivertedLine bounds how much of one non-JSON-RPC stdout line is kept in
// the tail.
const maxDivertedLine = 1 << 10

// stdoutFilter sits between a server's stdout and the MCP client. MCP over
// stdio is newline-delimited JSON-RPC, and the client ends the session on the
// first byte that is not; real servers print banners and log lines there.
// The filter forwards only lines that are JSON-RPC messages (an object with
// "jsonrpc":"2.0") and diverts every other line to the stderr tail, so a
// chatty server stays usable and what it printed is still visible.
type stdoutFilter struct {
	out  *io.PipeWriter
	tail *tail
	max  int

	mu         sync.Mutex // Write and finish may come from different goroutines
	line       []byte
	discarding bool

	rpcLines   atomic.Int64
	otherLines atomic.Int64
	tooLarge   atomic.Bool
}

func newStdoutFilter(out *io.PipeWriter, tail *tail, maxMessage int) *stdoutFilter {
	return &stdoutFilter{out: out, tail: tail, max: maxMessage}
}

// Write is called with arbitrary chunks of the stream.
func (f *stdoutFilter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if err := f.appendPartial(p); err != nil {
				return 0, err
			}
			break
		}
		if err := f.appendPartial(p[:i]); err != nil {
			return 0, err
		}
		if err := f.endLine(); err != nil {
			return 0, err
		}
		p = p[i+1:]
	}
	return n, nil
}

func (f *stdoutFilter) appendPartial(b []byte) error {
	if f.discarding || len(b) == 0 {
		return nil
	}
	if len(f.line)+len(b) <= f.max {
		f.line = append(f.line, b...)
		return nil
	}
	// The line is over the bound. A JSON-RPC message that large cannot be
	// delivered; anything else is dropped with a note.
	head := append(f.line, b[:min(len(b), maxDivertedLine)]...)
	if first, ok := firstNonSpace(head); ok && first == '{' {
		f.tooLarge.Store(true)
		return errMessageTooLarge
	}
	f.divert(head, " … (line longer than the message limit, dropped)")
	f.line = f.line[:0]
	f.discarding = true
	return nil
}

func (f *stdoutFilter) endLine() error {
	if f.discarding {
		f.discarding = false
		return nil
	}
	line := bytes.TrimSuffix(f.line, []byte("\r"))
	var err error
	switch {
	case isJSONRPC(line):
		f.rpcLines.Add(1)
		msg := append(line, '\n')
		_, err = f.out.Write(msg)
	case len(bytes.TrimSpace(line)) > 0:
		f.divert(line, "")
	}
	// Do not keep a huge buffer alive after one huge message.
	if cap(f.line) > 1<<20 {
		f.line = nil
	} else {
		f.line = f.line[:0]
	}
	return err
}

func (f *stdoutFilter) divert(line []byte, note string) {
	f.otherLines.Add(1)
	if len(line) > maxDivertedLine {
		// A secret cut by the bound would no longer be recognised: drop its start too.
		line = f.tail.withoutPartialSecret(line[:maxDivertedLine])
		note = " …" + note
	}
	var b bytes.Buffer
	b.WriteString("[stdout] ")
	b.Write(line)
	b.WriteString(note)
	b.WriteByte('\n')
	_, _ = f.tail.Write(b.Bytes())
}

// finish flushes a last line without a newline and closes the client's side
// with err (nil: end of stream).
func (f *stdoutFilter) finish(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil && len(f.line) > 0 {
		err = f.endLine()
	}
	if f.tooLarge.Load() {
		err = errMessageTooLarge
	}
	_ = f.out.CloseWithError(err)
}

// sawOnlyGarbage reports whether the server wrote lines to stdout and none of
// them was JSON-RPC: the signature of a program that is not an MCP server.
func (f *stdoutFilter) sawOnlyGarbage() bool {
	return f.rpcLines.Load() == 0 && f.otherLines.Load() > 0
}

func firstNonSpace(b []byte) (byte, bool) {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c, true
	}
	return 0, false
}

// isJSONRPC reports whether line is one JSON object with "jsonrpc":"2.0".
// Validating the whole line is what keeps a log line that happens to be JSON
// (or a truncated message) from ending the session. Almost every server writes
// the version member first, compactly; for those one allocation-free scan
// decides, and only other lines pay for a decode.
func isJSONRPC(line []byte) bool {
	trimmed := bytes.TrimLeft(line, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return false
	}
	if bytes.HasPrefix(trimmed, jsonrpcFirst) {
		return json.Valid(trimmed)
	}
	var probe struct {
		JSONRPC string `json:"jsonrpc"`
	}
	return json.Unmarshal(line, &probe) == nil && probe.JSONRPC == "2.0"
}

// jsonrpcFirst is how a compact message that names its version first begins.
var jsonrpcFirst = []byte(`{"jsonrpc":"2.0",`)

// tail keeps the last bytes a server wrote to stderr (plus diverted stdout
// lines) for diagnostics, with every secret value replaced by Mask when it is
// read. It keeps slack bytes beyond its limit, as long as the longest secret,
// so that a secret cut by the bound is still recognised and dropped rather
// than shown in part.
type tail struct {
	mu        sync.Mutex
	buf       []byte
	limit     int
	slack     int
	truncated bool
	secrets   [][]byte
}

func newTail(limit int, secrets []string) *tail {
	t := &tail{limit: limit}
	for _, s := range secrets {
		if s == "" {
			continue
		}
		t.secrets = append(t.secrets, []byte(s))
		t.slack = max(t.slack, len(s))
	}
	// Longest first, so that a secret containing another is masked whole.
	slices.SortFunc(t.secrets, func(a, b []byte) int { return len(b) - len(a) })
	return t
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	keep := t.limit + t.slack
	if len(p) >= keep {
		t.buf = append(t.buf[:0], p[len(p)-keep:]...)
		t.truncated = true
		return len(p), nil
	}
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*keep {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-keep:]...)
		t.truncated = true
	}
	return len(p), nil
}

// String returns the redacted tail, at most limit bytes of valid UTF-8 before it is
// sanitized and HTML-escaped.
func (t *tail) String() string {
	t.mu.Lock()
	raw := t.buf
	truncated := t.truncated
	keep := t.limit + t.slack
	if len(raw) > keep {
		raw = raw[len(raw)-keep:]
		truncated = true
	}
	raw = slices.Clone(raw)
	t.mu.Unlock()

	// When the front was cut, its first slack-1 bytes may be the end of a
	// secret whose start is gone: drop them unless they begin a whole one.
	dropBefore := 0
	if truncated {
		dropBefore = max(t.slack-1, 0)
	}
	out := redact(raw, t.secrets, dropBefore)
	if len(out) > t.limit {
		out = out[len(out)-t.limit:]
		truncated = true
	}
	// Do not start in the middle of a UTF-8 sequence.
	for len(out) > 0 && !utf8.RuneStart(out[0]) {
		out = out[1:]
	}
	s := strings.ToValidUTF8(string(out), "\uFFFD")
	// The tail is the server's own text and reaches callers and logs: stripped and escaped
	// like any server-chosen string (the escaped form may be longer than limit).
	secrets := make([]string, len(t.secrets))
	for i, sec := range t.secrets {
		secrets[i] = string(sec)
	}
	s = sanitize.String(cleanText(s, secrets), sanitize.Options{})
	if truncated {
		s = "…" + s
	}
	return s
}

// withoutPartialSecret cuts b before a trailing start of a secret: b was cut from a longer
// text, and the rest of that secret is gone.
func (t *tail) withoutPartialSecret(b []byte) []byte {
	cut := len(b)
	for _, s := range t.secrets {
		for i := max(len(b)-len(s)+1, 0); i < cut; i++ {
			if bytes.HasPrefix(s, b[i:]) {
				cut = i
				break
			}
		}
	}
	return b[:cut]
}

// redact replaces every occurrence of a secret in raw with Mask and drops the
// bytes before dropBefore that are not part of a whole secret.
func redact(raw []byte, secrets [][]byte, dropBefore int) []byte {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		matched := false
		for _, s := range secrets {
			if bytes.HasPrefix(raw[i:], s) {
				out = append(out, Mask...)
				i += len(s)
				matched = true
				break
			}
		}
		if matched {
			continue
		}
		if i >= dropBefore {
			out = append(out, raw[i])
		}
		i++
	}
	return out
}

// redactString masks secrets in a message built from text the spawner does
// not control (engine errors, server error messages).
func redactString(s string, secrets []string) string {
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, Mask)
		}
	}
	return s
}

// clip bounds text that comes from a server before it goes into a message.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
