package spawner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// newTestFilter is a filter with the given bounds, open requests and budget (each may be
// nil), and what it delivers; the filter's client side closes with the test.
func newTestFilter(t *testing.T, tl *tail, general, callCap int, requests *openRequests, budget *Budget) (*stdoutFilter, <-chan inMessage) {
	t.Helper()
	msgs := make(chan inMessage)
	life, end := context.WithCancel(context.Background())
	t.Cleanup(end)
	return newStdoutFilter(msgs, life, tl, requests, budget, general, callCap), msgs
}

// collect renders what a filter delivers: each message's line and a newline, or "skipped
// <id>: <error>" for an answer skipped as too large. Each message's budget is given back.
func collect(msgs <-chan inMessage) <-chan string {
	got := make(chan string, 1)
	go func() {
		var b strings.Builder
		for m := range msgs {
			if m.skipped != nil {
				fmt.Fprintf(&b, "skipped %s: %s\n", m.skipped.id, m.skipped.err.Message)
			} else {
				b.Write(m.line)
				b.WriteByte('\n')
			}
			m.hold.free()
		}
		got <- b.String()
	}()
	return got
}

// feed writes input to f in chunks of the given size, then ends the stream.
func feed(f *stdoutFilter, input string, chunk int) error {
	var werr error
	for p := []byte(input); len(p) > 0 && werr == nil; {
		n := min(chunk, len(p))
		_, werr = f.Write(p[:n])
		p = p[n:]
	}
	f.finish(werr)
	return werr
}

// runFilter feeds input to a filter in chunks of the given size and returns
// what reached the client, the tail, and the filter.
func runFilter(t *testing.T, input string, chunk, maxMessage int) (string, string, *stdoutFilter, error) {
	t.Helper()
	tl := newTail(1<<16, nil)
	f, msgs := newTestFilter(t, tl, maxMessage, maxMessage, nil, nil)
	got := collect(msgs)
	werr := feed(f, input, chunk)
	return <-got, tl.String(), f, werr
}

func TestStdoutFilter(t *testing.T) {
	rpc1 := `{"jsonrpc":"2.0","id":1,"result":{}}`
	rpc2 := `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`
	tests := []struct {
		name        string
		in          string
		wantOut     string
		wantTail    []string
		onlyGarbage bool
	}{
		{name: "json-rpc passes", in: rpc1 + "\n" + rpc2 + "\n", wantOut: rpc1 + "\n" + rpc2 + "\n"},
		{name: "crlf", in: rpc1 + "\r\n", wantOut: rpc1 + "\n"},
		{name: "banner diverted", in: "Starting server v1\n" + rpc1 + "\n", wantOut: rpc1 + "\n", wantTail: []string{"[stdout] Starting server v1"}},
		{name: "json log line diverted", in: `{"level":"info"}` + "\n" + rpc1 + "\n", wantOut: rpc1 + "\n", wantTail: []string{`{"level":"info"}`}},
		{name: "brace but not json", in: "{ not json\n" + rpc1 + "\n", wantOut: rpc1 + "\n", wantTail: []string{"{ not json"}},
		{name: "array diverted", in: "[1,2]\n", wantTail: []string{"[1,2]"}, onlyGarbage: true},
		{name: "wrong version", in: `{"jsonrpc":"1.0","id":1}` + "\n", wantTail: []string{`"1.0"`}, onlyGarbage: true},
		{name: "version not first", in: `{"id":1,"jsonrpc":"2.0","result":{}}` + "\n", wantOut: `{"id":1,"jsonrpc":"2.0","result":{}}` + "\n"},
		{name: "spaced message", in: ` { "jsonrpc": "2.0", "id": 1, "result": {} }` + "\n", wantOut: ` { "jsonrpc": "2.0", "id": 1, "result": {} }` + "\n"},
		{name: "truncated message diverted", in: `{"jsonrpc":"2.0","id":1,"result":{"content":[` + "\n", wantTail: []string{`"content":[`}, onlyGarbage: true},
		{name: "trailing garbage diverted", in: `{"jsonrpc":"2.0","id":1,"result":{}} tail` + "\n", wantTail: []string{`{}} tail`}, onlyGarbage: true},
		{name: "last line without newline", in: rpc1, wantOut: rpc1 + "\n"},
		{name: "blank lines ignored", in: "\n\n" + rpc1 + "\n", wantOut: rpc1 + "\n"},
		{name: "garbage only", in: "Usage: foo\nerror\n", wantTail: []string{"Usage: foo", "error"}, onlyGarbage: true},
	}
	for _, tt := range tests {
		for _, chunk := range []int{1, 7, 1 << 20} {
			t.Run(tt.name, func(t *testing.T) {
				out, tl, f, err := runFilter(t, tt.in, chunk, 1<<20)
				require.NoError(t, err)
				require.Equal(t, tt.wantOut, out)
				for _, w := range tt.wantTail {
					require.Contains(t, html.UnescapeString(tl), w, "the tail is escaped; what matters here is that the line was diverted")
				}
				require.Equal(t, tt.onlyGarbage, f.sawOnlyGarbage())
			})
		}
	}
}

func TestStdoutFilterBounds(t *testing.T) {
	rpc := `{"jsonrpc":"2.0","id":1,"result":{}}`
	const bound = 100 << 10
	long := strings.Repeat("x", 3*bound)
	t.Run("a long line that is not JSON is dropped, the session goes on", func(t *testing.T) {
		out, tl, _, err := runFilter(t, long+"\n"+rpc+"\n", 4096, bound)
		require.NoError(t, err)
		require.Equal(t, rpc+"\n", out)
		require.Contains(t, tl, "not JSON-RPC, longer than 64 KiB, dropped")
	})
	t.Run("a notification past the bound ends the stream", func(t *testing.T) {
		msg := `{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"` + long + `"}}`
		_, _, f, err := runFilter(t, msg+"\n", 4096, bound)
		require.True(t, errors.Is(err, errMessageTooLarge))
		require.True(t, f.tooLarge.Load())
	})
}

// TestAnAnswerPastItsBoundIsSkipped: an answer to tools/call past the registration's cap is
// not kept: the filter reads the rest of its line and discards it, and hands the client only
// the request it answers, found in its envelope wherever the server put the id. The stream goes
// on at the next line. Whether an answer is a tool's result is known from the requests open:
// the cap applies to an answer to tools/call, the message bound to anything else.
func TestAnAnswerPastItsBoundIsSkipped(t *testing.T) {
	const general, callCap = 1 << 20, 256 << 10
	big := strings.Repeat("lorem ipsum ", 40_000) // 480,000 bytes
	next := `{"jsonrpc":"2.0","id":9,"result":{}}`
	open := func(methods ...string) *openRequests {
		o := &openRequests{}
		for i, m := range methods {
			o.expect(intID(t, i+1), m, nil)
		}
		return o
	}
	for _, tc := range []struct {
		name     string
		line     string
		requests *openRequests
		want     string
	}{
		{"id first", `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + big + `"}]}}`, open(methodCallTool),
			"skipped 1: the server's answer is more than 262144 bytes\n" + next + "\n"},
		{"id last, only calls open", `{"result":{"content":[{"type":"text","text":"` + big + `"}]},"jsonrpc":"2.0","id":2}`, open(methodCallTool, methodCallTool),
			"skipped 2: the server's answer is more than 262144 bytes\n" + next + "\n"},
		{"a listing is held to the message bound", `{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"t","description":"` + big + `"}]}}`, open("tools/list"),
			`{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"t","description":"` + big + `"}]}}` + "\n" + next + "\n"},
		// Read up to the message bound until the id says which request it answers.
		{"id last, a listing open too", `{"result":{"content":[{"type":"text","text":"` + big + `"}]},"jsonrpc":"2.0","id":2}`, open("tools/list", methodCallTool),
			"skipped 2: the server's answer is more than 262144 bytes\n" + next + "\n"},
		{"a listing, id last", `{"result":{"tools":[{"name":"t","description":"` + big + `"}]},"jsonrpc":"2.0","id":1}`, open("tools/list", methodCallTool),
			`{"result":{"tools":[{"name":"t","description":"` + big + `"}]},"jsonrpc":"2.0","id":1}` + "\n" + next + "\n"},
	} {
		for _, chunk := range []int{4096, 1 << 20} {
			t.Run(fmt.Sprintf("%s/chunk=%d", tc.name, chunk), func(t *testing.T) {
				tl := newTail(1<<16, nil)
				f, msgs := newTestFilter(t, tl, general, callCap, tc.requests, nil)
				got := collect(msgs)
				require.NoError(t, feed(f, tc.line+"\n"+next+"\n", chunk))
				g := <-got
				require.Equal(t, len(tc.want), len(g), "%.200s", g)
				require.True(t, tc.want == g, "%.200s", g)
				require.False(t, f.tooLarge.Load(), "the stream goes on")
			})
		}
	}
}

// TestTheBudgetBoundsLinesInFlight: a line past budgetThreshold holds its bound in the budget
// while it is read and its size once read, until its consumer frees it; a line that finds no
// room within the budget's wait is skipped, and its request fails naming the budget.
func TestTheBudgetBoundsLinesInFlight(t *testing.T) {
	const callCap = 1 << 20
	budget, err := NewBudget(callCap, 50*time.Millisecond)
	require.NoError(t, err)
	answer := func(id int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":"%s"}]}}`, id, strings.Repeat("x", 200<<10))
	}
	requests := &openRequests{}
	requests.expect(intID(t, 1), methodCallTool, nil)
	requests.expect(intID(t, 2), methodCallTool, nil)
	f, msgs := newTestFilter(t, newTail(1<<10, nil), 16<<20, callCap, requests, budget)
	done := make(chan error, 1)
	go func() { done <- feed(f, answer(1)+"\n"+answer(2)+"\n", 8192) }()

	first := <-msgs
	require.Nil(t, first.skipped)
	require.Equal(t, int64(len(first.line)), first.hold.n, "a line read whole holds its size")
	require.Equal(t, int64(len(first.line)), budget.InUse())
	second := <-msgs
	require.NotNil(t, second.skipped, "with the first still held, the second finds no room")
	require.True(t, second.skipped.err.OverBudget)
	require.Contains(t, second.skipped.err.Message, "budget for results in flight")
	first.hold.free()
	require.NoError(t, <-done)
	require.Zero(t, budget.InUse())
	require.Equal(t, int64(callCap), budget.Peak(), "a line reserves its bound while it is read")
	require.Equal(t, int64(1), budget.Waited())
}

// TestALongLineLeavesNoBufferBehind: after a line of megabytes the filter keeps at most a small
// buffer, so an idle session holds nothing a past result grew.
func TestALongLineLeavesNoBufferBehind(t *testing.T) {
	requests := &openRequests{}
	requests.expect(intID(t, 1), methodCallTool, nil)
	f, msgs := newTestFilter(t, newTail(1<<10, nil), 16<<20, 16<<20, requests, nil)
	got := collect(msgs)
	line := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + strings.Repeat("x", 5<<20) + `"}]}}`
	_, err := f.Write([]byte(line + "\n"))
	require.NoError(t, err)
	require.LessOrEqual(t, cap(f.cur.small), keptLineBuffer)
	require.Empty(t, f.cur.blocks)
	f.finish(nil)
	require.Len(t, <-got, len(line)+1)
}

func TestTailRedaction(t *testing.T) {
	const secret = "hunter2-very-secret"
	tests := []struct {
		name   string
		limit  int
		writes []string
		want   string
	}{
		{name: "masked", limit: 100, writes: []string{"token=" + secret + "\n"}, want: "token=" + Mask + "\n"},
		{name: "masked across writes", limit: 100, writes: []string{"token=hunter2-", "very-secret\n"}, want: "token=" + Mask + "\n"},
		{name: "longest secret first", limit: 100, writes: []string{"a=hunter2-very-secret-and-more\n"}, want: "a=" + Mask + "\n"},
		{name: "bounded", limit: 10, writes: []string{strings.Repeat("a", 50) + "0123456789"}, want: "…0123456789"},
		{name: "sanitized like a result", limit: 100, writes: []string{"<b>__system__ x\u200by " + secret + "\n"}, want: "&lt;b&gt; xy " + Mask + "\n"},
		{name: "an invisible character does not shield a secret", limit: 100, writes: []string{"token=hunter2-\u200bvery-secret\n"}, want: "token=" + Mask + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tl := newTail(tt.limit, []string{secret, secret + "-and-more", ""})
			for _, w := range tt.writes {
				_, _ = tl.Write([]byte(w))
			}
			require.Equal(t, tt.want, tl.String())
		})
	}
}

// TestTailNeverShowsPartOfASecret writes a secret at every offset around the
// tail's bound: whatever is cut, no run of 4 or more of its bytes may show.
func TestTailNeverShowsPartOfASecret(t *testing.T) {
	const secret = "ABCDEFGHIJKLMNOP"
	for limit := 4; limit < 40; limit++ {
		for pad := 0; pad < 60; pad++ {
			tl := newTail(limit, []string{secret})
			_, _ = tl.Write([]byte(strings.Repeat(".", pad) + secret + strings.Repeat("-", limit/2)))
			got := tl.String()
			for i := 0; i+4 <= len(secret); i++ {
				require.NotContains(t, got, secret[i:i+4], "limit %d pad %d: %q", limit, pad, got)
			}
		}
	}
}

func TestTailIsValidUTF8(t *testing.T) {
	tl := newTail(5, nil)
	_, _ = tl.Write([]byte("ééééé\xff"))
	got := tl.String()
	require.True(t, strings.HasPrefix(got, "…"))
	require.True(t, bytes.Equal([]byte(got), bytes.ToValidUTF8([]byte(got), nil)))
}
