package spawner

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"
)

// TestEnvelope: whatever the order of the members, the spacing, or how the bytes arrive, the
// envelope names the request an answer answers and locates its result exactly; strings are
// opaque (braces, quotes and member names inside them change nothing); a message that is not
// one object is not an answer.
func TestEnvelope(t *testing.T) {
	for _, tt := range []struct {
		name, msg, id, result string
		answer, method        bool
	}{
		{name: "go-sdk order", msg: `{"jsonrpc":"2.0","id":12,"result":{"content":[]}}`, id: `12`, result: `{"content":[]}`, answer: true},
		{name: "result first", msg: `{"result":{"a":[1,{"b":"}"}]},"jsonrpc":"2.0","id":"x-1"}`, id: `"x-1"`, result: `{"a":[1,{"b":"}"}]}`, answer: true},
		{name: "spaced", msg: " { \"id\" : 7 ,\n\"result\" : [ ] , \"jsonrpc\" : \"2.0\" } ", id: `7`, result: `[ ]`, answer: true},
		{name: "scalar result", msg: `{"jsonrpc":"2.0","result":true,"id":3}`, id: `3`, result: `true`, answer: true},
		{name: "error", msg: `{"jsonrpc":"2.0","id":4,"error":{"code":-1,"message":"\"id\":9}"}}`, id: `4`, answer: true},
		{name: "escapes in strings", msg: `{"jsonrpc":"2.0","result":{"t":"a\"b\\","id":"no"},"id":"q\"1"}`, id: `"q\"1"`, result: `{"t":"a\"b\\","id":"no"}`, answer: true},
		{name: "an id inside the result is not the id", msg: `{"jsonrpc":"2.0","result":{"id":5}}`, result: `{"id":5}`},
		{name: "request", msg: `{"jsonrpc":"2.0","id":1,"method":"ping"}`, id: `1`, method: true},
		{name: "not closed", msg: `{"jsonrpc":"2.0","id":1,"result":{"a":`, id: `1`},
		{name: "two objects", msg: `{"jsonrpc":"2.0","id":1,"result":{}}{}`, id: `1`, result: `{}`},
		{name: "an array", msg: `[{"jsonrpc":"2.0","id":1,"result":{}}]`},
	} {
		for _, chunk := range []int{1, 3, 1 << 10} {
			t.Run(tt.name, func(t *testing.T) {
				var e envelope
				for p := []byte(tt.msg); len(p) > 0; {
					n := min(chunk, len(p))
					e.feed(p[:n])
					p = p[n:]
				}
				require.Equal(t, tt.answer, e.answer())
				require.Equal(t, tt.method, e.hasMethod)
				if tt.id != "" {
					require.True(t, e.idDone)
					require.Equal(t, tt.id, string(e.id))
				}
				if tt.result != "" {
					require.True(t, e.hasResult)
					require.Equal(t, tt.result, tt.msg[e.resultStart:e.resultEnd])
				}
			})
		}
	}
	t.Run("a long id is not kept", func(t *testing.T) {
		var e envelope
		e.feed([]byte(`{"jsonrpc":"2.0","id":"` + string(make([]byte, 300)) + `","result":{}}`))
		require.True(t, e.idTooLong)
		require.False(t, e.answer())
	})
}

// TestDecodeLineAnswer: an answer with a result, small or large, reaches the client as the
// bytes of its line (located by its envelope, neither decoded nor copied); an error answer, a
// request and a notification are decoded whole.
func TestDecodeLineAnswer(t *testing.T) {
	for _, tt := range []struct{ name, msg, result string }{
		{name: "number id", msg: `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"ping"}]}}`, result: `{"content":[{"type":"text","text":"ping"}]}`},
		{name: "string id, result first", msg: `{"result":{"a":"}"}, "jsonrpc":"2.0", "id":"x-1"}`, result: `{"a":"}"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			line := []byte(tt.msg)
			msg, err := decodeLine(inMessage{line: line})
			require.NoError(t, err)
			resp, ok := msg.(*jsonrpc.Response)
			require.True(t, ok)
			require.Equal(t, tt.result, string(resp.Result))
			start := strings.Index(tt.msg, tt.result)
			require.Same(t, &line[start], &resp.Result[0], "the result is the line's own bytes")
		})
	}
	for _, tt := range []struct{ name, msg string }{
		{name: "error", msg: `{"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"no"}}`},
		{name: "request", msg: `{"jsonrpc":"2.0","id":1,"method":"ping"}`},
		{name: "notification", msg: `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := decodeLine(inMessage{line: []byte(tt.msg)})
			require.NoError(t, err)
			want, err := jsonrpc.DecodeMessage([]byte(tt.msg))
			require.NoError(t, err)
			require.Equal(t, want, msg)
		})
	}
}
