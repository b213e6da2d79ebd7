// Package paging is the one rule for page sizes in List RPCs (0 means the default, larger
// than the maximum is capped, negative is refused naming the field) and for the page tokens of
// lists kept in key order (a version byte and a checksum, so a token the server did not issue
// is refused rather than read as the end of the list).
package paging

import "github.com/ringfence/ringfence/internal/fielderr"

// Page sizes every List RPC shares.
const (
	DefaultSize = 100
	MaxSize     = 1000
)

// Size turns a requested page_size into the one to use.
func Size(n int32) (int, error) {
	switch {
	case n < 0:
		return 0, fielderr.New("page_size", "must not be negative")
	case n == 0:
		return DefaultSize, nil
	case n > MaxSize:
		return MaxSize, nil
	}
	return int(n), nil
}
