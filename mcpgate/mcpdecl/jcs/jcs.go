// Package jcs implements the JSON Canonicalization Scheme of RFC 8785.
//
// Ringfence pins every MCP tool declaration by hashing its canonical JSON, so
// two encodings of the same declaration (other key order, other whitespace,
// other string escapes, other spellings of the same number) must produce the
// same bytes, and any change of meaning must produce different bytes. This
// package exists so that this property rests on code we own and test against
// the RFC's own examples rather than on an encoder's incidental behaviour.
//
// Canonicalize accepts exactly I-JSON (RFC 7493) and refuses everything that
// another parser could read differently:
//
//   - invalid UTF-8 and escaped lone surrogates (ErrInvalidUTF8),
//   - duplicate object keys, compared after unescaping (ErrDuplicateKey),
//   - numbers that are not finite IEEE 754 doubles (ErrNumber),
//   - nesting deeper than MaxDepth arrays and objects (ErrTooDeep),
//   - anything else outside RFC 8259, including a byte order mark and
//     trailing data (ErrSyntax).
//
// Output: object members sorted by the UTF-16 code units of their keys;
// numbers in ECMAScript Number::toString form; strings escaped as ECMAScript
// JSON.stringify does (only '"', '\\' and the C0 controls, with the short
// forms \b \t \n \f \r and lowercase \u00xx otherwise); no whitespace.
// The output is never more than six times the input size, and the work is
// linear in the input size times the nesting depth.
package jcs

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds how many arrays and objects may be nested inside each
// other. Tool schemas nest a handful of levels; 128 leaves room for any
// honest document while keeping the recursion small.
const MaxDepth = 128

// Errors that Canonicalize wraps in an *Error.
var (
	ErrSyntax       = errors.New("jcs: invalid JSON")
	ErrInvalidUTF8  = errors.New("jcs: invalid UTF-8 or lone surrogate")
	ErrDuplicateKey = errors.New("jcs: duplicate object key")
	ErrNumber       = errors.New("jcs: number is not a finite IEEE 754 double")
	ErrTooDeep      = fmt.Errorf("jcs: nested too deeply: more than %d levels of arrays and objects", MaxDepth)
)

// Error reports where in the input canonicalization failed. It never quotes
// the input, which may hold secrets.
type Error struct {
	Offset int   // byte offset into the input
	Err    error // one of the Err* sentinels
}

func (e *Error) Error() string { return fmt.Sprintf("%v at byte %d", e.Err, e.Offset) }

// Unwrap lets callers test the cause with errors.Is.
func (e *Error) Unwrap() error { return e.Err }

// Canonicalize returns the RFC 8785 canonical form of the single JSON value
// in raw.
func Canonicalize(raw []byte) ([]byte, error) {
	p := parser{data: raw}
	p.skipSpace()
	out, err := p.value(make([]byte, 0, len(raw)))
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return nil, p.fail(ErrSyntax)
	}
	return out, nil
}

type parser struct {
	data    []byte
	pos     int
	depth   int
	keyBuf  []byte
	scratch []byte
}

type member struct {
	key        string
	start, end int // span of `"key":value` in the output
}

func (p *parser) fail(err error) error { return &Error{Offset: p.pos, Err: err} }

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(dst []byte) ([]byte, error) {
	if p.pos >= len(p.data) {
		return nil, p.fail(ErrSyntax)
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(dst)
	case c == '[':
		return p.array(dst)
	case c == '"':
		out, _, err := p.str(dst, false)
		return out, err
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number(dst)
	case c == 't':
		return p.literal(dst, "true")
	case c == 'f':
		return p.literal(dst, "false")
	case c == 'n':
		return p.literal(dst, "null")
	default:
		return nil, p.fail(ErrSyntax)
	}
}

func (p *parser) literal(dst []byte, lit string) ([]byte, error) {
	if len(p.data)-p.pos < len(lit) || string(p.data[p.pos:p.pos+len(lit)]) != lit {
		return nil, p.fail(ErrSyntax)
	}
	p.pos += len(lit)
	return append(dst, lit...), nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > MaxDepth {
		return p.fail(ErrTooDeep)
	}
	return nil
}

func (p *parser) array(dst []byte) ([]byte, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	p.pos++ // '['
	dst = append(dst, '[')
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		p.depth--
		return append(dst, ']'), nil
	}
	for {
		var err error
		if dst, err = p.value(dst); err != nil {
			return nil, err
		}
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.fail(ErrSyntax)
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			p.skipSpace()
			dst = append(dst, ',')
		case ']':
			p.pos++
			p.depth--
			return append(dst, ']'), nil
		default:
			return nil, p.fail(ErrSyntax)
		}
	}
}

func (p *parser) object(dst []byte) ([]byte, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	open := p.pos
	p.pos++ // '{'
	start := len(dst)
	dst = append(dst, '{')
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		p.depth--
		return append(dst, '}'), nil
	}
	var members []member
	sorted := true
	for {
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, p.fail(ErrSyntax)
		}
		mstart := len(dst)
		var key string
		var err error
		if dst, key, err = p.str(dst, true); err != nil {
			return nil, err
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, p.fail(ErrSyntax)
		}
		p.pos++
		p.skipSpace()
		dst = append(dst, ':')
		if dst, err = p.value(dst); err != nil {
			return nil, err
		}
		if n := len(members); n > 0 && compareUTF16(members[n-1].key, key) >= 0 {
			sorted = false
		}
		members = append(members, member{key: key, start: mstart, end: len(dst)})
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.fail(ErrSyntax)
		}
		if p.data[p.pos] == ',' {
			p.pos++
			p.skipSpace()
			dst = append(dst, ',')
			continue
		}
		if p.data[p.pos] != '}' {
			return nil, p.fail(ErrSyntax)
		}
		p.pos++
		break
	}
	p.depth--
	if sorted {
		// Strictly ascending keys cannot hold a duplicate.
		return append(dst, '}'), nil
	}
	slices.SortStableFunc(members, func(a, b member) int { return compareUTF16(a.key, b.key) })
	for i := 1; i < len(members); i++ {
		if members[i-1].key == members[i].key {
			return nil, &Error{Offset: open, Err: ErrDuplicateKey}
		}
	}
	p.scratch = append(p.scratch[:0], dst[start+1:]...)
	dst = dst[:start+1]
	for i, m := range members {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, p.scratch[m.start-start-1:m.end-start-1]...)
	}
	return append(dst, '}'), nil
}

// str parses the string at p.pos, appends its canonical form to dst and,
// when wantKey is set, also returns the decoded text for sorting.
func (p *parser) str(dst []byte, wantKey bool) ([]byte, string, error) {
	p.pos++ // opening quote
	dst = append(dst, '"')
	key := p.keyBuf[:0]
	for {
		if p.pos >= len(p.data) {
			return nil, "", p.fail(ErrSyntax)
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			p.keyBuf = key
			if wantKey {
				return append(dst, '"'), string(key), nil
			}
			return append(dst, '"'), "", nil
		case c == '\\':
			r, err := p.escape()
			if err != nil {
				return nil, "", err
			}
			dst = appendEscaped(dst, r)
			if wantKey {
				key = utf8.AppendRune(key, r)
			}
		case c < 0x20:
			return nil, "", p.fail(ErrSyntax)
		case c < utf8.RuneSelf:
			// Copy the whole run of plain ASCII at once.
			end := p.pos + 1
			for end < len(p.data) {
				b := p.data[end]
				if b < 0x20 || b >= utf8.RuneSelf || b == '"' || b == '\\' {
					break
				}
				end++
			}
			dst = append(dst, p.data[p.pos:end]...)
			if wantKey {
				key = append(key, p.data[p.pos:end]...)
			}
			p.pos = end
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size == 1 {
				return nil, "", p.fail(ErrInvalidUTF8)
			}
			dst = append(dst, p.data[p.pos:p.pos+size]...)
			if wantKey {
				key = append(key, p.data[p.pos:p.pos+size]...)
			}
			p.pos += size
		}
	}
}

// escape decodes the escape sequence at p.pos, joining surrogate pairs and
// refusing lone surrogates, which have no UTF-8 form.
func (p *parser) escape() (rune, error) {
	if p.pos+1 >= len(p.data) {
		return 0, p.fail(ErrSyntax)
	}
	c := p.data[p.pos+1]
	p.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
	default:
		p.pos -= 2
		return 0, p.fail(ErrSyntax)
	}
	hi, ok := p.hex4()
	if !ok {
		return 0, p.fail(ErrSyntax)
	}
	switch {
	case hi >= 0xDC00 && hi <= 0xDFFF:
		return 0, p.fail(ErrInvalidUTF8)
	case hi < 0xD800 || hi > 0xDBFF:
		return hi, nil
	}
	if p.pos+1 >= len(p.data) || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
		return 0, p.fail(ErrInvalidUTF8)
	}
	p.pos += 2
	lo, ok := p.hex4()
	if !ok {
		return 0, p.fail(ErrSyntax)
	}
	if lo < 0xDC00 || lo > 0xDFFF {
		return 0, p.fail(ErrInvalidUTF8)
	}
	return utf16.DecodeRune(hi, lo), nil
}

func (p *parser) hex4() (rune, bool) {
	if len(p.data)-p.pos < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.pos += 4
	return r, true
}

const hexDigits = "0123456789abcdef"

// appendEscaped writes r as ECMAScript JSON.stringify would inside a string.
func appendEscaped(dst []byte, r rune) []byte {
	switch r {
	case '"':
		return append(dst, '\\', '"')
	case '\\':
		return append(dst, '\\', '\\')
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	if r < 0x20 {
		return append(dst, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xF])
	}
	return utf8.AppendRune(dst, r)
}

func (p *parser) number(dst []byte) ([]byte, error) {
	start := p.pos
	d := p.data
	i := p.pos
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	default:
		p.pos = i
		return nil, p.fail(ErrSyntax)
	}
	if i < len(d) && d[i] == '.' {
		i++
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == j {
			p.pos = i
			return nil, p.fail(ErrSyntax)
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == j {
			p.pos = i
			return nil, p.fail(ErrSyntax)
		}
	}
	f, err := strconv.ParseFloat(string(d[start:i]), 64)
	if err != nil {
		// The grammar above admits only what ParseFloat accepts, so the
		// only failure left is overflow to an infinity.
		return nil, p.fail(ErrNumber)
	}
	p.pos = i
	return appendNumber(dst, f), nil
}

// compareUTF16 orders strings by their UTF-16 code units, as RFC 8785
// section 3.2.3 requires. It differs from byte order only where a
// supplementary-plane character meets one in U+E000..U+FFFF.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			ua, ub := firstUnit(ra), firstUnit(rb)
			if ua != ub {
				return cmpInt(ua, ub)
			}
			// Equal high surrogates: both are supplementary.
			return cmpInt(ra, rb)
		}
		a, b = a[na:], b[nb:]
	}
	return cmpInt(len(a), len(b))
}

func firstUnit(r rune) rune {
	if r < 0x10000 {
		return r
	}
	return 0xD800 + (r-0x10000)>>10
}

func cmpInt[T rune | int](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// AppendString appends s as a canonical JSON string. Callers that assemble
// canonical documents from Go strings use it so that a string which is not
// valid UTF-8 is refused instead of silently repaired.
func AppendString(dst []byte, s string) ([]byte, error) {
	if !utf8.ValidString(s) {
		return nil, &Error{Offset: invalidOffset(s), Err: ErrInvalidUTF8}
	}
	// Surrogate code points cannot occur: utf8.ValidString rejects them. Only '"', '\\' and
	// the C0 controls are escaped, all ASCII: every other byte of valid UTF-8 is copied as it
	// is, in runs.
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			dst = appendEscaped(append(dst, s[start:i]...), rune(c))
			start = i + 1
		}
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"'), nil
}

func invalidOffset(s string) int {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(s)
}
