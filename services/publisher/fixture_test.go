package publisher

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
	"github.com/ringfence/ringfence/mcpgate/screen"
	"github.com/ringfence/ringfence/services/registry"
)

const adminKey = "publisher-test-admin-key-0123456789"

// fakeDiscoverer stands in for the pool: it serves listings built the way the pool builds them
// (the real screen and the real pin) from declarations the test writes, or a failure.
type fakeDiscoverer struct {
	mu       sync.Mutex
	reg      *registry.Service
	decls    map[string][]string
	failures map[string]error
	calls    int
}

var _ Discoverer = (*fakeDiscoverer)(nil)

func (f *fakeDiscoverer) DiscoverTools(ctx context.Context, ref string) (*discovery.Listing, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	p, err := f.reg.ServerPolicy(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := f.failures[ref]; err != nil {
		return nil, err
	}
	return listingOf(ref, p, f.decls[ref])
}

// listingOf pins and screens raw tool declarations (tools/list entries) as the pool does.
func listingOf(ref string, p mcpserver.Policy, raws []string) (*discovery.Listing, error) {
	decls := make([]mcpdecl.Declaration, len(raws))
	for i, raw := range raws {
		d, err := mcpdecl.FromJSON([]byte(raw))
		if err != nil {
			return nil, &discovery.Failure{Class: discovery.ClassProtocolViolation, Message: err.Error()}
		}
		decls[i] = d
	}
	report := screen.Screen(decls, screen.Context{})
	l := &discovery.Listing{ServerRef: ref, Revision: p.Revision}
	for _, f := range report.Listing {
		l.Findings = append(l.Findings, discovery.Finding{Code: f.Code, Severity: f.Severity.String(), Location: f.Location, Message: f.Message})
	}
	for i, d := range decls {
		t := discovery.Tool{Name: d.Name, Title: d.Title, Description: d.Description, InputSchema: d.InputSchema,
			OutputSchema: d.OutputSchema, Annotations: d.Annotations, Excluded: !p.Filter.Allows(d.Name)}
		for _, f := range report.Tools[i].Findings {
			t.Findings = append(t.Findings, discovery.Finding{Code: f.Code, Severity: f.Severity.String(), Location: f.Location, Message: f.Message})
		}
		if h, err := mcpdecl.Hash(d); err == nil {
			t.SchemaHash = h
		}
		l.Tools = append(l.Tools, t)
	}
	return l, nil
}

func (f *fakeDiscoverer) serve(ref string, decls ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decls[ref] = decls
}

func (f *fakeDiscoverer) fail(ref string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures[ref] = err
}

func (f *fakeDiscoverer) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// tool is a tools/list entry.
func tool(name, description string) string {
	b, _ := json.Marshal(map[string]any{
		"name": name, "description": description,
		"inputSchema": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}},
	})
	return string(b)
}

type fixture struct {
	svc    *Service
	reg    *registry.Service
	disc   *fakeDiscoverer
	client publisherv1.PublisherServiceClient
	regc   registryv1.RegistryServiceClient
	base   string
	keys   map[string]string
	dbPath string
	// audit receives what the publisher's and the registry's spools forward.
	audit *testutil.AuditRecorder
}

type fixtureOpts struct {
	noDiscoverer bool
	allowInline  bool
}

func newFixture(t *testing.T, opts ...fixtureOpts) *fixture {
	t.Helper()
	var o fixtureOpts
	if len(opts) > 0 {
		o = opts[0]
	}
	dir := t.TempDir()
	box, err := secretbox.LoadOrCreate(filepath.Join(dir, "secrets.key"))
	require.NoError(t, err)
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	recorder := testutil.NewAuditRecorder()
	reg, err := registry.Open(registry.Config{DBPath: filepath.Join(dir, "registry.db"), Secrets: box, Roles: roles, Logger: quiet, AuditSink: recorder})
	require.NoError(t, err)
	t.Cleanup(func() { reg.Close() })
	require.NoError(t, reg.EnsureBootstrapAdmin(t.Context(), adminKey))

	disc := &fakeDiscoverer{reg: reg, decls: map[string][]string{}, failures: map[string]error{}}
	cfg := Config{DBPath: filepath.Join(dir, "publisher.db"), Policies: reg, Discoverer: disc, AllowInlineMCPServers: o.allowInline, Logger: quiet, AuditSink: recorder}
	if o.noDiscoverer {
		cfg.Discoverer = nil
	}
	svc, err := Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { svc.Close() })
	reg.SetStrandFinder(svc) // as ringfenced wires them

	srv := grpcserver.New(grpcserver.Options{Name: "test", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: auth.NewAuthorizer(reg, auth.Rules), Logger: quiet})
	registryv1.RegisterRegistryServiceServer(srv.GRPC(), reg)
	registryv1.RegisterKeyServiceServer(srv.GRPC(), reg)
	publisherv1.RegisterPublisherServiceServer(srv.GRPC(), svc)
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return publisherv1.RegisterPublisherServiceHandler(ctx, mux, conn)
	})
	conn, base := testutil.Serve(t, srv)
	f := &fixture{svc: svc, reg: reg, disc: disc, client: publisherv1.NewPublisherServiceClient(conn),
		regc: registryv1.NewRegistryServiceClient(conn), base: base, keys: map[string]string{auth.RoleAdmin: adminKey},
		dbPath: cfg.DBPath, audit: recorder}
	kc := registryv1.NewKeyServiceClient(conn)
	for name, req := range map[string]*registryv1.CreateKeyRequest{
		auth.RoleAuthor:   {Name: "author", Role: auth.RoleAuthor},
		auth.RoleOperator: {Name: "operator", Role: auth.RoleOperator},
		"acme-author":     {Name: "acme-author", Role: auth.RoleAuthor, Tenant: "acme"},
		"acme-admin":      {Name: "acme-admin", Role: auth.RoleAdmin, Tenant: "acme"},
	} {
		resp, err := kc.CreateKey(testutil.WithKey(t.Context(), adminKey), req)
		require.NoError(t, err)
		f.keys[name] = resp.GetSecret()
	}
	return f
}

func (f *fixture) as(t *testing.T, who string) context.Context {
	return testutil.WithKey(t.Context(), f.keys[who])
}

func (f *fixture) author(t *testing.T) context.Context { return f.as(t, auth.RoleAuthor) }

func (f *fixture) admin(t *testing.T) context.Context { return f.as(t, auth.RoleAdmin) }

// register registers a stdio server with grants (an operator's step).
func (f *fixture) register(t *testing.T, ref string, grants ...string) {
	t.Helper()
	_, err := f.regc.CreateServer(f.admin(t), &registryv1.CreateServerRequest{Ref: ref, Command: "mcp-server", Grants: grants})
	require.NoError(t, err)
}

func (f *fixture) setGrants(t *testing.T, ref string, grants []string, filter *registryv1.ToolFilter) {
	t.Helper()
	_, err := f.regc.UpdateServer(f.admin(t), &registryv1.UpdateServerRequest{Ref: ref, Command: "mcp-server", Grants: grants, ToolFilter: filter})
	require.NoError(t, err)
}

func (f *fixture) createGraph(t *testing.T, id string, agents ...string) *publisherv1.Graph {
	t.Helper()
	resp, err := f.client.CreateGraph(f.author(t), &publisherv1.CreateGraphRequest{GraphId: id, Agents: agents})
	require.NoError(t, err)
	return resp.GetDraft()
}

func (f *fixture) draft(t *testing.T, id string) *publisherv1.Graph {
	t.Helper()
	resp, err := f.client.GetDraft(f.author(t), &publisherv1.GetDraftRequest{GraphId: id})
	require.NoError(t, err)
	return resp.GetDraft()
}

func (f *fixture) importTools(t *testing.T, graphID, ref, agent string, tools ...string) (*publisherv1.ImportToolsResponse, error) {
	t.Helper()
	return f.client.ImportTools(f.author(t), &publisherv1.ImportToolsRequest{GraphId: graphID, ServerRef: ref, Agent: agent, Tools: tools})
}

// rest sends a JSON request with the author's key.
func (f *fixture) rest(t *testing.T, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, f.base+path, bytes.NewBufferString(body))
	require.NoError(t, err)
	req.Header.Set("X-API-Key", f.keys[auth.RoleAuthor])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	return resp.StatusCode, out
}

func nodeByID(g *publisherv1.Graph, id string) *publisherv1.Node {
	for _, n := range g.GetNodes() {
		if n.GetId() == id {
			return n
		}
	}
	return nil
}

func rulesOf(vs []*publisherv1.Violation) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = fmt.Sprintf("%s@%s", v.GetRule(), v.GetNodeId())
	}
	return out
}
