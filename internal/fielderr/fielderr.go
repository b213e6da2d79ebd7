// Package fielderr is the one error type for invalid input: it names the field and the
// problem, so every front end (gRPC, REST, CLI) can tell a person which value to fix.
package fielderr

import (
	"errors"
	"fmt"
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
