package pool

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// What the RPC boundary guarantees a caller: server-chosen text reaches it safe, the details
// name the attempt as the audit log does, and a request the audit log could not hold is
// refused up front instead of going unrecorded.

func detail[T any](t *testing.T, st *status.Status) T {
	t.Helper()
	for _, d := range st.Details() {
		if v, ok := d.(T); ok {
			return v
		}
	}
	var zero T
	t.Fatalf("status %v carries no %T detail", st, zero)
	return zero
}

// TestServerErrorTextReachesTheCallerSafe: a server answers tools/call with a JSON-RPC error
// whose message holds markup, a role marker, a hidden character and the value of its env
// secret. The CallFailure (and the status message) carry it escaped, marker-free and masked,
// and no audit record holds the secret.
func TestServerErrorTextReachesTheCallerSafe(t *testing.T) {
	const canary = "canary-app-token-5f1e93"
	h := newHarness(t)
	h.server("fx", func(r *registryv1.CreateServerRequest) { r.Env = env("APP_TOKEN", canary) }, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"rpc_error"}}}, nil)
	client, ctx := grpcClient(t, h)
	run := h.start("g")

	_, err := client.CallTool(ctx, &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: "fx__rpc_error"})
	st := rftestutil.RequireStatus(t, err, codes.Unknown)
	fail := detail[*poolv1.CallFailure](t, st)
	require.Equal(t, failureTransport, fail.GetFailureClass())
	require.True(t, fail.GetMayHaveTakenEffect())
	for _, msg := range []string{fail.GetMessage(), st.Message()} {
		require.Contains(t, msg, "&lt;script&gt;alert(1)&lt;/script&gt;")
		require.NotContains(t, msg, "<script>")
		require.NotContains(t, msg, "__system__")
		require.NotContains(t, msg, "\u200b")
		require.NotContains(t, msg, canary)
		require.Contains(t, msg, "token="+spawner.Mask)
	}

	att := h.last()
	require.NotEmpty(t, fail.GetCallId(), "the pool's own call id is in the detail")
	require.Equal(t, att.CallID, fail.GetCallId())
	require.Equal(t, att.Attempt, fail.GetAttempt())
	for _, r := range h.audit.Records() {
		b, err := json.Marshal(r)
		require.NoError(t, err)
		require.NotContains(t, string(b), canary)
	}
}

// TestErrorDetailsNameTheAttemptAsTheAuditLogDoes: without a call id from the caller, the
// refusal's detail carries the id the pool generated, the one in the audit record; with one,
// the detail numbers the attempts of that id.
func TestErrorDetailsNameTheAttemptAsTheAuditLogDoes(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	client, ctx := grpcClient(t, h)
	run := h.start("g")

	_, err := client.CallTool(ctx, &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: "fx__nope"})
	ref := detail[*poolv1.CallRefusal](t, rftestutil.RequireStatus(t, err, codes.NotFound))
	require.Equal(t, reasonUnknownTool, ref.GetReason())
	require.NotEmpty(t, ref.GetCallId())
	att := h.last()
	require.Equal(t, att.CallID, ref.GetCallId())
	require.Equal(t, int32(1), ref.GetAttempt())

	for want := int32(1); want <= 2; want++ {
		_, err = client.CallTool(ctx, &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: "fx__nope", CallId: "mine"})
		ref = detail[*poolv1.CallRefusal](t, rftestutil.RequireStatus(t, err, codes.NotFound))
		require.Equal(t, "mine", ref.GetCallId())
		require.Equal(t, want, ref.GetAttempt())
		require.Equal(t, want, h.last().Attempt)
	}
}

// TestCallFieldsAreCheckedAtTheBoundary: a field the audit log could not hold is refused with
// INVALID_ARGUMENT naming the field and its limit, before any gate (nothing is recorded for
// such a malformed request); every well-formed attempt, up to those limits, is recorded.
func TestCallFieldsAreCheckedAtTheBoundary(t *testing.T) {
	h := newHarness(t)
	h.server("fx", nil)
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"echo"}}}, nil)
	client, ctx := grpcClient(t, h)
	run := h.start("g")
	long := strings.Repeat("x", 600)

	for _, tc := range []struct {
		name         string
		req          *poolv1.CallToolRequest
		field, limit string
	}{
		{"no run id", &poolv1.CallToolRequest{Agent: "a", Tool: "fx__echo"}, "run_id", "is required: StartRun answers it"},
		{"a run id no run can have", &poolv1.CallToolRequest{RunId: long, Agent: "a", Tool: "fx__echo"}, "run_id", "128"},
		{"no agent", &poolv1.CallToolRequest{RunId: run, Tool: "fx__echo"}, "agent", "128"},
		{"a 600-byte agent", &poolv1.CallToolRequest{RunId: run, Agent: long, Tool: "fx__echo"}, "agent", "128"},
		{"no tool", &poolv1.CallToolRequest{RunId: run, Agent: "a"}, "tool", "is required: the name the agent offers its model, <server>__<tool> (ListAgentTools"},
		{"a 600-byte tool", &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: long}, "tool", "512"},
		{"a 600-byte call id", &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: "fx__echo", CallId: long}, "call_id", "512"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.CallTool(ctx, tc.req)
			st := rftestutil.RequireStatus(t, err, codes.InvalidArgument)
			require.Contains(t, st.Message(), tc.limit)
			bad := detail[*errdetails.BadRequest](t, st)
			require.Equal(t, tc.field, bad.GetFieldViolations()[0].GetField())
		})
	}
	_, err := client.GetRun(ctx, &poolv1.GetRunRequest{})
	rftestutil.RequireStatus(t, err, codes.InvalidArgument)
	// An id left out says where the ids come from.
	_, err = client.DenyCall(ctx, &poolv1.DenyCallRequest{RunId: run})
	require.Contains(t, rftestutil.RequireStatus(t, err, codes.InvalidArgument).Message(), "approval_id: is required: ListApprovals")
	_, err = client.DeleteDocument(ctx, &poolv1.DeleteDocumentRequest{})
	require.Contains(t, rftestutil.RequireStatus(t, err, codes.InvalidArgument).Message(), "document_id: is required: PutDocument answers it")
	_, err = client.RevokeAgentToken(ctx, &poolv1.RevokeAgentTokenRequest{RunId: run})
	require.Contains(t, rftestutil.RequireStatus(t, err, codes.InvalidArgument).Message(), "token_id: is required: ListAgentTokens")
	_, err = client.EndRun(ctx, &poolv1.EndRunRequest{RunId: long})
	rftestutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Empty(t, h.attempts(), "a malformed request is not an attempt on record")

	// Right at the limits, every attempt is well-formed and lands in the audit log.
	agent, tool := strings.Repeat("b", 128), strings.Repeat("t", 512)
	_, err = client.CallTool(ctx, &poolv1.CallToolRequest{RunId: run, Agent: agent, Tool: "fx__echo", CallId: strings.Repeat("c", 512)})
	rftestutil.RequireStatus(t, err, codes.NotFound)
	_, err = client.CallTool(ctx, &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: tool})
	rftestutil.RequireStatus(t, err, codes.NotFound)
	got := h.attempts()
	require.Len(t, got, 2)
	require.Equal(t, agent, got[0].AgentNode)
	require.Equal(t, tool, got[1].ToolName)

	// An attempt whose record cannot be written (here an in-process caller past the boundary)
	// is never dropped silently: the caller is told.
	_, err = h.pool.CallTool(h.ctx, CallRequest{RunID: run, Agent: long, Tool: "fx__echo"})
	ref := requireRefused(t, err, reasonUnknownAgent)
	require.ErrorContains(t, ref, "could not be recorded in the audit log")
	st := status.Convert(callStatus(h.ctx, h.pool, err))
	require.Contains(t, detail[*poolv1.CallRefusal](t, st).GetMessage(), "could not be recorded in the audit log")
}

// TestSecretsStayInTheSandbox: the values a server is given never come back out of it: not in
// a result (a tool that prints its environment), not in a declaration (which hard-fails, so it
// cannot be pinned), and a server's stderr, where it writes what it likes, reaches only
// operators.
func TestSecretsStayInTheSandbox(t *testing.T) {
	const canary = "canary-app-token-5f1e93"
	h := newHarness(t)
	h.server("fx", func(r *registryv1.CreateServerRequest) { r.Env = env("APP_TOKEN", canary) }, "--runtime-tools")
	h.publish("g", []string{"a"}, []imp{{"fx", "a", []string{"env", "echo"}}}, nil)
	admin, adminCtx := grpcClient(t, h)

	t.Run("in a result", func(t *testing.T) {
		res, err := admin.CallTool(adminCtx, &poolv1.CallToolRequest{RunId: h.start("g"), Agent: "a", Tool: "fx__env"})
		require.NoError(t, err)
		b, err := protojson.Marshal(res)
		require.NoError(t, err)
		require.NotContains(t, string(b), canary)
		require.Contains(t, string(b), "APP_TOKEN="+spawner.Mask)
	})
	t.Run("in a declaration", func(t *testing.T) {
		h.server("leaky", func(r *registryv1.CreateServerRequest) { r.Env = env("APP_TOKEN", canary) }, "--describe", "echo=build "+canary)
		listing, err := h.pool.DiscoverTools(h.ctx, "leaky")
		require.NoError(t, err)
		b, err := json.Marshal(listing)
		require.NoError(t, err)
		require.NotContains(t, string(b), canary)
		for _, tool := range listing.Tools {
			if tool.Name == "echo" {
				require.Equal(t, "build "+spawner.Mask, tool.Description)
				require.True(t, tool.HasHardFailure(), "a declaration holding a secret cannot be pinned")
			} else {
				require.False(t, tool.HasHardFailure(), tool.Name)
			}
		}
	})
	t.Run("in the stderr tail", func(t *testing.T) {
		_, err := h.reg.UpdateServer(h.ctx, &registryv1.UpdateServerRequest{Ref: "fx", Command: "mcpfixture", Args: []string{"--stderr-env", "APP_TOKEN", "--exit-before-handshake"},
			Grants: []string{"process_spawn", "external_api_call"}})
		require.NoError(t, err)
		key, err := h.reg.CreateKey(h.ctx, &registryv1.CreateKeyRequest{Name: "runner", Role: auth.RoleRunner})
		require.NoError(t, err)
		runner := rftestutil.WithKey(t.Context(), key.GetSecret())
		args, err := structpb.NewStruct(map[string]any{"text": "x"})
		require.NoError(t, err)
		tails := map[string]string{}
		for who, ctx := range map[string]context.Context{"admin": adminCtx, "runner": runner} {
			_, err := admin.CallTool(ctx, &poolv1.CallToolRequest{RunId: h.start("g"), Agent: "a", Tool: "fx__echo", Arguments: args})
			st := rftestutil.RequireStatus(t, err, codes.Unavailable)
			ref := detail[*poolv1.CallRefusal](t, st)
			require.Equal(t, "exited_before_handshake", ref.GetServerFailure().GetClass())
			tails[who] = ref.GetServerFailure().GetStderrTail()
		}
		require.Contains(t, tails["admin"], "APP_TOKEN="+spawner.Mask)
		require.NotContains(t, tails["admin"], canary)
		require.Contains(t, tails["runner"], "withheld")
		require.NotContains(t, tails["runner"], "APP_TOKEN")
	})
}
