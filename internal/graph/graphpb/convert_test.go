package graphpb

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/graph"
)

// TestAgentSettingsRoundTrip: every tool surface setting and binding rule survives the
// proto, and the JSON a REST client writes uses the settings' own names.
func TestAgentSettingsRoundTrip(t *testing.T) {
	yes, no := true, false
	settings := graph.ToolSettings{
		IncludeServers: []string{"docs"}, ExcludeServers: []string{"tickets"},
		IncludeTools: []string{"docs__read_file"}, ExcludeTools: []string{"docs__write_file"},
		DeferTools: true, ConfirmationDefault: graph.ConfirmNonReadOnly, ConvertSchemasToStrict: true,
		SelectedServers: []string{"docs"},
		Mounts: []graph.Mount{
			{Name: "docs", IncludeTools: []string{"read_file"}, ExcludeTools: []string{"write_file"}, DeferTools: &no},
			{Name: "wiki", DeferTools: &yes},
			{Name: "files"},
		},
		DocumentResolver: &graph.DocumentResolver{Enabled: true, ServerNames: []string{"docs"}},
	}
	g := &graph.Graph{ID: "g", Nodes: []graph.Node{{ID: "a", Kind: graph.KindAgent, Agent: &graph.AgentNode{
		ToolBindings: []graph.ToolBinding{{Name: "docs__read_file", NodeID: "n", Confirmation: graph.ConfirmNever}},
		ToolSettings: settings,
	}}}}
	p := GraphToProto(g, true)
	back, err := GraphFromProto(p)
	require.NoError(t, err)
	require.Equal(t, g.Nodes[0].Agent, back.Nodes[0].Agent)

	raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(p.GetNodes()[0].GetAgent())
	require.NoError(t, err)
	require.JSONEq(t, `{
		"tool_bindings": [{"name": "docs__read_file", "node_id": "n", "confirmation": "never"}],
		"include_servers": ["docs"], "exclude_servers": ["tickets"],
		"include_tools": ["docs__read_file"], "exclude_tools": ["docs__write_file"],
		"defer_tools": true, "confirmation_default": "non_read_only", "convert_schemas_to_strict": true,
		"selected_servers": ["docs"],
		"mounts": [
			{"name": "docs", "include_tools": ["read_file"], "exclude_tools": ["write_file"], "defer_tools": false},
			{"name": "wiki", "defer_tools": true},
			{"name": "files"}
		],
		"document_resolver": {"enabled": true, "server_names": ["docs"]}
	}`, string(raw))

	// The domain JSON, which the publisher stores, has the same names.
	stored, err := json.Marshal(g.Nodes[0].Agent)
	require.NoError(t, err)
	var fromProto, fromStore map[string]any
	require.NoError(t, json.Unmarshal(raw, &fromProto))
	require.NoError(t, json.Unmarshal(stored, &fromStore))
	require.Equal(t, fromProto, fromStore)

	// A mount's defer_tools stays unset unless it is set: unset follows the agent.
	var back2 publisherv1.AgentNode
	require.NoError(t, protojson.Unmarshal([]byte(`{"mounts":[{"name":"files"}]}`), &back2))
	require.Nil(t, back2.GetMounts()[0].DeferTools)
}
