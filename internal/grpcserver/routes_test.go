package grpcserver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(`{"ref":"`))
		<-ctx.Done() // the client's body writer holds Do until the body ends
		pw.CloseWithError(ctx.Err())
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/mcp/servers", pr)
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
