package pool

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/documents"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// The agent surface's gates, decided without any server: the pipeline graph's agent "a"
// binds fx__echo (pinned, no annotations: not read-only) and, where a case adds it,
// fx__lookup (annotated read-only).

// withSettings sets agent a's tool settings.
func withSettings(edit func(s *graph.ToolSettings)) func(g *graph.Graph) {
	return func(g *graph.Graph) { edit(&g.Nodes[0].Agent.ToolSettings) }
}

// withLookup adds fx__lookup, a read-only tool, to agent a, and applies edit to its settings.
func withLookup(edit func(s *graph.ToolSettings)) func(g *graph.Graph) {
	return func(g *graph.Graph) {
		lookup := &mcpgateTool{name: "lookup", annotations: `{"readOnlyHint":true}`}
		g.Nodes = append(g.Nodes, graph.Node{ID: "fx__lookup", Kind: graph.KindMCPTool, MCPTool: lookup.node()})
		a := g.Nodes[0].Agent
		a.ToolBindings = append(a.ToolBindings, graph.ToolBinding{Name: "fx__lookup", NodeID: "fx__lookup"})
		if edit != nil {
			edit(&a.ToolSettings)
		}
	}
}

// mcpgateTool is a pinned declaration of server fx with echo's input schema.
type mcpgateTool struct{ name, annotations string }

func (m *mcpgateTool) node() *graph.MCPToolNode {
	return &graph.MCPToolNode{ServerRef: "fx", ToolName: m.name, Description: "Looks " + m.name + " up.", InputSchema: json.RawMessage(echoInput),
		Annotations: json.RawMessage(m.annotations), SchemaHash: mcpgate.LiveHash(echoTool()), CapabilityBindings: []string{"process_spawn", "external_api_call"}}
}

func TestDecideSurface(t *testing.T) {
	yes := true
	for _, c := range []gateCase{
		{name: "visible", check: func(t *testing.T, d decision) {
			require.NotNil(t, d.tool)
			require.False(t, d.ask)
		}},
		{name: "provider_servers", graph: withSettings(func(s *graph.ToolSettings) { s.ExcludeServers = []string{"fx"} }),
			reason: reasonFilteredOut, contains: "exclude_servers lists server", check: level("provider_servers")},
		{name: "selected_servers of the agent", graph: withLookup(func(s *graph.ToolSettings) { s.SelectedServers = []string{"other"} }),
			check: func(t *testing.T, d decision) {
				require.NotNil(t, d.tool, "a selection of none of the agent's servers narrows nothing")
			}},
		{name: "selected_servers of the run", graph: func(g *graph.Graph) {
			g.Nodes = append(g.Nodes, graph.Node{ID: "gx__echo", Kind: graph.KindMCPTool, MCPTool: &graph.MCPToolNode{ServerRef: "gx", ToolName: "echo", InputSchema: json.RawMessage(echoInput)}})
			g.Nodes[0].Agent.ToolBindings = append(g.Nodes[0].Agent.ToolBindings, graph.ToolBinding{Name: "gx__echo", NodeID: "gx__echo"})
		}, snap: func(s *runSnapshot) { s.selected = []string{"gx"} }, reason: reasonFilteredOut, contains: "selected servers", check: level("selected_servers")},
		{name: "provider_tools", graph: withSettings(func(s *graph.ToolSettings) { s.IncludeTools = []string{"fx__other"} }),
			reason: reasonFilteredOut, contains: "include_tools does not list fx__echo", check: level("provider_tools")},
		{name: "exclude_tools beats include_tools", graph: withSettings(func(s *graph.ToolSettings) {
			s.IncludeTools, s.ExcludeTools = []string{"fx__echo"}, []string{"fx__echo"}
		}), reason: reasonFilteredOut, contains: "exclude_tools lists fx__echo", check: level("provider_tools")},
		{name: "registration", policy: func(p *mcpserver.Policy) { p.Filter.Include = []string{"other"} },
			reason: reasonFilteredOut, contains: "tool_filter excludes", check: level("registration")},
		{name: "mount", graph: withSettings(func(s *graph.ToolSettings) { s.Mounts = []graph.Mount{{Name: "fx", ExcludeTools: []string{"echo"}}} }),
			reason: reasonFilteredOut, contains: "mount of server", check: level("mount")},
		{name: "the ceiling before the surface", graph: withSettings(func(s *graph.ToolSettings) { s.ExcludeServers = []string{"fx"} }),
			policy: func(p *mcpserver.Policy) { p.Grants = nil }, reason: reasonCeiling},
		{name: "deferred, not loaded", graph: withSettings(func(s *graph.ToolSettings) { s.DeferTools = true }),
			reason: reasonNotLoaded, contains: "find it with tool_search first"},
		{name: "deferred by the mount", graph: withSettings(func(s *graph.ToolSettings) { s.Mounts = []graph.Mount{{Name: "fx", DeferTools: &yes}} }),
			reason: reasonNotLoaded},
		{name: "deferred and loaded", graph: withSettings(func(s *graph.ToolSettings) { s.DeferTools = true }),
			snap:  func(s *runSnapshot) { s.loaded = map[string]bool{"fx__echo": true} },
			check: func(t *testing.T, d decision) { require.True(t, d.tool.Loaded) }},
		{name: "loaded by another agent", graph: withSettings(func(s *graph.ToolSettings) { s.DeferTools = true }),
			snap: func(s *runSnapshot) { s.loaded = nil }, reason: reasonNotLoaded},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

// run decides the case through both stages and checks what it must.
func (c gateCase) run(t *testing.T) {
	t.Helper()
	d := decideAll(c.input(t))
	requireDecision(t, d, c.reason, c.contains)
	if c.check != nil {
		c.check(t, d)
	}
}

func level(want string) func(t *testing.T, d decision) {
	return func(t *testing.T, d decision) { require.Equal(t, want, d.err.(*RefusedError).Level) }
}

func TestDecideToolSearch(t *testing.T) {
	deferred := withLookup(func(s *graph.ToolSettings) { s.DeferTools = true })
	search := func(c gateCase) gateCase {
		c.tool = graph.ToolSearchName
		if c.graph == nil {
			c.graph = deferred
		}
		prev := c.in
		c.in = func(in *gateInput) {
			in.searchPolicies = map[string]mcpserver.Policy{"fx": in.policy}
			if prev != nil {
				prev(in)
			}
		}
		return c
	}
	for _, c := range []gateCase{
		search(gateCase{name: "answered", args: `{"query":"lookup"}`, check: func(t *testing.T, d decision) {
			require.True(t, d.answered)
			require.Equal(t, []string{"fx__lookup"}, d.search.names())
			require.Equal(t, graph.ToolSearchName, d.attempt.ToolName)
			require.JSONEq(t, `{"query":"lookup"}`, string(d.args.canonical))
		}}),
		search(gateCase{name: "one server", args: `{"query":"echo lookup","server":"fx"}`, check: func(t *testing.T, d decision) {
			require.Equal(t, []string{"fx__lookup", "fx__echo"}, d.search.names(), "by score: lookup is in fx__lookup's name and description")
		}}),
		search(gateCase{name: "a filtered tool is never found", args: `{"query":"lookup"}`, graph: withLookup(func(s *graph.ToolSettings) {
			s.DeferTools, s.ExcludeTools = true, []string{"fx__lookup"}
		}), check: func(t *testing.T, d decision) { require.Empty(t, d.search.names()) }}),
		search(gateCase{name: "no query", args: `{}`, reason: reasonInvalidInput, contains: "query"}),
		search(gateCase{name: "a server it does not search", args: `{"query":"x","server":"nope"}`, reason: reasonInvalidInput}),
		search(gateCase{name: "strict: server may be null", args: `{"query":"lookup","server":null}`,
			graph: withLookup(func(s *graph.ToolSettings) { s.DeferTools, s.ConvertSchemasToStrict = true, true }),
			check: func(t *testing.T, d decision) { require.Equal(t, []string{"fx__lookup"}, d.search.names()) }}),
		search(gateCase{name: "strict: every property is required", args: `{"query":"lookup"}`,
			graph:  withLookup(func(s *graph.ToolSettings) { s.DeferTools, s.ConvertSchemasToStrict = true, true }),
			reason: reasonInvalidInput, contains: "server"}),
		search(gateCase{name: "registry down", args: `{"query":"x"}`, in: func(in *gateInput) { in.searchPolicyErr = errors.New("down") },
			reason: reasonRegistryUnavailable, contains: "nothing was loaded"}),
		search(gateCase{name: "no deferred server: no tool_search", args: `{"query":"x"}`, graph: withLookup(nil),
			reason: reasonUnknownTool, contains: "binds no mcp_tool"}),
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

func TestDecideStrictForm(t *testing.T) {
	strict := withSettings(func(s *graph.ToolSettings) { s.ConvertSchemasToStrict = true })
	for _, c := range []gateCase{
		{name: "an optional property as null is taken out", graph: strict, args: `{"path":"/srv/a","n":null}`, check: func(t *testing.T, d decision) {
			require.Equal(t, map[string]any{"path": "/srv/a"}, d.args.value, "the server gets the pinned form")
			require.JSONEq(t, `{"path":"/srv/a","n":null}`, string(d.args.canonical), "the record keeps what the caller wrote")
		}},
		{name: "every property is required", graph: strict, args: `{"path":"/srv/a"}`, reason: reasonInvalidInput, contains: "strict form"},
		{name: "every object is closed", graph: strict, args: `{"path":"/srv/a","n":1,"extra":true}`, reason: reasonInvalidInput, contains: "strict form"},
		{name: "without the setting null is no integer", args: `{"path":"/srv/a","n":null}`, reason: reasonInvalidInput, contains: "/n"},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

func TestDecideConfirmation(t *testing.T) {
	confirm := func(def string) func(g *graph.Graph) {
		return withLookup(func(s *graph.ToolSettings) { s.ConfirmationDefault = def })
	}
	rule := func(def, tool, r string) func(g *graph.Graph) {
		return func(g *graph.Graph) {
			confirm(def)(g)
			for i, b := range g.Nodes[0].Agent.ToolBindings {
				if b.Name == tool {
					g.Nodes[0].Agent.ToolBindings[i].Confirmation = r
				}
			}
		}
	}
	approved := func(in *gateInput) { in.decision = &approvalDecision{id: "apr-1", by: "key:ops", at: time.Unix(1, 0)} }
	for _, c := range []gateCase{
		{name: "none by default", graph: confirm("")},
		{name: "non_read_only: not annotated read-only", graph: confirm(graph.ConfirmNonReadOnly), reason: reasonApprovalRequired, contains: "asks a person first",
			check: func(t *testing.T, d decision) {
				require.True(t, d.ask)
				require.Equal(t, digest(d.args.canonical), d.err.(*RefusedError).ArgsDigest)
			}},
		{name: "non_read_only: annotated read-only", graph: confirm(graph.ConfirmNonReadOnly), tool: "fx__lookup"},
		{name: "all", graph: confirm(graph.ConfirmAll), tool: "fx__lookup", reason: reasonApprovalRequired},
		{name: "a rule always", graph: rule("", "fx__lookup", graph.ConfirmAlways), tool: "fx__lookup", reason: reasonApprovalRequired},
		{name: "a rule never beats all", graph: rule(graph.ConfirmAll, "fx__echo", graph.ConfirmNever)},
		{name: "after every other gate", graph: confirm(graph.ConfirmAll), args: `{"path":1}`, reason: reasonInvalidInput},
		{name: "the approved call itself", graph: confirm(graph.ConfirmAll), in: approved, check: func(t *testing.T, d decision) {
			require.Equal(t, &audit.ToolCallApproval{ID: "apr-1", State: audit.ApprovalApproved, DecidedBy: "key:ops", DecideTime: time.Unix(1, 0)}, d.attempt.Approval)
		}},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

func TestDecideApprovals(t *testing.T) {
	sum := digest([]byte(`{"path":"/srv/a"}`))
	approval := func(state string, edit func(a *approvalView)) func(s *runSnapshot) {
		return func(s *runSnapshot) {
			a := approvalView{Approval: store.Approval{ID: "apr-1", Agent: "a", Tool: "fx__echo", ArgsDigest: sum, State: state,
				ServerRef: "fx", ToolName: "echo", DecidedBy: "key:ops", ExpireTime: time.Unix(100, 0)}}
			if edit != nil {
				edit(&a)
			}
			s.approvals = append(s.approvals, a)
		}
	}
	outcome := func(a *approvalView) { a.Outcome = &store.Outcome{Result: json.RawMessage(`{}`)} }
	for _, c := range []gateCase{
		{name: "the same call waits", snap: approval(approvalPending, nil), reason: reasonApprovalRequired, contains: "waits for approval apr-1",
			check: func(t *testing.T, d decision) {
				require.Equal(t, "apr-1", d.err.(*RefusedError).ApprovalID)
				require.Equal(t, &audit.ToolCallApproval{ID: "apr-1", State: audit.ApprovalPending}, d.attempt.Approval)
			}},
		{name: "other arguments wait for it", args: `{"path":"/srv/b"}`, snap: approval(approvalPending, nil), reason: reasonApprovalPending, contains: "takes no other call"},
		{name: "another agent waits for it", agent: "b", snap: approval(approvalPending, nil), reason: reasonApprovalPending},
		{name: "before the tool is known", tool: "fx__nope", snap: approval(approvalPending, nil), reason: reasonApprovalPending},
		{name: "a paused run says so first", snap: func(s *runSnapshot) { approval(approvalPending, nil)(s); s.state = StatePaused }, reason: reasonRunNotRunning},
		{name: "its approved call is being dispatched", snap: approval(approvalApproved, func(a *approvalView) { a.executing = true }), reason: reasonApprovalPending, contains: "being dispatched"},
		{name: "an approved outcome is delivered", snap: approval(approvalApproved, outcome), check: delivers("apr-1")},
		{name: "a denial is delivered", snap: approval(approvalDenied, nil), check: delivers("apr-1")},
		{name: "an expiry is delivered", snap: approval(approvalExpired, nil), check: delivers("apr-1")},
		{name: "once", snap: approval(approvalApproved, func(a *approvalView) { outcome(a); a.Delivered = true })},
		{name: "an approval refused at approval is not delivered", snap: approval(approvalRefused, nil)},
		{name: "an approved call whose outcome is gone is not delivered", snap: approval(approvalApproved, nil)},
		{name: "another call's decision is not this one's", args: `{"path":"/srv/b"}`, snap: approval(approvalDenied, nil)},
		{name: "the newest decision first", snap: func(s *runSnapshot) {
			approval(approvalDenied, nil)(s)
			approval(approvalApproved, func(a *approvalView) { a.ID = "apr-2"; outcome(a) })(s)
		}, check: delivers("apr-2")},
		{name: "ApproveCall's call passes", snap: approval(approvalApproved, func(a *approvalView) { a.executing = true }),
			in: func(in *gateInput) { in.decision = &approvalDecision{id: "apr-1"} }},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

func delivers(id string) func(t *testing.T, d decision) {
	return func(t *testing.T, d decision) {
		require.True(t, d.answered)
		require.Equal(t, id, d.deliver.ID)
	}
}

// TestDelivered: what a retry of a decided call gets, and how its record names the approval.
func TestDelivered(t *testing.T) {
	base := approvalView{Approval: store.Approval{ID: "apr-1", ServerRef: "fx", ToolName: "echo", ArgsDigest: "sha256:x", DecidedBy: "key:ops (approver, k1)", Note: "not today"}}
	denied := base
	denied.State = approvalDenied
	att := audit.ToolCallAttempt{Attempt: 3}
	_, err := delivered(denied, &att, "c2")
	ref := requireRefused(t, err, reasonDeniedByApprover)
	require.Contains(t, ref.Error(), "denied by key:ops (approver, k1)")
	require.Contains(t, ref.Error(), "not today")
	require.Equal(t, audit.ApprovalDenied, att.Approval.State)
	require.Equal(t, "echo", att.ToolName)

	res := &CallResult{Result: audit.ResultSucceeded, Content: []map[string]any{{"type": "text", "text": "done"}}}
	approved := base
	approved.State = approvalApproved
	approved.Outcome = keptOutcome(res, nil, audit.ToolCallAttempt{PendingID: "p1", Attempt: 2}, time.Now())
	att = audit.ToolCallAttempt{Attempt: 3}
	got, err := delivered(approved, &att, "c2")
	require.NoError(t, err)
	require.Equal(t, "done", got.Content[0]["text"])
	require.Equal(t, "c2", got.CallID)
	require.Equal(t, "apr-1", got.ApprovalID)
	require.Equal(t, "p1", att.PendingID, "the retry's record names the approved execution's pending record")
	require.Equal(t, audit.ApprovalDelivered, att.Approval.State)

	failed := base
	failed.State = approvalApproved
	failed.Outcome = keptOutcome(nil, &FailedError{Class: failureTimeout, Err: errors.New("slow")}, audit.ToolCallAttempt{Attempt: 2}, time.Now())
	_, err = delivered(failed, &audit.ToolCallAttempt{}, "c2")
	var fe *FailedError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, failureTimeout, fe.Class)

	big := &CallResult{Content: []map[string]any{{"type": "text", "text": string(make([]byte, maxKeptResult))}}}
	o := keptOutcome(big, nil, audit.ToolCallAttempt{}, time.Now())
	require.Equal(t, failureResultNotKept, o.FailureClass)
	require.Nil(t, o.Result)
}

func TestDecideDocuments(t *testing.T) {
	resolver := func(servers ...string) func(g *graph.Graph) {
		return withSettings(func(s *graph.ToolSettings) {
			s.DocumentResolver = &graph.DocumentResolver{Enabled: true, ServerNames: servers}
		})
	}
	content := []byte("%PDF-1.7 a document of some length")
	docs := func(in *gateInput) { in.documents = map[string]fetched{"doc-1": {content: content}} }
	ref := `{"path":"my-documents://doc-1"}`
	for _, c := range []gateCase{
		{name: "a listed server gets the content", graph: resolver("fx"), args: ref, in: docs, check: func(t *testing.T, d decision) {
			require.Equal(t, []string{"doc-1"}, d.docRefs)
			require.Equal(t, base64.StdEncoding.EncodeToString(content), d.args.value["path"])
			require.JSONEq(t, ref, string(d.args.canonical), "the record keeps the reference, never the content")
		}},
		{name: "nested too", graph: resolver("fx"), args: `{"path":"x","n":1,"extra":{"files":["my-documents://doc-1"]}}`, in: docs, check: func(t *testing.T, d decision) {
			require.Equal(t, base64.StdEncoding.EncodeToString(content), d.args.value["extra"].(map[string]any)["files"].([]any)[0])
		}},
		{name: "an unlisted server keeps the reference", graph: resolver("other"), args: ref, check: func(t *testing.T, d decision) {
			require.Empty(t, d.docRefs)
			require.Equal(t, "my-documents://doc-1", d.args.value["path"])
		}},
		{name: "a disabled resolver keeps it", graph: withSettings(func(s *graph.ToolSettings) {
			s.DocumentResolver = &graph.DocumentResolver{ServerNames: []string{"fx"}}
		}), args: ref, check: func(t *testing.T, d decision) { require.Equal(t, "my-documents://doc-1", d.args.value["path"]) }},
		{name: "missing or another tenant's", graph: resolver("fx"), args: ref,
			in: func(in *gateInput) {
				in.documents = map[string]fetched{"doc-1": {err: fmt.Errorf("%w: this tenant has no document", documents.ErrUnavailable)}}
			},
			reason: reasonDocumentUnavailable, contains: "my-documents://doc-1: document unavailable: this tenant has no document"},
		{name: "a malformed reference", graph: resolver("fx"), args: `{"path":"my-documents://../x"}`, reason: reasonDocumentUnavailable, contains: "not a document reference"},
		{name: "the schema checks the content", graph: func(g *graph.Graph) {
			resolver("fx")(g)
			g.Nodes[2].MCPTool.InputSchema = json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","maxLength":20}}}`)
		}, args: ref, in: docs, reason: reasonInvalidInput, contains: "/path"},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

// BenchmarkDecide is the pure gate pipeline of one call before any server (decide, then
// decideArguments): an agent without surface settings, and one with every filter level set,
// strict schemas and a document reference, to show what the agent surface adds to a call.
func BenchmarkDecide(b *testing.B) {
	for _, c := range []struct {
		name string
		gc   gateCase
	}{
		{"plain", gateCase{}},
		{"surface", gateCase{args: `{"path":"my-documents://doc-1","n":null}`, graph: withSettings(func(s *graph.ToolSettings) {
			s.IncludeServers, s.IncludeTools, s.ExcludeTools = []string{"fx"}, []string{"fx__echo"}, []string{"fx__other"}
			s.Mounts = []graph.Mount{{Name: "fx", IncludeTools: []string{"echo"}}}
			s.ConvertSchemasToStrict, s.ConfirmationDefault = true, graph.ConfirmNone
			s.DocumentResolver = &graph.DocumentResolver{Enabled: true, ServerNames: []string{"fx"}}
		}), in: func(in *gateInput) { in.documents = map[string]fetched{"doc-1": {content: []byte("a small document")}} }}},
	} {
		b.Run(c.name, func(b *testing.B) {
			in := c.gc.input(b)
			if d := decideAll(in); d.err != nil {
				b.Fatal(d.err)
			}
			b.ReportAllocs()
			for b.Loop() {
				_ = decideAll(in)
			}
		})
	}
}
