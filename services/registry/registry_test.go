package registry

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
)

const (
	adminKey = "test-admin-key-0123456789"
	canary   = "canary-secret-7f3a9c"
)

type fixture struct {
	svc    *Service
	audit  *testutil.AuditRecorder
	conn   *grpc.ClientConn
	base   string
	client registryv1.RegistryServiceClient
	keys   registryv1.KeyServiceClient
	dbPath string
	// logs is everything the service and the server logged.
	logs *testutil.SyncBuffer
	// roleKeys maps each built-in role to a key holding it.
	roleKeys map[string]string
}

func newFixture(t *testing.T) *fixture { return newFixtureWithRoles(t, "") }

// rest sends one REST request with key (none when empty) and returns the status and body.
func (f *fixture) rest(t *testing.T, method, path, key, body string) (int, string) {
	t.Helper()
	code, b, _ := f.restHeaders(t, method, path, key, body)
	return code, b
}

// restHeaders is rest that also returns the response's headers.
func (f *fixture) restHeaders(t *testing.T, method, path, key, body string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, f.base+path, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

// newFixtureWithRoles is newFixture with custom roles (RINGFENCE_SERVICE_ROLES_JSON).
func newFixtureWithRoles(t *testing.T, rolesJSON string) *fixture {
	t.Helper()
	dir := t.TempDir()
	box, err := secretbox.LoadOrCreate(filepath.Join(dir, "secrets.key"))
	require.NoError(t, err)
	roles, err := auth.NewRoles(rolesJSON)
	require.NoError(t, err)
	dbPath := filepath.Join(dir, "registry.db")
	recorder := testutil.NewAuditRecorder()
	logs := &testutil.SyncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc, err := Open(Config{DBPath: dbPath, Secrets: box, Roles: roles, AllowedEnvKeys: []string{"APP_TOKEN", "REGION"}, AuditSink: recorder, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { svc.Close() })
	require.NoError(t, svc.EnsureBootstrapAdmin(t.Context(), adminKey))

	srv := grpcserver.New(grpcserver.Options{Name: "test", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: auth.NewAuthorizer(svc, auth.Rules), Logger: logger})
	registryv1.RegisterRegistryServiceServer(srv.GRPC(), svc)
	registryv1.RegisterKeyServiceServer(srv.GRPC(), svc)
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		if err := registryv1.RegisterRegistryServiceHandler(ctx, mux, conn); err != nil {
			return err
		}
		return registryv1.RegisterKeyServiceHandler(ctx, mux, conn)
	})
	conn, base := testutil.Serve(t, srv)
	f := &fixture{svc: svc, audit: recorder, conn: conn, base: base, client: registryv1.NewRegistryServiceClient(conn),
		keys: registryv1.NewKeyServiceClient(conn), dbPath: dbPath, logs: logs, roleKeys: map[string]string{auth.RoleAdmin: adminKey}}
	for _, role := range []string{auth.RoleOperator, auth.RoleAuthor, auth.RoleRunner, auth.RoleAuditor} {
		resp, err := f.keys.CreateKey(f.admin(t), &registryv1.CreateKeyRequest{Name: role, Role: role})
		require.NoError(t, err)
		f.roleKeys[role] = resp.GetSecret()
	}
	return f
}

func (f *fixture) admin(t *testing.T) context.Context { return testutil.WithKey(t.Context(), adminKey) }

func env(kv ...string) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.Fields[kv[i]] = structpb.NewStringValue(kv[i+1])
	}
	return s
}

func docsSearch() *registryv1.CreateServerRequest {
	return &registryv1.CreateServerRequest{
		Ref: "docs-search", Command: "mcp-server-filesystem", Args: []string{"/srv/docs"},
		Env: env("APP_TOKEN", canary), Grants: []string{"process_spawn", "external_api_call"},
	}
}

func TestCreateGetListDelete(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	created, err := f.client.CreateServer(ctx, docsSearch())
	require.NoError(t, err)
	s := created.GetServer()
	require.Equal(t, "stdio", s.GetTransport(), "transport defaults to stdio")
	require.Zero(t, s.GetMaxResultBytes(), "the default result cap")
	require.Equal(t, int64(1), s.GetRevision())
	require.Equal(t, map[string]string{"APP_TOKEN": SecretMask}, s.GetEnv())

	_, err = f.client.CreateServer(ctx, docsSearch())
	st := testutil.RequireStatus(t, err, codes.AlreadyExists)
	require.Contains(t, st.Message(), `a server with ref "docs-search" already exists: use PUT /v1/mcp/servers/docs-search (UpdateServer, ringfence servers update docs-search)`)

	got, err := f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search"})
	require.NoError(t, err)
	require.Equal(t, SecretMask, got.GetServer().GetEnv()["APP_TOKEN"])

	list, err := f.client.ListServers(ctx, &registryv1.ListServersRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetServers(), 1)

	_, err = f.client.DeleteServer(ctx, &registryv1.DeleteServerRequest{Ref: "docs-search"})
	require.NoError(t, err)
	_, err = f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search"})
	testutil.RequireStatus(t, err, codes.NotFound)
	_, err = f.client.DeleteServer(ctx, &registryv1.DeleteServerRequest{Ref: "docs-search"})
	testutil.RequireStatus(t, err, codes.NotFound)
}

func TestUpdateKeepsEnvWithoutEnvAndClearsWithEmptyEnv(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	_, err := f.client.CreateServer(ctx, docsSearch())
	require.NoError(t, err)

	upd := &registryv1.UpdateServerRequest{Ref: "docs-search", Command: "mcp-server-filesystem", Args: []string{"/srv/other"}, Grants: []string{"process_spawn"}, MaxResultBytes: 4 << 20}
	resp, err := f.client.UpdateServer(ctx, upd)
	require.NoError(t, err)
	require.Equal(t, []string{"/srv/other"}, resp.GetServer().GetArgs())
	require.Equal(t, int64(4<<20), resp.GetServer().GetMaxResultBytes())
	require.Equal(t, []string{"process_spawn"}, resp.GetServer().GetGrants())
	require.Equal(t, int64(2), resp.GetServer().GetRevision())
	res, err := f.svc.ResolveRegistration(ctx, "docs-search")
	require.NoError(t, err)
	require.Equal(t, canary, res.Env["APP_TOKEN"], "PUT without env keeps the stored env")
	require.Equal(t, int64(4<<20), res.ResultCap(), "the pool starts the server with its cap")

	upd.Env = env()
	resp, err = f.client.UpdateServer(ctx, upd)
	require.NoError(t, err)
	require.Empty(t, resp.GetServer().GetEnv(), `"env": {} clears it`)
	res, err = f.svc.ResolveRegistration(ctx, "docs-search")
	require.NoError(t, err)
	require.Empty(t, res.Env)

	upd.Revision = 1
	_, err = f.client.UpdateServer(ctx, upd)
	testutil.RequireStatus(t, err, codes.Aborted)
	upd.Revision = 3
	_, err = f.client.UpdateServer(ctx, upd)
	require.NoError(t, err, "the current revision is accepted")

	upd.Ref = "missing"
	_, err = f.client.UpdateServer(ctx, upd)
	testutil.RequireStatus(t, err, codes.NotFound)
}

func TestBadInputIsRefusedNamingTheFieldAndStoresNothing(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	long := strings.Repeat("a", 5000)
	for _, tc := range []struct {
		name  string
		mod   func(r *registryv1.CreateServerRequest)
		field string
	}{
		{"bad ref", func(r *registryv1.CreateServerRequest) { r.Ref = "Docs Search" }, "ref"},
		{"empty ref", func(r *registryv1.CreateServerRequest) { r.Ref = "" }, "ref"},
		{"ref too long", func(r *registryv1.CreateServerRequest) { r.Ref = strings.Repeat("a", 65) }, "ref"},
		{"no command", func(r *registryv1.CreateServerRequest) { r.Command = "" }, "command"},
		{"unknown transport", func(r *registryv1.CreateServerRequest) { r.Transport = "carrier-pigeon" }, "transport"},
		{"description too long", func(r *registryv1.CreateServerRequest) { r.Description = long }, "description"},
		{"arg too long", func(r *registryv1.CreateServerRequest) { r.Args = []string{long} }, "args[0]"},
		{"too many args", func(r *registryv1.CreateServerRequest) { r.Args = make([]string, 65) }, "args"},
		{"env key not allowlisted", func(r *registryv1.CreateServerRequest) { r.Env = env("SECRET", "x") }, "env.SECRET"},
		{"docker control key", func(r *registryv1.CreateServerRequest) { r.Env = env("DOCKER_HOST", "tcp://x") }, "env.DOCKER_HOST"},
		{"loader key", func(r *registryv1.CreateServerRequest) { r.Env = env("LD_PRELOAD", "/x.so") }, "env.LD_PRELOAD"},
		{"non-string env", func(r *registryv1.CreateServerRequest) {
			r.Env = &structpb.Struct{Fields: map[string]*structpb.Value{"APP_TOKEN": structpb.NewNumberValue(1)}}
		}, "env.APP_TOKEN"},
		{"bad grant", func(r *registryv1.CreateServerRequest) { r.Grants = []string{"Process Spawn"} }, "grants[0]"},
		{"url on stdio", func(r *registryv1.CreateServerRequest) { r.Url = "https://x" }, "url"},
		{"remote without url", func(r *registryv1.CreateServerRequest) {
			r.Transport, r.Command, r.Args, r.Env = "streamable_http", "", nil, nil
		}, "url"},
		{"remote with env", func(r *registryv1.CreateServerRequest) {
			r.Transport, r.Command, r.Args, r.Url = "sse", "", nil, "https://mcp.example.com/sse"
		}, "env"},
		{"header names no secret", func(r *registryv1.CreateServerRequest) {
			r.Transport, r.Command, r.Args, r.Env, r.Url = "streamable_http", "", nil, nil, "https://mcp.example.com/mcp"
			r.Headers = map[string]string{"Authorization": "not a name"}
		}, "headers.Authorization"},
		{"bad filter entry", func(r *registryv1.CreateServerRequest) {
			r.ToolFilter = &registryv1.ToolFilter{Exclude: []string{"rm -rf"}}
		}, "tool_filter.exclude[0]"},
		{"bad tool permission", func(r *registryv1.CreateServerRequest) {
			r.ToolPermissions = map[string]*registryv1.ToolPermissions{"read_file": {Required: []string{"fs.read:{path"}}}
		}, "tool_permissions.read_file[0]"},
		{"result cap too large", func(r *registryv1.CreateServerRequest) { r.MaxResultBytes = 1 << 30 }, "max_result_bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := docsSearch()
			tc.mod(req)
			_, err := f.client.CreateServer(ctx, req)
			st := testutil.RequireStatus(t, err, codes.InvalidArgument)
			require.Contains(t, st.Message(), tc.field)
			var named bool
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
					named = br.GetFieldViolations()[0].GetField() == tc.field
				}
			}
			require.True(t, named, "BadRequest detail names %s", tc.field)
			list, err := f.client.ListServers(ctx, &registryv1.ListServersRequest{})
			require.NoError(t, err)
			require.Empty(t, list.GetServers(), "nothing is stored on bad input")
		})
	}
}

func TestPermissions(t *testing.T) {
	f := newFixture(t)
	_, err := f.client.ListServers(t.Context(), &registryv1.ListServersRequest{})
	testutil.RequireStatus(t, err, codes.Unauthenticated)
	for role, key := range f.roleKeys {
		_, err := f.client.ListServers(testutil.WithKey(t.Context(), key), &registryv1.ListServersRequest{})
		if role == auth.RoleAdmin {
			require.NoError(t, err)
			continue
		}
		st := testutil.RequireStatus(t, err, codes.PermissionDenied, role)
		require.Contains(t, st.Message(), "mcp:admin")
	}
}

// A registry without a pool (started alone, no peers.pool_addr) names the setting that
// gives it one.
func TestListServerToolsWithoutAPoolIsUnavailable(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	_, err := f.client.CreateServer(ctx, docsSearch())
	require.NoError(t, err)
	_, err = f.client.ListServerTools(ctx, &registryv1.ListServerToolsRequest{Ref: "docs-search"})
	st := testutil.RequireStatus(t, err, codes.Unavailable)
	require.Contains(t, st.Message(), "RINGFENCE_PEERS__POOL_ADDR")
	_, err = f.client.ListServerTools(ctx, &registryv1.ListServerToolsRequest{Ref: "unknown"})
	testutil.RequireStatus(t, err, codes.NotFound)
}

// Every "no such server" answer names the ref and how to list the registered ones, and still
// matches mcpserver.ErrNotRegistered for the registry's in-process consumers.
func TestServerNotFoundNamesTheRef(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	for name, call := range map[string]func() error{
		"get": func() error {
			_, err := f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docss"})
			return err
		},
		"update": func() error {
			_, err := f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "docss", Command: "x"})
			return err
		},
		"delete": func() error {
			_, err := f.client.DeleteServer(ctx, &registryv1.DeleteServerRequest{Ref: "docss"})
			return err
		},
		"tools": func() error {
			_, err := f.client.ListServerTools(ctx, &registryv1.ListServerToolsRequest{Ref: "docss"})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			st := testutil.RequireStatus(t, call(), codes.NotFound)
			require.Equal(t, `registry: no server is registered with ref "docss": ListServers (ringfence servers list) shows the registered refs`, st.Message())
		})
	}
	_, err := f.svc.ResolveRegistration(ctx, "docss")
	require.ErrorIs(t, err, mcpserver.ErrNotRegistered)
	_, err = f.svc.ServerPolicy(ctx, "docss")
	require.ErrorIs(t, err, mcpserver.ErrNotRegistered)

	// A typo of a registered ref is answered with it; a ref near none is not.
	_, err = f.client.CreateServer(ctx, docsSearch())
	require.NoError(t, err)
	_, err = f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-serch"})
	st := testutil.RequireStatus(t, err, codes.NotFound)
	require.Equal(t, `registry: no server is registered with ref "docs-serch": did you mean "docs-search"? (ringfence servers list shows the registered refs)`, st.Message())
	_, err = f.client.DeleteServer(ctx, &registryv1.DeleteServerRequest{Ref: "tickets"})
	st = testutil.RequireStatus(t, err, codes.NotFound)
	require.NotContains(t, st.Message(), "did you mean")
}

func TestPaging(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	for i := range 25 {
		req := docsSearch()
		req.Ref = fmt.Sprintf("srv-%02d", i)
		_, err := f.client.CreateServer(ctx, req)
		require.NoError(t, err)
	}
	var refs []string
	token, issued := "", ""
	for {
		resp, err := f.client.ListServers(ctx, &registryv1.ListServersRequest{PageSize: 10, PageToken: token})
		require.NoError(t, err)
		for _, s := range resp.GetServers() {
			refs = append(refs, s.GetRef())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
		issued = token
	}
	require.Len(t, refs, 25)
	require.Equal(t, "srv-00", refs[0])
	require.Equal(t, "srv-24", refs[24])
	// A token the server never issued (any valid base64url, or one from before tokens were
	// versioned) answered an empty, final page: a client with a damaged token concluded the
	// list had ended.
	legacy := base64.RawURLEncoding.EncodeToString([]byte("srv-09"))
	damaged := []byte(issued)
	damaged[3] ^= 1
	for _, tok := range []string{"!!!", "zzz", legacy, string(damaged)} {
		_, err := f.client.ListServers(ctx, &registryv1.ListServersRequest{PageToken: tok})
		st := testutil.RequireStatus(t, err, codes.InvalidArgument)
		require.Equal(t, "registry: page_token is not one this server issued: start again without it", st.Message(), tok)
		require.Len(t, st.Details(), 1, "a BadRequest names the field, as for any invalid input")
		require.Equal(t, "page_token", st.Details()[0].(*errdetails.BadRequest).GetFieldViolations()[0].GetField())
	}
}

func TestSecretsAndHeaderResolution(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	remote := &registryv1.CreateServerRequest{
		Ref: "tickets", Transport: "streamable_http", Url: "https://mcp.example.com/mcp",
		Headers: map[string]string{"Authorization": "tickets-token"}, Grants: []string{"process_spawn", "external_api_call"},
	}
	// The secret comes first: TestHeadersMustNameASecretThatExists.
	_, err := f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tickets-token", Value: "Bearer " + canary})
	require.NoError(t, err)
	_, err = f.client.CreateServer(ctx, remote)
	require.NoError(t, err)
	res, err := f.svc.ResolveRegistration(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, "Bearer "+canary, res.HeaderValues["Authorization"])

	list, err := f.client.ListSecrets(ctx, &registryv1.ListSecretsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetSecrets(), 1)
	require.NotContains(t, list.String(), canary)
	deleted, err := f.client.DeleteSecret(ctx, &registryv1.DeleteSecretRequest{Name: "tickets-token"})
	require.NoError(t, err)
	require.Equal(t, []string{"server tickets still names secret tickets-token (header Authorization): it cannot start until the secret is set again (ringfence secrets set tickets-token) or the server stops naming it"},
		deleted.GetWarnings(), "the deletion stands, and says what it leaves unable to start")
	_, err = f.client.DeleteSecret(ctx, &registryv1.DeleteSecretRequest{Name: "tickets-token"})
	testutil.RequireStatus(t, err, codes.NotFound)
	// Over REST the warning is a Warning header; a secret nothing names deletes without one.
	_, err = f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tickets-token", Value: "Bearer " + canary})
	require.NoError(t, err)
	code, _, warnings := f.restWithHeaders(t, http.MethodDelete, "/v1/secrets/tickets-token", "")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, warnings, 1)
	require.Contains(t, warnings[0], "server tickets still names secret tickets-token")
	_, err = f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "unused", Value: canary})
	require.NoError(t, err)
	unused, err := f.client.DeleteSecret(ctx, &registryv1.DeleteSecretRequest{Name: "unused"})
	require.NoError(t, err)
	require.Empty(t, unused.GetWarnings())

	// A secret deleted after registering: resolving names the header and the server.
	_, err = f.svc.ResolveRegistration(ctx, "tickets")
	require.ErrorIs(t, err, errMissingSecret)
	require.EqualError(t, err, `registry: header "Authorization" of server "tickets" names a secret that no longer exists: ringfence servers show tickets names it; create it again with PutSecret (ringfence secrets set NAME)`)
	_, err = f.svc.Internal().ResolveServer(ctx, &registryinternalv1.ResolveServerRequest{Ref: "tickets"})
	testutil.RequireStatus(t, err, codes.FailedPrecondition)
}

// TestSecretValuesNoHeaderCanCarryAreRefused: a secret is only ever sent as a header value, so
// PutSecret refuses what no header can carry (a line break would make a second header) naming
// value and never quoting it, rather than the pool refusing it when a server starts. Tabs and
// text beyond ASCII are fine.
func TestSecretValuesNoHeaderCanCarryAreRefused(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	for _, tc := range []struct{ name, value, want string }{
		{"header injection", canary + "\r\nX-Evil: 1", "holds a line break or another control character other than tab"},
		{"trailing line break", "Bearer " + canary + "\n", "ends with a line break"},
		{"NUL", canary + "\x00", "holds a line break or another control character"},
		{"escape", "\x1b[31m" + canary, "holds a line break or another control character"},
		{"DEL", canary + "\x7f", "holds a line break or another control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tok", Value: tc.value})
			st := testutil.RequireStatus(t, err, codes.InvalidArgument)
			require.Contains(t, st.Message(), "registry: invalid value: "+tc.want)
			require.NotContains(t, st.Message(), canary)
			require.NotContains(t, f.logs.String(), canary)
		})
	}
	// grpc-go cannot send a string that is not UTF-8; an in-process caller can.
	_, err := f.svc.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tok", Value: canary + "\xff"})
	st := testutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Contains(t, st.Message(), "registry: invalid value: is not valid UTF-8 (the value is not shown)")
	list, err := f.client.ListSecrets(ctx, &registryv1.ListSecretsRequest{})
	require.NoError(t, err)
	require.Empty(t, list.GetSecrets(), "nothing is stored")

	for _, ok := range []string{"Bearer\t" + canary, "Basic cGFzc3fDtnJk: pässwörd"} {
		_, err := f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tok", Value: ok})
		require.NoError(t, err)
	}
}

// TestHeadersMustNameASecretThatExists: a header's value names a registry secret. One that
// names no secret (most likely the credential itself, pasted in its place) is refused when a
// server is created, updated or explored ad hoc, naming the header and how to create the
// secret; one that cannot be a secret's name is refused as invalid. No refusal (gRPC or REST),
// log line, audit record or byte of the bolt file carries the value, and nothing is stored.
func TestHeadersMustNameASecretThatExists(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	f.registerTickets(t, ctx)
	require.NoError(t, f.svc.Spool().Flush(ctx))
	mark := len(f.audit.Records())
	f.svc.SetDiscoverer(fakeDiscoverer{})
	tokenLike := "sk-live-" + canary // a secret's name by shape, but no secret has it

	const unknown = `registry: header "Authorization" names a secret that does not exist (the value sent is not shown: it may be a credential): create the secret first with ringfence secrets set NAME (PutSecret), then send its name; ringfence secrets list shows the secrets that exist`
	for _, tc := range []struct {
		name, value, want string
		code              codes.Code
		http              int
	}{
		{"names no secret", tokenLike, unknown, codes.FailedPrecondition, http.StatusBadRequest},
		{"cannot be a name", "Bearer " + canary, "registry: invalid headers.Authorization: must be the name of a registry secret", codes.InvalidArgument, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			headers := map[string]string{"Authorization": tc.value}
			var shown []string
			check := func(err error) {
				t.Helper()
				st := testutil.RequireStatus(t, err, tc.code)
				require.Contains(t, st.Message(), tc.want)
				shown = append(shown, st.Message(), fmt.Sprint(st.Details()))
			}
			create := tickets()
			create.Ref, create.Headers = "tickets-2", headers
			_, err := f.client.CreateServer(ctx, create)
			check(err)
			_, err = f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "tickets-2"})
			testutil.RequireStatus(t, err, codes.NotFound, "a refused create stores nothing")

			_, err = f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "tickets", Transport: "streamable_http", Url: remoteURL, Headers: headers})
			check(err)
			res, err := f.svc.ResolveRegistration(ctx, "tickets")
			require.NoError(t, err)
			require.Equal(t, "tickets-token", res.Headers["Authorization"], "a refused update changes nothing")

			_, err = f.client.ExploreServer(ctx, &registryv1.ExploreServerRequest{Ref: "adhoc", Server: &registryv1.CreateServerRequest{
				Transport: "sse", Url: "https://mcp.example.com/sse", Headers: headers,
			}})
			check(err)

			body := `{"transport":"streamable_http","url":"https://mcp.example.com/mcp","headers":{"Authorization":"` + tc.value + `"}}`
			code, resp := f.rest(t, http.MethodPost, "/v1/mcp/servers", adminKey, `{"ref":"tickets-2",`+body[1:])
			require.Equal(t, tc.http, code, resp)
			shown = append(shown, resp)
			code, resp = f.rest(t, http.MethodPut, "/v1/mcp/servers/tickets", adminKey, body)
			require.Equal(t, tc.http, code, resp)
			shown = append(shown, resp)

			for _, s := range shown {
				require.NotContains(t, s, canary)
			}
		})
	}

	require.NoError(t, f.svc.Spool().Flush(ctx))
	recs := f.audit.Records()[mark:]
	require.Empty(t, recs, "a refused registration records nothing")
	require.NotContains(t, f.logs.String(), canary, "a log line carries the value")
	raw, err := os.ReadFile(f.dbPath)
	require.NoError(t, err)
	require.NotContains(t, string(raw), canary, "the bolt file holds the value")

	// Once the secret exists, the same name is taken.
	_, err = f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tickets-2-token", Value: "t"})
	require.NoError(t, err)
	create := tickets()
	create.Ref, create.Headers = "tickets-2", map[string]string{"Authorization": "tickets-2-token"}
	_, err = f.client.CreateServer(ctx, create)
	require.NoError(t, err)
}

func TestKeysLifecycle(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	resp, err := f.keys.CreateKey(ctx, &registryv1.CreateKeyRequest{Name: "ci", Role: auth.RoleAdmin})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(resp.GetSecret(), KeyPrefix))
	ciCtx := testutil.WithKey(t.Context(), resp.GetSecret())
	_, err = f.client.ListServers(ciCtx, &registryv1.ListServersRequest{})
	require.NoError(t, err)

	// A tenant-bound key may not touch registrations: TestTenantBoundKeysCannotCallDeploymentRPCs.
	_, err = f.keys.CreateKey(ctx, &registryv1.CreateKeyRequest{Name: "acme-admin", Role: auth.RoleAdmin, Tenant: "acme"})
	require.NoError(t, err)

	list, err := f.keys.ListKeys(ctx, &registryv1.ListKeysRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetKeys(), 7)
	require.NotContains(t, list.String(), resp.GetSecret())

	_, err = f.keys.RevokeKey(ctx, &registryv1.RevokeKeyRequest{Id: resp.GetKey().GetId()})
	require.NoError(t, err)
	_, err = f.client.ListServers(ciCtx, &registryv1.ListServersRequest{})
	testutil.RequireStatus(t, err, codes.Unauthenticated, "a revoked key stops working at once")

	_, err = f.keys.CreateKey(ctx, &registryv1.CreateKeyRequest{Name: "x", Role: "wizard"})
	testutil.RequireStatus(t, err, codes.InvalidArgument)
	_, err = f.keys.RevokeKey(ctx, &registryv1.RevokeKeyRequest{Id: "key_000000000000"})
	testutil.RequireStatus(t, err, codes.NotFound)

	// The bootstrap key is idempotent: a second start changes nothing.
	require.NoError(t, f.svc.EnsureBootstrapAdmin(ctx, adminKey))
	list, err = f.keys.ListKeys(ctx, &registryv1.ListKeysRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetKeys(), 7)

	// Its id, shown to auditors and authors, says nothing of the key: a hash-derived id would
	// let them test guesses of an operator-chosen key offline.
	for _, k := range list.GetKeys() {
		if k.GetName() == "bootstrap-admin" {
			require.NotContains(t, auth.HashKey(adminKey), strings.TrimPrefix(k.GetId(), "key_"))
		}
	}
}

// TestTenantBoundKeysCannotCallDeploymentRPCs: every RPC over deployment-wide state refuses a
// tenant-bound key with PERMISSION_DENIED, even an admin's, while the same role unbound gets
// past authorization. The RPCs are every rule marked Deployment in auth.Rules and every
// RegistryService RPC an API key may call (registrations, secrets and grants are what every
// tenant shares), so a new one is covered as soon as it exists, and a rule that loses its
// Deployment mark fails here. The requests are empty: the refusal comes before the handler.
// A deployment-wide RPC of another service is tested where that service is served, and named
// in coveredElsewhere with its test.
func TestTenantBoundKeysCannotCallDeploymentRPCs(t *testing.T) {
	coveredElsewhere := map[string]string{
		"/ringfence.admin.v1.AdminService/Backup": "internal/app TestBackupNeedsThePermissionAndNoTenant",
	}
	f := newFixture(t)
	bound, err := f.keys.CreateKey(f.admin(t), &registryv1.CreateKeyRequest{Name: "acme-admin", Role: auth.RoleAdmin, Tenant: "acme"})
	require.NoError(t, err)
	require.Equal(t, "acme", bound.GetKey().GetTenant())

	methods := map[string]bool{}
	for m, r := range auth.Rules {
		if r.Deployment && coveredElsewhere[m] == "" {
			methods[m] = true
		}
	}
	registrySvc := registryv1.File_ringfence_registry_v1_registry_proto.Services().ByName("RegistryService")
	require.NotNil(t, registrySvc)
	for i := 0; i < registrySvc.Methods().Len(); i++ {
		full := "/" + string(registrySvc.FullName()) + "/" + string(registrySvc.Methods().Get(i).Name())
		if auth.Rules[full].Permission != "" {
			methods[full] = true
		}
	}
	require.NotEmpty(t, methods)
	for full := range methods {
		t.Run(shortName(full), func(t *testing.T) {
			// This fixture serves the registry's services only; a deployment-wide RPC of
			// another service needs a test where that service is served.
			require.True(t, strings.HasPrefix(full, "/"+string(registryv1.File_ringfence_registry_v1_registry_proto.Package())+"."),
				"%s is deployment-wide but not a registry RPC: cover it where its service is served, and name that test in coveredElsewhere", full)
			d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(strings.ReplaceAll(strings.TrimPrefix(full, "/"), "/", ".")))
			require.NoError(t, err)
			md, ok := d.(protoreflect.MethodDescriptor)
			require.True(t, ok, "%s is not a method", full)
			require.False(t, md.IsStreamingClient() || md.IsStreamingServer(), "%s streams: extend this test", full)
			invoke := func(key string) error {
				return f.conn.Invoke(testutil.WithKey(t.Context(), key), full, dynamicpb.NewMessage(md.Input()), dynamicpb.NewMessage(md.Output()))
			}

			st := testutil.RequireStatus(t, invoke(bound.GetSecret()), codes.PermissionDenied)
			require.Contains(t, st.Message(), `bound to tenant "acme"`)

			code := status.Code(invoke(adminKey))
			require.NotContains(t, []codes.Code{codes.PermissionDenied, codes.Unauthenticated}, code,
				"an unbound admin key gets past authorization")
		})
	}
}

// shortName turns /pkg.Service/Method into Service.Method for subtest names.
func shortName(full string) string {
	svc, m, _ := strings.Cut(strings.TrimPrefix(full, "/"), "/")
	return svc[strings.LastIndex(svc, ".")+1:] + "." + m
}

// TestKeysAdminIsNoWayUp: a key holding keys:admin mints keys only with permissions it holds,
// and a tenant-bound one only for its tenant, and sees and revokes only that tenant's keys.
func TestKeysAdminIsNoWayUp(t *testing.T) {
	f := newFixtureWithRoles(t, `{"keymaster": ["keys:admin", "run:execute"]}`)
	admin := f.admin(t)
	mint := func(ctx context.Context, name, role, tenant string) (*registryv1.CreateKeyResponse, error) {
		return f.keys.CreateKey(ctx, &registryv1.CreateKeyRequest{Name: name, Role: role, Tenant: tenant})
	}
	km, err := mint(admin, "km", "keymaster", "")
	require.NoError(t, err)
	kmCtx := testutil.WithKey(t.Context(), km.GetSecret())
	_, err = mint(kmCtx, "up", auth.RoleAdmin, "")
	st := testutil.RequireStatus(t, err, codes.PermissionDenied)
	require.Contains(t, st.Message(), `role "admin" carries mcp:admin`)
	runner, err := mint(kmCtx, "r", auth.RoleRunner, "acme")
	require.NoError(t, err, "a subset of its own permissions is fine")
	require.Equal(t, "acme", runner.GetKey().GetTenant())

	acme, err := mint(admin, "acme-km", "keymaster", "acme")
	require.NoError(t, err)
	acmeCtx := testutil.WithKey(t.Context(), acme.GetSecret())
	bound, err := mint(acmeCtx, "r2", auth.RoleRunner, "")
	require.NoError(t, err)
	require.Equal(t, "acme", bound.GetKey().GetTenant(), "a tenant-bound key's keys are bound to its tenant")
	_, err = mint(acmeCtx, "r3", auth.RoleRunner, "globex")
	testutil.RequireStatus(t, err, codes.PermissionDenied)

	list, err := f.keys.ListKeys(acmeCtx, &registryv1.ListKeysRequest{})
	require.NoError(t, err)
	var names []string
	for _, k := range list.GetKeys() {
		require.Equal(t, "acme", k.GetTenant(), k.GetName())
		names = append(names, k.GetName())
	}
	require.ElementsMatch(t, []string{"r", "acme-km", "r2"}, names, "a tenant-bound key lists every key of its tenant and no other")
	_, err = f.keys.RevokeKey(acmeCtx, &registryv1.RevokeKeyRequest{Id: km.GetKey().GetId()})
	testutil.RequireStatus(t, err, codes.NotFound, "another tenant's (or an unbound) key is not this key's to revoke")
	_, err = f.keys.RevokeKey(acmeCtx, &registryv1.RevokeKeyRequest{Id: runner.GetKey().GetId()})
	require.NoError(t, err)
}

// TestRevokeKeyIsNoWayUp: a key revokes only keys whose role's every permission it holds, as
// it mints: a key holding keys:admin alone cannot revoke an admin key or the bootstrap key
// (PERMISSION_DENIED naming what it lacks, the target keeps working, nothing is recorded),
// while an admin key can, and a key can still revoke itself.
func TestRevokeKeyIsNoWayUp(t *testing.T) {
	f := newFixtureWithRoles(t, `{"keyonly": ["keys:admin"]}`)
	admin := f.admin(t)
	mint := func(name, role string) (*registryv1.CreateKeyResponse, context.Context) {
		t.Helper()
		resp, err := f.keys.CreateKey(admin, &registryv1.CreateKeyRequest{Name: name, Role: role})
		require.NoError(t, err)
		return resp, testutil.WithKey(t.Context(), resp.GetSecret())
	}
	ko, koCtx := mint("ko", "keyonly")
	target, targetCtx := mint("ci-admin", auth.RoleAdmin)
	runner, _ := mint("ci-runner", auth.RoleRunner)
	peer, _ := mint("ko-2", "keyonly")
	bootstrap, err := f.svc.VerifyKey(t.Context(), auth.HashKey(adminKey))
	require.NoError(t, err)
	mark := len(f.recordsSince(t, 0))

	for _, tc := range []struct{ name, id, role, lacks string }{
		{"admin key", target.GetKey().GetId(), auth.RoleAdmin, "mcp:admin"},
		{"bootstrap key", bootstrap.KeyID, auth.RoleAdmin, "mcp:admin"},
		{"runner key", runner.GetKey().GetId(), auth.RoleRunner, "run:execute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.keys.RevokeKey(koCtx, &registryv1.RevokeKeyRequest{Id: tc.id})
			st := testutil.RequireStatus(t, err, codes.PermissionDenied)
			require.Contains(t, st.Message(), fmt.Sprintf("key %s has role %q, which carries ", tc.id, tc.role))
			require.Contains(t, st.Message(), tc.lacks)
			require.Contains(t, st.Message(), `which this key (role "keyonly") does not hold`)
			require.Contains(t, st.Message(), "revoke it with a key that holds them")
			code, body := f.rest(t, http.MethodPost, "/v1/keys/"+tc.id+":revoke", ko.GetSecret(), "{}")
			require.Equal(t, http.StatusForbidden, code, body)
		})
	}
	require.Empty(t, f.recordsSince(t, mark), "a refused revocation records nothing")
	_, err = f.client.ListServers(targetCtx, &registryv1.ListServersRequest{})
	require.NoError(t, err, "the admin key still works")
	_, err = f.client.ListServers(admin, &registryv1.ListServersRequest{})
	require.NoError(t, err, "the bootstrap key still works")
	list, err := f.keys.ListKeys(admin, &registryv1.ListKeysRequest{})
	require.NoError(t, err)
	for _, k := range list.GetKeys() {
		require.False(t, k.GetRevoked(), "%s was revoked", k.GetName())
	}

	_, err = f.keys.RevokeKey(koCtx, &registryv1.RevokeKeyRequest{Id: peer.GetKey().GetId()})
	require.NoError(t, err, "a key whose permissions the caller holds is the caller's to revoke")
	_, err = f.keys.RevokeKey(admin, &registryv1.RevokeKeyRequest{Id: target.GetKey().GetId()})
	require.NoError(t, err, "an admin key revokes an admin key")
	_, err = f.client.ListServers(targetCtx, &registryv1.ListServersRequest{})
	testutil.RequireStatus(t, err, codes.Unauthenticated)
	_, err = f.keys.RevokeKey(koCtx, &registryv1.RevokeKeyRequest{Id: ko.GetKey().GetId()})
	require.NoError(t, err, "a key revokes itself")
	_, err = f.keys.ListKeys(koCtx, &registryv1.ListKeysRequest{})
	testutil.RequireStatus(t, err, codes.Unauthenticated)
}

func TestCanaryNeverInClearAtRestOrInResponses(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	created, err := f.client.CreateServer(ctx, docsSearch())
	require.NoError(t, err)
	require.NotContains(t, created.String(), canary)
	_, err = f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tok", Value: canary})
	require.NoError(t, err)
	got, err := f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search"})
	require.NoError(t, err)
	require.NotContains(t, got.String(), canary)

	code, resp := f.rest(t, http.MethodGet, "/v1/mcp/servers/docs-search", adminKey, "")
	require.Equal(t, http.StatusOK, code, resp)
	var body map[string]any
	require.NoError(t, json.Unmarshal([]byte(resp), &body))
	require.Equal(t, map[string]any{"APP_TOKEN": SecretMask}, body["env"])

	raw, err := os.ReadFile(f.dbPath)
	require.NoError(t, err)
	require.False(t, bytes.Contains(raw, []byte(canary)), "the bolt file holds the canary in clear")
	require.True(t, bytes.Contains(raw, []byte("APP_TOKEN")), "env keys stay visible")
}

func TestDiscoveryErrorsCarryTheirClass(t *testing.T) {
	failure := &discovery.Failure{Class: discovery.ClassHandshakeTimeout, Message: "the server did not answer initialize within 2s"}
	err := discovery.Status(t.Context(), grpcserver.ErrorTable{Service: "registry"}, fmt.Errorf("discover: %w", failure))
	st, ok := status.FromError(err)
	require.True(t, ok)
	require.Equal(t, codes.DeadlineExceeded, st.Code())
	require.Equal(t, "handshake_timeout", st.Details()[0].(*typesv1.ServerFailure).GetClass())
}

// TestEveryChangeIsAnAdminEventWithSecretsMasked: server creates, updates and deletes and
// secret writes each reach the audit sink once, in order, naming the actor, and no record
// carries the canary. Key changes: TestKeyAndSecretChangesAreAdminEvents.
func TestEveryChangeIsAnAdminEventWithSecretsMasked(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	_, err := f.client.CreateServer(ctx, docsSearch())
	require.NoError(t, err)
	_, err = f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "docs-search", Command: "x", Env: env("APP_TOKEN", canary+"-2")})
	require.NoError(t, err)
	_, err = f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tok", Value: canary})
	require.NoError(t, err)
	_, err = f.client.DeleteServer(ctx, &registryv1.DeleteServerRequest{Ref: "docs-search"})
	require.NoError(t, err)
	// A refused change records nothing.
	_, err = f.client.CreateServer(ctx, &registryv1.CreateServerRequest{Ref: "BAD"})
	require.Error(t, err)
	require.NoError(t, f.svc.Spool().Flush(ctx))

	var actions []string
	for _, r := range f.audit.Records() {
		require.Equal(t, "registry", r.Producer)
		require.NotNil(t, r.Admin)
		raw, _ := json.Marshal(r)
		require.NotContains(t, string(raw), canary, "an audit record carries the canary")
		if r.Admin.ResourceType == resourceKey {
			continue // the fixture's key creations
		}
		actions = append(actions, r.Admin.Action+" "+r.Admin.ResourceType+" "+r.Admin.ResourceID)
		require.NotEmpty(t, r.Admin.ActorKeyID)
		require.Equal(t, "bootstrap-admin", r.Admin.ActorKeyName, "the record says what the key is, beside its id")
		require.Equal(t, auth.RoleAdmin, r.Admin.ActorRole)
	}
	require.Equal(t, []string{
		"create mcp_server docs-search", "update mcp_server docs-search", "put secret tok", "delete mcp_server docs-search",
	}, actions)
}

// TestGetServerFollowsEveryWrite: GetServer answers from a view kept per stored revision; an
// update, a delete and a re-create each show at once.
func TestGetServerFollowsEveryWrite(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	get := func() (*registryv1.Server, error) {
		resp, err := f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "docs-search"})
		return resp.GetServer(), err
	}
	_, err := f.client.CreateServer(ctx, docsSearch())
	require.NoError(t, err)
	first, err := get()
	require.NoError(t, err)
	again, err := get()
	require.NoError(t, err)
	require.True(t, proto.Equal(first, again))

	_, err = f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "docs-search", Command: "mcp-server-filesystem", Args: []string{"/srv/other"}})
	require.NoError(t, err)
	updated, err := get()
	require.NoError(t, err)
	require.Equal(t, int64(2), updated.GetRevision())
	require.Equal(t, []string{"/srv/other"}, updated.GetArgs())
	require.Equal(t, SecretMask, updated.GetEnv()["APP_TOKEN"], "the kept env is still masked")

	_, err = f.client.DeleteServer(ctx, &registryv1.DeleteServerRequest{Ref: "docs-search"})
	require.NoError(t, err)
	_, err = get()
	testutil.RequireStatus(t, err, codes.NotFound)

	recreated := docsSearch()
	recreated.Description = "born again"
	recreated.Env = nil
	_, err = f.client.CreateServer(ctx, recreated)
	require.NoError(t, err)
	got, err := get()
	require.NoError(t, err)
	require.Equal(t, int64(1), got.GetRevision())
	require.Equal(t, "born again", got.GetDescription())
	require.Empty(t, got.GetEnv())
}

func TestCreateRefusesARefHoldingTheNamespaceSeparator(t *testing.T) {
	f := newFixture(t)
	req := docsSearch()
	req.Ref = "docs__search"
	_, err := f.client.CreateServer(f.admin(t), req)
	st := testutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Contains(t, st.Message(), `contains "__"`)
}

// TestRESTAuthenticatesBeforeReadingTheBody: a request without a valid key is refused before
// the gateway decodes its body (so it cannot make the server buffer one), and a malformed body
// from a known key is still named as such.
func TestRESTAuthenticatesBeforeReadingTheBody(t *testing.T) {
	f := newFixture(t)
	post := func(key string) (int, string) {
		return f.rest(t, http.MethodPost, "/v1/mcp/servers", key, `{"ref": not json`)
	}
	code, body := post("")
	require.Equal(t, http.StatusUnauthorized, code, body)
	require.Contains(t, body, "missing API key")
	code, body = post("rf_not-a-key")
	require.Equal(t, http.StatusUnauthorized, code, body)
	code, body = post(adminKey)
	require.Equal(t, http.StatusBadRequest, code, body)
}

func TestRESTWrongMethodIs405(t *testing.T) {
	f := newFixture(t)
	code, body := f.rest(t, http.MethodPost, "/v1/mcp/servers/docs", adminKey, `{}`)
	require.Equal(t, http.StatusMethodNotAllowed, code, body)
	require.Contains(t, body, `\"POST\" is not a method of \"/v1/mcp/servers/docs\": it takes DELETE, GET, HEAD, PATCH, PUT`)

	// RFC 9110: a 405 names the methods the path takes in Allow.
	code, body, header := f.restHeaders(t, http.MethodDelete, "/v1/mcp/servers", adminKey, "")
	require.Equal(t, http.StatusMethodNotAllowed, code, body)
	require.Equal(t, "GET, HEAD, POST", header.Get("Allow"))
	_, _, header = f.restHeaders(t, http.MethodGet, "/v1/keys/key_1:revoke", adminKey, "")
	require.Equal(t, "POST", header.Get("Allow"), "a custom verb is part of the path")
}

// TestRESTBodyMayNotContradictThePath: the gateway sets a path variable's field after decoding
// the body, so PUT /v1/mcp/servers/docs with {"ref":"wiki"} changed docs and dropped "wiki"
// without a word. A body that repeats the path's value is fine; one that contradicts it is a
// 400 that changes nothing.
func TestRESTBodyMayNotContradictThePath(t *testing.T) {
	f := newFixture(t)
	for _, ref := range []string{"docs", "wiki"} {
		code, body := f.rest(t, http.MethodPost, "/v1/mcp/servers", adminKey, `{"ref":"`+ref+`","command":"x"}`)
		require.Equal(t, http.StatusOK, code, body)
	}
	for _, method := range []string{http.MethodPut, http.MethodPatch} {
		code, body := f.rest(t, method, "/v1/mcp/servers/docs", adminKey, `{"ref":"wiki","command":"y"}`)
		require.Equal(t, http.StatusBadRequest, code, body)
		require.Contains(t, body, `field \"ref\" differs from the ref the path names: leave it out of the body`)
		require.NotContains(t, body, "wiki", "no refusal of a body quotes a value")
	}
	code, body := f.rest(t, http.MethodGet, "/v1/mcp/servers/docs", adminKey, "")
	require.Equal(t, http.StatusOK, code, body)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Equal(t, "x", got["command"], "the refused requests changed nothing")

	code, body = f.rest(t, http.MethodPut, "/v1/mcp/servers/docs", adminKey, `{"ref":"docs","command":"y"}`)
	require.Equal(t, http.StatusOK, code, "a body may repeat the path's value: %s", body)
}

// TestRESTNamesAKeySentWhereItIsNotRead: a key sent as Authorization: Bearer, or in the query,
// was answered "missing API key" as if nothing had been sent; the 401 says where the key
// goes, and a key in the URL is never read nor quoted.
func TestRESTNamesAKeySentWhereItIsNotRead(t *testing.T) {
	f := newFixture(t)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, f.base+"/v1/mcp/servers", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, string(raw))
	require.Contains(t, string(raw), "read it from the X-API-Key header, not Authorization")

	for _, param := range []string{"api_key", "x-api-key", "apiKey", "key"} {
		code, body := f.rest(t, http.MethodGet, "/v1/mcp/servers?"+param+"="+adminKey, "", "")
		require.Equal(t, http.StatusUnauthorized, code, body)
		require.Contains(t, body, `send it in the X-API-Key header; a key in the URL (\"`+param+`\") is never read`)
		require.NotContains(t, body, adminKey)
	}
}
