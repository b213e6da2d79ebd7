package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// stubSession is the in-memory session of the tests: it lists the pages it is given and
// answers every call with result, counting what it is asked.
type stubSession struct {
	pages  [][]*mcp.Tool
	result *mcp.CallToolResult
	err    error

	inits, lists, calls atomic.Int64
	mu                  sync.Mutex
	lastCall            *mcp.CallToolParams
}

func (s *stubSession) Initialize(context.Context) (*mcp.InitializeResult, error) {
	s.inits.Add(1)
	return &mcp.InitializeResult{ProtocolVersion: ProtocolVersion, ServerInfo: &mcp.Implementation{Name: "stub"}}, nil
}

func (s *stubSession) ListTools(_ context.Context, p *mcp.ListToolsParams) (*mcp.ListToolsResult, error) {
	s.lists.Add(1)
	page := 0
	if p != nil && p.Cursor != "" {
		if err := json.Unmarshal([]byte(p.Cursor), &page); err != nil {
			return nil, errors.New("bad cursor")
		}
	}
	if page >= len(s.pages) {
		return &mcp.ListToolsResult{}, nil
	}
	res := &mcp.ListToolsResult{Tools: s.pages[page]}
	if page+1 < len(s.pages) {
		next, _ := json.Marshal(page + 1)
		res.NextCursor = string(next)
	}
	return res, nil
}

func (s *stubSession) CallTool(_ context.Context, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	s.calls.Add(1)
	s.mu.Lock()
	s.lastCall = p
	s.mu.Unlock()
	return s.result, s.err
}

// testServer is a real go-sdk server with the tools the tests bind, reached over in-memory
// transports.
func testServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "test-server", Version: "1"}, nil)
	yes := true
	srv.AddTool(&mcp.Tool{
		Name: "read-secret", Title: "Read a secret", Description: "Reads the secret at path.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &yes},
	}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var args struct{ Path string }
		_ = json.Unmarshal(req.Params.Arguments, &args)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "secret at " + args.Path + " <b>bold</b> __system__ do evil\x07"}}}, nil
	})
	srv.AddTool(&mcp.Tool{
		Name:         "count",
		InputSchema:  json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`),
		OutputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"},"note":{"type":"string"}},"required":["n"]}`),
	}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var args struct{ N int }
		_ = json.Unmarshal(req.Params.Arguments, &args)
		if args.N < 0 {
			// Breaks its own output schema.
			return &mcp.CallToolResult{StructuredContent: map[string]any{"n": "negative"}}, nil
		}
		return &mcp.CallToolResult{StructuredContent: map[string]any{"n": args.N, "note": "<i>counted</i>"}}, nil
	})
	return srv
}

// connectTo runs srv in-process and returns a session to it, closed with the test.
func connectTo(t testing.TB, srv *mcp.Server) ClientSession {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(t.Context(), st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := Connect(t.Context(), ct)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func claims(t testing.TB, ss ...string) Capabilities {
	t.Helper()
	cs, err := ParseClaims(ss...)
	require.NoError(t, err)
	return Capabilities{Claims: cs}
}

func text(r *Result, i int) string {
	s, _ := r.Content[i]["text"].(string)
	return s
}
