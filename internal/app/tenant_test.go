package app

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/testutil"
)

// TestRESTAnswersAnotherTenantsIDsAsNone walks ringfenced's REST routes that name a graph,
// run, approval, token or document with an admin key bound to acme: globex's ids are
// answered exactly as ids nothing has (status and body, the ids aside), and globex's things
// are left as they were.
func TestRESTAnswersAnotherTenantsIDsAsNone(t *testing.T) {
	s := serveAllInOne(t)
	admin := testutil.WithKey(t.Context(), bootstrapKey)
	minted, err := registryv1.NewKeyServiceClient(s.conn).CreateKey(admin, &registryv1.CreateKeyRequest{Name: "acme-admin", Role: auth.RoleAdmin, Tenant: "acme"})
	require.NoError(t, err)
	acme := minted.GetSecret()

	pub := publisherv1.NewPublisherServiceClient(s.conn)
	_, err = pub.CreateGraph(admin, &publisherv1.CreateGraphRequest{Tenant: "globex", GraphId: "theirs-graph", Agents: []string{"a"}})
	require.NoError(t, err)
	_, err = pub.Publish(admin, &publisherv1.PublishRequest{Tenant: "globex", GraphId: "theirs-graph"})
	require.NoError(t, err)
	pool := poolv1.NewPoolServiceClient(s.conn)
	run, err := pool.StartRun(admin, &poolv1.StartRunRequest{Tenant: "globex", GraphId: "theirs-graph", RunId: "nightly"})
	require.NoError(t, err)
	tok, err := pool.CreateAgentToken(admin, &poolv1.CreateAgentTokenRequest{Tenant: "globex", RunId: "nightly", Agent: "a"})
	require.NoError(t, err)
	up, err := pool.PutDocument(admin)
	require.NoError(t, err)
	require.NoError(t, up.Send(&poolv1.PutDocumentRequest{Tenant: "globex", Name: "n.txt", MediaType: "text/plain", Content: []byte("globex's")}))
	doc, err := up.CloseAndRecv()
	require.NoError(t, err)

	theirs := strings.NewReplacer("{graph}", "theirs-graph", "{run}", "nightly", "{token}", tok.GetToken().GetTokenId(), "{doc}", doc.GetDocument().GetDocumentId())
	none := strings.NewReplacer("{graph}", "nothing-here", "{run}", "run-nothing-here", "{token}", "tok-0123456789abcdef", "{doc}", "doc-0123456789abcdef")
	hide := strings.NewReplacer("nothing-here", "ID", "run-nothing-here", "ID", "tok-0123456789abcdef", "ID", "doc-0123456789abcdef", "ID",
		"theirs-graph", "ID", "nightly", "ID", tok.GetToken().GetTokenId(), "ID", doc.GetDocument().GetDocumentId(), "ID")
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, "http://"+s.httpAddr.String()+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-API-Key", acme)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(raw)
	}
	for _, route := range []struct{ method, path, body string }{
		{"GET", "/v1/graphs/{graph}/draft", ""},
		{"PUT", "/v1/graphs/{graph}/draft", `{"draft":{"nodes":[]}}`},
		{"POST", "/v1/graphs/{graph}/draft:validate", `{}`},
		{"POST", "/v1/graphs/{graph}:import", `{"server_ref":"docs","agent":"a"}`},
		{"POST", "/v1/graphs/{graph}:publish", `{}`},
		{"GET", "/v1/graphs/{graph}/versions", ""},
		{"GET", "/v1/graphs/{graph}/versions/1", ""},
		{"DELETE", "/v1/graphs/{graph}", ""},
		{"POST", "/v1/runs", `{"graph_id":"{graph}"}`},
		{"GET", "/v1/runs/{run}", ""},
		{"POST", "/v1/runs/{run}:call", `{"agent":"a","tool":"x","call_id":"c1"}`},
		{"POST", "/v1/runs/{run}:pause", `{}`},
		{"POST", "/v1/runs/{run}:resume", `{}`},
		{"POST", "/v1/runs/{run}:end", `{"status":"failed"}`},
		{"GET", "/v1/runs/{run}/agents/a/tools", ""},
		{"GET", "/v1/runs/{run}/approvals", ""},
		{"POST", "/v1/runs/{run}/approvals/apr-0123456789abcdef:approve", `{}`},
		{"POST", "/v1/runs/{run}/approvals/apr-0123456789abcdef:deny", `{"reason":"no"}`},
		{"POST", "/v1/runs/{run}/tokens", `{"agent":"a"}`},
		{"GET", "/v1/runs/{run}/tokens", ""},
		{"DELETE", "/v1/runs/{run}/tokens/{token}", ""},
		{"GET", "/v1/documents/{doc}", ""},
		{"DELETE", "/v1/documents/{doc}", ""},
	} {
		t.Run(route.method+" "+route.path, func(t *testing.T) {
			gotCode, got := do(route.method, theirs.Replace(route.path), theirs.Replace(route.body))
			wantCode, want := do(route.method, none.Replace(route.path), none.Replace(route.body))
			require.Equal(t, wantCode, gotCode, got)
			require.Equal(t, hide.Replace(want), hide.Replace(got))
			require.Contains(t, want, "NOT_FOUND", "an id nothing has is not found")
		})
	}

	got, err := pool.GetRun(admin, &poolv1.GetRunRequest{Tenant: "globex", RunId: run.GetRun().GetRunId()})
	require.NoError(t, err)
	require.Equal(t, "running", got.GetRun().GetState(), "acme's pause and end left globex's run")
	tokens, err := pool.ListAgentTokens(admin, &poolv1.ListAgentTokensRequest{Tenant: "globex", RunId: "nightly"})
	require.NoError(t, err)
	require.Len(t, tokens.GetTokens(), 1, "acme minted and revoked no token of globex's run")
	draft, err := pub.GetDraft(admin, &publisherv1.GetDraftRequest{Tenant: "globex", GraphId: "theirs-graph"})
	require.NoError(t, err, "acme's delete left globex's graph")
	require.Len(t, draft.GetDraft().GetNodes(), 1)
}
