package pool

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/mcpgate"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl/jcs"
)

// The result digest of a call's audit record (result_digest, result_size) is recomputed here
// as an auditor would, from what the caller received: the JCS form (RFC 8785, by
// jcs.Canonicalize, which reads JSON text) of {"content": [...], "isError": bool,
// "structuredContent": {...}}, structuredContent left out when there is none or it is empty.

// auditorDigest is the digest and size an auditor computes of a result received as JSON: its
// content list (nil: none), whether it is an error, and its structured content (nil: none).
func auditorDigest(t testing.TB, content json.RawMessage, isError bool, structured json.RawMessage) (string, int64) {
	t.Helper()
	if len(content) == 0 || string(content) == "null" {
		content = json.RawMessage(`[]`)
	}
	doc := `{"content":` + string(content) + `,"isError":` + map[bool]string{true: "true", false: "false"}[isError]
	if s := strings.TrimSpace(string(structured)); s != "" && s != "null" && s != "{}" {
		doc += `,"structuredContent":` + s
	}
	canonical, err := jcs.Canonicalize([]byte(doc + "}"))
	require.NoError(t, err, doc)
	sum := sha256.Sum256(canonical)
	return "sha256:" + hex.EncodeToString(sum[:]), int64(len(canonical))
}

// grpcResultDigest is auditorDigest of a CallToolResponse, its Structs read as JSON.
func grpcResultDigest(t testing.TB, resp *poolv1.CallToolResponse) (string, int64) {
	t.Helper()
	return structsDigest(t, resp.GetContent(), resp.GetIsError(), resp.GetStructuredContent())
}

// structsDigest is auditorDigest of a result as the API carries it: its content items and
// structured content as Structs, read as JSON (protojson).
func structsDigest(t testing.TB, content []*structpb.Struct, isError bool, structured *structpb.Struct) (string, int64) {
	t.Helper()
	items := make([]string, 0, len(content))
	for _, c := range content {
		b, err := protojson.Marshal(c)
		require.NoError(t, err)
		items = append(items, string(b))
	}
	var raw []byte
	if structured != nil {
		var err error
		raw, err = protojson.Marshal(structured)
		require.NoError(t, err)
	}
	return auditorDigest(t, json.RawMessage("["+strings.Join(items, ",")+"]"), isError, raw)
}

// outcomeOf is the outcome record (not the pending one) of the call with callID.
func outcomeOf(t *testing.T, h *harness, callID string) *audit.ToolCallAttempt {
	t.Helper()
	var found []*audit.ToolCallAttempt
	for _, att := range h.attempts() {
		if att.CallID == callID {
			found = append(found, att)
		}
	}
	require.Len(t, found, 1, "one outcome of call %s", callID)
	return found[0]
}

// TestTheOutcomeRecordCarriesTheDigestOfTheResultTheCallerGot: a call through the gRPC API
// that succeeded (text, structured content, markup the sanitizer changed) or answered a tool
// error has an outcome record whose result_digest and result_size are what the caller
// recomputes from the response it got; a call that timed out returned no result and has none,
// nor has any pending record.
func TestTheOutcomeRecordCarriesTheDigestOfTheResultTheCallerGot(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", callTimeout(time.Second), "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo", "add", "fail", "inject", "sleep"}}}, nil)
	run := h.start("g")
	client, ctx := grpcClient(t, h)

	call := func(callID, tool string, args map[string]any) (*poolv1.CallToolResponse, error) {
		st, err := structpb.NewStruct(args)
		require.NoError(t, err)
		return client.CallTool(ctx, &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: tool, Arguments: st, CallId: callID})
	}
	for _, tc := range []struct {
		callID, tool string
		args         map[string]any
		check        func(t *testing.T, resp *poolv1.CallToolResponse)
	}{
		{"call-echo", "fx__echo", map[string]any{"text": "hello\u0007 <b>there</b>"}, func(t *testing.T, resp *poolv1.CallToolResponse) {
			require.Equal(t, "hello &lt;b&gt;there&lt;/b&gt;", resp.GetContent()[0].AsMap()["text"], "the sanitizer changed what the caller got")
		}},
		{"call-add", "fx__add", map[string]any{"a": 2, "b": 40}, func(t *testing.T, resp *poolv1.CallToolResponse) {
			require.Equal(t, 42.0, resp.GetStructuredContent().AsMap()["sum"])
		}},
		{"call-inject", "fx__inject", map[string]any{}, func(t *testing.T, resp *poolv1.CallToolResponse) {
			require.NotContains(t, resp.GetStructuredContent().AsMap()["note"], "<script>")
		}},
		{"call-fail", "fx__fail", map[string]any{}, func(t *testing.T, resp *poolv1.CallToolResponse) {
			require.True(t, resp.GetIsError())
			require.Equal(t, failureToolError, resp.GetFailureClass())
		}},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			resp, err := call(tc.callID, tc.tool, tc.args)
			require.NoError(t, err)
			tc.check(t, resp)
			sum, size := grpcResultDigest(t, resp)
			att := outcomeOf(t, h, tc.callID)
			require.Equal(t, sum, att.ResultDigest, "the digest of the result as the caller got it")
			require.Equal(t, size, att.ResultSize)
			require.NotEqual(t, att.ArgsDigest, att.ResultDigest)
			require.Equal(t, att.ResultDigest, resp.GetResultDigest(), "the response names the record's digest")
			require.Equal(t, att.ResultSize, resp.GetResultSize())
		})
	}

	resp, err := call("call-slow", "fx__sleep", map[string]any{"ms": 60000})
	require.ErrorContains(t, err, "timeout")
	require.Empty(t, resp.GetResultDigest())
	slow := outcomeOf(t, h, "call-slow")
	require.Equal(t, failureTimeout, slow.FailureClass)
	require.Empty(t, slow.ResultDigest, "no result reached the caller")
	require.Zero(t, slow.ResultSize)
	for _, p := range h.pendings() {
		require.Empty(t, p.ResultDigest, "a pending record has no result yet")
		require.Zero(t, p.ResultSize)
	}
}

// TestTheDigestOfAnApprovedCallsResult: the approver's dispatch of an approved call and the
// caller's retry that got its result both record the digest of that result, the same one.
func TestTheDigestOfAnApprovedCallsResult(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	run := h.start("g")
	args := map[string]any{"text": "write <it>"}
	_, err := h.call(run, "a", "fx__echo", args)
	id := requireRefused(t, err, reasonApprovalRequired).ApprovalID
	_, approved, err := h.pool.ApproveCall(h.ctx, run, "", id, "key:ops (approver, key_1)")
	require.NoError(t, err)
	retried, err := h.call(run, "a", "fx__echo", args)
	require.NoError(t, err)

	content, err := json.Marshal(approved.Content)
	require.NoError(t, err)
	sum, size := auditorDigest(t, content, approved.IsError, nil)
	recs := h.toolCallRecords(func(tc *audit.ToolCallAttempt) bool { return tc.Approval != nil && tc.Approval.ID == id })
	var digests []string
	for _, r := range recs {
		digests = append(digests, r.Approval.State+"/"+r.Result+"/"+r.ResultDigest)
		if r.ResultDigest != "" {
			require.Equal(t, size, r.ResultSize)
		}
	}
	require.Equal(t, []string{
		"pending//", // refused before dispatch: it waits for the approver
		"approved/pending/",
		"approved/succeeded/" + sum,
		"delivered/succeeded/" + sum,
	}, digests)
	require.Equal(t, sum, approved.ResultDigest, "the approver's result names it")
	require.Equal(t, sum, retried.ResultDigest, "so does the retry's")
	require.Equal(t, size, retried.ResultSize)
	require.Equal(t, approved.Content, retried.Content)
}

// recorder keeps the bodies of the HTTP responses it relays, as the client read them.
type recorder struct {
	next   http.RoundTripper
	mu     sync.Mutex
	bodies [][]byte
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.bodies = append(r.bodies, body)
	r.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// result is the JSON-RPC result of request id among the recorded bodies (JSON, or server-sent
// events whose data lines are JSON), as it came over the wire.
func (r *recorder) result(t *testing.T, id int64) json.RawMessage {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, body := range r.bodies {
		var messages [][]byte
		if trimmed := bytes.TrimSpace(body); bytes.HasPrefix(trimmed, []byte("{")) {
			messages = append(messages, trimmed)
		}
		sc := bufio.NewScanner(bytes.NewReader(body))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:")); ok {
				messages = append(messages, bytes.Clone(bytes.TrimSpace(data)))
			}
		}
		for _, m := range messages {
			var msg struct {
				ID     *int64          `json:"id"`
				Result json.RawMessage `json:"result"`
			}
			if json.Unmarshal(m, &msg) == nil && msg.ID != nil && *msg.ID == id && len(msg.Result) > 0 {
				return msg.Result
			}
		}
	}
	t.Fatalf("no result for request %d among %d responses", id, len(r.bodies))
	return nil
}

// TestTheFrontDoorsResultDigestIsOfWhatTheMCPClientGot: through the MCP front door, the
// outcome record's result digest is recomputed from the JSON result the client received, whose
// strings the sanitizer changed: it is the digest of the delivered form, not of the server's.
func TestTheFrontDoorsResultDigestIsOfWhatTheMCPClientGot(t *testing.T) {
	h := newHarness(t, harnessOpts{host: true})
	h.server("fx", func(r *registryv1.CreateServerRequest) { r.Description = "The fixture." }, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo", "inject"}}}, nil)
	fd, err := h.pool.FrontDoor(FrontDoorConfig{})
	require.NoError(t, err)
	srv := httptest.NewServer(fd)
	t.Cleanup(srv.Close)
	d := &door{h: h, fd: fd, srv: srv, url: srv.URL + "/mcp", run: h.start("g")}
	_, secret := d.token(t)
	rec := &recorder{next: http.DefaultTransport}
	c := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, nil)
	cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: d.url, HTTPClient: &http.Client{Transport: bearer{secret, rec}}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })

	sent := "x\u0000y <i>markup</i>\u202e"
	for i, params := range []*mcp.CallToolParams{
		{Name: "fx__echo", Arguments: map[string]any{"text": sent}},
		{Name: "fx__inject", Arguments: map[string]any{}},
	} {
		res, err := cs.CallTool(t.Context(), params)
		require.NoError(t, err)
		require.False(t, res.IsError, textOf(res))
		callID := res.Meta["io.ringfence/call"].(map[string]any)["call_id"].(string)
		// Request 1 is initialize; the calls follow it.
		raw := rec.result(t, int64(i+2))
		var got struct {
			Content           json.RawMessage `json:"content"`
			IsError           bool            `json:"isError"`
			StructuredContent json.RawMessage `json:"structuredContent"`
		}
		require.NoError(t, json.Unmarshal(raw, &got))
		sum, size := auditorDigest(t, got.Content, got.IsError, got.StructuredContent)
		att := outcomeOf(t, h, callID)
		require.Equal(t, sum, att.ResultDigest, "recomputed from %s", raw)
		require.Equal(t, size, att.ResultSize)
		meta := res.Meta["io.ringfence/call"].(map[string]any)
		require.Equal(t, sum, meta["result_digest"], "the result's _meta names its digest")
		require.Equal(t, float64(size), meta["result_size"])
		if i == 0 {
			require.NotContains(t, string(got.Content), "<i>", "the sanitizer changed the text")
			asSent, _ := auditorDigest(t, json.RawMessage(`[{"type":"text","text":`+string(must(json.Marshal(sent)))+`}]`), false, nil)
			require.NotEqual(t, asSent, att.ResultDigest, "the digest is of the delivered form, not of the server's")
		} else {
			require.NotEmpty(t, got.StructuredContent)
		}
	}
}

// TestAResultThePoolBuiltReachesTheGRPCCallerWhole: a result the pool built with a Go value
// structpb does not take (the connect tool's []string of tools) reaches the gRPC caller as its
// JSON reads, not without its structured content, and the caller recomputes its digest.
func TestAResultThePoolBuiltReachesTheGRPCCallerWhole(t *testing.T) {
	res := &CallResult{Result: audit.ResultSucceeded, Content: []map[string]any{{"type": "text", "text": "Connected."}},
		StructuredContent: map[string]any{"server": "tickets", "state": ConnectConnected, "tools": []string{"whoami", "alpha"}}}
	resp := callToProto(res)
	require.Equal(t, map[string]any{"server": "tickets", "state": ConnectConnected, "tools": []any{"whoami", "alpha"}}, resp.GetStructuredContent().AsMap())
	sum, size, err := mcpgate.ResultDigest(res.Content, res.StructuredContent, res.IsError)
	require.NoError(t, err)
	wantSum, wantSize := grpcResultDigest(t, resp)
	require.Equal(t, wantSum, sum)
	require.Equal(t, wantSize, size)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
