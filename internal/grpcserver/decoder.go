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
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}}
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
		msg, ok := v.(proto.Message)
		if !ok {
			return m.JSONPb.Unmarshal(body, v)
		}
		if err := m.UnmarshalOptions.Unmarshal(body, msg); err != nil {
			return fmt.Errorf("invalid JSON body: %s", describeDecodeError(body, msg, err))
		}
		return nil
	})
}

// describeDecodeError finds the top-level field whose value fails to decode.
func describeDecodeError(body []byte, msg proto.Message, err error) string {
	var fields map[string]json.RawMessage
	if jerr := json.Unmarshal(body, &fields); jerr != nil {
		var syn *json.SyntaxError
		if errors.As(jerr, &syn) {
			return fmt.Sprintf("not valid JSON at byte %d: %s", syn.Offset, syn.Error())
		}
		if errors.Is(jerr, io.ErrUnexpectedEOF) {
			return "not valid JSON: the body ends early"
		}
		return "the body must be a JSON object"
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		one, _ := json.Marshal(map[string]json.RawMessage{name: fields[name]})
		probe := msg.ProtoReflect().Type().New().Interface()
		if ferr := (protojson.UnmarshalOptions{}).Unmarshal(one, probe); ferr != nil {
			return fmt.Sprintf("field %q: %s", name, cleanProtoError(ferr))
		}
	}
	return cleanProtoError(err)
}

// cleanProtoError drops protojson's "proto:" prefix and position, and the non-breaking spaces
// it inserts on purpose to keep callers from matching its messages.
func cleanProtoError(err error) string {
	s := strings.ReplaceAll(err.Error(), "\u00a0", " ")
	s = protoDecodePrefix.ReplaceAllString(s, "")
	return strings.TrimSpace(s)
}
