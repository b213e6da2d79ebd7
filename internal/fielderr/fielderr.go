// Package fielderr is the one error type for invalid input: it names the field and the
// problem, so every front end (gRPC, REST, CLI) can tell a person which value to fix.
package fielderr

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/ringfence/ringfence/internal/humanize"
)

// Error says which field of a request is wrong and why.
type Error struct {
	Field   string
	Problem string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return e.Problem
	}
	return e.Field + ": " + e.Problem
}

// New returns an Error for field.
func New(field, format string, args ...any) *Error {
	return &Error{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// As returns the field error inside err, if any.
func As(err error) (*Error, bool) {
	var fe *Error
	ok := errors.As(err, &fe)
	return fe, ok
}

// MaxQuoted bounds how much of a caller's value an error message quotes: a refusal must stay
// small (it travels in a gRPC trailer, which proxies reset past a few KiB) and must not echo
// a megabyte back.
const MaxQuoted = 256

// Quote is how every refusal quotes a value a caller sent: Go-quoted, so that no control or
// format character in it survives into a log or a terminal, cut to MaxQuoted bytes at a
// character boundary, and followed by its full length when cut: "aaaa…" (300000 bytes).
func Quote(v string) string {
	if len(v) <= MaxQuoted {
		return strconv.Quote(v)
	}
	return fmt.Sprintf("%s (%d bytes)", strconv.Quote(humanize.Cut(v, MaxQuoted, "")+"…"), len(v))
}
