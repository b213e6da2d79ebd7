package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// TestMain lets the test binary serve the test server over stdio, so OpenCommand starts a
// real program without any other package's binary; started with the one argument
// envServerArg, it serves envServer instead, which needs nothing of its environment to know
// it should.
func TestMain(m *testing.M) {
	serve := func(srv *mcp.Server) {
		if err := srv.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	switch {
	case len(os.Args) == 2 && os.Args[1] == envServerArg:
		serve(envServer())
	case os.Getenv("MCPGATE_TEST_STDIO_SERVER") == "1":
		serve(testServer())
	}
	os.Exit(m.Run())
}

// envServerArg starts the test binary as envServer.
const envServerArg = "mcpgate-test-serve-environment"

// envServer is an MCP server with one tool, environ, that answers its process's environment,
// one variable per line.
func envServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "env-server", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "environ", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Join(os.Environ(), "\n")}}}, nil
		})
	return srv
}

// countingConn counts the closes of a session.
type countingConn struct {
	Conn
	closes *atomic.Int64
}

func (c countingConn) Close() error {
	c.closes.Add(1)
	return c.Conn.Close()
}

// inProcess is a Server of the test server over in-memory transports; closes counts the
// sessions closed.
func inProcess(closes *atomic.Int64) Server {
	return ServerFunc(func(ctx context.Context) (Conn, error) {
		ct, st := mcp.NewInMemoryTransports()
		if _, err := testServer().Connect(ctx, st, nil); err != nil {
			return nil, err
		}
		cs, err := Connect(ctx, ct)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: cs, closes: closes}, nil
	})
}

func TestRegistryCollect(t *testing.T) {
	var r Registry
	srv := inProcess(new(atomic.Int64))
	r.Register(AdapterSpec{Name: "zeta", Server: srv}, AdapterSpec{Name: "alpha", Server: srv, RequiredCapabilities: []string{"fs.read:/tmp/*"}})
	got, err := r.Collect(AdapterSpec{Name: "mid", Server: srv})
	require.NoError(t, err)
	require.Equal(t, []string{"alpha", "mid", "zeta"}, []string{got[0].Name, got[1].Name, got[2].Name})

	r.Register(AdapterSpec{Name: "alpha", Server: srv}, AdapterSpec{Name: "Bad Name", Server: srv},
		AdapterSpec{Name: "empty"}, AdapterSpec{Name: "caps", Server: srv, RequiredCapabilities: []string{"NOT A CAP"}},
		AdapterSpec{Name: "perms", Server: srv, Permissions: map[string][]string{"ok": {}, "read": {"fs.read:/tmp/*", "*"}}})
	_, err = r.Collect()
	require.ErrorContains(t, err, `adapter "alpha" is registered twice`)
	require.ErrorContains(t, err, `adapter name "Bad Name"`)
	require.ErrorContains(t, err, `adapter "empty" has no Server`)
	require.ErrorContains(t, err, `adapter "caps"`)
	// A per-tool requirement is checked as a required one is: the adapter's Permissions, which
	// its tools are gated by alone without RequiredCapabilities, are not first refused at Start.
	require.ErrorContains(t, err, `adapter "perms": mcpgate: BindOptions.Permissions["read"][1] ("*"): capability "*"`)
}

// TestRegisterAdapterFromInit: the package registry, as a plugin's init would fill it.
func TestRegisterAdapterFromInit(t *testing.T) {
	t.Cleanup(func() { defaultRegistry = Registry{} })
	RegisterAdapter(AdapterSpec{Name: "filesystem", Server: inProcess(new(atomic.Int64)), RequiredCapabilities: []string{"fs.read:/tmp/sandbox/*"}})
	got, err := CollectAdapters()
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "filesystem", got[0].Name)
}

// TestHostLifecycle: Start binds every adapter, calls are gated with the adapter's required
// capabilities, and Close closes each session exactly once.
func TestHostLifecycle(t *testing.T) {
	var closes atomic.Int64
	h := NewHost(
		AdapterSpec{Name: "secrets", Server: inProcess(&closes), RequiredCapabilities: []string{"secrets.read"},
			Permissions: map[string][]string{"read-secret": {"fs.read:{path}"}}},
		AdapterSpec{Name: "counter", Server: inProcess(&closes), Permissions: map[string][]string{"count": {}}},
	)
	_, err := h.CallTool(t.Context(), "counter", "count", map[string]any{"n": 1}, Capabilities{})
	require.ErrorIs(t, err, ErrNotStarted)

	require.NoError(t, h.Start(t.Context()))
	require.Equal(t, []string{"counter", "secrets"}, h.Adapters())
	require.Len(t, h.Tools("secrets"), 2)
	require.Equal(t, []string{"secrets.read", "fs.read:{path}"}, h.Tools("secrets")[1].Permissions)

	res, err := h.CallTool(t.Context(), "counter", "count", map[string]any{"n": 2}, Capabilities{})
	require.NoError(t, err)
	require.EqualValues(t, 2, res.StructuredContent["n"])

	_, err = h.CallTool(t.Context(), "secrets", "read-secret", map[string]any{"path": "/s/a"}, claims(t, "fs.read"))
	var ce *CapabilityError
	require.ErrorAs(t, err, &ce, "the adapter's required capability is missing")
	require.Equal(t, []string{"secrets.read"}, ce.Missing)
	res, err = h.CallTool(t.Context(), "secrets", "read-secret", map[string]any{"path": "/s/a"}, claims(t, "fs.read", "secrets.read"))
	require.NoError(t, err)
	require.Contains(t, text(res, 0), "secret at /s/a")

	_, err = h.CallTool(t.Context(), "secrets", "nope", nil, Capabilities{})
	require.ErrorIs(t, err, ErrUnknownTool)
	require.ErrorContains(t, err, "it binds: count, read-secret")

	require.NoError(t, h.Close())
	require.Equal(t, int64(2), closes.Load())
	require.NoError(t, h.Close(), "a second Close closes nothing")
	require.Equal(t, int64(2), closes.Load())
	_, err = h.CallTool(t.Context(), "counter", "count", map[string]any{"n": 1}, Capabilities{})
	require.ErrorIs(t, err, ErrNotStarted)
}

// TestHostStartFailureClosesWhatItOpened: a failing adapter leaves no session open.
func TestHostStartFailureClosesWhatItOpened(t *testing.T) {
	var closes atomic.Int64
	broken := ServerFunc(func(context.Context) (Conn, error) { return nil, errors.New("no such server") })
	h := NewHost(AdapterSpec{Name: "a", Server: inProcess(&closes)}, AdapterSpec{Name: "b", Server: inProcess(&closes)}, AdapterSpec{Name: "c", Server: broken})
	err := h.Start(t.Context())
	require.ErrorContains(t, err, `adapter "c": no such server`)
	require.Equal(t, int64(2), closes.Load())
	require.Empty(t, h.Adapters())
}

// TestOpenCommand binds a real program over stdio: this test binary, serving.
func TestOpenCommand(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	conn, err := Command{Path: self, Env: []string{"MCPGATE_TEST_STDIO_SERVER=1"}}.Open(t.Context())
	require.NoError(t, err)
	specs, err := Bind(t.Context(), conn, BindOptions{})
	require.NoError(t, err)
	require.Len(t, specs, 2)
	require.NoError(t, conn.Close())

	_, err = OpenCommand(t.Context(), exec.Command(self, "-test.run=^$"))
	require.Error(t, err, "a program that is not an MCP server")
}

// TestCommandEnvironment: a program Command starts gets PATH and nothing else of the
// embedding process's environment (whose secrets a third-party server must not see), or, with
// Env set, exactly Env. The test process holds a canary; the server reports what it got.
func TestCommandEnvironment(t *testing.T) {
	const canary = "MCPGATE_TEST_CANARY_SECRET"
	t.Setenv(canary, "embedder-secret-value")
	t.Setenv("PATH", os.Getenv("PATH")+string(os.PathListSeparator)+"/mcpgate-test-path-marker")
	self, err := os.Executable()
	require.NoError(t, err)
	environ := func(c Command) []string {
		t.Helper()
		conn, err := c.Open(t.Context())
		require.NoError(t, err)
		defer func() { require.NoError(t, conn.Close()) }()
		res, err := conn.CallTool(t.Context(), &mcp.CallToolParams{Name: "environ", Arguments: map[string]any{}})
		require.NoError(t, err)
		require.False(t, res.IsError)
		require.Len(t, res.Content, 1)
		text, ok := res.Content[0].(*mcp.TextContent)
		require.True(t, ok)
		return strings.Split(text.Text, "\n")
	}

	// A failure names the variables the server got, never their values: they are this
	// process's, and may be secrets.
	names := func(env []string) []string {
		out := make([]string, len(env))
		for i, kv := range env {
			out[i], _, _ = strings.Cut(kv, "=")
		}
		return out
	}

	got := environ(Command{Path: self, Args: []string{envServerArg}})
	require.NotContains(t, names(got), canary)
	require.Equal(t, []string{"PATH"}, names(got), "PATH and nothing else")
	require.Equal(t, "PATH="+os.Getenv("PATH"), got[0], "PATH as the embedding process has it")

	got = environ(Command{Path: self, Args: []string{envServerArg}, Env: []string{"LISTED=yes", "PATH=/listed/bin"}})
	require.NotContains(t, names(got), canary)
	require.Equal(t, []string{"LISTED", "PATH"}, names(got), "Env is the whole environment")
	require.Equal(t, []string{"LISTED=yes", "PATH=/listed/bin"}, got)
}

// TestOpenStreamableHTTP binds the test server over streamable HTTP on loopback.
func TestOpenStreamableHTTP(t *testing.T) {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return testServer() }, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	conn, err := StreamableHTTP{URL: srv.URL}.Open(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	specs, err := Bind(t.Context(), conn, BindOptions{Permissions: map[string][]string{"count": {}}})
	require.NoError(t, err)
	require.Len(t, specs, 2)
	res, err := CallTool(t.Context(), conn, &specs[0], map[string]any{"n": 4}, Capabilities{})
	require.NoError(t, err)
	require.EqualValues(t, 4, res.StructuredContent["n"])
}
