package pool

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
)

// The pool's RPCs act in the tenant of the caller's key, whatever the request says. Every
// refusal here comes before a server would be spawned, so the harness runs without an image.

// tenantKey mints a runner key bound to tenant and returns a context carrying it.
func tenantKey(t *testing.T, h *harness, tenant string) context.Context {
	t.Helper()
	return tenantRoleKey(t, h, tenant, auth.RoleRunner)
}

// tenantRoleKey mints a key of role bound to tenant and returns a context carrying it.
func tenantRoleKey(t *testing.T, h *harness, tenant, role string) context.Context {
	t.Helper()
	req := &registryv1.CreateKeyRequest{Name: role + "-" + tenant, Role: role, Tenant: tenant}
	ctx, err := auth.NewAuthorizer(nil, auth.Rules).Resolve(h.ctx, registryv1.KeyService_CreateKey_FullMethodName, req) // as the interceptor does
	require.NoError(t, err)
	resp, err := h.reg.CreateKey(ctx, req)
	require.NoError(t, err)
	require.Equal(t, tenant, resp.GetKey().GetTenant())
	return rftestutil.WithKey(t.Context(), resp.GetSecret())
}

// TestRunsOfAnotherTenantAreNotFoundOverGRPC: a key bound to acme cannot read, pause, resume,
// list the agents' tools of, call in or end a run of the default tenant through the gRPC API: each is NOT_FOUND, as if
// the run did not exist, and the run is left as it was.
func TestRunsOfAnotherTenantAreNotFoundOverGRPC(t *testing.T) {
	h := newHarness(t, harnessOpts{noImage: true})
	h.publish("g", []string{"a"}, nil, nil)
	client, unbound := grpcClient(t, h)
	acme := tenantKey(t, h, "acme")
	run := h.start("g")

	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"get", func() error { _, err := client.GetRun(acme, &poolv1.GetRunRequest{RunId: run}); return err }},
		{"pause", func() error { _, err := client.PauseRun(acme, &poolv1.PauseRunRequest{RunId: run}); return err }},
		{"resume", func() error { _, err := client.ResumeRun(acme, &poolv1.ResumeRunRequest{RunId: run}); return err }},
		{"tools", func() error {
			_, err := client.ListAgentTools(acme, &poolv1.ListAgentToolsRequest{RunId: run, Agent: "a"})
			return err
		}},
		{"call", func() error {
			_, err := client.CallTool(acme, &poolv1.CallToolRequest{RunId: run, Agent: "a", Tool: "fx__echo"})
			return err
		}},
		{"end", func() error {
			_, err := client.EndRun(acme, &poolv1.EndRunRequest{RunId: run, Status: StateCompleted})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := rftestutil.RequireStatus(t, tc.call(), codes.NotFound)
			if tc.name == "call" {
				require.Equal(t, reasonUnknownRun, detail[*poolv1.CallRefusal](t, st).GetReason())
			}
		})
	}

	got, err := client.GetRun(unbound, &poolv1.GetRunRequest{RunId: run})
	require.NoError(t, err, "the run exists: an unbound key sees it")
	require.Equal(t, auth.DefaultTenant, got.GetRun().GetTenant())
	require.Equal(t, StateRunning, got.GetRun().GetState(), "acme's attempts left the run as it was")
	_, err = client.GetRun(tenantKey(t, h, auth.DefaultTenant), &poolv1.GetRunRequest{RunId: run})
	require.NoError(t, err, "a key bound to the run's own tenant sees it")
}

// twoTenants is a harness with graph g published in the default tenant and in acme.
func twoTenants(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t, harnessOpts{noImage: true})
	h.publish("g", []string{"a"}, nil, nil)
	acmeAdmin := auth.WithTenancy(auth.WithPrincipal(t.Context(), auth.Principal{KeyID: "key_acme", Role: auth.RoleAdmin, Permissions: auth.AllPermissions, Tenant: "acme"}),
		auth.Tenancy{Tenant: "acme"})
	_, err := h.pub.CreateGraph(acmeAdmin, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"a"}})
	require.NoError(t, err)
	_, err = h.pub.Publish(acmeAdmin, &publisherv1.PublishRequest{GraphId: "g"})
	require.NoError(t, err)
	return h
}

// TestStartRunKeepsToTheKeysTenant: a key bound to acme starts its runs in acme (against
// acme's graph of the same id, not the default tenant's) and may not name another tenant.
func TestStartRunKeepsToTheKeysTenant(t *testing.T) {
	h := twoTenants(t)
	client, _ := grpcClient(t, h)
	acme := tenantKey(t, h, "acme")

	_, err := client.StartRun(acme, &poolv1.StartRunRequest{GraphId: "g", Tenant: "globex"})
	st := rftestutil.RequireStatus(t, err, codes.PermissionDenied)
	require.Contains(t, st.Message(), `"acme"`)

	started, err := client.StartRun(acme, &poolv1.StartRunRequest{GraphId: "g"})
	require.NoError(t, err)
	require.Equal(t, "acme", started.GetRun().GetTenant(), "the run is in the key's tenant")
	started, err = client.StartRun(acme, &poolv1.StartRunRequest{GraphId: "g", Tenant: "acme"})
	require.NoError(t, err, "naming its own tenant is fine")
	require.Equal(t, "acme", started.GetRun().GetTenant())
}

// TestRefusalMessagesNameThePoolOnce: a refusal wraps sentinels that stand alone elsewhere
// ("pool: no run …"); the status and its detail say "pool:" once, and the detail
// carries the problem alone.
func TestRefusalMessagesNameThePoolOnce(t *testing.T) {
	h := newHarness(t, harnessOpts{noImage: true})
	h.publish("g", []string{"a"}, nil, nil)
	client, admin := grpcClient(t, h)
	paused := h.start("g")
	_, err := h.pool.PauseRun(h.ctx, paused, "")
	require.NoError(t, err)

	for _, tc := range []struct {
		name, run, reason, message, problem string
		code                                codes.Code
	}{
		{"no such run", "nosuch", reasonUnknownRun,
			"pool: refused before dispatch (unknown_run): no run \"nosuch\" in tenant \"default\" (a key bound to no tenant names the run's tenant, or acts for \"default\"); nothing reached the server",
			"no run \"nosuch\" in tenant \"default\" (a key bound to no tenant names the run's tenant, or acts for \"default\")", codes.NotFound},
		{"paused run", paused, reasonRunNotRunning,
			"pool: refused before dispatch (run_not_running): the run is not running (it is paused): resume it first (ringfence runs resume --run " + paused + "); nothing reached the server",
			"the run is not running (it is paused): resume it first (ringfence runs resume --run " + paused + ")", codes.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.CallTool(admin, &poolv1.CallToolRequest{RunId: tc.run, Agent: "a", Tool: "fx__echo"})
			st := rftestutil.RequireStatus(t, err, tc.code)
			require.Equal(t, tc.message, st.Message())
			d := detail[*poolv1.CallRefusal](t, st)
			require.Equal(t, tc.reason, d.GetReason())
			require.Equal(t, tc.problem, d.GetMessage())
		})
	}
}

// TestRunIDsAreScopedToTheirTenant: two tenants may use the same run id; each key reaches its
// own tenant's run, a key not bound to a tenant names the tenant (or gets "default"), and
// ending one leaves the other running. Before, the second start was ALREADY_EXISTS: a tenant
// could learn which ids another used, and take a predictable one first.
func TestRunIDsAreScopedToTheirTenant(t *testing.T) {
	h := twoTenants(t)
	client, unbound := grpcClient(t, h)
	acme := tenantKey(t, h, "acme")
	own := tenantKey(t, h, auth.DefaultTenant)

	_, err := client.StartRun(own, &poolv1.StartRunRequest{GraphId: "g", RunId: "nightly"})
	require.NoError(t, err)
	started, err := client.StartRun(acme, &poolv1.StartRunRequest{GraphId: "g", RunId: "nightly"})
	require.NoError(t, err, "another tenant's run id is not taken in acme")
	require.Equal(t, "acme", started.GetRun().GetTenant())
	_, err = client.StartRun(acme, &poolv1.StartRunRequest{GraphId: "g", RunId: "nightly"})
	rftestutil.RequireStatus(t, err, codes.AlreadyExists)

	tenantOf := func(ctx context.Context, tenant string) string {
		t.Helper()
		got, err := client.GetRun(ctx, &poolv1.GetRunRequest{RunId: "nightly", Tenant: tenant})
		require.NoError(t, err)
		return got.GetRun().GetTenant()
	}
	require.Equal(t, "acme", tenantOf(acme, ""))
	require.Equal(t, auth.DefaultTenant, tenantOf(own, ""))
	require.Equal(t, auth.DefaultTenant, tenantOf(unbound, ""), "an unbound key acts for the default tenant")
	require.Equal(t, "acme", tenantOf(unbound, "acme"))
	_, err = client.GetRun(acme, &poolv1.GetRunRequest{RunId: "nightly", Tenant: auth.DefaultTenant})
	require.Contains(t, rftestutil.RequireStatus(t, err, codes.PermissionDenied).Message(), `"acme"`)
	_, err = client.GetRun(unbound, &poolv1.GetRunRequest{RunId: "nightly", Tenant: "Not/A/Tenant"})
	rftestutil.RequireStatus(t, err, codes.InvalidArgument)

	// A call names its run's tenant the same way, and is recorded under it.
	_, err = client.CallTool(unbound, &poolv1.CallToolRequest{RunId: "nightly", Tenant: "acme", Agent: "a", Tool: "nope"})
	require.Equal(t, reasonUnknownTool, detail[*poolv1.CallRefusal](t, rftestutil.RequireStatus(t, err, codes.NotFound)).GetReason())
	last := h.last()
	require.Equal(t, "nightly", last.RunID)
	// The last tool-call record, not the last record: the registry's records (the keys made
	// above) reach the same sink by a forwarder of their own, and may arrive after it.
	recs := h.audit.Records()
	lastCall := len(recs) - 1
	for recs[lastCall].ToolCall == nil {
		lastCall--
	}
	require.Equal(t, "acme", recs[lastCall].Tenant)

	ended, err := client.EndRun(unbound, &poolv1.EndRunRequest{RunId: "nightly", Tenant: "acme"})
	require.NoError(t, err)
	require.Equal(t, "acme", ended.GetRun().GetTenant())
	require.Equal(t, StateCompleted, ended.GetRun().GetState())
	got, err := client.GetRun(own, &poolv1.GetRunRequest{RunId: "nightly"})
	require.NoError(t, err)
	require.Equal(t, StateRunning, got.GetRun().GetState(), "the default tenant's run of the same id still runs")
	got, err = client.GetRun(acme, &poolv1.GetRunRequest{RunId: "nightly"})
	require.NoError(t, err)
	require.Equal(t, StateCompleted, got.GetRun().GetState(), "acme's ended run is read back from the store")
}

// TestABadRunIDIsDescribedAlikeEverywhere: StartRun said "must match ^[A-Za-z0-9_.-]{1,128}$"
// where every other run RPC said which characters; one message now.
func TestABadRunIDIsDescribedAlikeEverywhere(t *testing.T) {
	h := newHarness(t, harnessOpts{noImage: true})
	h.publish("g", []string{"a"}, nil, nil)
	client, admin := grpcClient(t, h)
	const want = `run_id: "bad id" holds a space, which is not allowed: use 1 to 128 of A-Z a-z 0-9 _ . -, not only dots`
	_, err := client.StartRun(admin, &poolv1.StartRunRequest{GraphId: "g", RunId: "bad id"})
	st := rftestutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Contains(t, st.Message(), want)
	_, err = client.GetRun(admin, &poolv1.GetRunRequest{RunId: "bad id"})
	st = rftestutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Contains(t, st.Message(), want)
}

// TestCallerChosenIDsAreRefusedAtEntry: a run id or call id made only of dots, or holding a
// character outside its documented set, is refused before anything happens, naming the field
// and the set.
func TestCallerChosenIDsAreRefusedAtEntry(t *testing.T) {
	h := newHarness(t, harnessOpts{noImage: true})
	h.publish("g", []string{"a"}, nil, nil)
	client, admin := grpcClient(t, h)
	for _, id := range []string{".", "..", "...", "a/b", "r\u202e1"} {
		_, err := client.StartRun(admin, &poolv1.StartRunRequest{GraphId: "g", RunId: id})
		st := rftestutil.RequireStatus(t, err, codes.InvalidArgument)
		require.Contains(t, st.Message(), "run_id: ", id)
		require.Contains(t, st.Message(), "use 1 to 128 of A-Z a-z 0-9 _ . -, not only dots", id)
	}
	run, err := client.StartRun(admin, &poolv1.StartRunRequest{GraphId: "g"})
	require.NoError(t, err)
	for _, id := range []string{".", "..", "call id", "c/1", "c\u202e1", strings.Repeat("c", 513)} {
		_, err := client.CallTool(admin, &poolv1.CallToolRequest{RunId: run.GetRun().GetRunId(), Agent: "a", Tool: "x", CallId: id})
		st := rftestutil.RequireStatus(t, err, codes.InvalidArgument)
		require.Contains(t, st.Message(), "call_id: ", id)
		require.Contains(t, st.Message(), "use 1 to 512 of A-Z a-z 0-9 _ . : -, not only dots", id)
	}
}

// TestAnotherTenantsThingsAnswerAsNothingDoes walks every PoolService RPC that names a run,
// approval, token or document with a key bound to acme and the ids of the default tenant's
// things, and then with ids nothing has: each answer is the same (code and message, the id
// aside), so acme learns nothing of what the default tenant has, and the default tenant's
// things are left as they were.
func TestAnotherTenantsThingsAnswerAsNothingDoes(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	client, unbound := grpcClient(t, h)
	acme := tenantRoleKey(t, h, "acme", auth.RoleAdmin)

	run := h.start("g")
	_, err := h.call(run, "a", "fx__echo", map[string]any{"text": "x"})
	approval := requireRefused(t, err, reasonApprovalRequired).ApprovalID
	tok, _, err := h.pool.CreateAgentToken(h.ctx, auth.DefaultTenant, run, "a", 0)
	require.NoError(t, err)
	doc, err := h.pool.PutDocument(h.ctx, auth.DefaultTenant, "n.txt", "text/plain", []byte("the default tenant's"))
	require.NoError(t, err)

	type ids struct{ run, approval, token, doc string }
	theirs := ids{run, approval, tok.ID, doc.ID}
	none := ids{"run-" + randomHex(), "apr-" + randomHex(), "tok-" + randomHex(), "doc-" + randomHex()}
	for _, tc := range []struct {
		name string
		call func(ids) error
	}{
		{"GetRun", func(i ids) error { _, err := client.GetRun(acme, &poolv1.GetRunRequest{RunId: i.run}); return err }},
		{"PauseRun", func(i ids) error { _, err := client.PauseRun(acme, &poolv1.PauseRunRequest{RunId: i.run}); return err }},
		{"ResumeRun", func(i ids) error {
			_, err := client.ResumeRun(acme, &poolv1.ResumeRunRequest{RunId: i.run})
			return err
		}},
		{"EndRun", func(i ids) error {
			_, err := client.EndRun(acme, &poolv1.EndRunRequest{RunId: i.run, Status: StateFailed})
			return err
		}},
		{"CallTool", func(i ids) error {
			_, err := client.CallTool(acme, &poolv1.CallToolRequest{RunId: i.run, Agent: "a", Tool: "fx__peek"})
			return err
		}},
		{"ListAgentTools", func(i ids) error {
			_, err := client.ListAgentTools(acme, &poolv1.ListAgentToolsRequest{RunId: i.run, Agent: "a"})
			return err
		}},
		{"ListApprovals", func(i ids) error {
			_, err := client.ListApprovals(acme, &poolv1.ListApprovalsRequest{RunId: i.run})
			return err
		}},
		{"ApproveCall", func(i ids) error {
			_, err := client.ApproveCall(acme, &poolv1.ApproveCallRequest{RunId: i.run, ApprovalId: i.approval})
			return err
		}},
		{"DenyCall", func(i ids) error {
			_, err := client.DenyCall(acme, &poolv1.DenyCallRequest{RunId: i.run, ApprovalId: i.approval, Reason: "no"})
			return err
		}},
		{"CreateAgentToken", func(i ids) error {
			_, err := client.CreateAgentToken(acme, &poolv1.CreateAgentTokenRequest{RunId: i.run, Agent: "a"})
			return err
		}},
		{"ListAgentTokens", func(i ids) error {
			_, err := client.ListAgentTokens(acme, &poolv1.ListAgentTokensRequest{RunId: i.run})
			return err
		}},
		{"RevokeAgentToken", func(i ids) error {
			_, err := client.RevokeAgentToken(acme, &poolv1.RevokeAgentTokenRequest{RunId: i.run, TokenId: i.token})
			return err
		}},
		{"GetDocument", func(i ids) error {
			down, err := client.GetDocument(acme, &poolv1.GetDocumentRequest{DocumentId: i.doc})
			if err != nil {
				return err
			}
			_, err = down.Recv()
			return err
		}},
		{"DeleteDocument", func(i ids) error {
			_, err := client.DeleteDocument(acme, &poolv1.DeleteDocumentRequest{DocumentId: i.doc})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := rftestutil.RequireStatus(t, tc.call(theirs), codes.NotFound)
			want := rftestutil.RequireStatus(t, tc.call(none), codes.NotFound)
			hide := strings.NewReplacer(theirs.run, "ID", theirs.approval, "ID", theirs.token, "ID", theirs.doc, "ID",
				none.run, "ID", none.approval, "ID", none.token, "ID", none.doc, "ID")
			require.Equal(t, hide.Replace(want.Message()), hide.Replace(st.Message()), "another tenant's id is answered as one nothing has")
		})
	}

	// A graph only the default tenant published is no graph in acme.
	_, err = client.StartRun(acme, &poolv1.StartRunRequest{GraphId: "g"})
	st := rftestutil.RequireStatus(t, err, codes.NotFound)
	_, err = client.StartRun(acme, &poolv1.StartRunRequest{GraphId: "nothing-here"})
	want := rftestutil.RequireStatus(t, err, codes.NotFound)
	require.Equal(t, strings.ReplaceAll(want.Message(), `"nothing-here"`, `"g"`), st.Message())

	got, err := client.GetRun(unbound, &poolv1.GetRunRequest{RunId: run})
	require.NoError(t, err)
	require.Equal(t, StateRunning, got.GetRun().GetState())
	approvals, err := client.ListApprovals(unbound, &poolv1.ListApprovalsRequest{RunId: run})
	require.NoError(t, err)
	require.Len(t, approvals.GetApprovals(), 1)
	require.Equal(t, approvalPending, approvals.GetApprovals()[0].GetState(), "acme's approve and deny decided nothing")
	tokens, err := client.ListAgentTokens(unbound, &poolv1.ListAgentTokensRequest{RunId: run})
	require.NoError(t, err)
	require.Len(t, tokens.GetTokens(), 1, "acme minted and revoked no token of the run")
	_, _, err = h.pool.GetDocument(h.ctx, auth.DefaultTenant, doc.ID)
	require.NoError(t, err, "acme's delete left the document")
}
