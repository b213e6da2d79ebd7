package pool

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
)

// argumentCases are argument sets whose canonical JSON is easy to get wrong, with the digest
// (args_digest) of each as the pool at 728b292 computed it, before the gRPC front stopped encoding a
// call's arguments to JSON and decoding them again (protojson, then decodeArguments).
var argumentCases = []struct{ name, json, digest string }{
	{"nested", `{"a":{"b":{"c":[1,{"d":null},[[]]],"e":true}},"z":[],"y":{},"x":[false,"s",{"k":[0.5]}]}`,
		"sha256:a78b5fec01ce9ca6ed51b23f7a657df699c3a3f0158e751e26916c7bee8e81d8"},
	{"unicode", `{"ключ":"значение","emoji":"😀 \ud83d\ude00","html":"<b>&amp;</b>","ls":"\u2028\u2029","ctl":"\u0001\t\n\u007f","quote":"\"\\/","nul":"a\u0000b","bom":"\ufeff"}`,
		"sha256:5c3c9a65593e646f062e129e21c393ace65d626bc443aa017fc29a317ab9f77f"},
	{"numbers", `{"big":1e21,"below":999999999999999900000,"small":1e-7,"micro":0.000001,"tenth":0.1,"third":0.3333333333333333,"large":12345678901234567890,"past_2^53":9007199254740993,"neg0":-0,"huge":1.5e300,"int":42,"neg":-17,"sub":5e-324,"max":1.7976931348623157e308,"exp":1E+2}`,
		"sha256:74b5b893153e90ab214b797fe717351b6474544cd38f9e0ec801d9359322e777"},
	{"key order", `{"b":1,"a":2,"B":3,"_":4,"aa":5,"a ":6,"é":7,"e":8,"":9,"10":10,"9":11,"e\u0301":12}`,
		"sha256:5525c569ce38afab6a7610d0ea948f99c91db7cf0a4966b0e5ec3da6f47fdc01"},
	{"empty", `{}`, "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},
}

// oldArguments is the path every call's arguments took before: the Struct's JSON
// (protojson), decoded and encoded again (decodeArguments).
func oldArguments(t *testing.T, st *structpb.Struct) (map[string]any, []byte) {
	t.Helper()
	raw, err := st.MarshalJSON()
	require.NoError(t, err)
	var args map[string]any
	require.NoError(t, json.Unmarshal(raw, &args))
	if args == nil {
		args = map[string]any{}
	}
	canonical, err := json.Marshal(args)
	require.NoError(t, err)
	return args, canonical
}

// wireStruct is js as a Struct the way the gRPC front receives it: parsed, sent, received.
func wireStruct(t *testing.T, js string) *structpb.Struct {
	t.Helper()
	var st structpb.Struct
	require.NoError(t, protojson.Unmarshal([]byte(js), &st))
	b, err := proto.Marshal(&poolv1.CallToolRequest{Arguments: &st})
	require.NoError(t, err)
	var got poolv1.CallToolRequest
	require.NoError(t, proto.Unmarshal(b, &got))
	return got.GetArguments()
}

// TestArgumentsFromTheGRPCFrontAreWhatTheyWere: a call's arguments read straight from their
// protobuf form are the object and the canonical JSON the old path (protojson, then
// decodeArguments) made of them, byte for byte, and so the same args_digest: nested objects
// and lists, unicode and characters JSON escapes, numbers (1e21, 0.1, integers past 2^53, -0,
// the smallest and largest doubles) and key order.
func TestArgumentsFromTheGRPCFrontAreWhatTheyWere(t *testing.T) {
	for _, c := range argumentCases {
		t.Run(c.name, func(t *testing.T) {
			st := wireStruct(t, c.json)
			wantArgs, wantCanonical := oldArguments(t, st)
			call, err := callRequestFromProto(&poolv1.CallToolRequest{RunId: newRunID(), Agent: "a", Tool: "fx__echo", Arguments: st})
			require.NoError(t, err)
			args, canonical, err := call.arguments()
			require.NoError(t, err)
			require.Equal(t, string(wantCanonical), string(canonical))
			require.Equal(t, wantArgs, args)
			require.Equal(t, c.digest, digest(canonical))
			// The front door's raw JSON, decoded as ever, agrees.
			_, fromJSON, err := decodeArguments(json.RawMessage(c.json))
			require.NoError(t, err)
			require.Equal(t, string(canonical), string(fromJSON))
		})
	}
	t.Run("none", func(t *testing.T) {
		call, err := callRequestFromProto(&poolv1.CallToolRequest{RunId: newRunID(), Agent: "a", Tool: "fx__echo"})
		require.NoError(t, err)
		args, canonical, err := call.arguments()
		require.NoError(t, err)
		require.Equal(t, map[string]any{}, args)
		require.Equal(t, "{}", string(canonical))
	})
}

// TestArgumentsJSONCannotHoldAreRefusedAsBefore: what protojson refused to encode (a number
// that is NaN or infinite, a value of no kind, text that is not UTF-8), at any depth, is still
// refused before the call is an attempt, naming the field.
func TestArgumentsJSONCannotHoldAreRefusedAsBefore(t *testing.T) {
	nested := func(v *structpb.Value) *structpb.Struct {
		return &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{
			structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"b": v}})}})}}
	}
	for name, st := range map[string]*structpb.Struct{
		"NaN":          nested(structpb.NewNumberValue(math.NaN())),
		"infinity":     nested(structpb.NewNumberValue(math.Inf(-1))),
		"no kind":      nested(&structpb.Value{}),
		"nil value":    nested(nil),
		"invalid text": nested(structpb.NewStringValue("a\xffb")),
		"invalid key":  {Fields: map[string]*structpb.Value{"a\xff": structpb.NewBoolValue(true)}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := st.MarshalJSON()
			require.Error(t, err, "protojson refuses it")
			_, err = callRequestFromProto(&poolv1.CallToolRequest{RunId: newRunID(), Agent: "a", Tool: "fx__echo", Arguments: st})
			require.EqualError(t, err, fieldError("arguments", "cannot be encoded as JSON").Error())
		})
	}
}

// BenchmarkArgumentsFromStruct: a call's arguments from the gRPC front to the object and its
// canonical JSON, the old way (protojson, then decodeArguments) and as callRequestFromProto
// and arguments do now, for BenchmarkPoolProcessCPU's arguments and for a larger set.
func BenchmarkArgumentsFromStruct(b *testing.B) {
	for _, c := range []struct{ name, json string }{
		{"ping", `{"text":"ping"}`},
		{"nested", argumentCases[0].json},
		{"numbers", argumentCases[2].json},
	} {
		var st structpb.Struct
		require.NoError(b, protojson.Unmarshal([]byte(c.json), &st))
		b.Run(c.name+"/protojson", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				raw, err := st.MarshalJSON()
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := decodeArguments(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/struct", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				args, err := structArguments(&st)
				if err != nil {
					b.Fatal(err)
				}
				call := CallRequest{decoded: args}
				if _, _, err := call.arguments(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
