package grpcserver

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
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
		return fmt.Errorf("unknown query parameter %q: this route takes %s (docs/api.md lists every route's parameters)", unknown[0], takes)
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

// refuseQueryOnBodyRoutes refuses a query on POST, PUT and PATCH: every such route in
// proto/gateway.yaml takes its fields from the path and a "*" body, so the gateway never reads
// a query there and ?dry_run=true would be dropped without a word (TestBodyRoutesTakeNoQuery
// keeps gateway.yaml to that).
func refuseQueryOnBodyRoutes(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch:
			if q := r.URL.Query(); len(q) > 0 {
				names := make([]string, 0, len(q))
				for k := range q {
					names = append(names, k)
				}
				sort.Strings(names)
				WriteHTTPError(w, status.Errorf(codes.InvalidArgument,
					"unknown query parameter %q: %s routes take no query parameters; send the fields in the JSON body (docs/api.md)", names[0], r.Method))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}
