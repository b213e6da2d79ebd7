package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/config"
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
// key) on ringfenced and checks the answer against auth.Rules: a role without the permission
// is denied, a role with it gets past authorization, and internal RPCs are not served at all
// (its services call each other in-process).
func TestPermissionMatrix(t *testing.T) {
	a, err := NewAllInOne(t.Context(), testConfig(t), quietLogger())
	require.NoError(t, err)
	conn, _ := testutil.Serve(t, a.Server)
	defer a.Close()

	keys := map[string]string{auth.RoleAdmin: bootstrapKey}
	kc := registryv1.NewKeyServiceClient(conn)
	for _, role := range []string{auth.RoleOperator, auth.RoleAuthor, auth.RoleRunner, auth.RoleApprover, auth.RoleAuditor} {
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
				if len(rule.Internal) > 0 {
					require.Equal(t, codes.Unimplemented, code, "ringfenced serves no internal RPC: %s", full)
				} else if allowed {
					require.NotContains(t, []codes.Code{codes.PermissionDenied, codes.Unauthenticated}, code, "%s with role %s", full, role)
				} else {
					require.Equal(t, codes.PermissionDenied, code, "%s with role %s", full, role)
				}
			})
		}
		t.Run(string(md.Name())+"/no-key", func(t *testing.T) {
			code := invoke(t, conn, md, full, "")
			if len(rule.Internal) > 0 {
				require.Equal(t, codes.Unimplemented, code, "ringfenced serves no internal RPC")
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
	// A server that refuses the stream may end it before the request is sent: SendMsg then
	// returns io.EOF, and the status is RecvMsg's (grpc.ClientStream).
	if err := stream.SendMsg(req); !errors.Is(err, io.EOF) {
		require.NoError(t, err)
		require.NoError(t, stream.CloseSend())
	}
	return status.Code(stream.RecvMsg(resp))
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
	ctx := auth.SystemContext(t.Context(), "test")
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

// TestTenancyIsResolvedOnAStreamsFirstMessage: a streaming RPC's tenant is in its first
// message, which the interceptor reads before the handler runs: a key bound to acme that asks
// to watch or export globex's records is refused, and its own export holds acme's only.
func TestTenancyIsResolvedOnAStreamsFirstMessage(t *testing.T) {
	a, err := NewAllInOne(t.Context(), testConfig(t), quietLogger())
	require.NoError(t, err)
	conn, _ := testutil.Serve(t, a.Server)
	defer a.Close()
	admin := testutil.WithKey(t.Context(), bootstrapKey)
	minted, err := registryv1.NewKeyServiceClient(conn).CreateKey(admin, &registryv1.CreateKeyRequest{Name: "acme-auditor", Role: auth.RoleAuditor, Tenant: "acme"})
	require.NoError(t, err)
	acme := testutil.WithKey(t.Context(), minted.GetSecret())
	_, err = publisherv1.NewPublisherServiceClient(conn).CreateGraph(admin, &publisherv1.CreateGraphRequest{GraphId: "g", Tenant: "acme"})
	require.NoError(t, err)
	_, err = publisherv1.NewPublisherServiceClient(conn).CreateGraph(admin, &publisherv1.CreateGraphRequest{GraphId: "g", Tenant: "globex"})
	require.NoError(t, err)
	require.NoError(t, a.Publisher.Spool().Flush(t.Context()))

	ac := auditv1.NewAuditServiceClient(conn)
	watch, err := ac.Watch(acme, &auditv1.WatchRequest{FromSeq: 1, Filter: &auditv1.Filter{Tenant: "globex"}})
	require.NoError(t, err)
	_, err = watch.Recv()
	st := testutil.RequireStatus(t, err, codes.PermissionDenied)
	require.Contains(t, st.Message(), `bound to another tenant ("acme")`)

	export, err := ac.Export(acme, &auditv1.ExportRequest{})
	require.NoError(t, err)
	n := 0
	for {
		resp, err := export.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.Equal(t, "acme", resp.GetRecord().GetTenant())
		n++
	}
	require.Equal(t, 1, n, "acme's graph, not globex's")
}

// TestOAuthCallbackURLFollowsTheListener: the callback is oauth.callback_url when set, else at
// the origin of frontdoor.public_url, else at the HTTP listener's address (127.0.0.1 for an
// unspecified host); without an HTTP listener there is none, and sign-in is off.
func TestOAuthCallbackURLFollowsTheListener(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"RINGFENCE_HTTP_ADDR=0.0.0.0:8000"}, "http://127.0.0.1:8000/v1/oauth/callback"},
		{[]string{"RINGFENCE_FRONTDOOR__PUBLIC_URL=https://tools.example.com/mcp"}, "https://tools.example.com/v1/oauth/callback"},
		{[]string{"RINGFENCE_OAUTH__CALLBACK_URL=https://sso.example.com/v1/oauth/callback", "RINGFENCE_FRONTDOOR__PUBLIC_URL=https://tools.example.com/mcp"}, "https://sso.example.com/v1/oauth/callback"},
		{[]string{"RINGFENCE_HTTP_ADDR="}, ""},
	} {
		require.Equal(t, tc.want, oauthCallbackURL(testConfig(t, tc.env...)), "%v", tc.env)
	}
}

// TestAStoppingServerEndsAuditWatches: an audit watch (ringfence audit tail) open when
// ringfenced stops ends as the stop begins, with UNAVAILABLE naming the record to watch again
// from, rather than holding the graceful stop until its timeout and then being cut.
func TestAStoppingServerEndsAuditWatches(t *testing.T) {
	s := serveAllInOne(t)
	conn, stop, ran := s.conn, s.stop, s.ran

	admin := testutil.WithKey(t.Context(), bootstrapKey)
	watch, err := auditv1.NewAuditServiceClient(conn).Watch(admin, &auditv1.WatchRequest{FromSeq: 1})
	require.NoError(t, err)
	first, err := watch.Recv() // the bootstrap key's record: the watch is in place
	require.NoError(t, err)
	require.EqualValues(t, 1, first.GetRecord().GetSeq())

	stop()
	seen := first.GetRecord().GetSeq()
	var last error
	for last == nil {
		var resp *auditv1.WatchResponse
		if resp, last = watch.Recv(); last == nil {
			seen = resp.GetRecord().GetSeq()
		}
	}
	require.Equal(t, codes.Unavailable, status.Code(last), "%v", last)
	require.Contains(t, status.Convert(last).Message(), fmt.Sprintf("the audit service is stopping: watch again from record %d", seen+1))
	require.NoError(t, <-ran)
}

// served is ringfenced (NewAllInOne) serving on loopback ports, with a client connection.
type served struct {
	conn     *grpc.ClientConn
	httpAddr net.Addr
	stop     context.CancelFunc // begins the stop; ran then answers Run's error
	ran      chan error
}

// serveAllInOne starts ringfenced; a test that does not stop it leaves that to its cleanup.
func serveAllInOne(t *testing.T) served {
	t.Helper()
	a, err := NewAllInOne(t.Context(), testConfig(t), quietLogger())
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	ctx, stop := context.WithCancel(context.Background())
	ran, done := make(chan error, 1), make(chan struct{})
	go func() { ran <- a.Server.Run(ctx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	addr, httpAddr, err := a.Server.Addrs(ctx)
	require.NoError(t, err)
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return served{conn: conn, httpAddr: httpAddr, stop: stop, ran: ran}
}

// TestAKeySentTwiceIsRefused: two API keys on one request (two x-api-key entries, two
// X-API-Key headers) are refused as UNAUTHENTICATED whatever their values, over gRPC, REST and
// the audit export alike: the server took the first one, so a key a proxy put in front of the
// caller's decided who the caller was.
func TestAKeySentTwiceIsRefused(t *testing.T) {
	s := serveAllInOne(t)
	conn, httpAddr := s.conn, s.httpAddr

	twice := metadata.AppendToOutgoingContext(t.Context(), auth.MetadataKey, bootstrapKey, auth.MetadataKey, "some-other-key-0123456789")
	_, err := registryv1.NewRegistryServiceClient(conn).ListSecrets(twice, &registryv1.ListSecretsRequest{})
	require.Contains(t, testutil.RequireStatus(t, err, codes.Unauthenticated).Message(), "the API key is sent 2 times: send one")
	_, err = registryv1.NewRegistryServiceClient(conn).ListSecrets(testutil.WithKey(t.Context(), bootstrapKey), &registryv1.ListSecretsRequest{})
	require.NoError(t, err, "one key is fine")

	for _, path := range []string{"/v1/secrets", "/v1/audit/export"} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+httpAddr.String()+path, nil)
		require.NoError(t, err)
		req.Header.Add("X-API-Key", bootstrapKey)
		req.Header.Add("X-API-Key", "some-other-key-0123456789")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s: %s", path, body)
		require.Contains(t, string(body), "the API key is sent 2 times", path)
	}
}

// TestFilesItCannotMakeNameTheirKey: a secrets key file or a data_dir the server cannot
// create stops the start naming the setting and what to do, not with the file system's error
// alone.
func TestFilesItCannotMakeNameTheirKey(t *testing.T) {
	blocker := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(blocker, nil, 0o600))

	cfg := testConfig(t, "RINGFENCE_SECRETS_KEY_FILE="+filepath.Join(t.TempDir(), "missing", "secrets.key"))
	_, err := secretsBox(cfg)
	require.ErrorContains(t, err, "secrets_key_file (RINGFENCE_SECRETS_KEY_FILE; default <data_dir>/secrets.key)")
	require.ErrorContains(t, err, "create its directory")

	cfg = testConfig(t, "RINGFENCE_DATA_DIR="+filepath.Join(blocker, "data"))
	_, err = dataFile(cfg, "registry.db")
	require.ErrorContains(t, err, "data_dir (RINGFENCE_DATA_DIR)")
	require.ErrorContains(t, err, "name a directory this user may create and write")

	// Set under the seed's name, each is named so (configuration.md).
	cfg, err = config.Load("test", nil, []string{"ZEROTH_DATA_DIR=" + filepath.Join(blocker, "data")}, io.Discard)
	require.NoError(t, err)
	_, err = dataFile(cfg, "registry.db")
	require.ErrorContains(t, err, "data_dir (ZEROTH_DATA_DIR, read as RINGFENCE_DATA_DIR)")
	cfg = testConfig(t, "ZEROTH_SECRETS_KEY_FILE="+filepath.Join(t.TempDir(), "missing", "secrets.key"))
	_, err = secretsBox(cfg)
	require.ErrorContains(t, err, "secrets_key_file (ZEROTH_SECRETS_KEY_FILE, read as RINGFENCE_SECRETS_KEY_FILE; default <data_dir>/secrets.key)")
}
