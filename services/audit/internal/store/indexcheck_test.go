package store

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/audit"
)

// decodedFields is what indexedFields must agree with: the fields as encoding/json reads
// them.
func decodedFields(t testing.TB, body []byte) (bodyFields, bool) {
	var r struct {
		ID       *string `json:"id"`
		Tenant   string  `json:"tenant"`
		ToolCall *struct {
			RunID    string `json:"run_id"`
			CallID   string `json:"call_id"`
			Approval *struct {
				DispatchedCallID string `json:"dispatched_call_id"`
			} `json:"approval"`
		} `json:"tool_call"`
	}
	if json.Unmarshal(body, &r) != nil || r.ID == nil {
		return bodyFields{}, false
	}
	f := bodyFields{id: []byte(*r.ID)}
	if r.Tenant != "" {
		f.tenant = []byte(r.Tenant)
	}
	if tc := r.ToolCall; tc != nil {
		f.run = []byte(tc.RunID)
		if tc.CallID != "" {
			f.call = []byte(tc.CallID)
		}
		if tc.Approval != nil && tc.Approval.DispatchedCallID != "" {
			f.dispatched = []byte(tc.Approval.DispatchedCallID)
		}
	}
	return f, true
}

func TestIndexedFieldsReadWhatTheEncoderWrote(t *testing.T) {
	tricky := audit.NewAdminRecord("registry", `t"<&>\u2028`, audit.AdminEvent{
		ActorKeyID: "k", ActorRole: "admin", Action: "update", ResourceType: "mcp_server", ResourceID: "x",
		// Lookalike members nested where only a top-level walk must not look.
		Change: json.RawMessage(`{"tenant":"evil","tool_call":{"run_id":"evil"},"id":"evil","s":"}\"{]["}`),
	})
	quoted := toolRec(call{tenant: "", run: `run "quoted" \ é`, server: "s", tool: "t"}, "c-1")
	// A retry handed an approved call's outcome: indexed by its call id and the dispatched one,
	// with lookalikes in the members before them.
	retry := toolRec(call{tenant: "acme", run: "r", server: "s", tool: `call_id":"evil"`}, "c-9")
	retry.ToolCall.Approval = &audit.ToolCallApproval{ID: "apr-1", State: audit.ApprovalDelivered, Note: `{"dispatched_call_id":"evil"}`,
		DispatchedCallID: "c-1", DispatchedAttempt: 2}
	for _, r := range []audit.Record{tricky, quoted, retry, adminRec("tenant-a", "create")} {
		js, err := json.Marshal(r)
		require.NoError(t, err)
		body := buildBody(nil, 7, &Genesis, time.Unix(0, 0), js)
		got, ok := indexedFields(body)
		require.True(t, ok, "%s", body)
		want, _ := decodedFields(t, body)
		require.Equal(t, want, got, "%s", body)
	}
}

// FuzzIndexedFields: on any input the walk never panics, and whatever it accepts that is
// valid JSON written as our encoder writes it, it reads as encoding/json does.
func FuzzIndexedFields(f *testing.F) {
	js, _ := json.Marshal(toolRec(call{tenant: "t", run: "r", server: "s", tool: "x"}, "c"))
	f.Add(buildBody(nil, 1, &Genesis, time.Unix(0, 0), js))
	f.Add([]byte(`{"id":"a","tenant":"","tool_call":{}}`))
	f.Add([]byte(`{"id":"a\u0041","id":"b" , "tool_call" : {"run_id":"\"x"}}`))
	f.Add([]byte(`{"id":"a","x":[1,{"y":"]"}],"tenant":"t"}`))
	f.Add([]byte(`{"id":"a","tool_call":{"run_id":"r","call_id":"c","approval":{"id":"x","dispatched_call_id":"d"}}}`))
	f.Add([]byte(`{"id":"a","tool_call":{"approval":null,"call_id":""}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := indexedFields(body)
		if !ok || !json.Valid(body) || !utf8.Valid(body) || unlikeOurEncoder(body) {
			return
		}
		want, wantOK := decodedFields(t, body)
		if !wantOK {
			return // e.g. a non-string id that json rejects for *string only at depth
		}
		require.Equal(t, want, got, "%q", body)
	})
}

// unlikeOurEncoder reports whether body names an indexed key twice, or in another case:
// encoding/json takes the last of repeated keys and matches keys in any case, where
// indexedFields takes the first and matches exactly, and our encoder writes neither (nor
// invalid UTF-8, which encoding/json replaces and indexedFields keeps).
func unlikeOurEncoder(body []byte) bool {
	lower := bytes.ToLower(body)
	for _, k := range []string{`"id"`, `"tenant"`, `"tool_call"`, `"run_id"`, `"call_id"`, `"approval"`, `"dispatched_call_id"`} {
		if n := bytes.Count(lower, []byte(k)); n > 1 || n != bytes.Count(body, []byte(k)) {
			return true
		}
	}
	return false
}
