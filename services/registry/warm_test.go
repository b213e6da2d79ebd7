package registry

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/testutil"
)

// fakePool reports warm containers as a pool would; err makes it unreachable.
type fakePool struct {
	mu     sync.Mutex
	status map[string]mcpserver.WarmStatus
	err    error
	asked  [][]string
}

func (p *fakePool) WarmStatus(_ context.Context, refs []string) (map[string]mcpserver.WarmStatus, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, slices.Clone(refs))
	if p.err != nil {
		return nil, p.err
	}
	out := map[string]mcpserver.WarmStatus{}
	for _, r := range refs {
		out[r] = p.status[r]
	}
	return out, nil
}

// TestPrewarmIsStoredAndShownWithThePoolsWarmContainers: prewarm is stored with the
// registration, and every answer that carries one asking for warm containers carries what the
// pool holds of them (gRPC and REST alike). The pool is asked about those refs only; one that
// cannot be asked leaves warm out and the read still succeeds.
func TestPrewarmIsStoredAndShownWithThePoolsWarmContainers(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	pool := &fakePool{status: map[string]mcpserver.WarmStatus{"docs-search": {Ready: 1, Starting: 1}}}
	f.svc.SetWarmReporter(pool)

	req := docsSearch()
	req.Prewarm = 2
	created, err := f.client.CreateServer(ctx, req)
	require.NoError(t, err)
	require.Equal(t, int32(2), created.GetServer().GetPrewarm())
	cold := docsSearch()
	cold.Ref = "cold"
	_, err = f.client.CreateServer(ctx, cold)
	require.NoError(t, err)

	want := &registryv1.WarmStatus{Ready: 1, Starting: 1}
	got, err := f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search"})
	require.NoError(t, err)
	require.Equal(t, int32(2), got.GetServer().GetPrewarm())
	require.Equal(t, want.String(), got.GetServer().GetWarm().String())
	list, err := f.client.ListServers(ctx, &registryv1.ListServersRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetServers(), 2)
	require.Nil(t, list.GetServers()[0].GetWarm(), "cold asks for none: no warm status")
	require.Equal(t, want.String(), list.GetServers()[1].GetWarm().String())
	code, body := f.rest(t, http.MethodGet, "/v1/mcp/servers/docs-search", adminKey, "")
	require.Equal(t, http.StatusOK, code, body)
	var shown struct {
		Prewarm int            `json:"prewarm"`
		Warm    map[string]int `json:"warm"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &shown), body)
	require.Equal(t, 2, shown.Prewarm)
	require.Equal(t, map[string]int{"ready": 1, "starting": 1}, shown.Warm)
	for _, refs := range pool.asked {
		require.Equal(t, []string{"docs-search"}, refs, "only registrations that ask for warm containers are asked about")
	}

	// The view GetServer shares between readers is not changed by the answer.
	pool.mu.Lock()
	pool.err = errors.New("the pool is down")
	pool.mu.Unlock()
	got, err = f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search"})
	require.NoError(t, err, "the read does not depend on the pool")
	require.Equal(t, int32(2), got.GetServer().GetPrewarm())
	require.Nil(t, got.GetServer().GetWarm(), "unknown is absent, never zero")
	require.Contains(t, f.logs.String(), "the pool could not be asked for its warm containers")
}

// TestWarmTargetsFollowEveryWrite: the registrations the pool keeps warm containers for, with
// their revisions, follow creates, updates and deletes, in-process and over the internal RPC.
func TestWarmTargetsFollowEveryWrite(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	sys := auth.SystemContext(t.Context(), "test")
	targets := func() []mcpserver.WarmTarget {
		t.Helper()
		got, err := f.svc.WarmTargets(sys)
		require.NoError(t, err)
		resp, err := f.svc.Internal().ListWarmTargets(sys, &registryinternalv1.ListWarmTargetsRequest{})
		require.NoError(t, err)
		require.Len(t, resp.GetTargets(), len(got))
		for i, tg := range resp.GetTargets() {
			require.Equal(t, got[i], mcpserver.WarmTarget{Ref: tg.GetRef(), Prewarm: int(tg.GetPrewarm()), Revision: tg.GetRevision()})
		}
		return got
	}
	require.Empty(t, targets())
	req := docsSearch()
	req.Prewarm = 2
	_, err := f.client.CreateServer(ctx, req)
	require.NoError(t, err)
	_, err = f.client.CreateServer(ctx, &registryv1.CreateServerRequest{Ref: "cold", Command: "mcp"})
	require.NoError(t, err)
	require.Equal(t, []mcpserver.WarmTarget{{Ref: "docs-search", Prewarm: 2, Revision: 1}}, targets())
	require.Equal(t, []mcpserver.WarmTarget{{Ref: "docs-search", Prewarm: 2, Revision: 1}}, targets(), "read again, unchanged")

	floor := []string{"process_spawn", "external_api_call"}
	_, err = f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "docs-search", Command: "mcp-server-filesystem", Args: []string{"/srv/other"}, Grants: floor, Prewarm: 1})
	require.NoError(t, err)
	_, err = f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "cold", Command: "mcp", Grants: floor, Prewarm: 3})
	require.NoError(t, err)
	require.Equal(t, []mcpserver.WarmTarget{{Ref: "cold", Prewarm: 3, Revision: 2}, {Ref: "docs-search", Prewarm: 1, Revision: 2}}, targets())

	_, err = f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "docs-search", Command: "mcp-server-filesystem"})
	require.NoError(t, err, "an update without prewarm asks for none (PUT replaces every field)")
	_, err = f.client.DeleteServer(ctx, &registryv1.DeleteServerRequest{Ref: "cold"})
	require.NoError(t, err)
	require.Empty(t, targets())

	_, err = f.client.CreateServer(ctx, &registryv1.CreateServerRequest{Ref: "remote", Transport: "streamable_http", Url: "https://mcp.example.com/mcp", Prewarm: 1})
	require.ErrorContains(t, err, "prewarm")
}

// TestPrewarmWithoutTheFloorIsRefused: grants that miss process_spawn or external_api_call deny
// every call to the server, so warm containers of it could never be taken: a create or an
// update (gRPC, REST POST, PUT and PATCH) that asks for them is refused naming prewarm, the
// grants it lacks and both fixes, and stores nothing.
func TestPrewarmWithoutTheFloorIsRefused(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	_, err := f.client.CreateServer(ctx, &registryv1.CreateServerRequest{Ref: "idle", Command: "mcp", Prewarm: 1})
	st := testutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Contains(t, st.Message(), "prewarm: is 1, but grants do not grant external_api_call and process_spawn, which every call to the server needs, so no call could take a warm container: add external_api_call and process_spawn to grants (the CLI's --grant, listing every grant to keep), or set prewarm to 0")
	_, err = f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "idle"})
	testutil.RequireStatus(t, err, codes.NotFound)
	code, body := f.rest(t, http.MethodPost, "/v1/mcp/servers", adminKey, `{"ref":"idle","command":"mcp","prewarm":2,"grants":["process_spawn"]}`)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "grants do not grant external_api_call")

	req := docsSearch()
	req.Prewarm = 2
	_, err = f.client.CreateServer(ctx, req)
	require.NoError(t, err)
	code, body = f.rest(t, http.MethodPatch, "/v1/mcp/servers/docs-search", adminKey, `{"grants":[]}`)
	require.Equal(t, http.StatusBadRequest, code, "taking the floor away from a server kept warm: %s", body)
	require.Contains(t, body, "or set prewarm to 0")
	code, body = f.rest(t, http.MethodPut, "/v1/mcp/servers/docs-search", adminKey, `{"command":"mcp","prewarm":2}`)
	require.Equal(t, http.StatusBadRequest, code, "a PUT without grants grants nothing: %s", body)
	got, err := f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search"})
	require.NoError(t, err)
	require.Equal(t, []string{"process_spawn", "external_api_call"}, got.GetServer().GetGrants(), "nothing stored")
	require.Equal(t, int32(2), got.GetServer().GetPrewarm())

	code, body = f.rest(t, http.MethodPatch, "/v1/mcp/servers/docs-search", adminKey, `{"grants":[],"prewarm":0}`)
	require.Equal(t, http.StatusOK, code, body)
}
