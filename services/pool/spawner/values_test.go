package spawner

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
)

func TestJSONValues(t *testing.T) {
	for _, tt := range []struct {
		json string
		want int
	}{
		{``, 0},
		{`1`, 1},
		{`-1.5e+10`, 1},
		{`"a"`, 1},
		{`{}`, 1},
		{`[]`, 1},
		{`[true,false,null]`, 4},
		{`{"a":1}`, 3},
		{` { "a" : [ 1 , 2 ] , "b" : { } } `, 7},
		{`{"content":[{"type":"text","text":"ping"}]}`, 8},
		{`["a,b:c]}{[","\"","\\","\\\"{[1,2]}"]`, 5},
		{`["tru\u0065 1 2 3", 12345678901234567890]`, 3},
		{`[[[[]]]]`, 4},
	} {
		t.Run(tt.json, func(t *testing.T) {
			require.Equal(t, tt.want, jsonValues([]byte(tt.json), 1000))
			var v any
			if tt.json != "" {
				require.NoError(t, json.Unmarshal([]byte(tt.json), &v), "the cases are valid JSON")
			}
		})
	}
	t.Run("it stops past the limit", func(t *testing.T) {
		wide := []byte("[" + strings.Repeat("1,", 999) + "1]")
		require.Equal(t, 1001, jsonValues(wide, 10_000))
		require.Equal(t, 11, jsonValues(wide, 10))
	})
	t.Run("it allocates nothing", func(t *testing.T) {
		msg := []byte(`{"content":[{"type":"text","text":"a \"quoted\" \\ text"}],"structuredContent":{"n":[1,2.5,-3e4,true,null]}}`)
		require.Zero(t, testing.AllocsPerRun(100, func() { jsonValues(msg, maxMessageValues) }))
	})
}

// TestAWideAnswerFailsItsCallAlone: an answer within the byte bound but with more JSON values
// than maxMessageValues fails its call as too large, naming the bound, before the SDK decodes
// it; the server did nothing else amiss, so its session stays.
func TestAWideAnswerFailsItsCallAlone(t *testing.T) {
	fixture := fixtures.Binaries(t).Path(t, fixtures.MCPFixture)
	var logs testutil.SyncBuffer
	r := hostRouter(t, &logs)
	s := spawn(t, r, hostSpec(fixture, "--runtime-tools"))

	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "wide", Arguments: map[string]any{"n": 1000}})
	require.NoError(t, err)
	require.Len(t, res.StructuredContent.(map[string]any)["a"], 1000)

	// {"a":[…]} is n+3 values, and the result around it a few more.
	_, err = s.CallTool(t.Context(), &mcp.CallToolParams{Name: "wide", Arguments: map[string]any{"n": maxMessageValues}})
	require.True(t, IsTooLarge(err), "%v", err)
	require.Equal(t, ClassProtocolViolation, ClassOf(err))
	require.ErrorContains(t, err, fmt.Sprintf("more than %d JSON values", maxMessageValues))

	select {
	case <-s.Done():
		t.Fatalf("the session ended: %v", s.Err())
	default:
	}
	require.NoError(t, s.Err())
	res, err = s.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "still here"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
}

// TestAWideRequestIsABreach: a request or notification the server sends unasked with more
// values than the bound stops the server, as too large.
func TestAWideRequestIsABreach(t *testing.T) {
	params := json.RawMessage(`{"data":[` + strings.Repeat("1,", maxMessageValues) + `1]}`)
	g := newTrafficGuard()
	c, push := scriptedConn(t, g)
	push(&jsonrpc.Request{Method: "notifications/message", Params: json.RawMessage(`{"data":[1,2,3]}`)},
		&jsonrpc.Request{Method: "notifications/message", Params: params})
	_, err := c.Read(context.Background())
	require.NoError(t, err)
	_, err = c.Read(context.Background())
	require.True(t, IsTooLarge(err), "%v", err)
	require.ErrorContains(t, err, fmt.Sprintf("more than %d JSON values", maxMessageValues))
	require.Same(t, g.violation(), err)
}
