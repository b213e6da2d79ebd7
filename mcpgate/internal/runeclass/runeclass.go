// Package runeclass sorts code points into the classes that hide text from
// a human reader while a model still reads it. The declaration screen flags
// them and output sanitization strips them; both must agree on the list, so
// it lives here once.
package runeclass

import "unicode"

// Kind is the class of one code point.
type Kind uint8

const (
	// Visible is everything not listed below.
	Visible Kind = iota
	// Control is a C0 or C1 control character or DEL (\n and \t included;
	// callers decide which controls they keep).
	Control
	// LineBreak is U+2028 LINE SEPARATOR or U+2029 PARAGRAPH SEPARATOR.
	LineBreak
	// Bidi is a bidirectional formatting character: embeddings, overrides,
	// isolates and the LRM, RLM and ALM marks.
	Bidi
	// Tag is a code point of the Tags block U+E0000..U+E007F, which can
	// spell invisible ASCII.
	Tag
	// Invisible is any other format character (zero-width space and
	// joiners, word joiner, BOM, soft hyphen, invisible operators, …),
	// a variation selector, a Hangul filler or another code point that
	// renders as nothing.
	Invisible
)

// Of returns the class of r.
func Of(r rune) Kind {
	if r < 0x80 {
		if r < 0x20 || r == 0x7F {
			return Control
		}
		return Visible
	}
	switch {
	case r <= 0x9F:
		return Control
	case r == 0x2028 || r == 0x2029:
		return LineBreak
	case r == 0x061C || r == 0x200E || r == 0x200F ||
		(r >= 0x202A && r <= 0x202E) || (r >= 0x2066 && r <= 0x2069):
		return Bidi
	case r >= 0xE0000 && r <= 0xE007F:
		return Tag
	case r == 0x034F, // combining grapheme joiner
		r == 0x115F, r == 0x1160, r == 0x3164, r == 0xFFA0, // Hangul fillers
		r == 0x17B4, r == 0x17B5, // Khmer inherent vowels, never rendered
		r >= 0x180B && r <= 0x180F,   // Mongolian variation selectors and vowel separator
		r >= 0xFE00 && r <= 0xFE0F,   // variation selectors
		r >= 0xE0100 && r <= 0xE01EF, // variation selectors supplement
		r == 0x2065:                  // unassigned, inside the invisible-operator run
		return Invisible
	case unicode.Is(unicode.Cf, r):
		// Zero-width space and joiners, word joiner, invisible operators,
		// BOM, soft hyphen, interlinear annotation marks, and the rest.
		return Invisible
	}
	return Visible
}

// Hidden reports whether r is invisible to a reader: every class except
// Visible and the two controls that lay out text, \n and \t.
func Hidden(r rune) bool {
	k := Of(r)
	return k != Visible && r != '\n' && r != '\t'
}

// TagASCII returns the ASCII character that a Tags-block code point spells,
// or 0 for the language tag, the cancel tag and unassigned code points.
func TagASCII(r rune) byte {
	if r >= 0xE0020 && r <= 0xE007E {
		return byte(r - 0xE0000)
	}
	return 0
}

// Fold maps r to the ASCII character it imitates when r is a fullwidth or
// small-form variant of one (＿, ﹏, ｜, ＜, …), and lowercases ASCII
// letters. Marker matching uses it so that a fullwidth "＜｜im_start｜＞" is
// caught as surely as the ASCII spelling.
func Fold(r rune) rune {
	switch {
	case r >= 'A' && r <= 'Z':
		return r + ('a' - 'A')
	case r < 0x80:
		return r
	case r >= 0xFF01 && r <= 0xFF5E:
		return Fold(r - 0xFEE0)
	case r >= 0xFE4D && r <= 0xFE4F, r == 0xFF3F:
		return '_'
	case r == 0xFE64:
		return '<'
	case r == 0xFE65:
		return '>'
	case r == 0xFE59, r == 0xFE5D:
		return '['
	case r == 0xFE5A, r == 0xFE5E:
		return ']'
	}
	return r
}
