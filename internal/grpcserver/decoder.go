package grpcserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/humanize"
)

// jsonMarshaler is the gateway's JSON codec: proto field names out, unknown fields refused in,
// and decoding errors rewritten to name the offending top-level field, so a REST client learns
// which value to fix rather than a byte offset.
type jsonMarshaler struct {
	runtime.JSONPb
}

func newJSONMarshaler() *jsonMarshaler {
	return &jsonMarshaler{JSONPb: runtime.JSONPb{
		MarshalOptions: protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
		// protojson counts messages, not JSON levels; the body's levels are bounded first
		// (nesting), and this only backs that up.
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false, RecursionLimit: 2 * maxMessageNesting},
	}}
}

// maxMessageNesting bounds how deeply a REST body nests, in levels of arrays and objects (the
// body itself is the first). Well below the gRPC server's own limit (10,000 messages, where a
// JSON list inside arguments is two: Value, ListValue): a body the gateway accepted and the
// server then could not decode answered 500.
const maxMessageNesting = 1000

// tooDeep is the one wording of a value nested deeper than limit, for arrays and objects
// alike; the pool's argument and result checks (internal/schemas, sanitize) and the
// declaration screen (jcs, screen) say the same with their own limits.
func tooDeep(limit int) string {
	return fmt.Sprintf("nested too deeply: more than %d levels of arrays and objects", limit)
}

// maxBodyValues bounds the JSON values (objects, lists, scalars) of a REST body. Decoded, each
// costs ~160 bytes of memory and ~11 of protobuf: a 4 MB body of "0," took 319 MiB and became a
// 22 MB message no server accepts. At this bound a body costs ~80 MiB at most; larger requests
// go over gRPC, whose messages are bounded in bytes.
const maxBodyValues = 1 << 19

// shape counts the JSON values of body, at least (besides the first, every "," "[" and "{"
// outside a string starts one), and how many levels of arrays and objects it nests. It reads
// without allocating and stops once either passes its limit.
func shape(body []byte, maxValues, maxDepth int) (values, depth int) {
	values, level, inString, escaped := 1, 0, false, false
	for _, b := range body {
		switch {
		case inString && escaped:
			escaped = false
		case inString && b == '\\':
			escaped = true
		case inString:
			inString = b != '"'
		case b == '"':
			inString = true
		case b == ']' || b == '}':
			level--
		case b == '[' || b == '{':
			if level++; level > depth {
				depth = level
			}
			fallthrough
		case b == ',':
			if values++; values > maxValues || depth > maxDepth {
				return values, depth
			}
		}
	}
	return values, depth
}

func (m *jsonMarshaler) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		body, err := io.ReadAll(r)
		if err != nil {
			var limit *http.MaxBytesError
			if errors.As(err, &limit) {
				return fmt.Errorf("request body too large: a REST body may hold at most %s; send less in one request, or use gRPC (documents: ringfence documents put, which sends chunks)", humanize.Bytes(limit.Limit))
			}
			if strings.Contains(err.Error(), "request body too large") {
				return errors.New("request body too large")
			}
			return err
		}
		mark, _ := r.(markedBody)
		// RFC 8259 lets a parser ignore a byte order mark, which Windows editors and
		// PowerShell's Out-File write before UTF-8 text.
		body = bytes.TrimPrefix(body, []byte("\xef\xbb\xbf"))
		if len(bytes.TrimSpace(body)) == 0 {
			if mark.patch {
				return errors.New(emptyPatch)
			}
			return io.EOF // the gateway treats an empty body as an empty message
		}
		values, depth := shape(body, maxBodyValues, maxMessageNesting)
		if values > maxBodyValues {
			return fmt.Errorf("request body too large: it holds more than %d JSON values (objects, lists and scalars); send less in one request, or use gRPC", maxBodyValues)
		}
		if depth > maxMessageNesting {
			return errors.New("invalid JSON body: " + tooDeep(maxMessageNesting))
		}
		msg, ok := v.(proto.Message)
		if !ok {
			return m.JSONPb.Unmarshal(body, v)
		}
		if err := m.UnmarshalOptions.Unmarshal(body, msg); err != nil {
			if strings.Contains(err.Error(), "exceeded max recursion depth") {
				return errors.New("invalid JSON body: " + tooDeep(maxMessageNesting))
			}
			problem := describeDecodeError(body, msg, err)
			if mark.formType != "" && !json.Valid(body) && !looksLikeJSON(body) {
				problem += fmt.Sprintf("; it was sent as %s, and the REST routes read only JSON: send a JSON object (curl: -H 'Content-Type: application/json' -d '{...}'; docs/api.md)", mark.formType)
			}
			return fmt.Errorf("invalid JSON body: %s", problem)
		}
		if err := pathAgreesWithBody(msg, mark.path); err != nil {
			return err
		}
		if mark.patch {
			return maskFromBody(msg, body)
		}
		return nil
	})
}

// pathAgreesWithBody refuses a body that names a path variable's field with another value
// (PUT /v1/mcp/servers/docs with {"ref": "wiki"}): the gateway sets the field from the path
// after decoding, so the body's value was dropped without a word and the request acted on
// what the path names. Neither value is quoted, as no refusal of a body quotes one.
func pathAgreesWithBody(msg proto.Message, path map[string]string) error {
	m := msg.ProtoReflect()
	for _, name := range slices.Sorted(maps.Keys(path)) {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() || fd.IsMap() || !m.Has(fd) {
			continue
		}
		if m.Get(fd).String() != path[name] {
			return fmt.Errorf("invalid JSON body: field %q differs from the %s the path names: leave it out of the body (the path says which %s)", name, name, name)
		}
	}
	return nil
}

// looksLikeJSON reports whether a body that failed to decode was meant as JSON (it begins
// with an object or a list): such a body was damaged, not sent as a form, so the form hint
// would send its writer after a header that changes nothing.
func looksLikeJSON(body []byte) bool {
	trimmed := bytes.TrimLeftFunc(body, unicode.IsSpace)
	return len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[')
}

// markedBody is a request body with what the decoder (which sees only the body) needs to know
// of its request.
type markedBody struct {
	io.ReadCloser
	// formType is the media type of a body sent as an HTML form, which is what curl -d sends
	// unless told otherwise. A JSON body sent so decodes as usual; one that is not JSON is
	// refused with the header to send, rather than only a byte offset.
	formType string
	// patch marks a PATCH body: the fields it holds are the ones to change (maskFromBody).
	patch bool
	// path holds the route's path variables, which a body may repeat but not contradict.
	path map[string]string
}

// markBody marks a form-encoded body, a PATCH's, and one with path variables, for the decoder.
func markBody(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") && r.ContentLength != 0 {
			// Read as sent, a compressed body fails as JSON at byte 1, which names nothing.
			refuseUnread(w, r, status.Errorf(codes.InvalidArgument,
				"invalid JSON body: it was sent with Content-Encoding %s, which the REST routes do not decode: send the JSON uncompressed", fielderr.Quote(enc)))
			return
		}
		mark := markedBody{patch: r.Method == http.MethodPatch, path: params}
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && (mt == "application/x-www-form-urlencoded" || mt == "multipart/form-data") {
			mark.formType = mt
		}
		if r.Body != nil && (mark.patch || mark.formType != "" || len(params) > 0) {
			r = r.WithContext(r.Context()) // a shallow copy, so the caller's request keeps its body
			mark.ReadCloser = r.Body
			r.Body = mark
		}
		next(w, r, params)
	}
}

const emptyPatch = "invalid JSON body: a PATCH changes the fields its body holds, and this one holds none: send the fields to change, e.g. {\"grants\": [\"process_spawn\", \"external_api_call\"]}"

// maskFromBody gives a PATCH the update_mask its body implies, as grpc-gateway does for a
// PATCH whose body is one field: the fields the body holds are the ones to change, and only
// those (a field sent empty is cleared). A mask the body sends itself is kept. Messages
// without an update_mask take the body as it is.
func maskFromBody(msg proto.Message, body []byte) error {
	m := msg.ProtoReflect()
	fields := m.Descriptor().Fields()
	maskField := fields.ByName("update_mask")
	if maskField == nil || maskField.Message() == nil || maskField.Message().FullName() != "google.protobuf.FieldMask" || m.Has(maskField) {
		return nil
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(body, &keys); err != nil {
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	mask := &fieldmaskpb.FieldMask{}
	for k := range keys {
		fd := fields.ByName(protoreflect.Name(k))
		if fd == nil {
			fd = fields.ByJSONName(k)
		}
		if fd != nil && fd != maskField {
			mask.Paths = append(mask.Paths, string(fd.Name()))
		}
	}
	if len(mask.Paths) == 0 {
		return errors.New(emptyPatch)
	}
	slices.Sort(mask.Paths)
	m.Set(maskField, protoreflect.ValueOfMessage(mask.ProtoReflect()))
	return nil
}

// describeDecodeError finds the field whose value fails to decode and says what it should
// be. It never quotes the value: bodies carry secrets (env values, secret values), and an
// error message ends up in logs and terminals.
func describeDecodeError(body []byte, msg proto.Message, err error) string {
	var fields map[string]json.RawMessage
	if jerr := json.Unmarshal(body, &fields); jerr != nil {
		var syn *json.SyntaxError
		if errors.As(jerr, &syn) {
			if syn.Offset >= int64(len(bytes.TrimRightFunc(body, unicode.IsSpace))) {
				return "not valid JSON: the body ends early (an object or string is not closed)"
			}
			return fmt.Sprintf("not valid JSON at byte %d", syn.Offset)
		}
		return "the body must be a JSON object"
	}
	if fields == nil {
		return "the body must be a JSON object, not null"
	}
	// encoding/json keeps the last of a key given twice and reads bytes that are not UTF-8 as
	// U+FFFD, so failingField would blame a field's type for what protojson refused.
	if problem := textProblem(body); problem != "" {
		return problem
	}
	if where := failingField(fields, msg.ProtoReflect().Descriptor(), "", 0); where != "" {
		return where
	}
	if strings.Contains(err.Error(), "unknown field") {
		return cleanProtoError(err) // names the field, never a value
	}
	return "a value does not match its field's type"
}

// textProblem finds what protojson refuses and encoding/json lets through: a key given twice
// in one object (protojson keeps neither, since either could be the one meant), and a key or
// string that is not valid UTF-8. It names the path as sent (env.APP_TOKEN, args[2]), never a
// value, and returns "" when it finds neither.
func textProblem(body []byte) string {
	w := &tokenWalker{dec: json.NewDecoder(bytes.NewReader(body)), body: body}
	w.dec.UseNumber()
	tok, utf8OK, err := w.next()
	if err != nil {
		return ""
	}
	problem, _ := w.value("", tok, utf8OK, 0)
	return problem
}

// tokenWalker reads a body token by token, telling whether each token's bytes were UTF-8.
type tokenWalker struct {
	dec  *json.Decoder
	body []byte
	off  int64
}

var errStopWalk = errors.New("stop")

func (w *tokenWalker) next() (json.Token, bool, error) {
	tok, err := w.dec.Token()
	if err != nil {
		return nil, false, err
	}
	end := w.dec.InputOffset()
	if end < w.off || end > int64(len(w.body)) {
		return nil, false, errStopWalk
	}
	// Only a string can hold bytes that are not UTF-8: anything else is a syntax error.
	utf8OK := utf8.Valid(w.body[w.off:end])
	w.off = end
	return tok, utf8OK, nil
}

// value walks the value that begins with tok, found at path.
func (w *tokenWalker) value(path string, tok json.Token, utf8OK bool, depth int) (string, error) {
	if depth > maxMessageNesting {
		return "", errStopWalk // protojson refuses this nesting, and says so
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for {
			k, utf8OK, err := w.next()
			if err != nil {
				return "", err
			}
			if k == json.Delim('}') {
				return "", nil
			}
			key, _ := k.(string)
			if !utf8OK {
				return fmt.Sprintf("a key %s is not valid UTF-8 (it is not shown)", within(path)), nil
			}
			child := key
			if path != "" {
				child = path + "." + key
			}
			if seen[key] {
				return fmt.Sprintf("field %s is given twice: send each key of an object once", fielderr.Quote(child)), nil
			}
			seen[key] = true
			v, utf8OK, err := w.next()
			if err != nil {
				return "", err
			}
			if problem, err := w.value(child, v, utf8OK, depth+1); problem != "" || err != nil {
				return problem, err
			}
		}
	case json.Delim('['):
		for i := 0; ; i++ {
			v, utf8OK, err := w.next()
			if err != nil {
				return "", err
			}
			if v == json.Delim(']') {
				return "", nil
			}
			if problem, err := w.value(fmt.Sprintf("%s[%d]", path, i), v, utf8OK, depth+1); problem != "" || err != nil {
				return problem, err
			}
		}
	}
	if !utf8OK {
		return fmt.Sprintf("field %s is not valid UTF-8 (its value is not shown): send text as UTF-8", fielderr.Quote(path)), nil
	}
	return "", nil
}

// within says where a key sits: "at the top level" or "in field "env"".
func within(path string) string {
	if path == "" {
		return "at the top level"
	}
	return fmt.Sprintf("in field %s", fielderr.Quote(path))
}

// failingField returns "field "a.b": expected …" for the first field (in name order) of
// fields, described by md, that does not decode, descending into nested objects.
func failingField(fields map[string]json.RawMessage, md protoreflect.MessageDescriptor, prefix string, depth int) string {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		fd := md.Fields().ByJSONName(name)
		if fd == nil {
			fd = md.Fields().ByTextName(name)
		}
		if fd == nil {
			return fmt.Sprintf("unknown field %s", fielderr.Quote(prefix+name))
		}
		one, _ := json.Marshal(map[string]json.RawMessage{name: fields[name]})
		probe := dynamicpb.NewMessage(md)
		if protojson.Unmarshal(one, probe) == nil {
			continue
		}
		if where := failingElement(fields[name], fd, prefix+name, depth); where != "" {
			return where
		}
		return fmt.Sprintf("field %s: expected %s", fielderr.Quote(prefix+name), expected(fd))
	}
	return ""
}

// failingElement descends into the value of a message field, or into each element of a list or
// map of messages (nodes[3].mcp_tool), for the field inside that fails; "" when it finds none.
// Well-known types (Struct, Duration, …) have JSON forms of their own: not descended.
func failingElement(raw json.RawMessage, fd protoreflect.FieldDescriptor, path string, depth int) string {
	md := fd.Message()
	if fd.IsMap() {
		md = fd.MapValue().Message()
	}
	if md == nil || depth >= 8 || md.ParentFile().Package() == "google.protobuf" {
		return ""
	}
	inside := func(raw json.RawMessage, path string) string {
		var inner map[string]json.RawMessage
		if json.Unmarshal(raw, &inner) != nil {
			return ""
		}
		return failingField(inner, md, path+".", depth+1)
	}
	switch {
	case fd.IsList():
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			return ""
		}
		for i, item := range items {
			if where := inside(item, fmt.Sprintf("%s[%d]", path, i)); where != "" {
				return where
			}
		}
	case fd.IsMap():
		var entries map[string]json.RawMessage
		if json.Unmarshal(raw, &entries) != nil {
			return ""
		}
		keys := make([]string, 0, len(entries))
		for k := range entries {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if where := inside(entries[k], path+"."+k); where != "" {
				return where
			}
		}
	default:
		return inside(raw, path)
	}
	return ""
}

// expected describes the JSON a field takes.
func expected(fd protoreflect.FieldDescriptor) string {
	switch {
	case fd.IsMap():
		return "an object whose values are " + kindName(fd.MapValue())
	case fd.IsList():
		return "a list, each " + kindName(fd)
	}
	return kindName(fd)
}

func kindName(fd protoreflect.FieldDescriptor) string {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return "a string"
	case protoreflect.BoolKind:
		return "a boolean"
	case protoreflect.BytesKind:
		return "a base64 string"
	case protoreflect.EnumKind:
		return "an enum name"
	case protoreflect.MessageKind, protoreflect.GroupKind:
		switch fd.Message().FullName() {
		case "google.protobuf.Duration":
			return `a duration string (e.g. "30s")`
		case "google.protobuf.Timestamp":
			return "an RFC 3339 timestamp string"
		case "google.protobuf.Value":
			return "a JSON value"
		}
		return "an object"
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		// protojson takes a 64-bit integer as a string too, and writes it so.
		return "a whole number (e.g. 2 or \"2\")"
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return "a whole number, 0 or more (e.g. 2 or \"2\")"
	}
	return "a number"
}

// cleanProtoError drops protojson's "proto:" prefix and position, and the non-breaking spaces
// it inserts on purpose to keep callers from matching its messages.
func cleanProtoError(err error) string {
	s := strings.ReplaceAll(err.Error(), "\u00a0", " ")
	s = protoDecodePrefix.ReplaceAllString(s, "")
	return strings.TrimSpace(s)
}
