package grpcserver

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ringfence/ringfence/internal/auth"
)

// routeMethods maps every REST route, "METHOD pattern" as proto/gateway.yaml writes it, to the
// gRPC method behind it, so that the gateway checks a route's permission before it reads the
// body. TestRouteMethodsMatchGatewayYAML keeps it equal to proto/gateway.yaml.
var routeMethods = map[string]string{
	"POST /v1/mcp/servers":                                   "/ringfence.registry.v1.RegistryService/CreateServer",
	"GET /v1/mcp/servers":                                    "/ringfence.registry.v1.RegistryService/ListServers",
	"GET /v1/mcp/servers/{ref}":                              "/ringfence.registry.v1.RegistryService/GetServer",
	"PUT /v1/mcp/servers/{ref}":                              "/ringfence.registry.v1.RegistryService/UpdateServer",
	"PATCH /v1/mcp/servers/{ref}":                            "/ringfence.registry.v1.RegistryService/UpdateServer",
	"DELETE /v1/mcp/servers/{ref}":                           "/ringfence.registry.v1.RegistryService/DeleteServer",
	"GET /v1/mcp/servers/{ref}/tools":                        "/ringfence.registry.v1.RegistryService/ListServerTools",
	"POST /v1/mcp/servers/{ref}:explore":                     "/ringfence.registry.v1.RegistryService/ExploreServer",
	"PUT /v1/secrets/{name}":                                 "/ringfence.registry.v1.RegistryService/PutSecret",
	"GET /v1/secrets":                                        "/ringfence.registry.v1.RegistryService/ListSecrets",
	"DELETE /v1/secrets/{name}":                              "/ringfence.registry.v1.RegistryService/DeleteSecret",
	"POST /v1/keys":                                          "/ringfence.registry.v1.KeyService/CreateKey",
	"GET /v1/keys":                                           "/ringfence.registry.v1.KeyService/ListKeys",
	"POST /v1/keys/{id}:revoke":                              "/ringfence.registry.v1.KeyService/RevokeKey",
	"GET /v1/roles":                                          "/ringfence.registry.v1.KeyService/ListRoles",
	"POST /v1/graphs":                                        "/ringfence.publisher.v1.PublisherService/CreateGraph",
	"GET /v1/graphs":                                         "/ringfence.publisher.v1.PublisherService/ListGraphs",
	"GET /v1/graphs/{graph_id}/draft":                        "/ringfence.publisher.v1.PublisherService/GetDraft",
	"PUT /v1/graphs/{graph_id}/draft":                        "/ringfence.publisher.v1.PublisherService/ReplaceDraft",
	"POST /v1/graphs/{graph_id}/draft:validate":              "/ringfence.publisher.v1.PublisherService/ValidateDraft",
	"POST /v1/graphs/{graph_id}:publish":                     "/ringfence.publisher.v1.PublisherService/Publish",
	"GET /v1/graphs/{graph_id}/versions":                     "/ringfence.publisher.v1.PublisherService/ListVersions",
	"GET /v1/graphs/{graph_id}/versions/{version}":           "/ringfence.publisher.v1.PublisherService/GetVersion",
	"DELETE /v1/graphs/{graph_id}":                           "/ringfence.publisher.v1.PublisherService/DeleteGraph",
	"POST /v1/graphs/{graph_id}:import":                      "/ringfence.publisher.v1.PublisherService/ImportTools",
	"POST /v1/runs":                                          "/ringfence.pool.v1.PoolService/StartRun",
	"GET /v1/runs/{run_id}":                                  "/ringfence.pool.v1.PoolService/GetRun",
	"POST /v1/runs/{run_id}:call":                            "/ringfence.pool.v1.PoolService/CallTool",
	"POST /v1/runs/{run_id}:pause":                           "/ringfence.pool.v1.PoolService/PauseRun",
	"POST /v1/runs/{run_id}:resume":                          "/ringfence.pool.v1.PoolService/ResumeRun",
	"POST /v1/runs/{run_id}:end":                             "/ringfence.pool.v1.PoolService/EndRun",
	"GET /v1/runs/{run_id}/agents/{agent}/tools":             "/ringfence.pool.v1.PoolService/ListAgentTools",
	"GET /v1/runs/{run_id}/approvals":                        "/ringfence.pool.v1.PoolService/ListApprovals",
	"POST /v1/runs/{run_id}/approvals/{approval_id}:approve": "/ringfence.pool.v1.PoolService/ApproveCall",
	"POST /v1/runs/{run_id}/approvals/{approval_id}:deny":    "/ringfence.pool.v1.PoolService/DenyCall",
	"POST /v1/runs/{run_id}/tokens":                          "/ringfence.pool.v1.PoolService/CreateAgentToken",
	"GET /v1/runs/{run_id}/tokens":                           "/ringfence.pool.v1.PoolService/ListAgentTokens",
	"DELETE /v1/runs/{run_id}/tokens/{token_id}":             "/ringfence.pool.v1.PoolService/RevokeAgentToken",
	"POST /v1/documents":                                     "/ringfence.pool.v1.PoolService/PutDocument",
	"GET /v1/documents/{document_id}":                        "/ringfence.pool.v1.PoolService/GetDocument",
	"DELETE /v1/documents/{document_id}":                     "/ringfence.pool.v1.PoolService/DeleteDocument",
	"POST /v1/mcp/servers/{ref}:connect":                     "/ringfence.pool.v1.PoolService/ConnectServer",
	"GET /v1/audit/records":                                  "/ringfence.audit.v1.AuditService/List",
	"GET /v1/audit/records:watch":                            "/ringfence.audit.v1.AuditService/Watch",
	"POST /v1/audit:verify":                                  "/ringfence.audit.v1.AuditService/Verify",
}

// allowedMethods names the methods of the routes whose pattern matches path, sorted, for the
// Allow header of a 405: HEAD beside GET, which every GET route answers (headAsGet).
func allowedMethods(path string) []string {
	var methods []string
	for r := range routeMethods {
		method, pattern, _ := strings.Cut(r, " ")
		if patternMatches(pattern, path) && !slices.Contains(methods, method) {
			methods = append(methods, method)
			if method == http.MethodGet {
				methods = append(methods, http.MethodHead)
			}
		}
	}
	slices.Sort(methods)
	return methods
}

// patternMatches reports whether path fits a routeMethods pattern: literal segments equal, a
// {variable} one non-empty segment, and a custom verb (":call") the end of the last segment.
func patternMatches(pattern, path string) bool {
	if i := strings.LastIndex(pattern, ":"); i > strings.LastIndex(pattern, "/") {
		verb := pattern[i:]
		if !strings.HasSuffix(path, verb) {
			return false
		}
		pattern, path = pattern[:i], strings.TrimSuffix(path, verb)
	}
	want, got := strings.Split(pattern, "/"), strings.Split(path, "/")
	if len(want) != len(got) {
		return false
	}
	for i, w := range want {
		if strings.HasPrefix(w, "{") {
			if got[i] == "" {
				return false
			}
		} else if w != got[i] {
			return false
		}
	}
	return true
}

// route names the route the gateway matched for r, "METHOD pattern" with path variables as
// gateway.yaml writes them ({ref}, not the gateway's {ref=*}); "" before a route is matched.
func route(r *http.Request) string {
	p, ok := runtime.HTTPPattern(r.Context())
	if !ok {
		return ""
	}
	return r.Method + " " + capture.ReplaceAllString(p.String(), "}")
}

// authorizeRoute checks the permission of the RPC behind a REST route before the gateway
// decodes the body: a key without it is refused having sent at most the headers, never a body
// decoded into a message. The RPC checks again, as it does for every gRPC caller; a refusal
// here is counted and logged as that RPC's refusal would be.
func (s *Server) authorizeRoute(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		if s.opts.Authorizer == nil {
			next(w, r, params)
			return
		}
		method, ok := routeMethods[route(r)]
		if !ok {
			// Fail closed, as the Authorizer does for a method without a rule.
			refuseUnread(w, r, status.Errorf(codes.PermissionDenied, "%s has no authorization rule (routeMethods): nobody may call it", route(r)))
			return
		}
		start := time.Now()
		rid := r.Header.Get("X-Request-Id") // set, and sane, by httpRequestID
		ctx := metadata.NewIncomingContext(r.Context(), metadata.MD{auth.MetadataKey: r.Header.Values("X-API-Key")})
		if _, err := s.opts.Authorizer.Authorize(ctx, method); err != nil {
			s.finish(ctx, method, &requestInfo{id: rid}, start, err)
			refuseUnread(w, r, err)
			return
		}
		g := &gatewayRequest{}
		next(w, r.WithContext(context.WithValue(r.Context(), gatewayRequestKey{}, g)), params)
		if !g.rpcSent.Load() && g.refusal != nil {
			s.finish(ctx, method, &requestInfo{id: rid}, start, g.refusal)
		}
	}
}

// gatewayRequest follows one REST request from its route's check to its answer, so that a
// refusal the gateway writes before any RPC (a body that does not decode, a query parameter no
// field takes) is counted and logged as that RPC's refusal, as a refused permission is: with
// no RPC, the server's own access line and metrics would never see it.
type gatewayRequest struct {
	rpcSent atomic.Bool // set by the gateway connection's interceptors as the RPC is sent
	refusal error       // what writeError answered, if it answered
}

type gatewayRequestKey struct{}

func gatewayRequestOf(ctx context.Context) *gatewayRequest {
	g, _ := ctx.Value(gatewayRequestKey{}).(*gatewayRequest)
	return g
}

// markRPCSent and markStreamSent are the gateway connection's interceptors (gatewayRequest).
func markRPCSent(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if g := gatewayRequestOf(ctx); g != nil {
		g.rpcSent.Store(true)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func markStreamSent(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if g := gatewayRequestOf(ctx); g != nil {
		g.rpcSent.Store(true)
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// refuseUnread answers a request refused before its body was read.
func refuseUnread(w http.ResponseWriter, r *http.Request, err error) {
	closeIfBodyUnread(w, r)
	writeError(r.Context(), nil, nil, w, r, err)
}

// closeIfBodyUnread, before an answer that did not read the request's body: on HTTP/1
// net/http would drain up to 256 KiB of the body before answering, as slowly as the client
// cares to send it; closing the connection after the answer lets it go out at once. (HTTP/2
// resets the stream and needs nothing.)
func closeIfBodyUnread(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 && r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
}
