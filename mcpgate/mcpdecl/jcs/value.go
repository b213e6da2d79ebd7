package jcs

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
)

// ErrType is wrapped when AppendValue meets a Go value that is not a decoded JSON value.
var ErrType = errors.New("jcs: not a JSON value (nil, bool, float64, json.Number, string, []any, map[string]any)")

// AppendValue appends the RFC 8785 canonical form of v, a JSON value as encoding/json decodes
// one (nil, bool, float64, json.Number, string, []any, map[string]any; also []map[string]any),
// to dst. It writes the bytes Canonicalize writes for v's JSON encoding, without encoding it
// first: what a caller holds decoded is canonicalized in one pass. It refuses what
// Canonicalize refuses (a string that is not valid UTF-8, a number that is not a finite double,
// more than MaxDepth levels of nesting) and any other Go type; the error's Offset is then the
// length of dst where it stopped.
func AppendValue(dst []byte, v any) ([]byte, error) {
	return appendValue(dst, v, 0)
}

func appendValue(dst []byte, v any, depth int) ([]byte, error) {
	fail := func(err error) ([]byte, error) { return nil, &Error{Offset: len(dst), Err: err} }
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case bool:
		if v {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case string:
		out, err := AppendString(dst, v)
		if err != nil {
			return fail(ErrInvalidUTF8)
		}
		return out, nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fail(ErrNumber)
		}
		return appendNumber(dst, v), nil
	case json.Number:
		// Read as Canonicalize reads a number: the JSON grammar, then the nearest double.
		p := parser{data: []byte(v)}
		out, err := p.number(dst)
		if err != nil || p.pos != len(p.data) {
			if errors.Is(err, ErrNumber) {
				return fail(ErrNumber)
			}
			return fail(ErrSyntax)
		}
		return out, nil
	case []any:
		return appendArray(dst, v, depth, appendValue)
	case []map[string]any:
		return appendArray(dst, v, depth, appendObject)
	case map[string]any:
		return appendObject(dst, v, depth)
	}
	return fail(ErrType)
}

// appendObject appends m with its members sorted by the UTF-16 code units of their keys. A
// nil map is null, as encoding/json writes it.
func appendObject(dst []byte, m map[string]any, depth int) ([]byte, error) {
	if m == nil {
		return append(dst, "null"...), nil
	}
	if depth >= MaxDepth {
		return nil, &Error{Offset: len(dst), Err: ErrTooDeep}
	}
	var small [16]keyValue
	members := small[:0]
	for k, v := range m {
		members = append(members, keyValue{k, v})
	}
	slices.SortFunc(members, func(a, b keyValue) int { return compareUTF16(a.key, b.key) })
	dst = append(dst, '{')
	for i, kv := range members {
		if i > 0 {
			dst = append(dst, ',')
		}
		out, err := AppendString(dst, kv.key)
		if err != nil {
			return nil, &Error{Offset: len(dst), Err: ErrInvalidUTF8}
		}
		dst = append(out, ':')
		if dst, err = appendValue(dst, kv.value, depth+1); err != nil {
			return nil, err
		}
	}
	return append(dst, '}'), nil
}

type keyValue struct {
	key   string
	value any
}

// appendArray appends the array v, each element by elem, one level deeper than depth.
func appendArray[E any](dst []byte, v []E, depth int, elem func([]byte, E, int) ([]byte, error)) ([]byte, error) {
	if depth >= MaxDepth {
		return nil, &Error{Offset: len(dst), Err: ErrTooDeep}
	}
	dst = append(dst, '[')
	for i, e := range v {
		if i > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = elem(dst, e, depth+1); err != nil {
			return nil, err
		}
	}
	return append(dst, ']'), nil
}
