package grpcserver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
)

// TestRouteMethodsMatchGatewayYAML: every REST route has its RPC in routeMethods, so none is
// left to have its body decoded before its permission is checked.
func TestRouteMethodsMatchGatewayYAML(t *testing.T) {
	want := map[string]string{}
	for route, r := range gatewayRoutes(t) {
		want[route] = r.rpc
	}
	require.Equal(t, want, routeMethods)
}

// TestEveryRouteIsFoundInTheTableAsTheGatewayMatchesIt: what route() makes of the pattern the
// gateway matched is the table's key, for every route and path values that could confuse it
// (an escaped slash, a verb-like suffix); a route that rendered otherwise would be refused.
func TestEveryRouteIsFoundInTheTableAsTheGatewayMatchesIt(t *testing.T) {
	var matched string
	mux := NewGatewayMux(func(runtime.HandlerFunc) runtime.HandlerFunc {
		return func(_ http.ResponseWriter, r *http.Request, _ map[string]string) { matched = route(r) }
	})
	conn, err := grpc.NewClient("passthrough:///unused", grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	for _, register := range []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{
		registryv1.RegisterRegistryServiceHandler, registryv1.RegisterKeyServiceHandler,
		publisherv1.RegisterPublisherServiceHandler, poolv1.RegisterPoolServiceHandler, auditv1.RegisterAuditServiceHandler,
	} {
		require.NoError(t, register(t.Context(), mux, conn))
	}
	variable := regexp.MustCompile(`\{[^}]+\}`)
	for rt := range gatewayRoutes(t) {
		method, pattern, _ := strings.Cut(rt, " ")
		for _, value := range []string{"x", "a%2Fb", "x%3Acall"} {
			matched = ""
			mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, variable.ReplaceAllString(pattern, value), nil))
			if matched == "" && value != "x" {
				continue // not a value this route's path takes
			}
			require.Equal(t, rt, matched, "%s with %s", rt, value)
		}
	}
}

// TestAFormPostIsNotServedByAGetRoute: grpc-gateway would parse a form-encoded POST whole
// before any middleware and serve it by the GET route of its path (or the method an
// X-HTTP-Method-Override names); both are off, so such a request is 405 having been read by
// nobody, and a route the table lacks would be refused, not let through.
func TestAFormPostIsNotServedByAGetRoute(t *testing.T) {
	authz := &denyCreate{}
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: authz,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	registryv1.RegisterRegistryServiceServer(srv.GRPC(), listOnly{})
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		if err := mux.HandlePath(http.MethodGet, "/v1/unlisted", func(w http.ResponseWriter, _ *http.Request, _ map[string]string) {
			w.WriteHeader(http.StatusTeapot)
		}); err != nil {
			return err
		}
		return registryv1.RegisterRegistryServiceHandler(ctx, mux, conn)
	})
	_, base := start(t, srv)
	for _, override := range []string{"", "GET"} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/mcp/servers/x/tools", endlessBody(ctx, "page_size=1&"))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if override != "" {
			req.Header.Set("X-HTTP-Method-Override", override)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, "answered without reading the body (override %q)", override)
		resp.Body.Close()
		cancel()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "override %q", override)
	}
	authz.mu.Lock()
	require.Empty(t, authz.asked, "no route and no RPC was reached")
	authz.mu.Unlock()

	// A route answered by the routing error handler (unknown path, wrong method) does not
	// wait for the body either.
	for _, tc := range []struct {
		path string
		code int
	}{{"/v1/nope", http.StatusNotFound}, {"/v1/mcp/servers/x/tools", http.StatusMethodNotAllowed}} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+tc.path, endlessBody(ctx, `{"a":`))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, "%s answered without reading the body", tc.path)
		resp.Body.Close()
		cancel()
		require.Equal(t, tc.code, resp.StatusCode, tc.path)
	}

	// A route the table does not name is refused, not let through.
	resp, err := http.Get(base + "/v1/unlisted")
	require.NoError(t, err)
	var body ErrorBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, "GET /v1/unlisted has no authorization rule (routeMethods): nobody may call it", body.Message)
}

// endlessBody is a request body that sends start and then nothing until ctx ends (an HTTP
// client's body writer holds Do until its body ends).
func endlessBody(ctx context.Context, start string) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(start))
		<-ctx.Done()
		pw.CloseWithError(ctx.Err())
	}()
	return pr
}

// denyCreate refuses CreateServer and allows everything else, counting what it was asked.
type denyCreate struct {
	mu    sync.Mutex
	asked []string
}

func (d *denyCreate) Authorize(ctx context.Context, method string) (context.Context, error) {
	d.mu.Lock()
	d.asked = append(d.asked, method)
	d.mu.Unlock()
	if method == registryv1.RegistryService_CreateServer_FullMethodName {
		return nil, status.Error(codes.PermissionDenied, "auth: RegistryService.CreateServer needs permission mcp:admin")
	}
	return ctx, nil
}

// listOnly answers ListServers; CreateServer is never reached in these tests.
type listOnly struct {
	registryv1.UnimplementedRegistryServiceServer
}

func (listOnly) ListServers(context.Context, *registryv1.ListServersRequest) (*registryv1.ListServersResponse, error) {
	return &registryv1.ListServersResponse{}, nil
}

// TestARouteIsAuthorizedBeforeItsBodyIsRead: a key without the route's permission is refused
// 403 whatever its body: one that would not decode, and one that never ends (the answer comes
// with the body unread). The refusal is counted and logged as the RPC's; an allowed route is
// counted once.
func TestARouteIsAuthorizedBeforeItsBodyIsRead(t *testing.T) {
	authz := &denyCreate{}
	var logs bytes.Buffer
	var logMu sync.Mutex
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: authz,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))})
	registryv1.RegisterRegistryServiceServer(srv.GRPC(), listOnly{})
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return registryv1.RegisterRegistryServiceHandler(ctx, mux, conn)
	})
	_, base := start(t, srv)

	resp, err := http.Post(base+"/v1/mcp/servers", "application/json", strings.NewReader(`{"ref": [[[`))
	require.NoError(t, err)
	var body ErrorBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "the permission is checked before the body is decoded: %+v", body)
	require.Equal(t, "auth: RegistryService.CreateServer needs permission mcp:admin", body.Message)
	require.NotEmpty(t, resp.Header.Get("X-Request-Id"))

	// A body that never ends: the refusal is written without reading it.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/mcp/servers", endlessBody(ctx, `{"ref":"`))
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err, "the server answers before the body ends")
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)

	resp, err = http.Get(base + "/v1/mcp/servers")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	resp, err = http.Get(base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(metrics), `ringfence_grpc_requests_total{code="PermissionDenied",method="/ringfence.registry.v1.RegistryService/CreateServer"} 2`)
	require.Contains(t, string(metrics), `ringfence_grpc_requests_total{code="OK",method="/ringfence.registry.v1.RegistryService/ListServers"} 1`,
		"the route's check is not counted as a call")
	logMu.Lock()
	require.Contains(t, logs.String(), "method=/ringfence.registry.v1.RegistryService/CreateServer code=PermissionDenied")
	logMu.Unlock()
	authz.mu.Lock()
	require.Equal(t, []string{
		registryv1.RegistryService_CreateServer_FullMethodName, registryv1.RegistryService_CreateServer_FullMethodName,
		registryv1.RegistryService_ListServers_FullMethodName, registryv1.RegistryService_ListServers_FullMethodName,
	}, authz.asked, "checked at the route, and again by the RPC for an allowed one")
	authz.mu.Unlock()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestAGatewayRefusalIsCountedAndLoggedAsItsRPC: a REST request the gateway refuses before
// any RPC (a body that does not decode, a query parameter no field takes) is counted in
// ringfence_grpc_requests_total and logged under the route's RPC, as a refused permission is;
// one that reaches the RPC is counted once, by the RPC.
func TestAGatewayRefusalIsCountedAndLoggedAsItsRPC(t *testing.T) {
	var logs bytes.Buffer
	var logMu sync.Mutex
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: allowAll{},
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))})
	registryv1.RegisterRegistryServiceServer(srv.GRPC(), listOnly{})
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return registryv1.RegisterRegistryServiceHandler(ctx, mux, conn)
	})
	_, base := start(t, srv)
	send := func(method, path, body string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}

	require.Equal(t, http.StatusBadRequest, send(http.MethodPost, "/v1/mcp/servers", `{"ref": [[[`))
	require.Equal(t, http.StatusBadRequest, send(http.MethodGet, "/v1/mcp/servers?no_such_parameter=1", ""))
	require.Equal(t, http.StatusNotImplemented, send(http.MethodPost, "/v1/mcp/servers", `{"ref": "a"}`), "reaches the RPC")

	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(metrics), `ringfence_grpc_requests_total{code="InvalidArgument",method="/ringfence.registry.v1.RegistryService/CreateServer"} 1`)
	require.Contains(t, string(metrics), `ringfence_grpc_requests_total{code="InvalidArgument",method="/ringfence.registry.v1.RegistryService/ListServers"} 1`)
	require.Contains(t, string(metrics), `ringfence_grpc_requests_total{code="Unimplemented",method="/ringfence.registry.v1.RegistryService/CreateServer"} 1`,
		"a request that reached its RPC is counted by the RPC alone")
	logMu.Lock()
	defer logMu.Unlock()
	require.Regexp(t, `level=INFO msg=rpc method=/ringfence.registry.v1.RegistryService/CreateServer code=InvalidArgument duration=\S+ request_id=\S+ err="invalid JSON body`, logs.String())
	require.Contains(t, logs.String(), "method=/ringfence.registry.v1.RegistryService/ListServers code=InvalidArgument")
	require.Equal(t, 1, strings.Count(logs.String(), "code=Unimplemented"), logs.String())
}
