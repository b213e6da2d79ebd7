package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/config"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/testutil"
)

const bootstrapKey = "app-test-admin-key-0123456789"

func testConfig(t *testing.T, extraEnv ...string) *config.Config {
	t.Helper()
	env := append([]string{
		"RINGFENCE_DATA_DIR=" + t.TempDir(),
		"RINGFENCE_GRPC_ADDR=127.0.0.1:0",
		"RINGFENCE_HTTP_ADDR=127.0.0.1:0",
		"RINGFENCE_BOOTSTRAP_ADMIN_KEY=" + bootstrapKey,
	}, extraEnv...)
	cfg, err := config.Load("test", nil, env, io.Discard)
	require.NoError(t, err)
	return cfg
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestPermissionMatrix calls every RPC of every service with every built-in role (and with no
// key) and checks the answer against auth.Rules: a role without the permission is denied, a
// role with it gets past authorization, internal RPCs refuse every API key.
func TestPermissionMatrix(t *testing.T) {
	a, err := NewAllInOne(t.Context(), testConfig(t), quietLogger())
	require.NoError(t, err)
	conn, _ := testutil.Serve(t, a.Server)
	defer a.Close()

	keys := map[string]string{auth.RoleAdmin: bootstrapKey}
	kc := registryv1.NewKeyServiceClient(conn)
	for _, role := range []string{auth.RoleOperator, auth.RoleAuthor, auth.RoleRunner, auth.RoleAuditor} {
		resp, err := kc.CreateKey(testutil.WithKey(t.Context(), bootstrapKey), &registryv1.CreateKeyRequest{Name: role, Role: role})
		require.NoError(t, err)
		keys[role] = resp.GetSecret()
	}

	var methods []protoreflect.MethodDescriptor
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if strings.HasPrefix(string(fd.Package()), "ringfence.") {
			for i := 0; i < fd.Services().Len(); i++ {
				svc := fd.Services().Get(i)
				for j := 0; j < svc.Methods().Len(); j++ {
					methods = append(methods, svc.Methods().Get(j))
				}
			}
		}
		return true
	})
	require.NotEmpty(t, methods)

	for _, md := range methods {
		full := "/" + string(md.Parent().FullName()) + "/" + string(md.Name())
		rule, ok := auth.Rules[full]
		require.True(t, ok, "no rule for %s", full)
		for role, key := range keys {
			t.Run(string(md.Name())+"/"+role, func(t *testing.T) {
				code := invoke(t, conn, md, full, key)
				roleDef, _ := auth.BuiltinRoles[role]
				allowed := rule.Permission != "" && contains(roleDef, rule.Permission)
				if allowed {
					require.NotContains(t, []codes.Code{codes.PermissionDenied, codes.Unauthenticated}, code, "%s with role %s", full, role)
				} else {
					require.Equal(t, codes.PermissionDenied, code, "%s with role %s", full, role)
				}
			})
		}
		t.Run(string(md.Name())+"/no-key", func(t *testing.T) {
			code := invoke(t, conn, md, full, "")
			if len(rule.Internal) > 0 {
				require.Equal(t, codes.PermissionDenied, code)
			} else {
				require.Equal(t, codes.Unauthenticated, code)
			}
		})
	}
}

func contains(ps []auth.Permission, p auth.Permission) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

// invoke calls a method with an empty request and returns the status code.
func invoke(t *testing.T, conn *grpc.ClientConn, md protoreflect.MethodDescriptor, full, key string) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if key != "" {
		ctx = testutil.WithKey(ctx, key)
	}
	req := dynamicpb.NewMessage(md.Input())
	resp := dynamicpb.NewMessage(md.Output())
	if !md.IsStreamingServer() && !md.IsStreamingClient() {
		return status.Code(conn.Invoke(ctx, full, req, resp))
	}
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: md.IsStreamingServer(), ClientStreams: md.IsStreamingClient()}, full)
	if err != nil {
		return status.Code(err)
	}
	require.NoError(t, stream.SendMsg(req))
	require.NoError(t, stream.CloseSend())
	return status.Code(stream.RecvMsg(resp))
}

// serveWithDevCA runs ringfenced with TLS from `certs init` on a loopback port and returns a
// dialer: dialAs(svc) presents svc's certificate, dialAs("") presents none.
func serveWithDevCA(t *testing.T) (dialAs func(svc string) *grpc.ClientConn) {
	t.Helper()
	dir := t.TempDir()
	_, err := mtls.InitDevCA(dir, mtls.DevCAOptions{})
	require.NoError(t, err)
	cfg := testConfig(t,
		"RINGFENCE_TLS__CERT_FILE="+filepath.Join(dir, "registry.pem"),
		"RINGFENCE_TLS__KEY_FILE="+filepath.Join(dir, "registry-key.pem"),
		"RINGFENCE_TLS__CLIENT_CA_FILE="+filepath.Join(dir, "ca.pem"),
	)
	a, err := NewAllInOne(t.Context(), cfg, quietLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	go func() { _ = a.Server.Run(t.Context()) }()
	grpcAddr, _, err := a.Server.Addrs(t.Context())
	require.NoError(t, err)

	return func(svc string) *grpc.ClientConn {
		var tlsCfg credentials.TransportCredentials
		if svc == "" {
			c, err := mtls.CAOnlyConfig(filepath.Join(dir, "ca.pem"), "", "")
			require.NoError(t, err)
			tlsCfg = credentials.NewTLS(c)
		} else {
			c, err := mtls.ClientConfig(mtls.Files{CertFile: filepath.Join(dir, svc+".pem"), KeyFile: filepath.Join(dir, svc+"-key.pem"), CAFile: filepath.Join(dir, "ca.pem")}, mtls.Registry)
			require.NoError(t, err)
			tlsCfg = credentials.NewTLS(c)
		}
		conn, err := grpc.NewClient(grpcAddr.String(), grpc.WithTransportCredentials(tlsCfg))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return conn
	}
}

// TestInternalRPCsNeedTheirServiceCertificate runs ringfenced with TLS from `certs init` and
// calls internal RPCs with each service's certificate and with an API key alone.
func TestInternalRPCsNeedTheirServiceCertificate(t *testing.T) {
	conns := serveWithDevCA(t)
	dialAs := func(svc string) registryv1.RegistryServiceClient {
		return registryv1.NewRegistryServiceClient(conns(svc))
	}
	ctx := t.Context()
	keyHash := auth.HashKey(bootstrapKey)

	resp, err := dialAs(mtls.Pool).AuthenticateKey(ctx, &registryv1.AuthenticateKeyRequest{KeySha256: keyHash})
	require.NoError(t, err, "the pool's certificate may authenticate keys")
	require.Equal(t, auth.RoleAdmin, resp.GetRole())

	_, err = dialAs("").AuthenticateKey(testutil.WithKey(ctx, bootstrapKey), &registryv1.AuthenticateKeyRequest{KeySha256: keyHash})
	st := testutil.RequireStatus(t, err, codes.PermissionDenied, "an admin API key without a certificate")
	require.Contains(t, st.Message(), "API keys are never enough")

	_, err = dialAs(mtls.Publisher).ResolveServer(ctx, &registryv1.ResolveServerRequest{Ref: "x"})
	testutil.RequireStatus(t, err, codes.PermissionDenied, "only the pool may resolve secrets")

	_, err = dialAs(mtls.Pool).ResolveServer(ctx, &registryv1.ResolveServerRequest{Ref: "x"})
	testutil.RequireStatus(t, err, codes.NotFound, "the pool gets past authorization")

	_, err = dialAs("").ListServers(testutil.WithKey(ctx, bootstrapKey), &registryv1.ListServersRequest{})
	require.NoError(t, err, "public RPCs work over TLS with an API key")

	// The publisher may list a registered server's tools through Discover; running a tool, or
	// starting an ad hoc command, is the registry's explore alone.
	discover := func(svc string, req *poolv1.DiscoverRequest) error {
		_, err := poolv1.NewPoolServiceClient(conns(svc)).Discover(ctx, req)
		return err
	}
	require.Equal(t, codes.NotFound, status.Code(discover(mtls.Publisher, &poolv1.DiscoverRequest{ServerRef: "x"})),
		"the publisher lists registered servers")
	adhoc := &registryv1.ResolveServerResponse{Server: &registryv1.Server{Ref: "x", Command: "no-such-command"}}
	for _, req := range []*poolv1.DiscoverRequest{
		{ServerRef: "x", Adhoc: adhoc},
		{ServerRef: "x", Call: &typesv1.ExploreCall{Tool: "echo"}},
		{ServerRef: "x", Tenant: "default", ActorKeyId: "key_x"},
	} {
		st := testutil.RequireStatus(t, discover(mtls.Publisher, req), codes.PermissionDenied, "the publisher may not explore")
		require.Contains(t, st.Message(), "only the registry's certificate")
		require.NotEqual(t, codes.PermissionDenied, status.Code(discover(mtls.Registry, req)), "the registry may")
	}
}

// TestAllInOneWiresThePublisher: ringfenced serves the publisher with the registry's grants as
// its ceiling, and dev.allow_inline_mcp_servers turns the inline refusal into a warning.
func TestAllInOneWiresThePublisher(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow_inline=%v", allow), func(t *testing.T) {
			a, err := NewAllInOne(t.Context(), testConfig(t, fmt.Sprintf("RINGFENCE_DEV__ALLOW_INLINE_MCP_SERVERS=%v", allow)), quietLogger())
			require.NoError(t, err)
			conn, _ := testutil.Serve(t, a.Server)
			defer a.Close()
			require.NotNil(t, a.Publisher)
			ctx := testutil.WithKey(t.Context(), bootstrapKey)
			pc := publisherv1.NewPublisherServiceClient(conn)
			created, err := pc.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"a"}})
			require.NoError(t, err)
			d := created.GetDraft()
			d.GetNodes()[0].GetAgent().McpServers = []*publisherv1.InlineMcpServer{{Name: "fs", Command: "npx"}}
			_, err = pc.ReplaceDraft(ctx, &publisherv1.ReplaceDraftRequest{GraphId: "g", Draft: d})
			require.NoError(t, err)
			pub, err := pc.Publish(ctx, &publisherv1.PublishRequest{GraphId: "g"})
			if !allow {
				testutil.RequireStatus(t, err, codes.FailedPrecondition)
				return
			}
			require.NoError(t, err)
			require.Len(t, pub.GetWarnings(), 1)

			// The registry is the ceiling: a node referencing an unregistered server fails.
			_, err = registryv1.NewRegistryServiceClient(conn).CreateServer(ctx, &registryv1.CreateServerRequest{Ref: "docs", Command: "x"})
			require.NoError(t, err)
			imp, err := pc.ImportTools(ctx, &publisherv1.ImportToolsRequest{GraphId: "g", ServerRef: "docs", Agent: "a"})
			st := testutil.RequireStatus(t, err, codes.FailedPrecondition, "%v", imp)
			require.Contains(t, st.Message(), "grants: [] is the default")
		})
	}
}

// TestRequeueQuarantineAtStart: with audit.requeue_quarantine, a producer's quarantined
// records go back through its spool at start and reach the audit log with their IDs.
func TestRequeueQuarantineAtStart(t *testing.T) {
	cfg := testConfig(t, "RINGFENCE_AUDIT__REQUEUE_QUARANTINE=true")
	tc := audit.ToolCallAttempt{RunID: "run-q", CallID: "call-q", Attempt: 1, ToolName: "echo"}
	tc.Succeeded()
	rec := audit.NewToolCallRecord("pool", auth.DefaultTenant, tc)
	body, err := json.Marshal(rec)
	require.NoError(t, err)
	line, err := json.Marshal(map[string]any{"quarantine_time": time.Now().UTC(), "refusal": "refused by an older audit log", "record": json.RawMessage(body)})
	require.NoError(t, err)
	dir := filepath.Join(cfg.DataDir, "pool-audit-spool")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "quarantine.jsonl"), append(line, '\n'), 0o600))

	a, err := NewAllInOne(t.Context(), cfg, quietLogger())
	require.NoError(t, err)
	defer a.Close()
	ctx := auth.WithPrincipal(t.Context(), auth.Principal{KeyID: "key_test", Role: auth.RoleAdmin, Permissions: auth.AllPermissions})
	require.Eventually(t, func() bool {
		resp, err := a.Audit.List(ctx, &auditv1.ListRequest{PageSize: 1000})
		if err != nil {
			return false
		}
		for _, r := range resp.GetRecords() {
			if r.GetId() == rec.ID {
				return true
			}
		}
		return false
	}, 15*time.Second, 50*time.Millisecond, "the requeued record reaches the audit log")
	aside, err := filepath.Glob(filepath.Join(dir, "quarantine.jsonl.requeued-*"))
	require.NoError(t, err)
	require.Len(t, aside, 1)
}

// wantInternal pins, apart from auth.Rules, which service certificates may call each internal
// RPC. It is written out by hand on purpose: a test that read its expectations from auth.Rules
// could not notice an allowlist widened there. A new internal RPC fails TestInternalAllowlists
// until its callers are written down here too.
var wantInternal = map[string][]string{
	registryv1.RegistryService_ResolveServer_FullMethodName:         {mtls.Pool},
	registryv1.RegistryService_GetServerPolicy_FullMethodName:       {mtls.Publisher, mtls.Pool},
	registryv1.RegistryService_AuthenticateKey_FullMethodName:       {mtls.Publisher, mtls.Pool, mtls.Audit},
	publisherv1.PublisherService_GetPublishedVersion_FullMethodName: {mtls.Pool},
	poolv1.PoolService_Discover_FullMethodName:                      {mtls.Registry, mtls.Publisher},
	auditv1.AuditService_Append_FullMethodName:                      {mtls.Registry, mtls.Publisher, mtls.Pool},
}

// TestInternalAllowlists calls every internal RPC with every service's certificate over mutual
// TLS: a service on the RPC's allowlist gets past authorization (an empty request may still
// fail, on its merits), and every other service is refused with PermissionDenied. The RPCs come
// from auth.Rules, so a new internal RPC is covered; who may call each comes from wantInternal.
func TestInternalAllowlists(t *testing.T) {
	dialAs := serveWithDevCA(t)
	conns := make(map[string]*grpc.ClientConn, len(mtls.Services))
	for _, svc := range mtls.Services {
		conns[svc] = dialAs(svc)
	}

	var internal []string
	for full, rule := range auth.Rules {
		if len(rule.Internal) > 0 {
			internal = append(internal, full)
		}
	}
	slices.Sort(internal)
	for full := range wantInternal {
		require.Contains(t, internal, full, "wantInternal names %s, which auth.Rules does not make internal", full)
	}

	for _, full := range internal {
		allowed, ok := wantInternal[full]
		require.True(t, ok, "%s is internal in auth.Rules: write down in wantInternal which services may call it", full)
		name := protoreflect.FullName(strings.ReplaceAll(strings.TrimPrefix(full, "/"), "/", "."))
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		require.NoError(t, err, "no descriptor for %s", full)
		md, ok := d.(protoreflect.MethodDescriptor)
		require.True(t, ok, "%s is not a method", full)
		for _, svc := range mtls.Services {
			t.Run(string(md.Name())+"/"+svc, func(t *testing.T) {
				code := invoke(t, conns[svc], md, full, "")
				if slices.Contains(allowed, svc) {
					require.NotContains(t, []codes.Code{codes.PermissionDenied, codes.Unauthenticated}, code,
						"%s may call %s", svc, full)
				} else {
					require.Equal(t, codes.PermissionDenied, code, "%s may not call %s", svc, full)
				}
			})
		}
	}
}
