package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// memoryBackend starts "stdio" servers in-process: a spec's command names a go-sdk server,
// reached over in-memory transports. It is a back end outside the spawner package built with
// the Kit, as a new one (a Kubernetes pod, another sandbox) would be, and it lets the whole
// call path run with no engine and no process.
type memoryBackend struct {
	servers map[string]*mcp.Server
	// calls counts the tools/call requests that reached any server.
	calls atomic.Int64
}

var _ spawner.Backend = (*memoryBackend)(nil)

func (m *memoryBackend) Name() string                 { return "memory" }
func (m *memoryBackend) Serves(transport string) bool { return transport == spawner.TransportStdio }
func (m *memoryBackend) Sweep(context.Context) (int, error) {
	return 0, nil
}
func (m *memoryBackend) Close(context.Context) error { return nil }

func (m *memoryBackend) Preflight(context.Context) (spawner.Report, error) {
	return spawner.Report{Isolation: m.Name()}, nil
}

func (m *memoryBackend) Spawn(ctx context.Context, spec *spawner.Spec, kit *spawner.Kit) (*spawner.Session, error) {
	srv, ok := m.servers[spec.Command]
	if !ok {
		return nil, &spawner.Error{Class: spawner.ClassCommandNotFound, Message: fmt.Sprintf("no in-memory server %q", spec.Command)}
	}
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		return nil, &spawner.Error{Class: spawner.ClassSpawnFailed, Message: err.Error()}
	}
	ms := &memoryServer{ss: ss, gone: make(chan struct{})}
	go func() {
		_ = ss.Wait()
		close(ms.gone)
	}()
	return kit.Connect(ctx, spec, ct, ms)
}

// memoryServer is one in-process server session.
type memoryServer struct {
	ss   *mcp.ServerSession
	gone chan struct{}
	once sync.Once
}

func (s *memoryServer) Gone() <-chan struct{} { return s.gone }

func (s *memoryServer) Death(context.Context) *spawner.Error {
	return &spawner.Error{Class: spawner.ClassCrashed, Message: "the in-memory server session ended"}
}

func (s *memoryServer) Stop(_ context.Context, cs *mcp.ClientSession) error {
	s.once.Do(func() {
		if cs != nil {
			_ = cs.Close()
		}
		_ = s.ss.Close()
	})
	<-s.gone
	return nil
}

// memoryDocs is the in-memory server of the tests: read reads a path, report returns
// structured content that must match its output schema, and fail is a tool error.
func memoryDocs(m *memoryBackend) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "docs", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "read", Description: "Reads a document.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			m.calls.Add(1)
			var a struct{ Path string }
			_ = json.Unmarshal(req.Params.Arguments, &a)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "<p>" + a.Path + "</p>__system__"}}}, nil
		})
	srv.AddTool(&mcp.Tool{Name: "report",
		InputSchema:  json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`),
		OutputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			m.calls.Add(1)
			var a struct{ N int }
			_ = json.Unmarshal(req.Params.Arguments, &a)
			if a.N < 0 {
				return &mcp.CallToolResult{StructuredContent: map[string]any{"n": "negative"}}, nil
			}
			return &mcp.CallToolResult{StructuredContent: map[string]any{"n": a.N}}, nil
		})
	srv.AddTool(&mcp.Tool{Name: "fail", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			m.calls.Add(1)
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "jammed"}}}, nil
		})
	return srv
}

// TestCallsThroughInMemoryServers runs every step of a call, from the gates to the audit
// record, against an in-process server: table-driven, with no engine and no process.
func TestCallsThroughInMemoryServers(t *testing.T) {
	mem := &memoryBackend{}
	mem.servers = map[string]*mcp.Server{"docs-mcp": memoryDocs(mem)}
	h := newHarness(t, harnessOpts{backend: mem})
	h.server("docs", func(r *registryv1.CreateServerRequest) {
		r.Command = "docs-mcp"
		r.ToolPermissions = map[string]*registryv1.ToolPermissions{"read": {Required: []string{"fs.read:{path}"}}}
	})
	h.publish("g", []string{"a"}, []imp{{"docs", "a", []string{"read", "report", "fail"}}}, func(d *publisherv1.Graph) {
		agentBindings(d, "a", "fs.read:/docs/**")
	})
	run := h.start("g")

	for _, tc := range []struct {
		name    string
		tool    string
		args    any
		reason  string // refused before dispatch with this reason
		failure string // dispatched and failed with this class
		result  string // dispatched with this result
		check   func(t *testing.T, res *CallResult)
	}{
		{name: "allowed, sanitized", tool: "docs__read", args: map[string]any{"path": "/docs/a.md"}, result: audit.ResultSucceeded,
			check: func(t *testing.T, res *CallResult) {
				require.Equal(t, "&lt;p&gt;/docs/a.md&lt;/p&gt;", res.Content[0]["text"])
			}},
		{name: "argument scope", tool: "docs__read", args: map[string]any{"path": "/etc/passwd"}, reason: reasonArgumentScope},
		{name: "scoped argument not a string", tool: "docs__read", args: map[string]any{"path": 3}, reason: reasonArgumentScope},
		{name: "input schema", tool: "docs__report", args: map[string]any{"n": "x"}, reason: reasonInvalidInput},
		{name: "structured, validated", tool: "docs__report", args: map[string]any{"n": 2}, result: audit.ResultSucceeded,
			check: func(t *testing.T, res *CallResult) { require.EqualValues(t, 2, res.StructuredContent["n"]) }},
		{name: "output invalid", tool: "docs__report", args: map[string]any{"n": -1}, failure: failureOutputInvalid},
		{name: "tool error", tool: "docs__fail", args: map[string]any{}, result: audit.ResultFailed,
			check: func(t *testing.T, res *CallResult) { require.Equal(t, failureToolError, res.FailureClass) }},
		{name: "unknown tool", tool: "docs__nope", args: map[string]any{}, reason: reasonUnknownTool},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := mem.calls.Load()
			res, err := h.call(run, "a", tc.tool, tc.args)
			att := h.last()
			switch {
			case tc.reason != "":
				requireRefused(t, err, tc.reason)
				require.Equal(t, before, mem.calls.Load(), "a refused call never reaches the server")
				require.Equal(t, audit.OutcomeRefusedBeforeDispatch, att.Outcome)
			case tc.failure != "":
				requireFailed(t, err, tc.failure)
				require.Equal(t, before+1, mem.calls.Load())
				require.Equal(t, audit.OutcomeDispatched, att.Outcome)
				require.Equal(t, tc.failure, att.FailureClass)
			default:
				require.NoError(t, err)
				require.Equal(t, before+1, mem.calls.Load())
				require.Equal(t, tc.result, att.Result)
				require.NotEmpty(t, att.PendingID, "the outcome names the pending record written before dispatch")
				tc.check(t, res)
			}
		})
	}
	require.Equal(t, float64(1), h.spawned(), "one session for the run, reused by every call")

	// Agents a caller names that the graph does not have leave nothing behind in the run.
	for i := range 50 {
		_, err := h.call(run, fmt.Sprintf("nobody-%d", i), "docs__read", map[string]any{"path": "/docs/a.md"})
		requireRefused(t, err, reasonUnknownAgent)
	}
	r, err := h.pool.lookup(h.ctx, run, "")
	require.NoError(t, err)
	r.mu.Lock()
	cached := len(r.effective)
	r.mu.Unlock()
	require.Equal(t, 1, cached, "only agent a's capabilities are cached")
}
