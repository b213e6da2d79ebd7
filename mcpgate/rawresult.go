package mcpgate

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ProcessRawResult is ProcessResult for a result as the server wrote it: the JSON of the
// result of its answer to tools/call, as a session that hands on what it read (Ringfence's
// stdio sessions) gives it. It is decoded once, here, and raw is handed over: the text of a
// plain text item (the usual carrier of a large result) is decoded and sanitized where it lies
// in raw, so that a result costs no copy of itself unless HTML escaping grows it, and raw must
// not be used afterwards. Any other item is decoded as the MCP SDK decodes it. An answer that
// is not an MCP tool result is a *ProtocolError.
func ProcessRawResult(spec *ToolSpec, raw json.RawMessage, opts ...CallOption) (*Result, error) {
	if spec == nil {
		return nil, errNilSpec
	}
	cfg := configure(opts)
	var wire struct {
		Content           []rawJSON `json:"content"`
		StructuredContent rawJSON   `json:"structuredContent"`
		IsError           bool      `json:"isError"`
	}
	if err := json.Unmarshal(raw, &wire); err != nil {
		return nil, &ProtocolError{Tool: spec.Name, Message: "it does not decode as one: " + cfg.safe(err.Error())}
	}
	if len(wire.Content) > MaxContentItems {
		return nil, &TooLargeError{Tool: spec.Name, What: "content items", Size: len(wire.Content), Limit: MaxContentItems}
	}
	res := &mcp.CallToolResult{IsError: wire.IsError, Content: make([]mcp.Content, len(wire.Content))}
	var owned [][]byte
	for i, item := range wire.Content {
		text, c, err := decodeContent(item)
		if err != nil {
			return nil, &ProtocolError{Tool: spec.Name, Message: fmt.Sprintf("content item %d: %s", i, cfg.safe(err.Error()))}
		}
		if text != nil {
			if owned == nil {
				owned = make([][]byte, len(wire.Content))
			}
			owned[i], c = text, &mcp.TextContent{}
		}
		res.Content[i] = c
	}
	if len(wire.StructuredContent) > 0 && string(wire.StructuredContent) != "null" {
		if err := json.Unmarshal(wire.StructuredContent, &res.StructuredContent); err != nil {
			return nil, &ProtocolError{Tool: spec.Name, Message: "the structured content does not decode: " + cfg.safe(err.Error())}
		}
	}
	return processResult(spec, res, owned, &cfg)
}

// rawJSON is a JSON value as it stands in the text being decoded: json.Unmarshal never writes
// to its input, so the value is kept without a copy.
type rawJSON []byte

func (r *rawJSON) UnmarshalJSON(b []byte) error {
	*r = b
	return nil
}

// decodeContent decodes one content item: a plain text item (a type and a text, nothing else)
// into its text, any other as the MCP SDK decodes it, which refuses a type MCP does not define.
func decodeContent(item rawJSON) (text []byte, c mcp.Content, err error) {
	var members map[string]rawJSON
	if err := json.Unmarshal(item, &members); err != nil {
		return nil, nil, fmt.Errorf("not an object: %v", err)
	}
	if raw, ok := members["text"]; ok && len(members) == 2 && string(members["type"]) == `"text"` {
		// Decoding never lengthens valid UTF-8 (an escape is longer than what it stands for),
		// so it is done in place; an invalid byte becomes U+FFFD, three bytes for one.
		dst := raw[:0:len(raw)]
		if !utf8.Valid(raw) {
			dst = make([]byte, 0, len(raw))
		}
		if text, ok := unquote(dst, raw); ok {
			return text, nil, nil
		}
	}
	wrapped := make([]byte, 0, len(item)+len(`{"content":[]}`))
	wrapped = append(append(append(wrapped, `{"content":[`...), item...), `]}`...)
	var res mcp.CallToolResult
	if err := json.Unmarshal(wrapped, &res); err != nil {
		return nil, nil, err
	}
	if len(res.Content) != 1 {
		return nil, nil, errors.New("not a content item")
	}
	return nil, res.Content[0], nil
}

// unquote appends the JSON string raw, decoded as encoding/json decodes one (escapes resolved,
// invalid UTF-8 and lone surrogates replaced by U+FFFD), to b, which may be raw[:0] when raw is
// valid UTF-8: nothing is then written ahead of what was read. ok is false when raw is not a
// string.
func unquote(b, raw []byte) (_ []byte, ok bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false
	}
	s := raw[1 : len(raw)-1]
	for r := 0; r < len(s); {
		switch c := s[r]; {
		case c == '\\':
			if r+1 >= len(s) {
				return nil, false
			}
			r += 2
			switch s[r-1] {
			case '"', '\\', '/', '\'':
				b = append(b, s[r-1])
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				rr := hex4(s[r-2:])
				if rr < 0 {
					return nil, false
				}
				r += 4
				if utf16.IsSurrogate(rr) {
					if dec := utf16.DecodeRune(rr, hex4(s[r:])); dec != unicode.ReplacementChar {
						b = utf8.AppendRune(b, dec)
						r += 6
						break
					}
					rr = unicode.ReplacementChar
				}
				b = utf8.AppendRune(b, rr)
			default:
				return nil, false
			}
		case c == '"', c < ' ':
			return nil, false
		case c < utf8.RuneSelf:
			b = append(b, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			b = utf8.AppendRune(b, rr)
			r += size
		}
	}
	return b, true
}

// hex4 is the code unit of the \uXXXX escape that s begins with, or -1.
func hex4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}
