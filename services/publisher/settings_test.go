package publisher

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/testutil"
)

// TestAgentSettingsThroughTheDraft: the tool surface settings go through ReplaceDraft, come
// back from GetDraft and the published version as they were written, are immutable once
// published, and a malformed one is refused naming its field path.
func TestAgentSettingsThroughTheDraft(t *testing.T) {
	f := newFixture(t)
	ctx := f.author(t)
	f.register(t, "docs", "process_spawn", "external_api_call")
	f.disc.serve("docs", tool("read_file", "Read a file."), tool("write_file", "Write a file."))
	f.createGraph(t, "g", "researcher")
	_, err := f.importTools(t, "g", "docs", "researcher")
	require.NoError(t, err)

	d := f.draft(t, "g")
	no := false
	a := nodeByID(d, "researcher").GetAgent()
	a.IncludeServers, a.ExcludeTools = []string{"docs"}, []string{"docs__write_file"}
	a.DeferTools, a.ConfirmationDefault, a.ConvertSchemasToStrict = true, "non_read_only", true
	a.SelectedServers = []string{"docs", "tickets"}
	a.Mounts = []*publisherv1.Mount{{Name: "docs", IncludeTools: []string{"read_file", "write_file", "nope"}, DeferTools: &no}}
	a.DocumentResolver = &publisherv1.DocumentResolver{Enabled: true, ServerNames: []string{"docs"}}
	a.ToolBindings[0].Confirmation = "always"
	want := proto.Clone(a).(*publisherv1.AgentNode)
	_, err = f.client.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: d})
	require.NoError(t, err)
	got := nodeByID(f.draft(t, "g"), "researcher").GetAgent()
	require.True(t, proto.Equal(want, got), "GetDraft returns the settings as written:\n%v\n%v", want, got)

	pub, err := f.client.Publish(ctx, &publisherv1.PublishRequest{GraphId: "g"})
	require.NoError(t, err)
	var unknown []string
	for _, w := range pub.GetWarnings() {
		if strings.Contains(w, "has no effect") {
			unknown = append(unknown, w)
		}
	}
	require.Len(t, unknown, 2, "selected server tickets and the mount's tool nope match nothing: %v", pub.GetWarnings())
	require.Contains(t, unknown[0], `selected_servers names server "tickets"`)
	require.Contains(t, unknown[1], `names tool "nope"`)
	v, err := f.client.GetVersion(ctx, &publisherv1.GetVersionRequest{GraphId: "g", Version: pub.GetVersion()})
	require.NoError(t, err)
	require.Equal(t, pub.GetWarnings(), v.GetVersion().GetWarnings(), "the warnings are stored with the version")
	require.True(t, proto.Equal(want, nodeByID(v.GetVersion().GetGraph(), "researcher").GetAgent()))

	// A later draft edit leaves the published version as it was.
	d = f.draft(t, "g")
	nodeByID(d, "researcher").GetAgent().ConfirmationDefault = "all"
	_, err = f.client.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: d})
	require.NoError(t, err)
	again, err := f.client.GetVersion(ctx, &publisherv1.GetVersionRequest{GraphId: "g", Version: pub.GetVersion()})
	require.NoError(t, err)
	require.Equal(t, "non_read_only", nodeByID(again.GetVersion().GetGraph(), "researcher").GetAgent().GetConfirmationDefault())

	for _, tc := range []struct {
		name, field string
		edit        func(a *publisherv1.AgentNode)
	}{
		{"confirmation_default", "draft.nodes[0].agent.confirmation_default", func(a *publisherv1.AgentNode) { a.ConfirmationDefault = "ask" }},
		{"namespaced tool", "draft.nodes[0].agent.include_tools[0]", func(a *publisherv1.AgentNode) { a.IncludeTools = []string{"read_file"} }},
		{"mount tool", "draft.nodes[0].agent.mounts[0].exclude_tools[0]", func(a *publisherv1.AgentNode) {
			a.Mounts = []*publisherv1.Mount{{Name: "docs", ExcludeTools: []string{"docs__read_file"}}}
		}},
		{"binding rule", "draft.nodes[0].agent.tool_bindings[0].confirmation", func(a *publisherv1.AgentNode) { a.ToolBindings[0].Confirmation = "maybe" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := f.draft(t, "g")
			tc.edit(nodeByID(d, "researcher").GetAgent())
			require.Equal(t, "researcher", d.GetNodes()[0].GetId())
			_, err := f.client.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: d})
			st := testutil.RequireStatus(t, err, codes.InvalidArgument)
			var br *errdetails.BadRequest
			for _, det := range st.Details() {
				if b, ok := det.(*errdetails.BadRequest); ok {
					br = b
				}
			}
			require.NotNil(t, br, "%v", st)
			require.Equal(t, tc.field, br.GetFieldViolations()[0].GetField())
		})
	}
}

// TestAgentSettingsOverREST: REST clients write and read the settings under their own names.
func TestAgentSettingsOverREST(t *testing.T) {
	f := newFixture(t)
	f.createGraph(t, "g", "researcher")
	code, body := f.rest(t, http.MethodPut, "/v1/graphs/g/draft", `{"draft":{"revision":1,"nodes":[{"id":"researcher","kind":"agent","agent":{
		"include_servers":["docs"],"exclude_tools":["docs__write_file"],"defer_tools":true,"confirmation_default":"all",
		"convert_schemas_to_strict":true,"selected_servers":["docs"],
		"mounts":[{"name":"docs","include_tools":["read_file"],"defer_tools":false}],
		"document_resolver":{"enabled":true,"server_names":["docs"]}}}]}}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	code, body = f.rest(t, http.MethodGet, "/v1/graphs/g/draft", "")
	require.Equal(t, http.StatusOK, code)
	a := body["draft"].(map[string]any)["nodes"].([]any)[0].(map[string]any)["agent"].(map[string]any)
	require.Equal(t, []any{"docs"}, a["include_servers"])
	require.Equal(t, "all", a["confirmation_default"])
	require.Equal(t, true, a["convert_schemas_to_strict"])
	require.Equal(t, false, a["mounts"].([]any)[0].(map[string]any)["defer_tools"])
	require.Equal(t, []any{"docs"}, a["document_resolver"].(map[string]any)["server_names"])

	code, body = f.rest(t, http.MethodPut, "/v1/graphs/g/draft", `{"draft":{"nodes":[{"id":"researcher","kind":"agent","agent":{"exclude_servers":["Docs"]}}]}}`)
	require.Equal(t, http.StatusBadRequest, code, "%v", body)
	require.Contains(t, body["message"], "draft.nodes[0].agent.exclude_servers[0]")
}
