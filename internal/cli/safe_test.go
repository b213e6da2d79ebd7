package cli

import (
	"bytes"
	"encoding/json"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
)

// hostile is text a server or caller may choose: a right-to-left override that makes
// "exe.pdf" read as "fdp.exe", an isolate, zero-width characters, Tag characters (invisible
// ASCII), an OSC that sets the window title, a "conceal" SGR, a C1 CSI, a line separator, a
// carriage return, and a line break followed by a forged line. (It is UTF-8: protobuf strings
// are; TestEscapeText covers bytes that are not.)
const hostile = "ok\u202egnp.exe\u2066x\u2069\u200b\u200d\ufeff\u00ad\U000E0001\U000E0041\U000E007F\U000E0000" +
	"\x1b]0;pwned\a\x1b[8m\u009b31m\x7f\u2028\u2029\r\nFORGED: "

// TestEscapeText: every unsafe rune is escaped, text a person reads as text is not, and the
// escapes are JSON's, so an escaped value still decodes to the original.
func TestEscapeText(t *testing.T) {
	for _, r := range []rune{
		0, 0x07, 0x1b, 0x7f, 0x85, 0x9b, // C0, DEL, C1
		0x202a, 0x202b, 0x202c, 0x202d, 0x202e, // bidi embeddings and overrides
		0x2066, 0x2067, 0x2068, 0x2069, 0x200e, 0x200f, 0x061c, // isolates and marks
		0x200b, 0x200c, 0x200d, 0x2060, 0xfeff, 0x00ad, // zero-width, word joiner, BOM, soft hyphen
		0xfff9, 0xfffa, 0xfffb, // interlinear annotation
		0xe0000, 0xe0001, 0xe0020, 0xe0041, 0xe007f, // the Tag block
		0x2028, 0x2029, // line and paragraph separators
	} {
		s := "a" + string(r) + "b"
		got := oneLine(s)
		require.NotContains(t, got, string(r), "U+%04X", r)
		require.True(t, strings.HasPrefix(got, "a\\") && strings.HasSuffix(got, "b"), "U+%04X: %q", r, got)
		var back string
		require.NoError(t, json.Unmarshal([]byte(`"`+got+`"`), &back), "U+%04X: %s", r, got)
		require.Equal(t, s, back, "U+%04X", r)
	}
	for _, s := range []string{"plain", "café", "日本語", "emoji 😀", "e\u0301", "עברית", "tab\tand line\n"} {
		require.Equal(t, s, escapeText(s, true))
	}
	require.Equal(t, `a\tb\nc\rd`, oneLine("a\tb\nc\rd"))
	require.Equal(t, `\xff\xfe`, oneLine("\xff\xfe"))
	require.Equal(t, `\udb40\udc41`, oneLine("\U000E0041"))
	require.Equal(t, oneLine(hostile), oneLine(oneLine(hostile)), "escaping twice changes nothing")
}

// TestSafeWriterJoinsSplitRunes: a rune written in two halves is escaped whole, and a sequence
// that never completes is escaped byte by byte at the end.
func TestSafeWriterJoinsSplitRunes(t *testing.T) {
	var out bytes.Buffer
	w := newSafeWriter(&out)
	rlo := []byte("\u202e")
	_, _ = w.Write(append([]byte("x"), rlo[:1]...))
	_, _ = w.Write(rlo[1:2])
	_, _ = w.Write(append(rlo[2:], "y\n"...))
	_, _ = w.Write(rlo[:2])
	require.NoError(t, w.Flush())
	require.Equal(t, "x\\u202ey\n\\xe2\\x80", out.String())
}

// TestEveryOutputPathEscapesUntrustedText runs every command of the CLI, as a table and as
// JSON, against a server that answers every RPC with hostile text in every field, and again
// with an error whose message and details are hostile: nothing unsafe reaches stdout or
// stderr, no line begins with the server's text, and JSON stays JSON.
func TestEveryOutputPathEscapesUntrustedText(t *testing.T) {
	srv := startHostileServer(t)
	cmds := leafCommands()
	require.Greater(t, len(cmds), 30, "the walk finds the CLI's commands")
	for _, failing := range []bool{false, true} {
		for _, output := range []string{"table", "json"} {
			for _, c := range cmds {
				name := strings.Join(c.path, " ")
				t.Run(name+"/"+output+map[bool]string{true: "/error"}[failing], func(t *testing.T) {
					srv.failing.Store(failing)
					args := append(slices.Clone(c.path), c.args...)
					args = append(args, "--addr", srv.addr, "--api-key", "k", "-o", output, "--timeout", "10s")
					var stdout, stderr bytes.Buffer
					Execute(args, strings.NewReader(hostile), &stdout, &stderr)
					for stream, text := range map[string]string{"stdout": stdout.String(), "stderr": stderr.String()} {
						requireInert(t, stream, text)
						if output == "json" && stream == "stdout" && !failing && !c.rawText {
							requireJSON(t, text)
						}
					}
				})
			}
		}
	}
	require.Greater(t, srv.methodsCalled(), 30, "the commands reached the server's methods")
}

// requireInert fails when text holds an unsafe rune other than the line breaks and tabs of
// the CLI's own layout, or a line the server's text began (the forged line follows a line
// break in the hostile text).
func requireInert(t *testing.T, stream, text string) {
	t.Helper()
	for i, r := range text {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(text[i:]); size == 1 {
				t.Fatalf("%s holds a byte that is not UTF-8 at %d:\n%s", stream, i, text)
			}
		}
		if r != '\n' && r != '\t' && unsafeRune(r) {
			t.Fatalf("%s holds U+%04X at %d:\n%s", stream, r, i, text)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		require.False(t, strings.HasPrefix(line, "FORGED"), "%s: a line begins with the server's text:\n%s", stream, text)
	}
}

// requireJSON checks that every JSON value on stdout still parses after escaping.
func requireJSON(t *testing.T, text string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(text))
	for {
		var v any
		err := dec.Decode(&v)
		if err != nil {
			require.ErrorContains(t, err, "EOF", "stdout is JSON:\n%s", text)
			return
		}
	}
}

type leafCommand struct {
	path, args []string
	// rawText commands print a tool's result text as it is (their JSON is one value per
	// line, preceded by other lines).
	rawText bool
}

// leafCommands lists every command the CLI runs, with a value for each positional argument
// and required flag, all of them hostile where they are text.
func leafCommands() []leafCommand {
	skip := map[string]bool{
		"ringfence help": true, "ringfence completion": true,
		// These write files or build an image; their output names a path or an image id the
		// CLI itself chose.
		"ringfence certs init": true, "ringfence image build": true,
	}
	extra := map[string][]string{
		"ringfence servers explore": {"--call", hostile, "--args", `{"q":"` + hostileJSONSafe + `"}`},
		"ringfence runs call":       {"--args", `{"q":"x"}`},
		"ringfence servers add":     {"--command", "x"},
		"ringfence servers update":  {"--description", "x"},
		"ringfence graphs edit":     {"--file", "-", "--force"},
		"ringfence graphs show":     {"--version", "1"},
		"ringfence call":            {"--args", `{"q":"x"}`},
	}
	var out []leafCommand
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if skip[c.CommandPath()] || c.Hidden {
			return
		}
		if c.HasSubCommands() {
			for _, sub := range c.Commands() {
				walk(sub)
			}
			return
		}
		if !c.Runnable() {
			return
		}
		var args []string
		for _, word := range strings.Fields(c.Use)[1:] {
			if !positional.MatchString(word) {
				break
			}
			args = append(args, hostile)
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if _, ok := f.Annotations[cobra.BashCompOneRequiredFlag]; !ok {
				return
			}
			args = append(args, "--"+f.Name, valueFor(f.Value.Type()))
		})
		args = append(args, extra[c.CommandPath()]...)
		path := strings.Fields(c.CommandPath())[1:]
		raw := slices.Contains([]string{"ringfence servers explore", "ringfence runs call", "ringfence call"}, c.CommandPath())
		out = append(out, leafCommand{path: path, args: args, rawText: raw})
	}
	walk(newRoot(&globals{}))
	return out
}

// positional matches a positional argument in a command's Use line: REF, [REF], NAME...
var positional = regexp.MustCompile(`^\[?[A-Z_]+\]?(\.\.\.)?$`)

const hostileJSONSafe = "ok\u202egnp.exe\u200b\U000E0041"

func valueFor(typ string) string {
	switch typ {
	case "int", "int32", "int64", "uint64", "uint32":
		return "1"
	case "duration":
		return "1s"
	case "bool":
		return "true"
	}
	return hostile
}

// hostileServer answers every RPC of every Ringfence service with hostile text in every
// string field of its response, or, when failing, with a status whose message and details
// are hostile.
type hostileServer struct {
	addr    string
	failing atomicBool
	mu      sync.Mutex
	called  map[string]bool
}

type atomicBool struct {
	mu sync.Mutex
	v  bool
}

func (b *atomicBool) Store(v bool) { b.mu.Lock(); b.v = v; b.mu.Unlock() }
func (b *atomicBool) Load() bool   { b.mu.Lock(); defer b.mu.Unlock(); return b.v }

func (h *hostileServer) methodsCalled() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.called)
}

func startHostileServer(t *testing.T) *hostileServer {
	t.Helper()
	h := &hostileServer{called: map[string]bool{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h.addr = lis.Addr().String()
	s := grpc.NewServer(grpc.UnknownServiceHandler(h.handle))
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return h
}

func (h *hostileServer) handle(_ any, stream grpc.ServerStream) error {
	full, _ := grpc.MethodFromServerStream(stream)
	svc, method, _ := strings.Cut(strings.TrimPrefix(full, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return status.Errorf(codes.Unimplemented, "unknown service %s", svc)
	}
	md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(method))
	if md == nil {
		return status.Error(codes.Unimplemented, "no method")
	}
	h.mu.Lock()
	h.called[full] = true
	h.mu.Unlock()
	if err := stream.RecvMsg(dynamicpb.NewMessage(md.Input())); err != nil {
		return err
	}
	if h.failing.Load() {
		return hostileStatus()
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return err
	}
	n := 1
	if md.IsStreamingServer() {
		n = 2
	}
	for range n {
		out := mt.New()
		fill(out, 0)
		if err := stream.SendMsg(out.Interface()); err != nil {
			return err
		}
	}
	return nil
}

// hostileStatus is an error with every detail a Ringfence service sends, each filled with
// hostile text.
func hostileStatus() error {
	st := status.New(codes.FailedPrecondition, hostile)
	details := []protoadapt.MessageV1{&errdetails.BadRequest{}, &typesv1.ServerFailure{}, &poolv1.CallRefusal{}, &poolv1.CallFailure{}, &publisherv1.PublishViolations{}}
	for _, m := range details {
		fill(protoadapt.MessageV2Of(m).ProtoReflect(), 0)
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// fill sets every field of m: text to hostile (and the text of a Struct), one element in
// each list and map, numbers to 1. Page tokens stay empty, so listings end.
func fill(m protoreflect.Message, depth int) {
	if depth > 4 {
		return
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Name() == "next_page_token" {
			continue
		}
		if o := fd.ContainingOneof(); o != nil && m.WhichOneof(o) != nil {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			if fd.Message() != nil {
				e := l.NewElement()
				if fillMessage(e.Message(), depth+1) {
					l.Append(e)
				}
			} else {
				l.Append(scalar(fd))
			}
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			key := protoreflect.ValueOfString(hostile).MapKey()
			if fd.MapKey().Kind() != protoreflect.StringKind {
				key = protoreflect.ValueOfInt64(1).MapKey()
			}
			if fd.MapValue().Message() != nil {
				v := mp.NewValue()
				if fillMessage(v.Message(), depth+1) {
					mp.Set(key, v)
				}
			} else {
				mp.Set(key, scalar(fd.MapValue()))
			}
		case fd.Message() != nil:
			v := m.NewField(fd)
			if fillMessage(v.Message(), depth+1) {
				m.Set(fd, v)
			}
		default:
			m.Set(fd, scalar(fd))
		}
	}
}

// fillMessage fills m; well-known types get a valid value of their own, and false means
// leave the field unset.
func fillMessage(m protoreflect.Message, depth int) bool {
	switch m.Descriptor().FullName() {
	case "google.protobuf.Struct":
		s, _ := structpb.NewStruct(map[string]any{hostile: hostile, "type": "text", "text": hostile})
		proto.Merge(m.Interface(), s)
		return true
	case "google.protobuf.Value":
		proto.Merge(m.Interface(), structpb.NewStringValue(hostile))
		return true
	case "google.protobuf.Any", "google.protobuf.ListValue":
		return false
	case "google.protobuf.Timestamp", "google.protobuf.Duration":
		return true
	}
	fill(m, depth)
	return true
}

func scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(hostile)
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(hostile))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(fd.Enum().Values().Get(fd.Enum().Values().Len() - 1).Number())
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(1)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(1)
	}
	return protoreflect.ValueOfInt64(1)
}

// TestRemovalsPrintWhatTheyRemoved: -o json of a removal names what it removed, documents
// delete as graphs delete does, rather than the REST answer's {}.
func TestRemovalsPrintWhatTheyRemoved(t *testing.T) {
	srv := startHostileServer(t)
	for args, want := range map[string]string{
		"documents delete doc-1":  `{"deleted": "doc-1"}`,
		"graphs delete --graph g": `{"deleted": "g"}`,
		"servers remove docs":     `{"removed": "docs"}`,
	} {
		var stdout, stderr bytes.Buffer
		code := Execute(append(strings.Fields(args), "--addr", srv.addr, "--api-key", "k", "-o", "json"), nil, &stdout, &stderr)
		require.Equal(t, ExitOK, code, stderr.String())
		require.Equal(t, want+"\n", stdout.String(), args)
	}
}
