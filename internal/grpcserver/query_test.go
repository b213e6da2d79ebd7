package grpcserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
)

// echoAudit answers List with one record whose kind is the filter's, so a test sees what the
// gateway bound from the query.
type echoAudit struct {
	auditv1.UnimplementedAuditServiceServer
}

func (echoAudit) List(_ context.Context, req *auditv1.ListRequest) (*auditv1.ListResponse, error) {
	return &auditv1.ListResponse{Records: []*auditv1.Record{{Kind: req.GetFilter().GetKind()}}, NextPageToken: req.GetPageToken()}, nil
}

// Watch fails at once for filter.kind "refuse"; otherwise it sends one record and then fails,
// as a server that stops ends a watch.
func (echoAudit) Watch(req *auditv1.WatchRequest, stream auditv1.AuditService_WatchServer) error {
	if req.GetFilter().GetKind() == "refuse" {
		return status.Error(codes.InvalidArgument, "audit: invalid filter: kind is not one of admin, tool_call")
	}
	if err := stream.Send(&auditv1.WatchResponse{Record: &auditv1.Record{Kind: "admin"}}); err != nil {
		return err
	}
	return status.Error(codes.Unavailable, "audit: the server is stopping: watch again from seq 2")
}

// TestUnknownQueryParametersAreRefused: a misspelt filter is 400 naming it and the
// parameters the route takes, never a silently unfiltered answer.
func TestUnknownQueryParametersAreRefused(t *testing.T) {
	base := auditGateway(t)
	get := func(query string) (int, map[string]any) {
		t.Helper()
		return getJSON(t, base+"/v1/audit/records?"+query)
	}

	for _, ok := range []string{"filter.kind=admin", "filter.kind=admin&page_size=1&page_token=x", "filter.runId=r&pageSize=1", "filter.since=2026-01-01T00:00:00Z"} {
		code, body := get(ok)
		require.Equal(t, http.StatusOK, code, "%s: %v", ok, body)
	}
	code, body := get("filter.kind=admin")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, "admin", body["records"].([]any)[0].(map[string]any)["kind"])

	for _, tc := range []struct{ query, param string }{
		{"kidn=admin", "kidn"},
		{"kind=admin", "kind"},
		{"filter.kidn=admin&page_size=1", "filter.kidn"},
		{"page_size=1&zzz=1&aaa=2", "aaa"},
	} {
		code, body = get(tc.query)
		require.Equal(t, http.StatusBadRequest, code, tc.query)
		require.Equal(t, "INVALID_ARGUMENT", body["status"])
		require.Contains(t, body["message"], `unknown query parameter "`+tc.param+`": this route takes only filter.tenant, filter.run_id, `)
		require.Contains(t, body["message"], "filter.kind, filter.since, filter.until, filter.call_id, page_size, page_token")
	}
}

// TestAnUnknownPathNamesItself: a path no route takes is a 404 that says so, not a bare "Not
// Found" that reads like a missing resource.
func TestAnUnknownPathNamesItself(t *testing.T) {
	code, body := getJSON(t, auditGateway(t)+"/v1/audit/recordz")
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, "NOT_FOUND", body["status"])
	require.Contains(t, body["message"], `no route takes GET "/v1/audit/recordz": docs/api.md lists the routes`)

	// The path named is the one sent: a %2F the gateway reads as a separator is kept, and said.
	code, body = getJSON(t, auditGateway(t)+"/v1/audit/records%2Fall")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body["message"], `no route takes GET "/v1/audit/records%2Fall"`)
	require.Contains(t, body["message"], "a path variable never holds a /, even sent as %2F")
}

// auditGateway serves echoAudit over gRPC and REST and returns the REST base URL.
func auditGateway(t *testing.T) string {
	t.Helper()
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: allowAll{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	auditv1.RegisterAuditServiceServer(srv.GRPC(), echoAudit{})
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return auditv1.RegisterAuditServiceHandler(ctx, mux, conn)
	})
	_, base := start(t, srv)
	return base
}

func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return resp.StatusCode, body
}

// TestAQueryOnABodyRouteIsRefused: POST, PUT and PATCH take their fields in the body; a query
// there would be dropped unread.
func TestAQueryOnABodyRouteIsRefused(t *testing.T) {
	resp, err := http.Post(auditGateway(t)+"/v1/audit:verify?anchor_seq=3", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, "INVALID_ARGUMENT", body["status"])
	require.Equal(t, `unknown query parameter "anchor_seq": POST routes take no query parameters; send the fields in the JSON body (docs/api.md)`, body["message"])
}

// gatewayRoute is what proto/gateway.yaml says of one route.
type gatewayRoute struct {
	// rpc is the gRPC method behind the route, /pkg.Service/Method.
	rpc string
	// starBody: the route has a "*" body; pathOnly: the path binds every field of the request.
	starBody, pathOnly bool
}

// gatewayRoutes reads proto/gateway.yaml, by route ("METHOD path").
func gatewayRoutes(t *testing.T) map[string]gatewayRoute {
	t.Helper()
	raw, err := os.ReadFile("../../proto/gateway.yaml")
	require.NoError(t, err)
	// A rule's additional_bindings are rules of the same selector.
	type rule struct {
		Selector, Get, Post, Put, Patch, Delete, Body string
		AdditionalBindings                            []rule `yaml:"additional_bindings"`
	}
	var cfg struct {
		HTTP struct {
			Rules []rule `yaml:"rules"`
		} `yaml:"http"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &cfg))
	require.NotEmpty(t, cfg.HTTP.Rules)
	_ = registryv1.File_ringfence_registry_v1_registry_proto
	_ = publisherv1.File_ringfence_publisher_v1_publisher_proto
	_ = poolv1.File_ringfence_pool_v1_pool_proto
	_ = auditv1.File_ringfence_audit_v1_audit_proto
	pathParam := regexp.MustCompile(`\{([a-z_.]+)\}`)
	out := map[string]gatewayRoute{}
	var rules []rule
	for _, r := range cfg.HTTP.Rules {
		rules = append(rules, r)
		for _, b := range r.AdditionalBindings {
			b.Selector = r.Selector
			rules = append(rules, b)
		}
	}
	for _, rule := range rules {
		for method, path := range map[string]string{"get": rule.Get, "post": rule.Post, "put": rule.Put, "patch": rule.Patch, "delete": rule.Delete} {
			if path == "" {
				continue
			}
			d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(rule.Selector))
			require.NoError(t, err, rule.Selector)
			in := d.(protoreflect.MethodDescriptor).Input()
			bound := map[string]bool{}
			for _, m := range pathParam.FindAllStringSubmatch(path, -1) {
				bound[m[1]] = true
			}
			pathOnly := true
			for i := range in.Fields().Len() {
				pathOnly = pathOnly && bound[string(in.Fields().Get(i).Name())]
			}
			rpc := "/" + string(d.Parent().FullName()) + "/" + string(d.Name())
			out[strings.ToUpper(method)+" "+path] = gatewayRoute{rpc: rpc, starBody: rule.Body == "*", pathOnly: pathOnly}
		}
	}
	return out
}

// TestBodyRoutesTakeNoQuery keeps proto/gateway.yaml to what refuseUnreadQuery assumes: a
// POST, PUT or PATCH route binds every field of its request from the path or a "*" body.
func TestBodyRoutesTakeNoQuery(t *testing.T) {
	for route, r := range gatewayRoutes(t) {
		if strings.HasPrefix(route, "GET ") || strings.HasPrefix(route, "DELETE ") {
			continue
		}
		require.True(t, r.starBody || r.pathOnly, "%s: a field is neither in the path nor in a \"*\" body, so it could only come from the query, which refuseUnreadQuery refuses", route)
	}
}

// TestQuerylessRoutesMatchGatewayYAML: queryless names exactly the GET and DELETE routes
// whose request the path binds whole.
func TestQuerylessRoutesMatchGatewayYAML(t *testing.T) {
	want := map[string]bool{}
	for route, r := range gatewayRoutes(t) {
		if (strings.HasPrefix(route, "GET ") || strings.HasPrefix(route, "DELETE ")) && r.pathOnly {
			want[route] = true
		}
	}
	require.Equal(t, want, queryless)
}

// TestAQueryOnAQuerylessRouteIsRefused: GET /v1/roles?x=1 would be answered as if it were
// GET /v1/roles.
func TestAQueryOnAQuerylessRouteIsRefused(t *testing.T) {
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: allowAll{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	auditv1.RegisterAuditServiceServer(srv.GRPC(), echoAudit{})
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return registryv1.RegisterRegistryServiceHandler(ctx, mux, conn)
	})
	_, base := start(t, srv)
	code, body := getJSON(t, base+"/v1/mcp/servers/docs?verbose=1")
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, `unknown query parameter "verbose": GET /v1/mcp/servers/{ref} takes no query parameters (docs/api.md)`, body["message"])
}

// TestParametersThatAreNotUTF8AreRefused: a path variable or query parameter that is not
// valid UTF-8 binds a string field grpc-go cannot marshal, which answered 500 with no request
// id. It is a 400 naming the parameter, never quoting the value, before the body is read.
func TestParametersThatAreNotUTF8AreRefused(t *testing.T) {
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: allowAll{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	auditv1.RegisterAuditServiceServer(srv.GRPC(), echoAudit{})
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		if err := auditv1.RegisterAuditServiceHandler(ctx, mux, conn); err != nil {
			return err
		}
		if err := registryv1.RegisterRegistryServiceHandler(ctx, mux, conn); err != nil {
			return err
		}
		return registryv1.RegisterKeyServiceHandler(ctx, mux, conn)
	})
	_, base := start(t, srv)

	for _, tc := range []struct{ method, path, body, want string }{
		{"GET", "/v1/mcp/servers/%ff", "", `path variable "ref" is not valid UTF-8 (its value is not shown)`},
		{"DELETE", "/v1/secrets/sk-live%ff", "", `path variable "name" is not valid UTF-8`},
		{"POST", "/v1/keys/%ff:revoke", `{}`, `path variable "id" is not valid UTF-8`},
		{"PUT", "/v1/secrets/%c3", `{"value":"x"}`, `path variable "name" is not valid UTF-8`},
		{"GET", "/v1/mcp/servers?page_token=sk-live%ff", "", `query parameter "page_token" is not valid UTF-8 (its value is not shown)`},
		{"GET", "/v1/audit/records?filter.kind=admin&filter.tenant=%ff", "", `query parameter "filter.tenant" is not valid UTF-8`},
		{"GET", "/v1/audit/records?sk-live%ff=1", "", `a query parameter's name is not valid UTF-8 (it is not shown)`},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tc.method, base+tc.path, strings.NewReader(tc.body))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(raw))
			var body ErrorBody
			require.NoError(t, json.Unmarshal(raw, &body))
			require.Equal(t, "INVALID_ARGUMENT", body.Status)
			require.Contains(t, body.Message, tc.want)
			require.NotContains(t, string(raw), "sk-live")
			require.NotEmpty(t, resp.Header.Get("X-Request-Id"))
			if tc.body != "" {
				require.True(t, resp.Close, "refused before the body is read: the connection is closed, not drained")
			}
		})
	}

	code, body := getJSON(t, base+"/v1/audit/records?filter.kind=%C3%A9t%C3%A9")
	require.Equal(t, http.StatusOK, code, "valid UTF-8 beyond ASCII passes: %v", body)
	require.Equal(t, "été", body["records"].([]any)[0].(map[string]any)["kind"])
}

// TestFormBodiesAreToldToSendJSON: curl -d sends a form unless told otherwise. A JSON body sent
// so decodes as usual; a body that is not JSON is refused naming the header to send, and the
// hint is only for forms.
func TestFormBodiesAreToldToSendJSON(t *testing.T) {
	base := auditGateway(t)
	post := func(contentType, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(base+"/v1/audit:verify", contentType, strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(raw)
	}
	code, body := post("application/x-www-form-urlencoded", "tenant=sk-live-0123")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "; it was sent as application/x-www-form-urlencoded, and the REST routes read only JSON")
	require.Contains(t, body, "-H 'Content-Type: application/json'")
	require.NotContains(t, body, "sk-live-0123")

	code, body = post("multipart/form-data; boundary=x", "--x\r\n")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "it was sent as multipart/form-data")

	code, body = post("application/x-www-form-urlencoded", `{}`)
	require.Equal(t, http.StatusNotImplemented, code, "a JSON body sent as a form decodes and reaches the service: %s", body)

	// curl -d with damaged JSON: the header is not what is wrong, so no form hint.
	code, body = post("application/x-www-form-urlencoded", `{"tenant":`)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "not valid JSON: the body ends early")
	require.NotContains(t, body, "sent as", "damaged JSON is not told to send a JSON header")
	code, body = post("application/x-www-form-urlencoded", `{"tenant":"a"} {"tenant":"b"}`)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "not valid JSON at byte 16")
	require.NotContains(t, body, "sent as")
	code, body = post("application/json", "null")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "the body must be a JSON object, not null")

	code, body = post("application/json", "tenant=x")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "not valid JSON at byte 2")
	require.NotContains(t, body, "sent as", "a JSON request gets no form hint")
}

// TestUnparsableParametersAreNamedNotQuoted: the gateway's own refusal of a parameter it cannot
// parse quoted the value and Go's parse error (`strconv.ParseInt: parsing "abc": invalid
// syntax`); it names the parameter as sent and what it takes, with a BadRequest detail.
func TestUnparsableParametersAreNamedNotQuoted(t *testing.T) {
	base := auditGateway(t)
	for _, tc := range []struct{ query, want string }{
		{"page_size=sk-live-1", `query parameter "page_size" must be a whole number`},
		{"page_size=99999999999", `query parameter "page_size" is out of range for its type: send a smaller number`},
		{"filter.since=sk-live-1", `query parameter "filter.since" must be an RFC 3339 time, e.g. 2026-12-03T10:00:00Z`},
		{"page_size=1&page_size=sk-live-1", `query parameter "page_size" is given more than once: send it once`},
	} {
		code, body := getJSON(t, base+"/v1/audit/records?"+tc.query)
		require.Equal(t, http.StatusBadRequest, code, tc.query)
		require.Equal(t, tc.want, body["message"], tc.query)
		require.NotContains(t, fmt.Sprint(body), "sk-live", "the value is never quoted")
		require.NotContains(t, fmt.Sprint(body), "strconv", "no Go error text")
		violation := body["details"].([]any)[0].(map[string]any)["field_violations"].([]any)[0].(map[string]any)
		require.Equal(t, strings.SplitN(tc.query, "=", 2)[0], violation["field"], tc.query)
	}
}

// TestPathsOutsideTheRoutesAnswerJSON: a path outside /v1/, /healthz and /metrics answered
// net/http's plain-text "404 page not found", and /healthz and /metrics answered any method;
// both now answer in the error body every REST route uses.
func TestPathsOutsideTheRoutesAnswerJSON(t *testing.T) {
	base := auditGateway(t)
	for _, tc := range []struct {
		method, path string
		code         int
		allow, want  string
	}{
		{http.MethodGet, "/", http.StatusNotFound, "", `no route takes GET "/": the REST routes are under /v1/`},
		{http.MethodGet, "/v2/audit/records", http.StatusNotFound, "", `no route takes GET "/v2/audit/records"`},
		{http.MethodPost, "/healthz", http.StatusMethodNotAllowed, "GET, HEAD", `"POST" is not a method of "/healthz": it takes GET, HEAD`},
		{http.MethodDelete, "/metrics", http.StatusMethodNotAllowed, "GET, HEAD", `"DELETE" is not a method of "/metrics"`},
	} {
		req, err := http.NewRequestWithContext(t.Context(), tc.method, base+tc.path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var body ErrorBody
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body), "%s %s", tc.method, tc.path)
		resp.Body.Close()
		require.Equal(t, tc.code, resp.StatusCode)
		require.Equal(t, tc.code, body.Code)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		require.Equal(t, tc.allow, resp.Header.Get("Allow"))
		require.Contains(t, body.Message, tc.want)
	}
	code, body := getJSON(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "SERVING", body["status"])
}

// TestAStreamThatFailsAtOnceAnswersTheErrorBody: a streaming route that failed before its first
// message answered {"error":{"code":3,…}} (grpc-gateway's end of a stream, with the gRPC code)
// where every other error is the ErrorBody; a stream that fails later still ends with that line.
func TestAStreamThatFailsAtOnceAnswersTheErrorBody(t *testing.T) {
	base := auditGateway(t)
	code, body := getJSON(t, base+"/v1/audit/records:watch?filter.kind=refuse")
	require.Equal(t, http.StatusBadRequest, code, "%v", body)
	require.Equal(t, map[string]any{"code": float64(400), "status": "INVALID_ARGUMENT",
		"message": "audit: invalid filter: kind is not one of admin, tool_call"}, body)

	resp, err := http.Get(base + "/v1/audit/records:watch")
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.Len(t, lines, 2, string(raw))
	require.Contains(t, lines[0], `"result"`)
	require.Contains(t, lines[1], `{"error":{"code":14,"message":"audit: the server is stopping: watch again from seq 2"`)
}

// TestBodiesAsWindowsAndCompressingClientsSendThem: a UTF-8 byte order mark (PowerShell's
// Out-File writes one) is skipped, as RFC 8259 allows; a compressed body is refused naming its
// Content-Encoding, not as JSON that breaks at byte 1.
func TestBodiesAsWindowsAndCompressingClientsSendThem(t *testing.T) {
	base := auditGateway(t)
	post := func(encoding, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/audit:verify", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if encoding != "" {
			req.Header.Set("Content-Encoding", encoding)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(raw)
	}
	code, body := post("", "\xef\xbb\xbf{}")
	require.Equal(t, http.StatusNotImplemented, code, "a body after a BOM decodes and reaches the service: %s", body)

	code, body = post("gzip", "\x1f\x8b\x08\x00")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, `it was sent with Content-Encoding \"gzip\", which the REST routes do not decode: send the JSON uncompressed`)

	code, body = post("identity", "{}")
	require.Equal(t, http.StatusNotImplemented, code, body)
}

// TestRefusedBodyFieldsCarryABadRequestDetail: the gateway's refusal of a body field had a
// message only; like every other refusal of input, it names the field in a BadRequest detail.
func TestRefusedBodyFieldsCarryABadRequestDetail(t *testing.T) {
	base := auditGateway(t)
	for body, field := range map[string]string{`{"bogus":1}`: "bogus", `{"anchor_seq":"sk-live-1"}`: "anchor_seq"} {
		resp, err := http.Post(base+"/v1/audit:verify", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		var got ErrorBody
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
		require.Len(t, got.Details, 1, "%s: %+v", body, got)
		var detail struct {
			Type       string `json:"@type"`
			Violations []struct {
				Field string `json:"field"`
			} `json:"field_violations"`
		}
		require.NoError(t, json.Unmarshal(got.Details[0], &detail))
		require.Equal(t, "type.googleapis.com/google.rpc.BadRequest", detail.Type)
		require.Equal(t, field, detail.Violations[0].Field)
		require.NotContains(t, string(got.Details[0]), "sk-live")
	}
}

// TestABodyOnAGetRouteIsRefused: the gateway never reads a GET's body, so a filter sent in one
// answered every record as if it had been applied.
func TestABodyOnAGetRouteIsRefused(t *testing.T) {
	base := auditGateway(t)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v1/audit/records", strings.NewReader(`{"filter":{"kind":"admin"}}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var body ErrorBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body.Message)
	require.Equal(t, "GET routes take no body, and this one would be ignored: send its fields as query parameters (e.g. ?filter.kind=admin; docs/api.md lists each route's)", body.Message)

	code, got := getJSON(t, base+"/v1/audit/records?filter.kind=admin")
	require.Equal(t, http.StatusOK, code, "without a body the same GET is served: %v", got)
}
