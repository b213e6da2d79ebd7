package pool

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/auth"
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
