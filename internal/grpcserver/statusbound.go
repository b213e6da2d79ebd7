package grpcserver

import (
	"fmt"
	"strings"
	"unicode/utf8"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ringfence/ringfence/internal/humanize"
)

// A gRPC status travels in trailers: its message as grpc-message and the whole status, details
// included, as grpc-status-details-bin (base64). Proxies reset a stream whose headers exceed a
// few KiB (nginx's grpc_buffer_size is 4 or 8 KiB), so an error that quotes a caller's
// megabyte, or lists a thousand violations, would reach the caller as a reset stream instead
// of the error. Every status a Ringfence server sends, gRPC and REST alike, is bounded here.
const (
	// MaxStatusMessageBytes bounds a status message.
	MaxStatusMessageBytes = 1024
	// MaxStatusBytes bounds the whole status as protobuf, message and details together
	// (4 KiB as base64).
	MaxStatusBytes = 3 << 10
)

// shortenedNote ends a message whose details were shortened to fit.
const shortenedNote = " (details shortened to fit the 3 KiB a status may take)"

// boundStatus returns err with its status message and details within the bounds: a long
// message is cut (saying its full length); details that do not fit have their long strings
// cut (a stderr tail keeps its end), then their longest lists shortened, then are dropped
// from the last, and the message says so. Errors that are not statuses pass through.
func boundStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	p := st.Proto()
	if len(p.GetMessage()) <= MaxStatusMessageBytes && proto.Size(p) <= MaxStatusBytes {
		return err
	}
	p.Message = cutMessage(p.GetMessage())
	if proto.Size(p) > MaxStatusBytes {
		shrinkDetails(p)
		p.Message += shortenedNote
	}
	return status.FromProto(p).Err()
}

// cutMessage cuts a message to MaxStatusMessageBytes, less what shortenedNote may add,
// at a character boundary.
func cutMessage(msg string) string {
	limit := MaxStatusMessageBytes - len(shortenedNote)
	if len(msg) <= limit {
		return msg
	}
	suffix := fmt.Sprintf("… (cut from %d bytes)", len(msg))
	return cutString(msg, limit-len(suffix), false) + suffix
}

// shrinkDetails makes p fit MaxStatusBytes, in steps that keep the most of what a caller may
// branch on: long strings first, then long lists, then whole details from the last.
func shrinkDetails(p *spb.Status) {
	var details []proto.Message
	for _, a := range p.GetDetails() {
		m, err := a.UnmarshalNew()
		if err != nil {
			continue // a type this binary does not know cannot be shortened: drop it
		}
		details = append(details, m)
	}
	fits := func() bool {
		p.Details = p.Details[:0]
		for _, m := range details {
			if a, err := anypb.New(m); err == nil {
				p.Details = append(p.Details, a)
			}
		}
		return proto.Size(p) <= MaxStatusBytes
	}
	for _, limit := range []int{512, 128} {
		for _, m := range details {
			cutStrings(m.ProtoReflect(), limit)
		}
		if fits() {
			return
		}
	}
	for range 32 {
		shortened := false
		for _, m := range details {
			shortened = halveLongestList(m.ProtoReflect()) || shortened
		}
		if fits() || !shortened {
			break
		}
	}
	for len(details) > 0 && !fits() {
		details = details[:len(details)-1]
	}
}

// cutStrings cuts every string in m longer than limit bytes, at any depth. A field named as a
// tail (stderr_tail) keeps its end, where the last thing a server said is.
func cutStrings(m protoreflect.Message, limit int) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		keepEnd := strings.HasSuffix(string(fd.Name()), "_tail")
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				switch {
				case fd.Kind() == protoreflect.StringKind:
					l.Set(i, protoreflect.ValueOfString(cutString(l.Get(i).String(), limit, keepEnd)))
				case fd.Message() != nil:
					cutStrings(l.Get(i).Message(), limit)
				}
			}
		case fd.IsMap():
			mp := v.Map()
			mp.Range(func(k protoreflect.MapKey, e protoreflect.Value) bool {
				switch {
				case fd.MapValue().Kind() == protoreflect.StringKind:
					mp.Set(k, protoreflect.ValueOfString(cutString(e.String(), limit, keepEnd)))
				case fd.MapValue().Message() != nil:
					cutStrings(e.Message(), limit)
				}
				return true
			})
		case fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(cutString(v.String(), limit, keepEnd)))
		case fd.Message() != nil:
			cutStrings(v.Message(), limit)
		}
		return true
	})
}

// halveLongestList halves the longest list of more than one element in m, at any depth, and
// reports whether there was one.
func halveLongestList(m protoreflect.Message) bool {
	var longest protoreflect.List
	var walk func(m protoreflect.Message)
	walk = func(m protoreflect.Message) {
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList():
				l := v.List()
				if l.Len() > 1 && (longest == nil || l.Len() > longest.Len()) {
					longest = l
				}
				if fd.Message() != nil {
					for i := range l.Len() {
						walk(l.Get(i).Message())
					}
				}
			case !fd.IsMap() && fd.Message() != nil:
				walk(v.Message())
			}
			return true
		})
	}
	walk(m)
	if longest == nil {
		return false
	}
	longest.Truncate(longest.Len() / 2)
	return true
}

// cutString cuts s to at most n bytes at a character boundary, marking the cut with "…"; with
// keepEnd it keeps the end instead.
func cutString(s string, n int, keepEnd bool) string {
	if len(s) <= n {
		return s
	}
	if keepEnd {
		from := len(s) - max(n-len("…"), 0)
		for from < len(s) && !utf8.RuneStart(s[from]) {
			from++
		}
		return "…" + s[from:]
	}
	return humanize.Cut(s, n, "…")
}
