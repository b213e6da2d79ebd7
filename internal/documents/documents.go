// Package documents resolves my-documents://<id> references in a tool call's arguments: the
// agent runtime's My Documents argument resolver. A model cannot put a file's bytes in a tool
// call, so it names the document instead, and the pool puts the content there, base64, right
// before the call reaches a server the agent's document_resolver setting lists.
//
// Finding the references and substituting them is pure (Refs, Substitute); fetching a
// document is a Resolver's: the pool's built-in store, or a platform's own document service
// (HTTP), chosen by configuration.
package documents

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ringfence/ringfence/internal/ident"
)

// Scheme starts a reference: my-documents://<id>.
const Scheme = "my-documents://"

// MaxRefs bounds the distinct references one call may carry.
const MaxRefs = 32

// maxDepth bounds the walk; arguments are bounded far below it by the pool's checks.
const maxDepth = 128

// ErrUnavailable is wrapped by every failure to resolve a reference: a document that does not
// exist, belongs to another tenant (which is the same, to the caller), is too large, or a
// document service that cannot be asked. The call is refused before dispatch.
var ErrUnavailable = errors.New("document unavailable")

// Resolver fetches one of tenant's documents, at most limit bytes of it: a larger one is
// ErrUnavailable, never cut short.
type Resolver interface {
	Document(ctx context.Context, tenant, id string, limit int64) ([]byte, error)
}

// CheckID checks a document id as a reference names it: 1 to 128 of A-Z a-z 0-9 _ . -, not
// dots only (it becomes part of a URL path).
func CheckID(field, id string) error { return ident.Document.Check(field, id) }

// Refs returns the distinct document ids that args reference, in the order met (keys sorted
// at each level): every string value, at any depth, that is exactly my-documents://<id>. A
// reference whose id is malformed, or more than MaxRefs distinct ones, is an error that wraps
// ErrUnavailable.
func Refs(args map[string]any) ([]string, error) {
	var ids []string
	var walk func(v any, depth int) error
	walk = func(v any, depth int) error {
		if depth > maxDepth {
			return nil
		}
		switch x := v.(type) {
		case string:
			id, ok := strings.CutPrefix(x, Scheme)
			if !ok {
				return nil
			}
			if err := CheckID("document id", id); err != nil {
				return fmt.Errorf("%w: %q is not a document reference: %v", ErrUnavailable, clip(x), err)
			}
			for _, have := range ids {
				if have == id {
					return nil
				}
			}
			if len(ids) == MaxRefs {
				return fmt.Errorf("%w: the arguments reference more than %d documents", ErrUnavailable, MaxRefs)
			}
			ids = append(ids, id)
		case map[string]any:
			for _, k := range sortedKeys(x) {
				if err := walk(x[k], depth+1); err != nil {
					return err
				}
			}
		case []any:
			for _, e := range x {
				if err := walk(e, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(args, 0); err != nil {
		return nil, err
	}
	return ids, nil
}

// Substitute returns a copy of args in which every reference to a document in contents is
// replaced by that content, base64 (standard encoding, padded); args is not changed.
func Substitute(args map[string]any, contents map[string][]byte) map[string]any {
	encoded := make(map[string]string, len(contents))
	for id, c := range contents {
		encoded[id] = base64.StdEncoding.EncodeToString(c)
	}
	var walk func(v any, depth int) any
	walk = func(v any, depth int) any {
		if depth > maxDepth {
			return v
		}
		switch x := v.(type) {
		case string:
			if id, ok := strings.CutPrefix(x, Scheme); ok {
				if e, found := encoded[id]; found {
					return e
				}
			}
			return x
		case map[string]any:
			out := make(map[string]any, len(x))
			for k, e := range x {
				out[k] = walk(e, depth+1)
			}
			return out
		case []any:
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = walk(e, depth+1)
			}
			return out
		}
		return v
	}
	return walk(args, 0).(map[string]any)
}

func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

// clip bounds a caller's text quoted in an error.
func clip(s string) string {
	if len(s) <= 160 {
		return s
	}
	return s[:160] + "…"
}
