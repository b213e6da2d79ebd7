package app

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/config"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/telemetry"
	"github.com/ringfence/ringfence/internal/testutil"
)

// split is a split deployment in this process: ringfence-registry, -publisher, -pool and
// -audit built by their own builders, each on its own public and internal listeners, talking
// mutual TLS with certificates from `certs init`.
type split struct {
	t        *testing.T
	certs    string
	apps     map[string]*App
	internal map[string]string // service → its internal listener's address
	public   map[string]string // service → its public gRPC address
	logs     map[string]*testutil.SyncBuffer
}

var splitBuilders = map[string]Builder{
	mtls.Registry: NewRegistry, mtls.Publisher: NewPublisher, mtls.Pool: NewPool, mtls.Audit: NewAudit,
}

// startSplit starts the four binaries' apps; extraEnv applies to each.
func startSplit(t *testing.T, extraEnv ...string) *split {
	t.Helper()
	certs := t.TempDir()
	_, err := mtls.InitDevCA(certs, mtls.DevCAOptions{})
	require.NoError(t, err)
	s := &split{t: t, certs: certs, apps: map[string]*App{}, internal: map[string]string{}, public: map[string]string{}, logs: map[string]*testutil.SyncBuffer{}}
	for _, svc := range mtls.Services {
		s.internal[svc] = testutil.FreeAddr(t)
	}
	for _, svc := range []string{mtls.Audit, mtls.Registry, mtls.Publisher, mtls.Pool} {
		env := append([]string{
			"RINGFENCE_DATA_DIR=" + t.TempDir(),
			"RINGFENCE_GRPC_ADDR=127.0.0.1:0",
			"RINGFENCE_HTTP_ADDR=",
			"RINGFENCE_INTERNAL_ADDR=" + s.internal[svc],
			"RINGFENCE_TLS__CERT_FILE=" + filepath.Join(certs, svc+".pem"),
			"RINGFENCE_TLS__KEY_FILE=" + filepath.Join(certs, svc+"-key.pem"),
			"RINGFENCE_TLS__CLIENT_CA_FILE=" + filepath.Join(certs, "ca.pem"),
			"RINGFENCE_PEERS__REGISTRY_ADDR=" + s.internal[mtls.Registry],
			"RINGFENCE_PEERS__PUBLISHER_ADDR=" + s.internal[mtls.Publisher],
			"RINGFENCE_PEERS__POOL_ADDR=" + s.internal[mtls.Pool],
			"RINGFENCE_PEERS__AUDIT_ADDR=" + s.internal[mtls.Audit],
			"RINGFENCE_BOOTSTRAP_ADMIN_KEY=" + bootstrapKey,
		}, extraEnv...)
		cfg, err := config.Load("ringfence-"+svc, nil, env, io.Discard)
		require.NoError(t, err)
		s.logs[svc] = &testutil.SyncBuffer{}
		log := slog.New(slog.NewTextHandler(s.logs[svc], &slog.HandlerOptions{Level: slog.LevelDebug}))
		a, err := splitBuilders[svc](t.Context(), cfg, log)
		require.NoError(t, err)
		s.apps[svc] = a
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			require.NoError(t, <-done)
		})
		grpcAddr, _, err := a.Server.Addrs(t.Context())
		require.NoError(t, err)
		s.public[svc] = grpcAddr.String()
	}
	return s
}

// dialInternal connects to svc's internal listener presenting as's certificate ("" presents
// none).
func (s *split) dialInternal(svc, as string) *grpc.ClientConn {
	s.t.Helper()
	var cfg *tls.Config
	var err error
	if as == "" {
		cfg, err = mtls.CAOnlyConfig(filepath.Join(s.certs, "ca.pem"), "", svc)
	} else {
		cfg, err = mtls.ClientConfig(mtls.Files{CertFile: filepath.Join(s.certs, as+".pem"), KeyFile: filepath.Join(s.certs, as+"-key.pem"), CAFile: filepath.Join(s.certs, "ca.pem")}, svc)
	}
	require.NoError(s.t, err)
	conn, err := grpc.NewClient(s.internal[svc], grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(s.t, err)
	s.t.Cleanup(func() { conn.Close() })
	return conn
}

// dialPublic connects to svc's public port as an API-key client (the CLI): TLS, no certificate.
func (s *split) dialPublic(svc string) *grpc.ClientConn {
	s.t.Helper()
	cfg, err := mtls.CAOnlyConfig(filepath.Join(s.certs, "ca.pem"), "", svc)
	require.NoError(s.t, err)
	conn, err := grpc.NewClient(s.public[svc], grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(s.t, err)
	s.t.Cleanup(func() { conn.Close() })
	return conn
}

// TestInternalRPCsNeedTheirServiceCertificate calls the registry's internal RPCs on its
// internal listener with each service's certificate, and with an API key alone.
func TestInternalRPCsNeedTheirServiceCertificate(t *testing.T) {
	s := startSplit(t)
	registry := func(as string) registryinternalv1.RegistryInternalServiceClient {
		return registryinternalv1.NewRegistryInternalServiceClient(s.dialInternal(mtls.Registry, as))
	}
	ctx := t.Context()
	keyHash := auth.HashKey(bootstrapKey)

	resp, err := registry(mtls.Pool).AuthenticateKey(ctx, &registryinternalv1.AuthenticateKeyRequest{KeySha256: keyHash})
	require.NoError(t, err, "the pool's certificate may authenticate keys")
	require.Equal(t, auth.RoleAdmin, resp.GetRole())

	// Without a certificate nothing is read: the handshake fails.
	_, err = registry("").AuthenticateKey(testutil.WithKey(ctx, bootstrapKey), &registryinternalv1.AuthenticateKeyRequest{KeySha256: keyHash})
	st := testutil.RequireStatus(t, err, codes.Unavailable, "an admin API key without a certificate")
	// In TLS 1.3 the client's side of the handshake completes before the server has checked
	// its (missing) certificate, so the refusal reaches the client as the server's alert or,
	// when the client wrote first, as the connection the server closed.
	require.Regexp(t, `certificate|broken pipe|connection reset`, st.Message(), "the refusal is the TLS handshake's")

	_, err = registry(mtls.Publisher).ResolveServer(ctx, &registryinternalv1.ResolveServerRequest{Ref: "x"})
	testutil.RequireStatus(t, err, codes.PermissionDenied, "only the pool may resolve secrets")
	_, err = registry(mtls.Pool).ResolveServer(ctx, &registryinternalv1.ResolveServerRequest{Ref: "x"})
	testutil.RequireStatus(t, err, codes.NotFound, "the pool gets past authorization")

	_, err = registryv1.NewRegistryServiceClient(s.dialPublic(mtls.Registry)).ListServers(testutil.WithKey(ctx, bootstrapKey), &registryv1.ListServersRequest{})
	require.NoError(t, err, "public RPCs work over TLS with an API key")

	// The publisher may list a registered server's tools through Discover; running a tool, or
	// starting an ad hoc command, is the registry's explore alone.
	discover := func(as string, req *poolinternalv1.DiscoverRequest) error {
		_, err := poolinternalv1.NewPoolInternalServiceClient(s.dialInternal(mtls.Pool, as)).Discover(ctx, req)
		return err
	}
	require.Equal(t, codes.NotFound, status.Code(discover(mtls.Publisher, &poolinternalv1.DiscoverRequest{ServerRef: "x"})),
		"the publisher lists registered servers")
	adhoc := &registryinternalv1.ResolveServerResponse{Server: &registryv1.Server{Ref: "x", Command: "no-such-command"}}
	for _, req := range []*poolinternalv1.DiscoverRequest{
		{ServerRef: "x", Adhoc: adhoc},
		{ServerRef: "x", Call: &typesv1.ExploreCall{Tool: "echo"}},
		{ServerRef: "x", Tenant: "default", ActorKeyId: "key_x"},
	} {
		st := testutil.RequireStatus(t, discover(mtls.Publisher, req), codes.PermissionDenied, "the publisher may not explore")
		require.Contains(t, st.Message(), "only the registry's certificate")
		require.NotEqual(t, codes.PermissionDenied, status.Code(discover(mtls.Registry, req)), "the registry may")
	}
}

// wantInternal pins, apart from auth.Rules, which service certificates may call each internal
// RPC. It is written out by hand on purpose: a test that read its expectations from auth.Rules
// could not notice an allowlist widened there. A new internal RPC fails TestInternalAllowlists
// until its callers are written down here too.
var wantInternal = map[string][]string{
	registryinternalv1.RegistryInternalService_ResolveServer_FullMethodName:         {mtls.Pool},
	registryinternalv1.RegistryInternalService_GetServerPolicy_FullMethodName:       {mtls.Publisher, mtls.Pool},
	registryinternalv1.RegistryInternalService_AuthenticateKey_FullMethodName:       {mtls.Publisher, mtls.Pool, mtls.Audit},
	registryinternalv1.RegistryInternalService_ListWarmTargets_FullMethodName:       {mtls.Pool},
	"/ringfence.internal.publisher.v1.PublisherInternalService/GetPublishedVersion": {mtls.Pool},
	poolinternalv1.PoolInternalService_Discover_FullMethodName:                      {mtls.Registry, mtls.Publisher},
	poolinternalv1.PoolInternalService_GetWarmStatus_FullMethodName:                 {mtls.Registry},
	poolinternalv1.PoolInternalService_ForwardRun_FullMethodName:                    {mtls.Pool},
	poolinternalv1.PoolInternalService_ForwardCallTool_FullMethodName:               {mtls.Pool},
	poolinternalv1.PoolInternalService_WatchAgentTools_FullMethodName:               {mtls.Pool},
	"/ringfence.internal.audit.v1.AuditInternalService/Append":                      {mtls.Registry, mtls.Publisher, mtls.Pool},
}

// TestInternalAllowlists calls every internal RPC, on the internal listener of the binary that
// serves it, with every service's certificate: a service on the RPC's allowlist gets past
// authorization (an empty request may still fail, on its merits), and every other service is
// refused with PermissionDenied. The RPCs come from auth.Rules, so a new internal RPC is
// covered; who may call each comes from wantInternal.
func TestInternalAllowlists(t *testing.T) {
	s := startSplit(t)
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
		require.True(t, strings.HasPrefix(full, "/ringfence.internal."), "%s is internal, so it belongs to a ringfence.internal.* package", full)
		name := protoreflect.FullName(strings.ReplaceAll(strings.TrimPrefix(full, "/"), "/", "."))
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		require.NoError(t, err, "no descriptor for %s", full)
		md, ok := d.(protoreflect.MethodDescriptor)
		require.True(t, ok, "%s is not a method", full)
		server := strings.Split(string(md.Parent().FullName()), ".")[2] // ringfence.internal.<service>.v1
		for _, svc := range mtls.Services {
			t.Run(string(md.Name())+"/"+svc, func(t *testing.T) {
				code := invoke(t, s.dialInternal(server, svc), md, full, "")
				if slices.Contains(allowed, svc) {
					require.NotContains(t, []codes.Code{codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented}, code,
						"%s may call %s", svc, full)
				} else {
					require.Equal(t, codes.PermissionDenied, code, "%s may not call %s", svc, full)
				}
			})
		}
	}
}

// reflected lists the services a server's reflection names.
func reflected(t *testing.T, conn *grpc.ClientConn) []string {
	t.Helper()
	stream, err := reflectionv1.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	require.NoError(t, err)
	require.NoError(t, stream.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}))
	resp, err := stream.Recv()
	require.NoError(t, err)
	var names []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	return names
}

// TestTheInternalPlaneIsApartFromThePublicPort: each split binary's public port neither lists
// (reflection) nor serves an internal service, and its internal listener serves them.
func TestTheInternalPlaneIsApartFromThePublicPort(t *testing.T) {
	s := startSplit(t)
	for _, svc := range mtls.Services {
		t.Run(svc, func(t *testing.T) {
			public := reflected(t, s.dialPublic(svc))
			require.NotEmpty(t, public)
			for _, name := range public {
				require.False(t, strings.HasPrefix(name, "ringfence.internal."), "the public port lists %s", name)
			}
			internal := reflected(t, s.dialInternal(svc, svc))
			require.Contains(t, strings.Join(internal, " "), "ringfence.internal."+svc+".v1.")
		})
	}
	// The registry's secrets resolver is not on its public port, whatever the caller presents.
	var resp registryinternalv1.ResolveServerResponse
	err := s.dialPublic(mtls.Registry).Invoke(testutil.WithKey(t.Context(), bootstrapKey),
		registryinternalv1.RegistryInternalService_ResolveServer_FullMethodName, &registryinternalv1.ResolveServerRequest{Ref: "x"}, &resp)
	testutil.RequireStatus(t, err, codes.Unimplemented)
	// Plaintext is refused on the internal listener.
	conn, err := grpc.NewClient(s.internal[mtls.Registry], grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	err = conn.Invoke(t.Context(), registryinternalv1.RegistryInternalService_ResolveServer_FullMethodName, &registryinternalv1.ResolveServerRequest{Ref: "x"}, &resp)
	testutil.RequireStatus(t, err, codes.Unavailable)
}

// recorder is tracing into memory, installed in place of the OTLP exporter.
func recorder(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var once sync.Once
	orig := startTracing
	startTracing = func(context.Context, string, string) (*telemetry.Tracing, error) {
		once.Do(func() {})
		return telemetry.New(tp), nil
	}
	t.Cleanup(func() { startTracing = orig })
	return rec
}

// TestOneCallIsOneTraceAcrossServices: with tracing on, one import through the publisher's
// public port crosses the publisher, the registry (key check, grants, secrets) and the pool
// (discovery) over the real internal listeners, and every span of it shares one trace id; the
// request id the caller chose reaches the peers' access logs.
func TestOneCallIsOneTraceAcrossServices(t *testing.T) {
	rec := recorder(t)
	s := startSplit(t, "RINGFENCE_OTEL__ENDPOINT=http://127.0.0.1:4317")
	ctx := testutil.WithKey(t.Context(), bootstrapKey)
	_, err := registryv1.NewRegistryServiceClient(s.dialPublic(mtls.Registry)).CreateServer(ctx,
		&registryv1.CreateServerRequest{Ref: "fx", Command: "mcpfixture", Grants: []string{"process_spawn", "external_api_call"}})
	require.NoError(t, err)
	pc := publisherv1.NewPublisherServiceClient(s.dialPublic(mtls.Publisher))
	_, err = pc.CreateGraph(ctx, &publisherv1.CreateGraphRequest{GraphId: "g", Agents: []string{"a"}})
	require.NoError(t, err)

	const rid = "trace-test-0001"
	callCtx := metadata.AppendToOutgoingContext(ctx, grpcserver.RequestIDKey, rid)
	_, err = pc.ImportTools(callCtx, &publisherv1.ImportToolsRequest{GraphId: "g", ServerRef: "fx", Agent: "a"})
	// No isolation image: the pool refuses to start the server, after every hop was made.
	testutil.RequireStatus(t, err, codes.Unavailable)

	// A server span ends after its status is sent, so the caller may hold the answer before the
	// spans of the public call and of each hop are recorded: wait for them.
	hops := []string{
		"ringfence.internal.registry.v1.RegistryInternalService/GetServerPolicy/server",
		"ringfence.internal.pool.v1.PoolInternalService/Discover/client",
		"ringfence.internal.pool.v1.PoolInternalService/Discover/server",
		"ringfence.internal.registry.v1.RegistryInternalService/ResolveServer/client",
		"ringfence.internal.registry.v1.RegistryInternalService/ResolveServer/server",
	}
	var byName map[string]int
	recorded := assert.Eventually(t, func() bool {
		var root sdktrace.ReadOnlySpan
		for _, sp := range rec.Ended() {
			if sp.Name() == "ringfence.publisher.v1.PublisherService/ImportTools" {
				root = sp
			}
		}
		if root == nil {
			return false
		}
		trace := root.SpanContext().TraceID()
		byName = map[string]int{}
		for _, sp := range rec.Ended() {
			if sp.SpanContext().TraceID() == trace {
				byName[sp.Name()+"/"+sp.SpanKind().String()]++
			}
		}
		for _, hop := range hops {
			if byName[hop] == 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond)
	require.True(t, recorded, "the public call has a span, and every hop is in its trace; the trace holds %v", byName)

	// Each peer logged the hop under the caller's request id.
	require.Eventually(t, func() bool {
		reg, pl := s.logs[mtls.Registry].String(), s.logs[mtls.Pool].String()
		return strings.Contains(reg, "ResolveServer") && strings.Contains(reg, "request_id="+rid) &&
			strings.Contains(pl, "Discover") && strings.Contains(pl, "request_id="+rid)
	}, 5*time.Second, 20*time.Millisecond, "registry log:\n%s\npool log:\n%s", s.logs[mtls.Registry].String(), s.logs[mtls.Pool].String())
}

// TestAPublicPortNamesTheBinaryThatServesAService: asking a split binary for a service
// another one serves answers grpc-go's own "unknown service <name>", which the CLI turns into
// its hint, with an ErrorInfo naming the binary and listener that serve it (what grpcurl
// shows); an internal service on a public port is answered in the same form.
func TestAPublicPortNamesTheBinaryThatServesAService(t *testing.T) {
	s := startSplit(t)
	ctx := testutil.WithKey(t.Context(), bootstrapKey)
	for _, tc := range []struct {
		method, service, servedBy string
	}{
		{"/ringfence.pool.v1.PoolService/GetRun", "ringfence.pool.v1.PoolService", "ringfence-pool on its RINGFENCE_GRPC_ADDR"},
		{registryinternalv1.RegistryInternalService_ResolveServer_FullMethodName, "ringfence.internal.registry.v1.RegistryInternalService", "ringfence-registry on its internal listener"},
	} {
		t.Run(tc.service, func(t *testing.T) {
			var resp registryinternalv1.ResolveServerResponse
			err := s.dialPublic(mtls.Registry).Invoke(ctx, tc.method, &registryinternalv1.ResolveServerRequest{}, &resp)
			st := testutil.RequireStatus(t, err, codes.Unimplemented)
			require.Equal(t, "unknown service "+tc.service, st.Message())
			require.Len(t, st.Details(), 1)
			info, ok := st.Details()[0].(*errdetails.ErrorInfo)
			require.True(t, ok, "%T", st.Details()[0])
			require.Equal(t, "SERVICE_NOT_SERVED", info.GetReason())
			require.Contains(t, info.GetMetadata()["served_by"], tc.servedBy)
			require.Equal(t, "ringfence.admin.v1.AdminService, ringfence.registry.v1.KeyService, ringfence.registry.v1.RegistryService", info.GetMetadata()["this_listener_serves"])
		})
	}
	// A method its service does not have names both.
	err := s.dialPublic(mtls.Registry).Invoke(ctx, "/ringfence.registry.v1.RegistryService/NoSuch", &registryv1.ListServersRequest{}, &registryv1.ListServersResponse{})
	st := testutil.RequireStatus(t, err, codes.Unimplemented)
	require.Equal(t, `grpcserver: unknown method "NoSuch" of ringfence.registry.v1.RegistryService; grpcurl ... describe ringfence.registry.v1.RegistryService lists its methods`, st.Message())
}

// TestHealthNamesOnlyWhatItsListenerServes: the public port's health service, like its
// reflection, names no internal service (and answers one as unknown); the internal listener's
// names its internal services.
func TestHealthNamesOnlyWhatItsListenerServes(t *testing.T) {
	s := startSplit(t)
	for _, svc := range mtls.Services {
		t.Run(svc, func(t *testing.T) {
			internalName := map[string]string{
				mtls.Registry: "ringfence.internal.registry.v1.RegistryInternalService", mtls.Publisher: "ringfence.internal.publisher.v1.PublisherInternalService",
				mtls.Pool: "ringfence.internal.pool.v1.PoolInternalService", mtls.Audit: "ringfence.internal.audit.v1.AuditInternalService",
			}[svc]
			public := grpc_health_v1.NewHealthClient(s.dialPublic(svc))
			list, err := public.List(t.Context(), &grpc_health_v1.HealthListRequest{})
			require.NoError(t, err)
			for name := range list.GetStatuses() {
				require.False(t, strings.HasPrefix(name, "ringfence.internal."), "the public port's health names %s", name)
			}
			_, err = public.Check(t.Context(), &grpc_health_v1.HealthCheckRequest{Service: internalName})
			testutil.RequireStatus(t, err, codes.NotFound)

			got, err := grpc_health_v1.NewHealthClient(s.dialInternal(svc, svc)).Check(t.Context(), &grpc_health_v1.HealthCheckRequest{Service: internalName})
			require.NoError(t, err)
			require.Equal(t, grpc_health_v1.HealthCheckResponse_SERVING, got.GetStatus())
		})
	}
}
