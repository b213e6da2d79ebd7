package pool

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/documents"
	"github.com/ringfence/ringfence/internal/testutil"
)

// documentsHarness registers fx and gx (both the fixture) and publishes graph g: agent a binds
// echo of each, and its document_resolver lists fx only.
func documentsHarness(t *testing.T, opts harnessOpts) *harness {
	t.Helper()
	opts.host = true
	h := newHarness(t, opts)
	h.server("fx", nil)
	h.server("gx", nil)
	h.publish("g", []string{"a"}, []imp{{server: "fx", agent: "a", tools: []string{"echo"}}, {server: "gx", agent: "a", tools: []string{"echo"}}},
		func(d *publisherv1.Graph) {
			d.GetNodes()[0].GetAgent().DocumentResolver = &publisherv1.DocumentResolver{Enabled: true, ServerNames: []string{"fx"}}
		})
	return h
}

// TestDocumentReferences: a my-documents:// reference becomes the document's content, base64,
// in a call to a server the resolver lists, and stays as written elsewhere; another tenant's
// document, or one that is gone, is refused before dispatch; the audit log keeps the
// reference and never the content.
func TestDocumentReferences(t *testing.T) {
	h := documentsHarness(t, harnessOpts{})
	content := []byte("%PDF-1.7 the quarterly report")
	doc, err := h.pool.PutDocument(h.ctx, auth.DefaultTenant, "report.pdf", "application/pdf", content)
	require.NoError(t, err)
	ref := documents.Scheme + doc.ID
	run := h.start("g")

	res, err := h.call(run, "a", "fx__echo", map[string]any{"text": ref})
	require.NoError(t, err)
	encoded := base64.StdEncoding.EncodeToString(content)
	require.Equal(t, encoded, res.Content[0]["text"], "the listed server gets the content")
	res, err = h.call(run, "a", "gx__echo", map[string]any{"text": ref})
	require.NoError(t, err)
	require.Equal(t, ref, res.Content[0]["text"], "an unlisted server gets the reference as written")

	foreign, err := h.pool.PutDocument(h.ctx, "globex", "theirs.txt", "", []byte("globex's secret"))
	require.NoError(t, err)
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": documents.Scheme + foreign.ID})
	r := requireRefused(t, err, reasonDocumentUnavailable)
	require.Contains(t, r.Error(), "this tenant has no document")
	require.NotContains(t, r.Error(), "globex")

	require.NoError(t, h.pool.DeleteDocument(h.ctx, auth.DefaultTenant, doc.ID))
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": ref})
	requireRefused(t, err, reasonDocumentUnavailable)

	raw, _ := json.Marshal(map[string]any{"text": ref})
	sum, err := ArgsDigest(raw)
	require.NoError(t, err)
	for _, rec := range h.audit.Records() {
		body, err := json.Marshal(rec)
		require.NoError(t, err)
		require.NotContains(t, string(body), encoded, "no record holds a document's content")
		require.NotContains(t, string(body), "quarterly")
	}
	first := h.attempts()[0]
	require.Equal(t, sum, first.ArgsDigest, "the digest is of the arguments as the caller wrote them")
	require.Equal(t, int64(len(raw)), first.ArgsSize)
}

// TestDocumentBounds: one document, one call's documents together and one tenant's documents
// are each bounded.
func TestDocumentBounds(t *testing.T) {
	h := documentsHarness(t, harnessOpts{})
	h.pool.cfg.DocumentMaxBytes, h.pool.cfg.DocumentMaxCallBytes, h.pool.cfg.DocumentMaxTenantBytes = 64, 100, 150

	_, err := h.pool.PutDocument(h.ctx, "", "big", "", make([]byte, 65))
	require.ErrorContains(t, err, "documents.max_bytes")
	_, err = h.pool.PutDocument(h.ctx, "", "empty", "", nil)
	require.ErrorContains(t, err, "is empty")
	a, err := h.pool.PutDocument(h.ctx, "", "a", "", make([]byte, 60))
	require.NoError(t, err)
	b, err := h.pool.PutDocument(h.ctx, "", "b", "", make([]byte, 60))
	require.NoError(t, err)
	_, err = h.pool.PutDocument(h.ctx, "", "c", "", make([]byte, 60))
	require.ErrorIs(t, err, errDocumentQuota)
	_, err = h.pool.PutDocument(h.ctx, "globex", "c", "", make([]byte, 60))
	require.NoError(t, err, "each tenant has its own bound")

	run := h.start("g")
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": documents.Scheme + a.ID})
	require.NoError(t, err)
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": "x", "also": []any{documents.Scheme + a.ID, documents.Scheme + b.ID}})
	r := requireRefused(t, err, reasonDocumentUnavailable)
	require.Contains(t, r.Error(), "more than the 40 this call may still receive")
}

// TestDocumentsFromAPlatformService: with documents.url_template every reference is one
// authenticated GET to the platform's service, for the run's tenant; the built-in store is
// off.
func TestDocumentsFromAPlatformService(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-token\n"), 0o600))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret-token" {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/api/default/doc-7" {
			_, _ = w.Write([]byte("from the platform"))
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	resolver, err := documents.NewHTTP(srv.URL+"/api/{tenant}/{id}", tokenFile)
	require.NoError(t, err)
	h := documentsHarness(t, harnessOpts{documents: resolver})
	run := h.start("g")

	res, err := h.call(run, "a", "fx__echo", map[string]any{"text": documents.Scheme + "doc-7"})
	require.NoError(t, err)
	require.Equal(t, base64.StdEncoding.EncodeToString([]byte("from the platform")), res.Content[0]["text"])
	_, err = h.call(run, "a", "fx__echo", map[string]any{"text": documents.Scheme + "doc-8"})
	requireRefused(t, err, reasonDocumentUnavailable)
	_, err = h.pool.PutDocument(h.ctx, "", "x", "", []byte("x"))
	require.ErrorIs(t, err, errDocumentsElsewhere)
}

// TestDocumentsOverGRPC: a document larger than one gRPC message goes up in chunks and comes
// back in chunks; another tenant's is NOT_FOUND.
func TestDocumentsOverGRPC(t *testing.T) {
	h := newHarness(t, harnessOpts{noImage: true})
	client, ctx := grpcClient(t, h)
	content := make([]byte, 5<<20+123)
	_, _ = rand.Read(content)

	up, err := client.PutDocument(ctx)
	require.NoError(t, err)
	require.NoError(t, up.Send(&poolv1.PutDocumentRequest{Name: "big.bin", MediaType: "application/octet-stream"}))
	for rest := content; len(rest) > 0; {
		n := min(len(rest), 1<<20)
		require.NoError(t, up.Send(&poolv1.PutDocumentRequest{Content: rest[:n]}))
		rest = rest[n:]
	}
	put, err := up.CloseAndRecv()
	require.NoError(t, err)
	doc := put.GetDocument()
	require.Equal(t, int64(len(content)), doc.GetSize())
	require.Equal(t, "big.bin", doc.GetName())
	require.Equal(t, auth.DefaultTenant, doc.GetTenant())

	down, err := client.GetDocument(ctx, &poolv1.GetDocumentRequest{DocumentId: doc.GetDocumentId()})
	require.NoError(t, err)
	var got bytes.Buffer
	messages := 0
	for {
		msg, err := down.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if messages == 0 {
			require.Equal(t, doc.GetSha256(), msg.GetDocument().GetSha256())
		}
		messages++
		got.Write(msg.GetContent())
	}
	require.Equal(t, content, got.Bytes())
	require.Equal(t, 6, messages, "1 MiB at a time")

	down, err = client.GetDocument(ctx, &poolv1.GetDocumentRequest{DocumentId: doc.GetDocumentId(), Tenant: "globex"})
	require.NoError(t, err)
	_, err = down.Recv()
	testutil.RequireStatus(t, err, codes.NotFound)
	_, err = client.DeleteDocument(ctx, &poolv1.DeleteDocumentRequest{DocumentId: "../x"})
	testutil.RequireStatus(t, err, codes.InvalidArgument)
	_, err = client.DeleteDocument(ctx, &poolv1.DeleteDocumentRequest{DocumentId: doc.GetDocumentId()})
	require.NoError(t, err)
	_, err = client.DeleteDocument(ctx, &poolv1.DeleteDocumentRequest{DocumentId: doc.GetDocumentId()})
	testutil.RequireStatus(t, err, codes.NotFound)

	tooBig, err := client.PutDocument(ctx)
	require.NoError(t, err)
	for range 11 {
		if tooBig.Send(&poolv1.PutDocumentRequest{Content: content[:1<<20]}) != nil {
			break
		}
	}
	_, err = tooBig.CloseAndRecv()
	st := testutil.RequireStatus(t, err, codes.InvalidArgument)
	require.True(t, strings.Contains(st.Message(), "documents.max_bytes"), st.Message())
}

// TestApprovalsOverGRPC: the approver's RPCs, through the real server: the call's refusal
// names the approval, ListApprovals shows its arguments, ApproveCall answers the result and
// names the approver in the record.
func TestApprovalsOverGRPC(t *testing.T) {
	h := deskHarness(t, harnessOpts{}, askNonReadOnly)
	client, ctx := grpcClient(t, h)
	run, err := client.StartRun(ctx, &poolv1.StartRunRequest{GraphId: "g"})
	require.NoError(t, err)
	runID := run.GetRun().GetRunId()
	args, err := structpb.NewStruct(map[string]any{"text": "ship it"})
	require.NoError(t, err)
	_, err = client.CallTool(ctx, &poolv1.CallToolRequest{RunId: runID, Agent: "a", Tool: "fx__echo", Arguments: args})
	st := testutil.RequireStatus(t, err, codes.FailedPrecondition)
	refusal := st.Details()[0].(*poolv1.CallRefusal)
	require.Equal(t, reasonApprovalRequired, refusal.GetReason())
	id := refusal.GetApprovalId()
	require.NotEmpty(t, refusal.GetArgsDigest())

	got, err := client.GetRun(ctx, &poolv1.GetRunRequest{RunId: runID})
	require.NoError(t, err)
	require.Equal(t, id, got.GetRun().GetPendingApprovalId())
	list, err := client.ListApprovals(ctx, &poolv1.ListApprovalsRequest{RunId: runID})
	require.NoError(t, err)
	require.Len(t, list.GetApprovals(), 1)
	require.Equal(t, "ship it", list.GetApprovals()[0].GetArguments().GetFields()["text"].GetStringValue())
	require.Equal(t, refusal.GetArgsDigest(), list.GetApprovals()[0].GetArgsDigest())

	_, err = client.ApproveCall(ctx, &poolv1.ApproveCallRequest{RunId: runID, ApprovalId: "apr-nope"})
	testutil.RequireStatus(t, err, codes.NotFound)
	_, err = client.ApproveCall(ctx, &poolv1.ApproveCallRequest{RunId: runID, ApprovalId: "Bad/Id"})
	testutil.RequireStatus(t, err, codes.InvalidArgument)
	resp, err := client.ApproveCall(ctx, &poolv1.ApproveCallRequest{RunId: runID, ApprovalId: id})
	require.NoError(t, err)
	require.Equal(t, "ship it", resp.GetCall().GetContent()[0].GetFields()["text"].GetStringValue())
	require.Equal(t, id, resp.GetCall().GetApprovalId())
	require.Equal(t, "approved", resp.GetApproval().GetState())
	require.Contains(t, resp.GetApproval().GetDecidedBy(), "key:")
	_, err = client.DenyCall(ctx, &poolv1.DenyCallRequest{RunId: runID, ApprovalId: id})
	testutil.RequireStatus(t, err, codes.FailedPrecondition)

	approved := h.toolCallRecords(func(tc *audit.ToolCallAttempt) bool {
		return tc.Approval != nil && tc.Approval.State == audit.ApprovalApproved && tc.Result == audit.ResultSucceeded
	})
	require.Len(t, approved, 1)
	require.Equal(t, resp.GetApproval().GetDecidedBy(), approved[0].Approval.DecidedBy)
}
