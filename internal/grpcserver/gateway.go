package grpcserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/textproto"
	"regexp"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/fielderr"
)

// NewGatewayMux returns the REST mux every binary uses: proto field names in JSON, unknown
// fields and query parameters refused, path variables and query parameters that are not UTF-8
// refused, X-API-Key and X-Request-Id passed to the RPC, and errors
// as JSON a person can act on. first runs before anything else once a route is matched (the
// server's permission check).
func NewGatewayMux(first ...runtime.Middleware) *runtime.ServeMux {
	return runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, newJSONMarshaler()),
		runtime.WithIncomingHeaderMatcher(func(h string) (string, bool) {
			switch textproto.CanonicalMIMEHeaderKey(h) {
			case "X-Api-Key":
				return auth.MetadataKey, true
			case "X-Request-Id":
				return RequestIDKey, true
			}
			return runtime.DefaultHeaderMatcher(h)
		}),
		// X-Request-Id is set by httpRequestID before the gateway runs, to the id the RPC
		// also takes; forwarding it again would send the header twice. Warnings become HTTP
		// Warning headers (SetWarnings).
		runtime.WithOutgoingHeaderMatcher(func(key string) (string, bool) {
			if key == WarningHeader {
				return "Warning", true
			}
			return "", false
		}),
		runtime.WithErrorHandler(writeError),
		runtime.WithRoutingErrorHandler(writeRoutingError),
		runtime.WithStreamErrorHandler(streamError),
		runtime.WithForwardResponseOption(answerHeadOnAdmission),
		// The gateway keeps one parser for the whole process; every mux sets the same one.
		runtime.SetQueryParameterParser(&strictQuery{}),
		runtime.WithMiddlewares(append(first, refuseInvalidUTF8, refuseUnreadQuery, markBody, answerStreamFailuresAsErrors)...),
		// A form-encoded POST would be parsed whole, before any middleware, and served by the
		// GET route of the same path (or the method its X-HTTP-Method-Override names): no
		// client of ours sends one, and the permission is checked before a body is read.
		runtime.WithDisablePathLengthFallback(),
		runtime.WithDisableHTTPMethodOverride(),
	)
}

// streamContentType is the Content-Type the gateway gives a stream at its first message.
var streamContentType = newJSONMarshaler().ContentType(nil)

// admittedKey is the header metadata AdmitStream sends; the gateway forwards none of it.
const admittedKey = "ringfence-stream-admitted"

// AdmitStream sends a server stream's headers at once, saying that it was admitted (authorized
// and its request accepted), for a stream whose first message may be long in coming (a watch
// of an idle log): a gRPC client gets the headers then, and a REST HEAD of the route is
// answered then (answerHeadOnAdmission) rather than at a first message. Call it once, before
// the first Send.
func AdmitStream(stream grpc.ServerStream) error {
	return stream.SendHeader(metadata.Pairs(admittedKey, "true"))
}

// Admitted reports whether a stream's headers, as its client reads them (ClientStream.Header),
// say that AdmitStream admitted it. Headers that do not are a refusal's (it sends the request
// id in headers of its own) or come with a first message.
func Admitted(md metadata.MD) bool { return len(md.Get(admittedKey)) > 0 }

// answerHeadOnAdmission is a forward-response option of the gateway mux. The gateway calls
// the options once with no message as a stream begins, once its RPC's headers have arrived
// and before its first message. When those headers say the stream was admitted (AdmitStream:
// headers alone do not, since a refusal sends the request id in headers of its own), a HEAD
// served as GET (headAsGet) has its answer: 200 and the headers the GET's first message would
// bring, sent at once, which ends the stream (headResponse.Flush). Any other stream answers a
// HEAD as the GET: at its first message or its refusal.
func answerHeadOnAdmission(ctx context.Context, w http.ResponseWriter, m proto.Message) error {
	if m != nil || !isHead(ctx) {
		return nil
	}
	if md, ok := runtime.ServerMetadataFromContext(ctx); !ok || len(md.HeaderMD.Get(admittedKey)) == 0 {
		return nil
	}
	w.Header().Set("Content-Type", streamContentType)
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).Flush() //nolint:errcheck // nothing to do about a client gone
	return nil
}

// writeRoutingError answers a request no route takes with the HTTP status that says why (404
// naming the path, or 405 naming the method), in the usual error body: the gateway's default
// turns a wrong method into 501 Not Implemented, and says only "Not Found" for a typo.
func writeRoutingError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	closeIfBodyUnread(w, r)
	switch httpStatus {
	case http.StatusMethodNotAllowed:
		MethodNotAllowed(w, r, allowedMethods(r.URL.Path)...)
	case http.StatusNotFound:
		// The gateway's own "Not Found" reads like a missing resource; this is a path no
		// route takes (a typo, or a route of another binary in a split deployment).
		msg := fmt.Sprintf("no route takes %s %s: docs/api.md lists the routes (in a split deployment, each binary serves its own service's)", r.Method, fielderr.Quote(r.URL.EscapedPath()))
		if strings.Contains(strings.ToUpper(r.URL.RawPath), "%2F") {
			// The gateway matches the decoded path, where %2F is a separator.
			msg += "; a path variable never holds a /, even sent as %2F (no identifier may contain one)"
		}
		writeErrorBody(w, ErrorBody{Code: httpStatus, Status: "NOT_FOUND", Message: msg})
	default:
		runtime.DefaultRoutingErrorHandler(ctx, mux, m, w, r, httpStatus)
	}
}

// MethodNotAllowed answers 405 in the usual error body, naming the methods the path takes in
// its message and in Allow, which RFC 9110 requires of a 405 (a client library reads it).
func MethodNotAllowed(w http.ResponseWriter, r *http.Request, allowed ...string) {
	takes := "see docs/api.md for the routes and their methods"
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		takes = "it takes " + strings.Join(allowed, ", ") + " (docs/api.md lists the routes)"
	}
	writeErrorBody(w, ErrorBody{Code: http.StatusMethodNotAllowed, Status: "METHOD_NOT_ALLOWED",
		Message: fmt.Sprintf("%s is not a method of %s: %s", fielderr.Quote(r.Method), fielderr.Quote(r.URL.Path), takes)})
}

// noRoute answers a path outside every route (/, /v2/…) as the gateway answers one under /v1/,
// rather than with net/http's plain-text "404 page not found".
func noRoute(w http.ResponseWriter, r *http.Request) {
	closeIfBodyUnread(w, r)
	writeErrorBody(w, ErrorBody{Code: http.StatusNotFound, Status: "NOT_FOUND",
		Message: fmt.Sprintf("no route takes %s %s: the REST routes are under /v1/ (docs/api.md lists them), health is GET /healthz and metrics GET /metrics", r.Method, fielderr.Quote(r.URL.Path))})
}

func writeErrorBody(w http.ResponseWriter, body ErrorBody) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(body.Code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(body)
}

// ErrorBody is the JSON body of every REST error.
type ErrorBody struct {
	// Code is the HTTP status.
	Code int `json:"code"`
	// Status is the gRPC code name, e.g. ALREADY_EXISTS.
	Status  string `json:"status"`
	Message string `json:"message"`
	// Details are the status details in protojson form (e.g. the field that was wrong, or
	// every publish violation).
	Details []json.RawMessage `json:"details,omitempty"`
	// Violations lifts the violations of a PublishViolations detail to the top level, so a
	// REST client reads the list of broken publish rules without decoding details.
	Violations []json.RawMessage `json:"violations,omitempty"`
}

var protoDecodePrefix = regexp.MustCompile(`^proto:\s*(\(line \d+:\d+\):\s*)?(syntax error \(line \d+:\d+\):\s*)?`)

// WriteHTTPError writes err (a gRPC status) as the REST error body, for plain handlers that sit
// beside the gateway (the audit export).
func WriteHTTPError(w http.ResponseWriter, err error) {
	writeError(context.Background(), nil, nil, w, nil, err)
}

func writeError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	// The gateway's own refusals (a body that does not decode, a parameter no route takes)
	// are bounded as the RPCs' statuses are.
	st, _ := status.FromError(boundStatus(err))
	st, _ = gatewayParseError(st, r)
	msg := st.Message()
	body := ErrorBody{Code: runtime.HTTPStatusFromCode(st.Code()), Status: st.Code().String(), Message: msg}
	body.Status = strings.ToUpper(toSnake(body.Status))
	for _, d := range st.Proto().GetDetails() {
		if raw, derr := (protojson.MarshalOptions{UseProtoNames: true}).Marshal(d); derr == nil {
			body.Details = append(body.Details, raw)
		}
	}
	for _, d := range st.Details() {
		vs, ok := violationsOf(d)
		if !ok {
			continue
		}
		if body.Violations == nil {
			body.Violations = []json.RawMessage{}
		}
		for _, v := range vs {
			if raw, derr := (protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}).Marshal(v); derr == nil {
				body.Violations = append(body.Violations, raw)
			}
		}
	}
	if st.Code() == codes.Unauthenticated {
		w.Header().Set("WWW-Authenticate", `ApiKey header="X-API-Key"`)
	}
	if st.Code() == codes.ResourceExhausted && strings.Contains(msg, "received message larger than max") {
		// The body decoded into a message over the server's limit: no retry can succeed, so
		// not 429, and grpc-go's own text names sizes the client never sent.
		body.Code = http.StatusRequestEntityTooLarge
		body.Message = "the request is larger than the server accepts once encoded (JSON lists and numbers grow as protobuf): send less in one request"
	}
	if r != nil {
		if g := gatewayRequestOf(r.Context()); g != nil {
			g.refusal = st.Err()
		}
	}
	writeErrorBody(w, body)
}

// violationsOf reads a status detail shaped as a list of violations: a message whose one
// field is a repeated message field named "violations" (publisher.v1.PublishViolations is
// one). The gateway lifts those to the REST body by their shape, so that this package knows
// no service's API.
func violationsOf(d any) ([]proto.Message, bool) {
	m, ok := d.(proto.Message)
	if !ok {
		return nil, false
	}
	fields := m.ProtoReflect().Descriptor().Fields()
	f := fields.ByName("violations")
	if fields.Len() != 1 || f == nil || !f.IsList() || f.Message() == nil {
		return nil, false
	}
	list := m.ProtoReflect().Get(f).List()
	out := make([]proto.Message, list.Len())
	for i := range out {
		out[i] = list.Get(i).Message().Interface()
	}
	return out, true
}

// toSnake turns AlreadyExists into Already_Exists.
func toSnake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return b.String()
}
