package grpcserver

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ringfence/ringfence/internal/fielderr"
)

// strictQuery refuses a query parameter that names no field of the route's request: the
// gateway's default parser skips it, so GET /v1/audit/records?kidn=admin answered every
// record as if the filter had been applied. The error names the parameter and the ones the
// route takes; the gateway sends it as 400 INVALID_ARGUMENT in the usual error body.
type strictQuery struct {
	runtime.DefaultQueryParser
}

var _ runtime.QueryParameterParser = (*strictQuery)(nil)

// mapKeySuffix matches the gateway's map syntax, labels[key]=value.
var mapKeySuffix = regexp.MustCompile(`^(.*)\[.*\]$`)

func (p *strictQuery) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	md := msg.ProtoReflect().Descriptor()
	var unknown []string
	for key := range values {
		name := key
		if m := mapKeySuffix.FindStringSubmatch(key); m != nil {
			name = m[1]
		}
		path, ok := fieldPath(md, strings.Split(name, "."))
		if !ok || filter.HasCommonPrefix(path) {
			unknown = append(unknown, key)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		takes := "no query parameters"
		if accepted := queryParams(md, filter, nil, 0); len(accepted) > 0 {
			takes = "only " + strings.Join(accepted, ", ")
		}
		return fmt.Errorf("unknown query parameter %s: this route takes %s (docs/api.md lists every route's parameters)", fielderr.Quote(unknown[0]), takes)
	}
	return p.DefaultQueryParser.Parse(msg, values, filter)
}

// fieldPath resolves a dotted parameter name (proto or JSON field names) to proto names.
func fieldPath(md protoreflect.MessageDescriptor, names []string) ([]string, bool) {
	out := make([]string, 0, len(names))
	for i, n := range names {
		if md == nil {
			return nil, false
		}
		fd := md.Fields().ByName(protoreflect.Name(n))
		if fd == nil {
			fd = md.Fields().ByJSONName(n)
		}
		if fd == nil {
			return nil, false
		}
		out = append(out, string(fd.Name()))
		md = nil
		if i < len(names)-1 && fd.Message() != nil && !fd.IsList() && !fd.IsMap() {
			md = fd.Message()
		}
	}
	return out, true
}

// queryParams lists the parameters md takes from a query: its fields, nested messages spelt
// out (filter.kind), minus what the path or body binds. Well-known types (a Timestamp, say)
// are one parameter.
func queryParams(md protoreflect.MessageDescriptor, filter *utilities.DoubleArray, prefix []string, depth int) []string {
	var out []string
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		path := append(append([]string(nil), prefix...), string(fd.Name()))
		if filter.HasCommonPrefix(path) {
			continue
		}
		if m := fd.Message(); m != nil && !fd.IsList() && !fd.IsMap() && depth < 4 && m.ParentFile().Package() != "google.protobuf" {
			out = append(out, queryParams(m, filter, path, depth+1)...)
			continue
		}
		out = append(out, strings.Join(path, "."))
	}
	return out
}

// queryless lists the GET and DELETE routes whose request is bound entirely from the path:
// the gateway never reads their query. TestQuerylessRoutesMatchGatewayYAML keeps it equal to
// what proto/gateway.yaml says.
var queryless = map[string]bool{
	"GET /v1/mcp/servers/{ref}":       true,
	"DELETE /v1/mcp/servers/{ref}":    true,
	"GET /v1/mcp/servers/{ref}/tools": true,
	"GET /v1/secrets":                 true,
	"DELETE /v1/secrets/{name}":       true,
	"GET /v1/roles":                   true,
}

// capture matches the "={pattern}" the gateway writes into a path variable ({ref=*}).
var capture = regexp.MustCompile(`=[^}]*\}`)

// refuseUnreadQuery refuses what the gateway would drop unread: a query on POST, PUT and
// PATCH, whose routes in proto/gateway.yaml all take their fields from the path and a "*"
// body (TestBodyRoutesTakeNoQuery keeps them so), and on the queryless routes (elsewhere
// strictQuery checks each parameter); and a body on GET and DELETE, whose routes take none.
func refuseUnreadQuery(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		if (r.Method == http.MethodGet || r.Method == http.MethodDelete) && r.ContentLength != 0 {
			// The gateway never reads a GET's or DELETE's body: GET /v1/audit/records with
			// {"filter":{…}} answered every record, as if filtered.
			refuseUnread(w, r, status.Errorf(codes.InvalidArgument,
				"%s routes take no body, and this one would be ignored: send its fields as query parameters (e.g. ?filter.kind=admin; docs/api.md lists each route's)", r.Method))
			return
		}
		q := r.URL.Query()
		if len(q) == 0 {
			next(w, r, params)
			return
		}
		names := make([]string, 0, len(q))
		for k := range q {
			names = append(names, k)
		}
		sort.Strings(names)
		switch route := route(r); {
		case r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch:
			refuseUnread(w, r, status.Errorf(codes.InvalidArgument,
				"unknown query parameter %s: %s routes take no query parameters; send the fields in the JSON body (docs/api.md)", fielderr.Quote(names[0]), r.Method))
		case queryless[route]:
			refuseUnread(w, r, status.Errorf(codes.InvalidArgument,
				"unknown query parameter %s: %s takes no query parameters (docs/api.md)", fielderr.Quote(names[0]), route))
		default:
			next(w, r, params)
		}
	}
}

// refuseInvalidUTF8 refuses a path variable or query parameter that is not valid UTF-8 (%ff):
// each binds a proto string field, which grpc-go refuses to marshal, so the request was
// answered 500 with no request id and no log line. Runs before the body is read.
func refuseInvalidUTF8(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		if err := CheckParamsUTF8(params, r.URL.Query()); err != nil {
			refuseUnread(w, r, err)
			return
		}
		next(w, r, params)
	}
}

// CheckParamsUTF8 returns INVALID_ARGUMENT, with a BadRequest detail, naming the first path
// variable or query parameter (by name) whose name or value is not valid UTF-8, or nil. It
// never quotes a value (a query value may be a credential), nor a name that is not UTF-8.
// Handlers beside the gateway (the audit export) call it themselves.
func CheckParamsUTF8(params map[string]string, query url.Values) error {
	for _, name := range slices.Sorted(maps.Keys(params)) {
		if !utf8.ValidString(name) || !utf8.ValidString(params[name]) {
			return invalidUTF8(name, fmt.Sprintf("path variable %q is not valid UTF-8 (its value is not shown): percent-encode the text as UTF-8", name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(query)) {
		if !utf8.ValidString(name) {
			return invalidUTF8("", "a query parameter's name is not valid UTF-8 (it is not shown): docs/api.md lists every route's parameters")
		}
		for _, v := range query[name] {
			if !utf8.ValidString(v) {
				return invalidUTF8(name, fmt.Sprintf("query parameter %s is not valid UTF-8 (its value is not shown): percent-encode the text as UTF-8", fielderr.Quote(name)))
			}
		}
	}
	return nil
}

func invalidUTF8(field, msg string) error {
	st := status.New(codes.InvalidArgument, msg)
	if withDetail, err := st.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: "is not valid UTF-8"}},
	}); err == nil {
		st = withDetail
	}
	return st.Err()
}

// The gateway's own refusals of a path variable or query parameter it cannot parse quote the
// value and Go's parse error (`parsing field "page_size": strconv.ParseInt: parsing "abc":
// invalid syntax`). gatewayParseError rewrites them to name the parameter as sent and the
// type it takes, never the value, with a BadRequest detail naming it; a refused body field
// keeps its message and gains the detail.
var (
	gatewayQueryParse = regexp.MustCompile(`^parsing (?:field|list|map key|map value) "([^"]+)": (.*)$`)
	gatewayQueryTwice = regexp.MustCompile(`^too many values for field "([^"]+)": `)
	gatewayPathParse  = regexp.MustCompile(`^type mismatch, parameter: ([A-Za-z0-9_.]+), error: (.*)$`)
	// The decoder's refusal of a body field (decoder.go), which the gateway turns into a
	// status without details.
	gatewayBodyField = regexp.MustCompile(`^invalid JSON body: (?:field|unknown field) "([^"]+)"`)
)

func gatewayParseError(st *status.Status, r *http.Request) (*status.Status, bool) {
	if st.Code() != codes.InvalidArgument || len(st.Details()) > 0 {
		return st, false
	}
	msg := st.Message()
	var field, problem string
	if m := gatewayPathParse.FindStringSubmatch(msg); m != nil {
		field = m[1]
		problem = fmt.Sprintf("path variable %s %s", fielderr.Quote(field), expectedValue(m[2]))
	} else if m := gatewayQueryParse.FindStringSubmatch(msg); m != nil {
		field = queryKeyFor(r, m[1])
		problem = fmt.Sprintf("query parameter %s %s", fielderr.Quote(field), expectedValue(m[2]))
	} else if m := gatewayQueryTwice.FindStringSubmatch(msg); m != nil {
		field = queryKeyFor(r, m[1])
		problem = fmt.Sprintf("query parameter %s is given more than once: send it once", fielderr.Quote(field))
	} else if m := gatewayBodyField.FindStringSubmatch(msg); m != nil {
		field, problem = m[1], msg
	} else {
		return st, false
	}
	out := status.New(codes.InvalidArgument, problem)
	if withDetail, err := out.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: problem}},
	}); err == nil {
		out = withDetail
	}
	return out, true
}

// expectedValue says what a parameter takes, read from the parse error the gateway wrapped.
func expectedValue(parseErr string) string {
	switch {
	case strings.Contains(parseErr, "value out of range"):
		return "is out of range for its type: send a smaller number"
	case strings.Contains(parseErr, "strconv.ParseUint"):
		return "must be a whole number, 0 or more"
	case strings.Contains(parseErr, "strconv.ParseInt"):
		return "must be a whole number"
	case strings.Contains(parseErr, "strconv.ParseFloat"):
		return "must be a number"
	case strings.Contains(parseErr, "strconv.ParseBool"):
		return "must be true or false"
	case strings.Contains(parseErr, "parsing time"):
		return "must be an RFC 3339 time, e.g. 2026-12-03T10:00:00Z"
	case strings.Contains(parseErr, "time: "):
		return "must be a duration, e.g. 30s"
	}
	return "is not a value of its type (docs/api.md)"
}

// queryKeyFor finds the parameter, as the request spelt it (filter.since), behind the proto
// field name the gateway's error gives (since); the field name when none matches.
func queryKeyFor(r *http.Request, name string) string {
	if r == nil {
		return name
	}
	keys := slices.Sorted(maps.Keys(r.URL.Query()))
	for _, k := range keys {
		if k == name || strings.HasSuffix(k, "."+name) {
			return k
		}
	}
	return name
}
