package screen

import (
	"errors"
	"strings"
)

// node is one value of a canonical JSON document. The screen decodes the
// output of jcs.Canonicalize itself rather than through encoding/json: the
// input is already validated and minimal, members arrive sorted, and no
// reflection or maps are needed.
type node struct {
	kind  byte   // '{', '[', '"', '0' (number), 't', 'f', 'n'
	str   string // decoded string, or the number's text
	keys  []string
	items []*node // object member values (aligned with keys) or array elements
}

var errCanonical = errors.New("screen: not canonical JSON")

// decodeCanonical decodes a document produced by jcs.Canonicalize.
func decodeCanonical(b []byte) (*node, error) {
	d := cdecoder{b: b}
	n, err := d.value()
	if err != nil {
		return nil, err
	}
	if d.i != len(b) {
		return nil, errCanonical
	}
	return n, nil
}

type cdecoder struct {
	b []byte
	i int
}

func (d *cdecoder) value() (*node, error) {
	if d.i >= len(d.b) {
		return nil, errCanonical
	}
	switch c := d.b[d.i]; c {
	case '{':
		d.i++
		n := &node{kind: '{'}
		if d.i < len(d.b) && d.b[d.i] == '}' {
			d.i++
			return n, nil
		}
		for {
			k, err := d.str()
			if err != nil {
				return nil, err
			}
			if d.i >= len(d.b) || d.b[d.i] != ':' {
				return nil, errCanonical
			}
			d.i++
			v, err := d.value()
			if err != nil {
				return nil, err
			}
			n.keys = append(n.keys, k)
			n.items = append(n.items, v)
			if d.i >= len(d.b) {
				return nil, errCanonical
			}
			d.i++
			if d.b[d.i-1] == '}' {
				return n, nil
			}
			if d.b[d.i-1] != ',' {
				return nil, errCanonical
			}
		}
	case '[':
		d.i++
		n := &node{kind: '['}
		if d.i < len(d.b) && d.b[d.i] == ']' {
			d.i++
			return n, nil
		}
		for {
			v, err := d.value()
			if err != nil {
				return nil, err
			}
			n.items = append(n.items, v)
			if d.i >= len(d.b) {
				return nil, errCanonical
			}
			d.i++
			if d.b[d.i-1] == ']' {
				return n, nil
			}
			if d.b[d.i-1] != ',' {
				return nil, errCanonical
			}
		}
	case '"':
		s, err := d.str()
		if err != nil {
			return nil, err
		}
		return &node{kind: '"', str: s}, nil
	case 't', 'f', 'n':
		lit := "null"
		switch c {
		case 't':
			lit = "true"
		case 'f':
			lit = "false"
		}
		if len(d.b)-d.i < len(lit) || string(d.b[d.i:d.i+len(lit)]) != lit {
			return nil, errCanonical
		}
		d.i += len(lit)
		return &node{kind: c}, nil
	default:
		start := d.i
		for d.i < len(d.b) && strings.IndexByte("-+.0123456789e", d.b[d.i]) >= 0 {
			d.i++
		}
		if d.i == start {
			return nil, errCanonical
		}
		return &node{kind: '0', str: string(d.b[start:d.i])}, nil
	}
}

// str decodes a canonical string: only \" \\ \b \f \n \r \t and \u00xx
// escapes occur.
func (d *cdecoder) str() (string, error) {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return "", errCanonical
	}
	d.i++
	start := d.i
	for d.i < len(d.b) && d.b[d.i] != '"' && d.b[d.i] != '\\' {
		d.i++
	}
	if d.i < len(d.b) && d.b[d.i] == '"' {
		s := string(d.b[start:d.i])
		d.i++
		return s, nil
	}
	var sb strings.Builder
	sb.Write(d.b[start:d.i])
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return sb.String(), nil
		case c != '\\':
			sb.WriteByte(c)
			d.i++
			continue
		}
		if d.i+1 >= len(d.b) {
			return "", errCanonical
		}
		e := d.b[d.i+1]
		d.i += 2
		switch e {
		case '"', '\\':
			sb.WriteByte(e)
		case 'b':
			sb.WriteByte('\b')
		case 'f':
			sb.WriteByte('\f')
		case 'n':
			sb.WriteByte('\n')
		case 'r':
			sb.WriteByte('\r')
		case 't':
			sb.WriteByte('\t')
		case 'u':
			if d.i+4 > len(d.b) {
				return "", errCanonical
			}
			var r rune
			for _, h := range d.b[d.i : d.i+4] {
				r <<= 4
				switch {
				case h >= '0' && h <= '9':
					r |= rune(h - '0')
				case h >= 'a' && h <= 'f':
					r |= rune(h - 'a' + 10)
				default:
					return "", errCanonical
				}
			}
			d.i += 4
			sb.WriteRune(r)
		default:
			return "", errCanonical
		}
	}
	return "", errCanonical
}

// member returns the value of key k in an object node, or nil.
func (n *node) member(k string) *node {
	if n == nil || n.kind != '{' {
		return nil
	}
	for i, key := range n.keys {
		if key == k {
			return n.items[i]
		}
	}
	return nil
}

func (n *node) kindName() string {
	switch n.kind {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case '0':
		return "number"
	case 't', 'f':
		return "boolean"
	}
	return "null"
}
