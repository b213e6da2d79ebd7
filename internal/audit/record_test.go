package audit

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func validToolCall() Record {
	tc := ToolCallAttempt{
		RunID: "run-1", GraphID: "g", GraphVersion: 3, AgentNode: "agent", ToolNode: "tool",
		ServerRef: "files", ToolName: "read_file", CallID: "call-1", Attempt: 1,
		PinnedHash: "sha256:aa", ArgsDigest: "sha256:bb", ArgsSize: 12,
	}
	tc.Succeeded()
	return NewToolCallRecord("pool", "tenant-a", tc)
}

func validAdmin() Record {
	return NewAdminRecord("registry", "", AdminEvent{
		ActorKeyID: "key-1", ActorRole: "admin", Action: ActionCreate,
		ResourceType: "mcp_server", ResourceID: "files", Change: json.RawMessage(`{"ref":"files"}`),
	})
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(r *Record)
		admin  bool
		want   string // substring of the error, empty for valid
	}{
		{name: "valid tool call"},
		{name: "valid admin", admin: true},
		{name: "valid refusal", mutate: func(r *Record) { r.ToolCall.Refused(ReasonSchemaDrift); r.ToolCall.LiveHash = "sha256:cc" }},
		{name: "valid failure", mutate: func(r *Record) { r.ToolCall.Failed(FailureTimeout) }},
		{name: "missing id", mutate: func(r *Record) { r.ID = "" }, want: "id must be"},
		{name: "id with space", mutate: func(r *Record) { r.ID = "a b" }, want: "id may hold"},
		{name: "id too long", mutate: func(r *Record) { r.ID = strings.Repeat("a", MaxIDLen+1) }, want: "id must be"},
		{name: "seq set by producer", mutate: func(r *Record) { r.Seq = 4 }, want: "seq is assigned"},
		{name: "zero time", mutate: func(r *Record) { r.Time = time.Time{} }, want: "time is required"},
		{name: "no producer", mutate: func(r *Record) { r.Producer = "" }, want: "producer is required"},
		{name: "unknown kind", mutate: func(r *Record) { r.Kind = "other" }, want: "kind \"other\""},
		{name: "kind without payload", mutate: func(r *Record) { r.ToolCall = nil }, want: "needs tool_call"},
		{name: "both payloads", mutate: func(r *Record) { r.Admin = &AdminEvent{} }, want: "needs tool_call and no admin"},
		{name: "tool call without tenant", mutate: func(r *Record) { r.Tenant = "" }, want: "tenant is required"},
		{name: "guarantee overstated", mutate: func(r *Record) { r.ToolCall.OperationResidualDuplicateRisk = false }, want: "at_least_once"},
		{name: "guarantee renamed", mutate: func(r *Record) { r.ToolCall.OperationSupport = "exactly_once" }, want: "at_least_once"},
		{name: "no run id", mutate: func(r *Record) { r.ToolCall.RunID = "" }, want: "run_id is required"},
		{name: "attempt zero", mutate: func(r *Record) { r.ToolCall.Attempt = 0 }, want: "attempt starts at 1"},
		{name: "outcome naming its pending record", mutate: func(r *Record) { r.ToolCall.PendingID = NewID() }},
		{name: "pending naming a pending record", mutate: func(r *Record) { r.ToolCall.Pending(); r.ToolCall.PendingID = NewID() }, want: "only such an outcome"},
		{name: "refusal naming a pending record", mutate: func(r *Record) { r.ToolCall.Refused(ReasonCeiling); r.ToolCall.PendingID = NewID() }, want: "only such an outcome"},
		{name: "pending id with space", mutate: func(r *Record) { r.ToolCall.PendingID = "a b" }, want: "pending_id"},
		{name: "negative size", mutate: func(r *Record) { r.ToolCall.ResultSize = -1 }, want: "must not be negative"},
		{name: "unknown outcome", mutate: func(r *Record) { r.ToolCall.Outcome = "maybe" }, want: "outcome \"maybe\""},
		{name: "refusal without reason", mutate: func(r *Record) { r.ToolCall.Refused("") }, want: "reason is required"},
		{name: "refusal with result", mutate: func(r *Record) { r.ToolCall.Refused(ReasonCeiling); r.ToolCall.Result = ResultFailed }, want: "no result"},
		{name: "dispatched with reason", mutate: func(r *Record) { r.ToolCall.Reason = ReasonCeiling }, want: "no refusal reason"},
		{name: "failure without class", mutate: func(r *Record) { r.ToolCall.Failed("") }, want: "failure_class is required"},
		{name: "success with class", mutate: func(r *Record) { r.ToolCall.FailureClass = FailureCrashed }, want: "no failure_class"},
		{name: "reason not snake case", mutate: func(r *Record) { r.ToolCall.Refused("Schema Drift") }, want: "lower-case"},
		{name: "field too long", mutate: func(r *Record) { r.ToolCall.ToolName = strings.Repeat("x", MaxFieldLen+1) }, want: "tool_name is"},
		{name: "field not utf8", mutate: func(r *Record) { r.ToolCall.ServerRef = "\xff" }, want: "not valid UTF-8"},
		{name: "too many advisories", mutate: func(r *Record) { r.ToolCall.Advisory = make([]string, MaxAdvisory+1) }, want: "advisory has"},
		{name: "too many loaded tools", mutate: func(r *Record) { r.ToolCall.LoadedTools = make([]string, MaxLoadedTools+1) }, want: "loaded_tools has"},
		{name: "approval without id", mutate: func(r *Record) { r.ToolCall.Approval = &ToolCallApproval{State: ApprovalPending} }, want: "approval.id is required"},
		{name: "approval of no state", mutate: func(r *Record) { r.ToolCall.Approval = &ToolCallApproval{ID: "apr-1", State: "maybe"} }, want: "approval.state"},
		{name: "approval note too long", mutate: func(r *Record) {
			r.ToolCall.Approval = &ToolCallApproval{ID: "apr-1", State: ApprovalDenied, Note: strings.Repeat("x", MaxFieldLen+1)}
		}, want: "approval.note is"},
		{name: "admin without action", admin: true, mutate: func(r *Record) { r.Admin.Action = "" }, want: "action is required"},
		{name: "admin change not json", admin: true, mutate: func(r *Record) { r.Admin.Change = json.RawMessage(`{"token":"s3cret"`) }, want: "not valid JSON"},
		{name: "admin change too large", admin: true, mutate: func(r *Record) {
			r.Admin.Change = json.RawMessage(`"` + strings.Repeat("x", MaxChangeBytes) + `"`)
		}, want: "admin.change is"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := validToolCall()
			if tt.admin {
				r = validAdmin()
			}
			if tt.mutate != nil {
				tt.mutate(&r)
			}
			err := r.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidRecord)
			require.ErrorContains(t, err, tt.want)
			// A change may carry an unmasked secret; it must never be echoed.
			require.NotContains(t, err.Error(), "s3cret")
		})
	}
}

func TestNewToolCallRecordAlwaysStatesTheGuarantee(t *testing.T) {
	r := NewToolCallRecord("pool", "t", ToolCallAttempt{OperationSupport: "exactly_once", OperationResidualDuplicateRisk: false})
	require.Equal(t, OperationSupportAtLeastOnce, r.ToolCall.OperationSupport)
	require.True(t, r.ToolCall.OperationResidualDuplicateRisk)
	require.Equal(t, KindToolCall, r.Kind)
	require.Equal(t, time.UTC, r.Time.Location())

	js, err := json.Marshal(r)
	require.NoError(t, err)
	require.Contains(t, string(js), `"operation_support":"at_least_once"`)
	require.Contains(t, string(js), `"operation_residual_duplicate_risk":true`)
}

func TestRecordJSONIsSnakeCase(t *testing.T) {
	r := validToolCall()
	r.ToolCall.Refused(ReasonSchemaDrift)
	r.ToolCall.LiveHash = "sha256:dd"
	r.ToolCall.Advisory = []string{"agent_floor"}
	js, err := json.Marshal(r)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(js, &m))
	keys := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	var walk func(v any)
	walk = func(v any) {
		if obj, ok := v.(map[string]any); ok {
			for k, child := range obj {
				require.Regexp(t, keys, k)
				walk(child)
			}
		}
	}
	walk(m)
	tc := m["tool_call"].(map[string]any)
	for _, k := range []string{"run_id", "graph_id", "graph_version", "agent_node", "tool_node", "server_ref", "tool_name",
		"call_id", "attempt", "outcome", "reason", "pinned_hash", "live_hash", "args_digest", "args_size", "advisory"} {
		require.Contains(t, tc, k)
	}
	require.NotContains(t, m, "seq", "seq is omitted until the log assigns it")

	var back Record
	require.NoError(t, json.Unmarshal(js, &back))
	require.Equal(t, r.ID, back.ID)
	require.True(t, r.Time.Equal(back.Time))
	require.Equal(t, *r.ToolCall, *back.ToolCall)
}

func TestNewID(t *testing.T) {
	seen := make(map[string]bool)
	before := time.Now().UnixMilli()
	var last string
	for range 1000 {
		id := NewID()
		require.Regexp(t, `^[0-9a-f]{32}$`, id)
		require.False(t, seen[id])
		seen[id] = true
		// The 48-bit prefix is the minting time, so IDs sort by it.
		prefix, err := strconv.ParseInt(id[:12], 16, 64)
		require.NoError(t, err)
		require.GreaterOrEqual(t, prefix, before)
		require.LessOrEqual(t, prefix, time.Now().UnixMilli())
		require.GreaterOrEqual(t, id[:12], last)
		last = id[:12]
	}
}

func TestMaskValues(t *testing.T) {
	require.Nil(t, MaskValues(nil))
	in := map[string]string{"API_TOKEN": "s3cret-value", "EMPTY": "", "LONG": strings.Repeat("x", 100)}
	out := MaskValues(in)
	require.Equal(t, map[string]string{"API_TOKEN": SecretMask, "EMPTY": SecretMask, "LONG": SecretMask}, out)
	require.Equal(t, "s3cret-value", in["API_TOKEN"], "the input is not modified")
}
