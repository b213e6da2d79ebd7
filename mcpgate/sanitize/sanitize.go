// Package sanitize cleans every string a tool returns before a model or a
// person sees it.
//
// Tool output is attacker-controlled text that lands in a model's context
// (attack class 7 in notes/security.md). The pool applies String to every
// string leaf of content and structuredContent, and to every object key:
//
//  1. invalid UTF-8 bytes become U+FFFD, never pass through;
//  2. control characters other than \n and \t are dropped; U+2028 and U+2029
//     become \n;
//  3. bidi controls, Tag characters, zero-width and other format
//     characters, variation selectors and fillers are dropped;
//  4. role markers (__system__, __assistant__, __user__, __developer__,
//     __tool__, __human__) and chat-template boundary tokens are removed,
//     matching case-insensitively and through fullwidth look-alikes;
//  5. unless Options.KeepMarkup, the result is HTML-escaped (<, >, &, ', ").
//
// Chat-template tokens recognised: any <|name|> whose name is 1 to
// MaxTemplateTokenName runes of letters, digits, '_', '-', '.', ':', ' ' or
// '▁' (ChatML, Llama 3, Phi, GPT and DeepSeek families, e.g. <|im_start|>,
// <|eot_id|>, <|start_header_id|>, <|endoftext|>, <｜User｜>); <<SYS>>,
// <</SYS>>; <start_of_turn>, <end_of_turn>; and [INST], [/INST],
// [SYSTEM_PROMPT], [/SYSTEM_PROMPT], [AVAILABLE_TOOLS], [/AVAILABLE_TOOLS],
// [TOOL_CALLS], [TOOL_RESULTS], [/TOOL_RESULTS].
//
// Removal cannot splice a new marker together: text is emitted one code
// point at a time and, whenever the emitted text ends in a marker, that
// marker is cut off at once. The emitted text therefore never contains a
// marker, whatever the nesting (__sys__system__tem__ yields nothing), and
// the work stays linear in the input. Stripping runs before marker matching,
// so a zero-width space inside a marker does not shield it.
//
// Emoji sequences built with ZWJ or variation selectors lose those joiners,
// and scripts that need ZWNJ lose it: this trade is deliberate, since those
// are exactly the code points used to hide text.
package sanitize

import (
	"encoding/json"
	"fmt"
	"html"
	"slices"
	"strconv"
	"unicode/utf8"
	"unsafe"

	"github.com/ringfence/ringfence/mcpgate/internal/runeclass"
)

// Options selects per-server behaviour; the zero value is the safe default.
type Options struct {
	// KeepMarkup skips HTML escaping, for servers whose output is consumed
	// as markup on purpose. Stripping and marker removal still apply.
	KeepMarkup bool
	// Redact, when set, masks secret values in every string and key. It runs
	// before stripping and again after, so an invisible character inside a
	// secret does not shield it.
	Redact func(string) string
}

const (
	// MaxDepth bounds how many levels of arrays and objects Value descends
	// into (the value itself is the first): an array or object deeper than
	// that is replaced by nil rather than passed on unsanitized. It is the
	// depth to which the pool's schemas validate a value (schemas.MaxDepth),
	// so whatever passes a schema check passes here whole; ValueWithin
	// refuses what would not.
	MaxDepth = 128
	// MaxTemplateTokenName bounds the name inside a <|name|> token.
	MaxTemplateTokenName = 48
)

// String returns s cleaned as the package documentation describes.
func String(s string, o Options) string {
	if o.Redact != nil {
		s = o.Redact(s)
	}
	out := clean(s)
	if o.Redact != nil {
		out = o.Redact(out)
	}
	if o.KeepMarkup {
		return out
	}
	return html.EscapeString(out)
}

// Owned is String for text the caller hands over in b: it is cleaned where it lies when it is
// valid UTF-8 (as decoded JSON text is), and the result shares b's memory unless a secret is
// masked or HTML escaping grows it, so that a result of megabytes is not copied once more. b
// must not be used afterwards.
func Owned(b []byte, o Options) string {
	if !utf8.Valid(b) {
		// An invalid byte becomes U+FFFD, three bytes for one: it cannot be cleaned in place.
		return String(string(b), o)
	}
	if o.Redact != nil {
		s := bytesString(b)
		if r := o.Redact(s); len(r) != len(s) || unsafe.StringData(r) != unsafe.StringData(s) {
			b = []byte(r) // a secret was masked: clean the masked copy
		}
	}
	out := bytesString(cleanInto(b[:0], b))
	if o.Redact != nil {
		out = o.Redact(out)
	}
	if o.KeepMarkup {
		return out
	}
	return html.EscapeString(out)
}

func clean(s string) string {
	return bytesString(cleanInto(make([]byte, 0, len(s)), unsafe.Slice(unsafe.StringData(s), len(s))))
}

// bytesString is b as a string, sharing its memory: b is not written again.
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// cleanInto appends s, cleaned, to b and returns the result. b may be s[:0] when s is valid
// UTF-8: no code point is written longer than it was read (U+2028 and U+2029 become a newline,
// markers are cut), so the output never overtakes the input it overwrites. Only an invalid
// byte grows, to U+FFFD.
func cleanInto(b, s []byte) []byte {
	var t tail
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			// ASCII fast path: only controls are dropped, and only _ > ]
			// can end a marker.
			i++
			if (c < 0x20 || c == 0x7F) && c != '\n' && c != '\t' {
				continue
			}
			b = append(b, c)
			if (c == '_' || c == '>' || c == ']') && mayEndMarker(b) {
				b = b[:t.markerStart(b)]
			}
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		i += size
		switch runeclass.Of(r) {
		case runeclass.Control:
			continue // C1 controls; \n and \t took the fast path
		case runeclass.LineBreak:
			r = '\n'
		case runeclass.Bidi, runeclass.Tag, runeclass.Invisible:
			continue
		}
		// An invalid byte decodes as utf8.RuneError, which AppendRune
		// writes as U+FFFD.
		b = utf8.AppendRune(b, r)
		switch runeclass.Fold(r) {
		case '_', '>', ']':
			b = b[:t.markerStart(b)]
		}
	}
	return b
}

// tailWindow bounds how far back markerStart looks; the longest marker is
// <| + MaxTemplateTokenName + |>.
const tailWindow = MaxTemplateTokenName + 4

// fixedMarkers are matched on folded text, so they are written lowercase.
var fixedMarkers = [][]rune{
	[]rune("__system__"), []rune("__assistant__"), []rune("__user__"),
	[]rune("__developer__"), []rune("__tool__"), []rune("__human__"),
	[]rune("[inst]"), []rune("[/inst]"),
	[]rune("[system_prompt]"), []rune("[/system_prompt]"),
	[]rune("[available_tools]"), []rune("[/available_tools]"),
	[]rune("[tool_calls]"), []rune("[tool_results]"), []rune("[/tool_results]"),
	[]rune("<<sys>>"), []rune("<</sys>>"),
	[]rune("<start_of_turn>"), []rune("<end_of_turn>"),
}

// mayEndMarker is a cheap byte-level test that b, ending in ASCII _ > or ],
// could end in a marker: every marker's last two folded code points are
// "__" preceded by a letter, a letter and "]", or "|>", ">>" or "n>". A
// non-ASCII byte before the end defers to markerStart, which folds.
func mayEndMarker(b []byte) bool {
	n := len(b)
	if n < 3 {
		return false
	}
	p, pp := b[n-2], b[n-3]
	if p >= utf8.RuneSelf || pp >= utf8.RuneSelf {
		return true
	}
	letter := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	switch b[n-1] {
	case '_':
		return p == '_' && letter(pp)
	case ']':
		return letter(p)
	default: // '>'
		return p == '|' || p == '>' || p == 'n' || p == 'N'
	}
}

// tail reads the end of the output backwards, folded, one code point at a
// time and only as far as a comparison needs.
type tail struct {
	b   []byte
	end int // b[:end] is not decoded yet
	n   int
	r   [tailWindow]rune
	off [tailWindow]int // byte offset where r[j] starts
}

// at returns the j-th code point from the end (0 is the last).
func (t *tail) at(j int) (rune, bool) {
	for t.n <= j {
		if t.end == 0 || t.n == tailWindow {
			return 0, false
		}
		r, size := utf8.DecodeLastRune(t.b[:t.end])
		t.end -= size
		t.r[t.n], t.off[t.n] = runeclass.Fold(r), t.end
		t.n++
	}
	return t.r[j], true
}

func (t *tail) endsWith(m []rune) bool {
	for j := range m {
		if r, ok := t.at(j); !ok || r != m[len(m)-1-j] {
			return false
		}
	}
	return true
}

// markersByEnd groups fixedMarkers by their last two code points, so a
// tail is compared only with the few markers that can match it.
var markersByEnd = func() map[[2]rune][][]rune {
	m := map[[2]rune][][]rune{}
	for _, mk := range fixedMarkers {
		k := [2]rune{mk[len(mk)-1], mk[len(mk)-2]}
		m[k] = append(m[k], mk)
	}
	return m
}()

// markerStart returns the byte offset where a marker ending at the end of b
// starts, or len(b) when b does not end in one. t is scratch space.
func (t *tail) markerStart(b []byte) int {
	t.b, t.end, t.n = b, len(b), 0
	last, ok1 := t.at(0)
	prev, ok2 := t.at(1)
	if !ok1 || !ok2 {
		return len(b)
	}
	for _, m := range markersByEnd[[2]rune{last, prev}] {
		if t.endsWith(m) {
			return t.off[len(m)-1]
		}
	}
	if last != '>' || prev != '|' {
		return len(b)
	}
	// <| name |> with the name read backwards from the third code point.
	for j := 2; j-2 <= MaxTemplateTokenName; j++ {
		c, ok := t.at(j)
		if !ok {
			break
		}
		if c == '|' {
			if j > 2 {
				if lt, ok := t.at(j + 1); ok && lt == '<' {
					return t.off[j+1]
				}
			}
			break
		}
		if !templateNameRune(c) {
			break
		}
	}
	return len(b)
}

func templateNameRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= '0' && r <= '9' ||
		r == '_' || r == '-' || r == '.' || r == ':' || r == ' ' || r == '\u2581'
}

// Value returns a sanitized copy of v, a value as encoding/json decodes into
// any: every string leaf and every object key goes through String. Numbers,
// booleans and nil pass through; a json.Number that is not a number, a value
// of any other Go type and anything nested deeper than MaxDepth become nil,
// so nothing unsanitized leaves. When two keys of one object sanitize to the
// same key, the member whose original key sorts first is kept and the
// others are dropped.
func Value(v any, o Options) any {
	return value(v, o, 0, new(bool))
}

// ErrTooDeep refuses a value that nests more than MaxDepth levels, in the
// words every depth check of Ringfence uses, for arrays and objects alike.
var ErrTooDeep = fmt.Errorf("nested too deeply: more than %d levels of arrays and objects", MaxDepth)

// ValueWithin is Value for a value that must be passed on whole or not at
// all: where Value would replace a part nested deeper than MaxDepth by nil,
// it returns ErrTooDeep instead.
func ValueWithin(v any, o Options) (any, error) {
	var cut bool
	out := value(v, o, 0, &cut)
	if cut {
		return nil, ErrTooDeep
	}
	return out, nil
}

// value sanitizes v, inside depth levels of arrays and objects; it sets *cut
// when it drops a part for nesting more than MaxDepth levels.
func value(v any, o Options, depth int, cut *bool) any {
	switch v.(type) {
	case []any, map[string]any:
		if depth >= MaxDepth {
			*cut = true
			return nil
		}
	}
	switch v := v.(type) {
	case nil, bool, float64, float32, int, int8, int16, int32, int64,
		uint, uint8, uint16, uint32, uint64:
		return v
	case string:
		return String(v, o)
	case json.Number:
		if _, err := strconv.ParseFloat(string(v), 64); err != nil || !json.Valid([]byte(v)) {
			return nil
		}
		return v
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = value(e, o, depth+1, cut)
		}
		return out
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		out := make(map[string]any, len(v))
		for _, k := range keys {
			sk := String(k, o)
			if _, dup := out[sk]; dup {
				continue
			}
			out[sk] = value(v[k], o, depth+1, cut)
		}
		return out
	}
	return nil
}
