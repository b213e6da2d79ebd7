package cli

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Text that servers and callers chose (a tool's description, an error message quoting a value,
// an audit record's fields) reaches the operator's terminal through the CLI. Such text must stay
// inert there: no escape sequence that moves the cursor, sets the window title or conceals what
// follows, and nothing invisible that makes it read differently from what it is (bidi
// overrides and isolates reordering it, zero-width characters splitting or joining words, Tag
// characters carrying hidden instructions). escapeText is the one rule for all of it: every
// byte the CLI prints passes through a safeWriter, and single-line fields through oneLine.

// unsafeRune reports whether r must not reach a terminal as itself: C0 and C1 controls, DEL,
// format characters (Unicode category Cf: bidi embeddings, overrides, isolates and marks,
// zero-width space and joiners, word joiner, byte order mark, soft hyphen, interlinear
// annotation marks, Tag characters), the Tag block as a whole (U+E0000 is unassigned, not Cf),
// and the line and paragraph separators, which some terminals break lines at.
func unsafeRune(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r < 0xa0:
		return false
	case r >= 0xe0000 && r <= 0xe007f, r == '\u2028', r == '\u2029':
		return true
	}
	return unicode.Is(unicode.Cf, r)
}

// escapeText returns s with every unsafe rune written as a JSON-style escape (\n, \r, \t,
// \u202e; a rune beyond U+FFFF as its surrogate pair, \udb40\udc41), and every byte that is not
// UTF-8 as \xff. The escapes are also valid inside a JSON string, so JSON output stays JSON
// and decodes to the same value. With keepLayout, line breaks and tabs pass as they are: the
// CLI's own layout uses them.
func escapeText(s string, keepLayout bool) string {
	if !needsEscape(s, keepLayout) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case keepLayout && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case !unsafeRune(r):
			b.WriteString(s[i : i+size])
		case r > 0xffff:
			r1, r2 := utf16Pair(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += size
	}
	return b.String()
}

func needsEscape(s string, keepLayout bool) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 || c == 0x7f) && !(keepLayout && (c == '\n' || c == '\t')) {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || unsafeRune(r) {
			return true
		}
		i += size
	}
	return false
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

// oneLine is a field printed inside a line of the CLI's own (a table cell, a message, a
// "key: value" pair): nothing in it may break the line, so that no text a server or caller
// chose reads as a line the CLI wrote (a forged "hint:", say).
func oneLine(s string) string { return escapeText(s, false) }

// safeWriter writes everything through escapeText, keeping line breaks and tabs. A UTF-8
// sequence split across two writes is held back until it is whole, so that no rune slips
// through in halves.
type safeWriter struct {
	w       io.Writer
	pending []byte
}

func newSafeWriter(w io.Writer) *safeWriter { return &safeWriter{w: w} }

func (s *safeWriter) Write(p []byte) (int, error) {
	buf := append(s.pending, p...)
	cut := len(buf)
	// An incomplete sequence at the end is at most UTFMax-1 bytes after its first byte.
	for i := len(buf) - 1; i >= 0 && i >= len(buf)-utf8.UTFMax; i-- {
		if utf8.RuneStart(buf[i]) {
			if !utf8.FullRune(buf[i:]) {
				cut = i
			}
			break
		}
	}
	out := escapeText(string(buf[:cut]), true)
	s.pending = append([]byte(nil), buf[cut:]...)
	if _, err := io.WriteString(s.w, out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes a sequence still held back: it can no longer be completed, so each of its bytes
// is escaped.
func (s *safeWriter) Flush() error {
	if len(s.pending) == 0 {
		return nil
	}
	out := escapeText(string(s.pending), true)
	s.pending = nil
	_, err := io.WriteString(s.w, out)
	return err
}

// linef is fmt.Fprintf with every string argument passed through oneLine: the line breaks
// in format are the CLI's, and none in the text it formats.
func linef(w io.Writer, format string, args ...any) (int, error) {
	return fmt.Fprintf(w, format, oneLines(args)...)
}

// writef is linef for a line whose failed write changes nothing the command does (a note, a
// warning, one line of a listing): the command's exit status reports its outcome.
func writef(w io.Writer, format string, args ...any) { _, _ = linef(w, format, args...) }

// sprintLine is fmt.Sprintf with every string argument passed through oneLine.
func sprintLine(format string, args ...any) string {
	return fmt.Sprintf(format, oneLines(args)...)
}

func oneLines(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		if s, ok := a.(string); ok {
			a = lineText(s)
		}
		out[i] = a
	}
	return out
}

// lineText formats as oneLine's text; %q quotes the text as it is, since strconv.Quote
// already escapes every rune that is not graphic.
type lineText string

func (t lineText) Format(f fmt.State, verb rune) {
	s := string(t)
	if verb != 'q' {
		s = oneLine(s)
	}
	fmt.Fprintf(f, fmt.FormatString(f, verb), s)
}
