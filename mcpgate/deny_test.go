package mcpgate

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// countedSession counts the tools/call requests that reach a real session.
type countedSession struct {
	Session
	calls atomic.Int64
}

func (c *countedSession) CallTool(ctx context.Context, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	c.calls.Add(1)
	return c.Session.CallTool(ctx, p)
}

// requireUnpermissioned: err is the default-deny refusal of tool, which names the tool and
// both fixes.
func requireUnpermissioned(t *testing.T, err error, tool string) {
	t.Helper()
	var ce *CapabilityError
	require.ErrorAs(t, err, &ce)
	require.True(t, ce.Unpermissioned, "%v", err)
	require.Equal(t, tool, ce.Tool)
	require.Empty(t, ce.Missing)
	require.NotEmpty(t, ce.Problem, "a caller that reads Problem (the Ringfence pool) has the reason")
	require.ErrorContains(t, err, `mcpgate: tool "`+tool+`": it was given no permissions, and calls are default-deny`)
	require.ErrorContains(t, err, "BindOptions.Permissions")
	require.ErrorContains(t, err, "mapping it to an empty list")
}

// TestDefaultDeny: a tool the binder gave no permissions (not in BindOptions.Permissions, no
// Required) is refused every call, whatever the caller holds, before anything reaches the
// server; until the binder says it needs none, by mapping it to an empty list.
func TestDefaultDeny(t *testing.T) {
	s := &countedSession{Session: connectTo(t, testServer())}
	specs, err := Bind(t.Context(), s, BindOptions{})
	require.NoError(t, err)
	require.Len(t, specs, 2)
	everything := claims(t, "fs.read", "process_spawn", "secrets.read")
	for i := range specs {
		spec := &specs[i]
		require.Empty(t, spec.Permissions, spec.Name)
		require.False(t, spec.NoPermissionNeeded, spec.Name)
		args := map[string]any{"path": "/secrets/api-key"}
		if spec.Name == "count" {
			args = map[string]any{"n": 1}
		}
		for _, caps := range []Capabilities{{}, everything} {
			_, err := CallTool(t.Context(), s, spec, args, caps)
			requireUnpermissioned(t, err, spec.Name)
			requireUnpermissioned(t, Check(spec, args, caps), spec.Name)
		}
	}
	require.Zero(t, s.calls.Load(), "nothing reached the server")

	// Mapped to an empty list (or to nil: the entry is what says it), a tool needs none.
	for _, none := range [][]string{{}, nil} {
		specs, err = Bind(t.Context(), s, BindOptions{Permissions: map[string][]string{"count": none}})
		require.NoError(t, err)
		byName := map[string]*ToolSpec{specs[0].Name: &specs[0], specs[1].Name: &specs[1]}
		require.True(t, byName["count"].NoPermissionNeeded)
		require.Empty(t, byName["count"].Permissions)
		res, err := CallTool(t.Context(), s, byName["count"], map[string]any{"n": 5}, Capabilities{})
		require.NoError(t, err)
		require.EqualValues(t, 5, res.StructuredContent["n"])
		require.False(t, byName["read-secret"].NoPermissionNeeded, "the other tool is still given nothing")
		_, err = CallTool(t.Context(), s, byName["read-secret"], map[string]any{"path": "/secrets/api-key"}, everything)
		requireUnpermissioned(t, err, "read-secret")
	}
	require.EqualValues(t, 2, s.calls.Load(), "only the two calls of count reached the server")

	// With Required, an empty entry adds nothing: the tool needs what every tool does.
	specs, err = Bind(t.Context(), s, BindOptions{Required: []string{"process_spawn"}, Permissions: map[string][]string{"count": {}}})
	require.NoError(t, err)
	for _, spec := range specs {
		require.Equal(t, []string{"process_spawn"}, spec.Permissions, spec.Name)
		require.False(t, spec.NoPermissionNeeded, spec.Name)
		if spec.Name == "count" {
			_, err = CallTool(t.Context(), s, &spec, map[string]any{"n": 1}, Capabilities{})
			var ce *CapabilityError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, []string{"process_spawn"}, ce.Missing)
			// A bound spec whose permissions are taken away afterwards is refused, not opened.
			spec.Permissions = nil
			_, err = CallTool(t.Context(), s, &spec, map[string]any{"n": 1}, everything)
			requireUnpermissioned(t, err, "count")
		}
	}
	require.EqualValues(t, 2, s.calls.Load())
}

// TestDefaultDenyPerCallPermissions: permissions given per call (WithPermissions) are the
// tool's permissions for that call, so a spec without its own is gated by them, not refused.
func TestDefaultDenyPerCallPermissions(t *testing.T) {
	s := &stubSession{result: &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}}
	spec := &ToolSpec{Name: "read", InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)}
	args := map[string]any{"path": "/srv/a"}
	_, err := CallTool(t.Context(), s, spec, args, claims(t, "fs.read"))
	requireUnpermissioned(t, err, "read")
	_, err = CallTool(t.Context(), s, spec, args, claims(t, "fs.read"), WithPermissions())
	requireUnpermissioned(t, err, "read")

	scoped := WithPermissions("fs.read:{path}")
	_, err = CallTool(t.Context(), s, spec, args, claims(t, "fs.read:/srv/*"), scoped)
	require.NoError(t, err)
	_, err = CallTool(t.Context(), s, spec, args, Capabilities{}, scoped)
	var ce *CapabilityError
	require.ErrorAs(t, err, &ce)
	require.False(t, ce.Unpermissioned)
	require.Equal(t, []string{"fs.read:/srv/a"}, ce.Missing)

	// A spec built by hand says it needs none itself; per-call permissions still apply.
	spec.NoPermissionNeeded = true
	_, err = CallTool(t.Context(), s, spec, args, Capabilities{})
	require.NoError(t, err)
	_, err = CallTool(t.Context(), s, spec, args, Capabilities{}, scoped)
	require.ErrorAs(t, err, &ce)
	require.Equal(t, []string{"fs.read:/srv/a"}, ce.Missing)
	require.EqualValues(t, 2, s.calls.Load())
}

// TestHostDefaultDeny: an adapter with no RequiredCapabilities gates its tools by its
// Permissions alone: a tool it does not name is refused, one mapped to an empty list is open,
// and the host's copies of the specs say which.
func TestHostDefaultDeny(t *testing.T) {
	var closes atomic.Int64
	h := NewHost(
		AdapterSpec{Name: "bare", Server: inProcess(&closes)},
		AdapterSpec{Name: "counter", Server: inProcess(&closes), Permissions: map[string][]string{"count": {}}},
	)
	require.NoError(t, h.Start(t.Context()))
	t.Cleanup(func() { _ = h.Close() })
	everything := claims(t, "fs.read", "process_spawn")

	_, err := h.CallTool(t.Context(), "bare", "read-secret", map[string]any{"path": "/secrets/api-key"}, Capabilities{})
	requireUnpermissioned(t, err, "read-secret")
	_, err = h.CallTool(t.Context(), "bare", "count", map[string]any{"n": 1}, everything)
	requireUnpermissioned(t, err, "count")
	_, err = h.CallTool(t.Context(), "counter", "read-secret", map[string]any{"path": "/secrets/api-key"}, everything)
	requireUnpermissioned(t, err, "read-secret")
	res, err := h.CallTool(t.Context(), "counter", "count", map[string]any{"n": 3}, Capabilities{})
	require.NoError(t, err)
	require.EqualValues(t, 3, res.StructuredContent["n"])

	open := map[string]bool{}
	for _, spec := range h.Tools("counter") {
		open[spec.Name] = spec.NoPermissionNeeded
	}
	require.Equal(t, map[string]bool{"count": true, "read-secret": false}, open)
}
