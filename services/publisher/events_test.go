package publisher

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/graph"
)

// keyID is the id of the fixture's key for who, as audit records name it.
func (f *fixture) keyID(t *testing.T, who string) string {
	t.Helper()
	p, err := f.reg.VerifyKey(t.Context(), auth.HashKey(f.keys[who]))
	require.NoError(t, err)
	require.NotEmpty(t, p.KeyID)
	return p.KeyID
}

// adminEvents flushes the publisher's spool and returns the admin records it forwarded, in
// order.
func (f *fixture) adminEvents(t *testing.T) []audit.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, f.svc.Spool().Flush(ctx))
	var out []audit.Record
	for _, r := range f.audit.Records() {
		if r.Producer == "publisher" && r.Kind == audit.KindAdmin {
			out = append(out, r)
		}
	}
	return out
}

// TestEveryGraphChangeIsAnAdminEvent: creating a graph, importing into it, writing its draft,
// publishing it and deleting it each leave one admin record naming the graph, the action, and
// the key and role of whoever did it.
func TestEveryGraphChangeIsAnAdminEvent(t *testing.T) {
	f := newFixture(t)
	ctx := f.author(t)
	f.register(t, "docs", "process_spawn", "external_api_call")
	f.disc.serve("docs", tool("read_file", "Read a file."))

	f.createGraph(t, "g", "researcher")
	_, err := f.importTools(t, "g", "docs", "researcher")
	require.NoError(t, err)
	d := f.draft(t, "g")
	d.Nodes = append(d.Nodes, &publisherv1.Node{Id: "note", Kind: "note", Data: &publisherv1.Node_Opaque{Opaque: mustStruct(t, map[string]any{"text": "v2"})}})
	_, err = f.client.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: d})
	require.NoError(t, err)
	_, err = f.client.Publish(ctx, &publisherv1.PublishRequest{GraphId: "g"})
	require.NoError(t, err)
	_, err = f.client.DeleteGraph(f.as(t, auth.RoleOperator), &publisherv1.DeleteGraphRequest{GraphId: "g"})
	require.NoError(t, err)

	author, operator := f.keyID(t, auth.RoleAuthor), f.keyID(t, auth.RoleOperator)
	require.NotEqual(t, author, operator)
	type event struct{ action, actor, role string }
	want := []event{
		{audit.ActionCreate, author, auth.RoleAuthor},
		{audit.ActionImport, author, auth.RoleAuthor},
		{audit.ActionUpdate, author, auth.RoleAuthor},
		{audit.ActionPublish, author, auth.RoleAuthor},
		{audit.ActionDelete, operator, auth.RoleOperator},
	}
	recs := f.adminEvents(t)
	got := make([]event, len(recs))
	changes := make(map[string]map[string]any, len(recs))
	for i, r := range recs {
		require.Equal(t, auth.DefaultTenant, r.Tenant)
		require.Equal(t, resourceGraph, r.Admin.ResourceType)
		require.Equal(t, "g", r.Admin.ResourceID)
		got[i] = event{r.Admin.Action, r.Admin.ActorKeyID, r.Admin.ActorRole}
		if len(r.Admin.Change) > 0 {
			var c map[string]any
			require.NoError(t, json.Unmarshal(r.Admin.Change, &c))
			changes[r.Admin.Action] = c
		}
	}
	require.Equal(t, want, got)

	// Each change says what it did.
	require.Equal(t, []any{"researcher"}, changes[audit.ActionCreate]["agents"])
	require.Equal(t, "docs", changes[audit.ActionImport]["server_ref"])
	require.Equal(t, []any{"note"}, changes[audit.ActionUpdate]["nodes_added"])
	require.InDelta(t, 3, changes[audit.ActionPublish]["draft_revision"], 0, "published the draft after create, import and the write")
}

// TestADraftChangeOfAnEnvValueAloneIsRecorded: the nodes a draft edit changed were found by
// digests of their masked JSON, so an inline server's env value changed alone left
// nodes_changed empty; the record still names only ids, never a value.
func TestADraftChangeOfAnEnvValueAloneIsRecorded(t *testing.T) {
	const secret = "sk-live-canary-7c1e"
	agent := func(token string) *graph.Graph {
		return &graph.Graph{Nodes: []graph.Node{{ID: "a", Kind: "agent", Agent: &graph.AgentNode{
			MCPServers: []graph.InlineMCPServer{{Name: "s", Command: "srv", Env: map[string]string{"APP_TOKEN": token}}}}}}}
	}
	change := draftChange(agent("old-value"), agent(secret))
	require.Equal(t, []string{"a"}, change["nodes_changed"])
	b, err := json.Marshal(change)
	require.NoError(t, err)
	require.NotContains(t, string(b), secret)
	require.Empty(t, draftChange(agent(secret), agent(secret))["nodes_changed"])
}
