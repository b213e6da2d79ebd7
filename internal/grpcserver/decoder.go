package grpcserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// jsonMarshaler is the gateway's JSON codec: proto field names out, unknown fields refused in,
// and decoding errors rewritten to name the offending top-level field, so a REST client learns
// which value to fix rather than a byte offset.
type jsonMarshaler struct {
	runtime.JSONPb
}

func newJSONMarshaler() *jsonMarshaler {
	return &jsonMarshaler{JSONPb: runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false, RecursionLimit: maxMessageNesting},
	}}
}

// maxMessageNesting bounds how deeply a REST body nests. Well below the gRPC server's own
// limit (10,000 messages, where a JSON list inside arguments is two: Value, ListValue): a
// body the gateway accepted and the server then could not decode answered 500.
const maxMessageNesting = 1000

// maxBodyValues bounds the JSON values (objects, lists, scalars) of a REST body. Decoded, each
// costs ~160 bytes of memory and ~11 of protobuf: a 4 MB body of "0," took 319 MiB and became a
// 22 MB message no server accepts. At this bound a body costs ~80 MiB at most; larger requests
// go over gRPC, whose messages are bounded in bytes.
const maxBodyValues = 1 << 19

// countValues counts the JSON values of body, at least: besides the first, every "," "[" and
// "{" outside a string starts one. It reads without allocating and stops past limit.
func countValues(body []byte, limit int) int {
	n, inString, escaped := 1, false, false
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
		case b == ',' || b == '[' || b == '{':
			if n++; n > limit {
				return n
			}
		}
	}
	return n
}

func (m *jsonMarshaler) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		body, err := io.ReadAll(r)
		if err != nil {
			if strings.Contains(err.Error(), "request body too large") {
				return errors.New("request body too large")
			}
			return err
		}
		if len(bytes.TrimSpace(body)) == 0 {
			return io.EOF // the gateway treats an empty body as an empty message
		}
		if countValues(body, maxBodyValues) > maxBodyValues {
			return fmt.Errorf("request body too large: it holds more than %d JSON values (objects, lists and scalars); send less in one request, or use gRPC", maxBodyValues)
		}
		msg, ok := v.(proto.Message)
		if !ok {
			return m.JSONPb.Unmarshal(body, v)
		}
		if err := m.UnmarshalOptions.Unmarshal(body, msg); err != nil {
			if strings.Contains(err.Error(), "exceeded max recursion depth") {
				return fmt.Errorf("invalid JSON body: nested too deeply (at most %d levels of objects and lists)", maxMessageNesting)
			}
			return fmt.Errorf("invalid JSON body: %s", describeDecodeError(body, msg, err))
		}
		return nil
	})
}

// describeDecodeError finds the field whose value fails to decode and says what it should
// be. It never quotes the value: bodies carry secrets (env values, secret values), and an
// error message ends up in logs and terminals.
func describeDecodeError(body []byte, msg proto.Message, err error) string {
	var fields map[string]json.RawMessage
	if jerr := json.Unmarshal(body, &fields); jerr != nil {
		var syn *json.SyntaxError
		if errors.As(jerr, &syn) {
			return fmt.Sprintf("not valid JSON at byte %d", syn.Offset)
		}
		if errors.Is(jerr, io.ErrUnexpectedEOF) {
			return "not valid JSON: the body ends early"
		}
		return "the body must be a JSON object"
	}
	if where := failingField(fields, msg.ProtoReflect().Descriptor(), "", 0); where != "" {
		return where
	}
	if strings.Contains(err.Error(), "unknown field") {
		return cleanProtoError(err) // names the field, never a value
	}
	return "a value does not match its field's type"
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
			return fmt.Sprintf("unknown field %q", prefix+name)
		}
		one, _ := json.Marshal(map[string]json.RawMessage{name: fields[name]})
		probe := dynamicpb.NewMessage(md)
		if protojson.Unmarshal(one, probe) == nil {
			continue
		}
		// Well-known types (Struct, Duration, …) have JSON forms of their own: not descended.
		if fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap() && depth < 8 &&
			fd.Message().ParentFile().Package() != "google.protobuf" {
			var inner map[string]json.RawMessage
			if json.Unmarshal(fields[name], &inner) == nil {
				if where := failingField(inner, fd.Message(), prefix+name+".", depth+1); where != "" {
					return where
				}
			}
		}
		return fmt.Sprintf("field %q: expected %s", prefix+name, expected(fd))
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
