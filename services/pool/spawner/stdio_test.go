package spawner

import (
	"bytes"
	"errors"
	"html"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// runFilter feeds input to a filter in chunks of the given size and returns
// what reached the client, the tail, and the filter.
func runFilter(t *testing.T, input string, chunk, maxMessage int) (string, string, *stdoutFilter, error) {
	t.Helper()
	pr, pw := io.Pipe()
	tl := newTail(1<<16, nil)
	f := newStdoutFilter(pw, tl, maxMessage)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(pr)
		got <- b
	}()
	var werr error
	for p := []byte(input); len(p) > 0 && werr == nil; {
		n := min(chunk, len(p))
		_, werr = f.Write(p[:n])
		p = p[n:]
	}
	f.finish(werr)
	return string(<-got), tl.String(), f, werr
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
	t.Run("oversized non-json line is dropped, session continues", func(t *testing.T) {
		long := strings.Repeat("x", 300)
		out, tl, _, err := runFilter(t, long+"\n"+rpc+"\n", 16, 100)
		require.NoError(t, err)
		require.Equal(t, rpc+"\n", out)
		require.Contains(t, tl, "longer than the message limit, dropped")
	})
	t.Run("oversized message ends the stream", func(t *testing.T) {
		long := `{"jsonrpc":"2.0","id":1,"result":{"x":"` + strings.Repeat("x", 300) + `"}}`
		_, _, f, err := runFilter(t, long+"\n", 16, 100)
		require.True(t, errors.Is(err, errMessageTooLarge))
		require.True(t, f.tooLarge.Load())
	})
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
