package pool

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/graph"
)

// The MCP front door of a pool host that does not own a run answers its clients as the owner's
// does: tests on two hosts on one etcd cluster, over mutual TLS (servedHosts).

// doorsOf starts run runID of graphID on owner and serves a front door on each host; it returns
// an agent token's secret for agent a of the run and the doors, by host.
func doorsOf(t *testing.T, h *harness, hosts map[string]*Service, owner *Service, graphID, runID string, cfg FrontDoorConfig) (string, map[*Service]*door) {
	t.Helper()
	info, err := owner.StartRun(context.WithValue(h.ctx, forwardedKey{}, true), "", graphID, 0, runID) // placed on owner
	require.NoError(t, err)
	require.Equal(t, owner.host, info.Run.Host)
	_, secret, err := owner.CreateAgentToken(h.ctx, auth.DefaultTenant, runID, "a", 0)
	require.NoError(t, err)
	doors := map[*Service]*door{}
	for _, p := range hosts {
		fd, err := p.FrontDoor(cfg)
		require.NoError(t, err)
		srv := httptest.NewServer(fd)
		t.Cleanup(srv.Close)
		doors[p] = &door{h: h, fd: fd, srv: srv, url: srv.URL + "/mcp", run: runID}
	}
	return secret, doors
}

// TestAForwardedFrontDoorCallAnswersWithTheServersError: a server's JSON-RPC error reaches a
// client of another host's front door as the JSON-RPC error a client of the owner's gets: the
// server's code, the same text (the server's made safe) and the same data but the call's id.
func TestAForwardedFrontDoorCallAnswersWithTheServersError(t *testing.T) {
	h, hosts, _ := servedHosts(t)
	h.publish("errs", []string{"a"}, []imp{{server: "fx", agent: "a", tools: []string{"rpc_error"}}}, nil)
	owner, other := hosts["h1"], hosts["h2"]
	secret, doors := doorsOf(t, h, hosts, owner, "errs", "errs", FrontDoorConfig{})

	answer := func(p *Service) (*jsonrpc.Error, map[string]any) {
		cs := doors[p].connect(t, secret, "2025-11-25", nil)
		_, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "fx__rpc_error", Arguments: map[string]any{}})
		var rpcErr *jsonrpc.Error
		require.ErrorAs(t, err, &rpcErr, "a JSON-RPC error, not a tool error")
		var data map[string]any
		require.NoError(t, json.Unmarshal(rpcErr.Data, &data))
		failure, ok := data["io.ringfence/failure"].(map[string]any)
		require.True(t, ok, "%s", rpcErr.Data)
		require.NotEmpty(t, failure["call_id"])
		delete(failure, "call_id")
		return rpcErr, data
	}
	atOwner, ownerData := answer(owner)
	forwarded, forwardedData := answer(other)
	require.Equal(t, int64(-32000), forwarded.Code, "the server's own code")
	require.Equal(t, atOwner.Code, forwarded.Code)
	require.Equal(t, atOwner.Message, forwarded.Message)
	require.Contains(t, forwarded.Message, "It may have taken effect")
	require.NotContains(t, forwarded.Message, "<script>", "the server's text made safe")
	require.Equal(t, ownerData, forwardedData)
}

// TestAnotherHostsFrontDoorHearsListChanged: a session at the front door of a host that does
// not own its run is told tools/list_changed when tool_search loads tools on the owner (here
// through the owner's API), through one watch of the run, whatever its sessions; the watch
// ends when the host's last session of the run closes, when the owner stops, and when the run
// ends.
func TestAnotherHostsFrontDoorHearsListChanged(t *testing.T) {
	h, hosts, _ := servedHosts(t)
	h.publish("deferred", []string{"a"}, []imp{{server: "fx", agent: "a", tools: []string{"peek"}}}, func(d *publisherv1.Graph) {
		d.GetNodes()[0].GetAgent().DeferTools = true
	})
	owner, other := hosts["h1"], hosts["h2"]
	// A listing is read again only when a change is heard of.
	secret, doors := doorsOf(t, h, hosts, owner, "deferred", "deferred", FrontDoorConfig{ListTTL: time.Hour})
	fd := doors[other].fd
	follows := func() int {
		fd.mu.Lock()
		defer fd.mu.Unlock()
		return len(fd.follows)
	}
	watching := func(n int) func() bool {
		return func() bool {
			return owner.servedWatches() == n && other.heldWatches.Load() == int64(n) && follows() == n
		}
	}

	// Two sessions, one watch. A session lists again when it is told of a change, and says
	// so once its listing has what tool_search loads (which no listing has before).
	loaded := make(chan *mcp.ClientSession, 8)
	opts := &mcp.ClientOptions{ToolListChangedHandler: func(_ context.Context, req *mcp.ToolListChangedRequest) {
		go func() {
			list, err := req.Session.ListTools(context.Background(), nil)
			if err == nil && slices.Contains(toolNamesOf(list.Tools), "fx__peek") {
				loaded <- req.Session
			}
		}()
	}}
	first := doors[other].connect(t, secret, "2025-11-25", opts)
	second := doors[other].connect(t, secret, "2025-06-18", opts)
	for _, cs := range []*mcp.ClientSession{first, second} {
		list, err := cs.ListTools(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, []string{graph.ToolSearchName}, toolNamesOf(list.Tools))
	}
	require.Eventually(t, watching(1), 10*time.Second, 10*time.Millisecond, "one watch of the run, held open to its owner")

	_, err := owner.CallTool(h.ctx, CallRequest{RunID: "deferred", Agent: "a", Tool: graph.ToolSearchName, Arguments: json.RawMessage(`{"query":"changes nothing"}`)})
	require.NoError(t, err)
	told := map[*mcp.ClientSession]bool{}
	for len(told) < 2 {
		select {
		case cs := <-loaded:
			told[cs] = true
		case <-time.After(10 * time.Second):
			t.Fatal("no tools/list_changed at the other host's front door after tool_search on the owner")
		}
	}
	list, err := first.ListTools(t.Context(), nil)
	require.NoError(t, err)
	require.Equal(t, []string{"fx__peek", graph.ToolSearchName}, toolNamesOf(list.Tools))

	// The last session closes: the watch ends, on both hosts.
	require.NoError(t, first.Close())
	require.NoError(t, second.Close())
	require.Eventually(t, watching(0), 10*time.Second, 10*time.Millisecond, "the watch ends with the sessions")

	// A new session watches again. The owner stops: it ends the watches it serves and takes no
	// more, which the other host tries again, as long as the run is the owner's.
	doors[other].connect(t, secret, "2025-11-25", opts)
	require.Eventually(t, watching(1), 10*time.Second, 10*time.Millisecond)
	owner.EndListingWatches()
	require.Eventually(t, func() bool { return owner.servedWatches() == 0 && other.heldWatches.Load() == 0 && follows() == 1 },
		10*time.Second, 10*time.Millisecond, "the owner's watches end as it stops")
	// The run ends: the watch ends though the session stays.
	_, err = owner.EndRun(h.ctx, "deferred", "", StateCompleted, "done")
	require.NoError(t, err)
	require.Eventually(t, watching(0), 10*time.Second, 10*time.Millisecond, "the watch ends with the run")
}
