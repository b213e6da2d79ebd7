package spawner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/ringfence/ringfence/internal/humanize"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate/sanitize"
)

// Mask replaces every secret value (environment values, header values) in diagnostics.
const Mask = mcpserver.SecretMask

// errMessageTooLarge ends a session whose server wrote a JSON-RPC message larger than the
// bound that the pool cannot answer for: a request or notification it sent unasked, or a
// message that names no request (the stream can no longer be trusted to say which request
// what it writes answers).
var errMessageTooLarge = errors.New("spawner: the server wrote a message larger than the limit")

// errClientClosed is a write after the client's side of the stream closed.
var errClientClosed = errors.New("spawner: the MCP client closed its side of the server's output")

// maxDivertedLine bounds how much of one non-JSON-RPC stdout line is kept in
// the tail.
const maxDivertedLine = 1 << 10

// Sizes of the line buffer. A line is gathered in a small buffer, kept between lines only
// while it stays small (an idle session keeps no more), and beyond it in blocks shared by
// every session, so that a large line is copied once, into a buffer of its exact size, and
// no buffer grown for it outlives it.
const (
	keptLineBuffer = 4 << 10
	lineBlockSize  = 1 << 20
)

var lineBlocks = sync.Pool{New: func() any { return new([lineBlockSize]byte) }}

// inMessage is what the filter hands the MCP client: a JSON-RPC message read whole (its line,
// the envelope of a large one, and the budget it holds), or an answer that was skipped
// unread because it was past its bound.
type inMessage struct {
	line    []byte
	env     *envelope
	hold    hold
	skipped *skippedAnswer
}

// skippedAnswer is an answer the filter discarded as it read it: the request it answers
// fails with err.
type skippedAnswer struct {
	id  []byte
	err *Error
}

// stdoutFilter sits between a server's stdout and the MCP client. MCP over stdio is
// newline-delimited JSON-RPC, and the client ends the session on the first byte that is not;
// real servers print banners and log lines there. The filter forwards only lines that are
// JSON-RPC messages (an object with "jsonrpc":"2.0") and diverts every other line to the
// stderr tail, so a chatty server stays usable and what it printed is still visible.
//
// It also bounds what it holds. A line past budgetThreshold is followed as it arrives (its
// envelope) and counted in the pool's result budget; a line past its bound (the
// registration's result cap for an answer to tools/call, the message bound for anything else)
// is no longer kept: the rest of it is read and discarded, and if it is an answer, the request
// it answers fails as too large while the session goes on. Newlines cannot occur inside a
// JSON text, so the next line is the next message. Only a message past its bound that names
// no request ends the session.
type stdoutFilter struct {
	out chan<- inMessage
	// life ends when the client closes its side: a delivery or a wait for budget gives up.
	life     context.Context
	tail     *tail
	requests *openRequests
	budget   *Budget
	// general bounds every message; callCap an answer to tools/call.
	general int
	callCap int

	mu  sync.Mutex // Write and finish may come from different goroutines
	cur lineState
	end error // why the stream ended, once finish ran

	rpcLines   atomic.Int64
	otherLines atomic.Int64
	tooLarge   atomic.Bool
}

// lineState is the line being read.
type lineState struct {
	small  []byte
	blocks []*[lineBlockSize]byte
	n      int // bytes of the line so far
	// env is fed once the line passes budgetThreshold; hold is the budget it reserved then.
	env  *envelope
	hold hold
	// skip is set once the line is past its bound: the rest is read and discarded (env still
	// fed, for an answer's id). discard drops a line that is not JSON.
	skip    *Error
	discard bool
}

func newStdoutFilter(out chan<- inMessage, life context.Context, tail *tail, requests *openRequests, budget *Budget, general, callCap int) *stdoutFilter {
	return &stdoutFilter{out: out, life: life, tail: tail, requests: requests, budget: budget, general: general, callCap: callCap}
}

// Write is called with arbitrary chunks of the stream.
func (f *stdoutFilter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if err := f.add(p); err != nil {
				return 0, err
			}
			break
		}
		if err := f.add(p[:i]); err != nil {
			return 0, err
		}
		if err := f.endLine(); err != nil {
			return 0, err
		}
		p = p[i+1:]
	}
	return n, nil
}

// add takes the next bytes of the current line.
func (f *stdoutFilter) add(b []byte) error {
	c := &f.cur
	switch {
	case len(b) == 0 || c.discard:
		return nil
	case c.skip != nil:
		c.n += len(b)
		c.env.feed(b)
		return nil
	case c.n+len(b) <= budgetThreshold:
		c.small = append(c.small, b...)
		c.n += len(b)
		return nil
	}
	if c.env == nil {
		// The line outgrows what is read without counting: only a JSON object may go on.
		head := c.small
		if len(head) < maxDivertedLine {
			head = append(head[:len(head):len(head)], b[:min(len(b), maxDivertedLine-len(head))]...)
		}
		if first, ok := firstNonSpace(head); !ok || first != '{' {
			f.divert(head, " … (a line that is not JSON-RPC, longer than 64 KiB, dropped)")
			c.discard = true
			return nil
		}
		c.env = &envelope{}
		c.env.feed(c.small)
		if err := f.reserve(); err != nil {
			return err
		}
	}
	c.n += len(b)
	c.env.feed(b)
	if c.skip != nil {
		return nil
	}
	bound := f.bound(c.env)
	if c.n > bound {
		c.skip = tooLarge("the server's answer is more than %d bytes", bound)
		c.skip.Limit = int64(bound)
		f.dropBuffer()
		return nil
	}
	c.hold.shrink(int64(bound))
	f.store(b)
	return nil
}

// reserve takes the current line's bound from the budget, waiting for room. A line that finds
// none is skipped: as an answer, its request fails as too large for the budget.
func (f *stdoutFilter) reserve() error {
	c := &f.cur
	if f.budget == nil {
		return nil
	}
	n, err := f.budget.acquire(f.life, int64(f.bound(c.env)))
	switch {
	case err == nil:
		c.hold = hold{b: f.budget, n: n}
		return nil
	case errors.Is(err, errNoRoom):
		c.skip = tooLarge("the pool's budget for results in flight (%d bytes) had no room for the server's answer within %s", f.budget.limit, f.budget.wait)
		c.skip.Limit, c.skip.OverBudget = f.budget.limit, true
		f.dropBuffer()
		return nil
	}
	return errClientClosed
}

// bound is the most the current line may hold, as far as its envelope says what it is: an
// answer to tools/call the registration's cap, any other message the general bound.
func (f *stdoutFilter) bound(e *envelope) int {
	switch {
	case e.hasMethod:
		return f.general
	case e.idDone:
		if id, err := idFromRaw(e.id); err == nil && f.requests.method(id) == methodCallTool {
			return f.callCap
		}
		return f.general
	case (e.hasResult || e.hasError) && f.requests.onlyCalls():
		return f.callCap
	}
	return max(f.general, f.callCap)
}

// store appends b, past the small buffer, to the line's blocks.
func (f *stdoutFilter) store(b []byte) {
	c := &f.cur
	for len(b) > 0 {
		used := (c.n - len(b) - len(c.small)) % lineBlockSize
		if used == 0 {
			c.blocks = append(c.blocks, lineBlocks.Get().(*[lineBlockSize]byte))
		}
		k := copy(c.blocks[len(c.blocks)-1][used:], b)
		b = b[k:]
	}
}

// dropBuffer frees what the line holds: it is past its bound.
func (f *stdoutFilter) dropBuffer() {
	c := &f.cur
	for _, b := range c.blocks {
		lineBlocks.Put(b)
	}
	c.blocks, c.small = nil, nil
	c.hold.free()
}

// line assembles the current line in a buffer of its own, of its exact size.
func (f *stdoutFilter) line() []byte {
	c := &f.cur
	out := make([]byte, c.n)
	k := copy(out, c.small)
	for _, b := range c.blocks {
		k += copy(out[k:], b[:])
		lineBlocks.Put(b)
	}
	c.blocks = nil
	return out
}

// endLine passes on the line just ended, or diverts it, and starts the next.
func (f *stdoutFilter) endLine() error {
	c := &f.cur
	defer f.reset()
	switch {
	case c.discard:
		return nil
	case c.skip != nil:
		if !c.env.answer() {
			// A request, a notification or something that names no request: nothing can be
			// answered for it, and the stream is not to be trusted.
			f.tooLarge.Store(true)
			return errMessageTooLarge
		}
		c.skip.Size = int64(c.n)
		return f.deliver(inMessage{skipped: &skippedAnswer{id: c.env.id, err: c.skip}})
	case c.n == 0:
		return nil
	}
	line := bytes.TrimSuffix(f.line(), []byte("\r"))
	switch {
	case isJSONRPC(line):
		f.rpcLines.Add(1)
		c.hold.shrink(int64(len(line)))
		msg := inMessage{line: line, env: c.env, hold: c.hold}
		c.hold = hold{}
		return f.deliver(msg)
	case len(bytes.TrimSpace(line)) > 0:
		f.divert(line, "")
	}
	return nil
}

// deliver hands a message to the client, or gives it up once the client closed.
func (f *stdoutFilter) deliver(m inMessage) error {
	if f.out == nil {
		m.hold.free()
		return errClientClosed
	}
	select {
	case f.out <- m:
		return nil
	case <-f.life.Done():
		m.hold.free()
		return errClientClosed
	}
}

// reset starts the next line, keeping only a small buffer.
func (f *stdoutFilter) reset() {
	c := &f.cur
	c.hold.free()
	for _, b := range c.blocks {
		lineBlocks.Put(b)
	}
	small := c.small[:0]
	if cap(small) > keptLineBuffer {
		small = nil
	}
	*c = lineState{small: small}
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

// finish flushes a last line without a newline and ends the client's side of the stream with
// err (nil: end of stream).
func (f *stdoutFilter) finish(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.end != nil || f.out == nil {
		return
	}
	if err == nil && f.cur.n > 0 {
		err = f.endLine()
	}
	f.reset()
	if f.tooLarge.Load() {
		err = errMessageTooLarge
	}
	if err == nil {
		err = io.EOF
	}
	f.end = err
	close(f.out)
	f.out = nil
}

// ended is why the stream ended (io.EOF at its end), once the client has seen it end.
func (f *stdoutFilter) ended() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.end
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
	return humanize.Cut(s, n, "") + "…"
}
