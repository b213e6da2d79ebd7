// Package schemas validates tool arguments and structured results against the pinned JSON
// Schemas (draft 2020-12 unless a schema's "$schema" names another built-in draft). The pool
// compiles with it at run time, and the declaration screen compiles with it before a schema is
// pinned, so a schema that would fail every call is refused at import instead. Compiled
// schemas are cached by pin, and nothing is ever loaded from outside the schema itself: a $ref
// that leaves the document is refused, never fetched, and never read from disk.
package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Schema is a compiled schema.
type Schema struct {
	s *jsonschema.Schema
	g *graph
}

// refuseLoader is the only loader a compiler gets: every external document is refused.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("the schema refers to %q outside itself; remote and file references are never loaded", url)
}

// maxCacheEntries bounds the cache; pins are few per deployment, so eviction is rare.
const maxCacheEntries = 4096

// Cache compiles each distinct schema once.
type Cache struct {
	mu      sync.Mutex
	entries map[string]cacheEntry
}

type cacheEntry struct {
	s   *Schema
	err error
}

// NewCache returns an empty cache.
func NewCache() *Cache { return &Cache{entries: make(map[string]cacheEntry)} }

// Get compiles raw (cached under key, e.g. the pin plus "input"/"output").
func (c *Cache) Get(key string, raw json.RawMessage) (*Schema, error) {
	return c.get(key, func() (*Schema, error) { return Compile(raw) })
}

// GetStrict compiles Strict(raw), cached under key (which must differ from raw's own key).
func (c *Cache) GetStrict(key string, raw json.RawMessage) (*Schema, error) {
	return c.get(key, func() (*Schema, error) { return CompileStrict(raw) })
}

func (c *Cache) get(key string, compile func() (*Schema, error)) (*Schema, error) {
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	if ok {
		return e.s, e.err
	}
	s, err := compile()
	c.mu.Lock()
	if len(c.entries) >= maxCacheEntries {
		clear(c.entries)
	}
	c.entries[key] = cacheEntry{s, err}
	c.mu.Unlock()
	return s, err
}

// Compile compiles one schema document. A schema without "$schema" is read as draft 2020-12;
// one that names a draft the compiler has built in (4, 6, 7, 2019-09, 2020-12) is read as that
// draft, as JSON Schema specifies; any other meta-schema would have to be fetched, so it is
// refused like a remote $ref. A schema that does not compile is a *CompileError.
func Compile(raw json.RawMessage) (*Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schemas: the schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(refuseLoader{})
	if err := c.AddResource(docURL, doc); err != nil {
		return nil, compileError(doc, err)
	}
	s, err := c.Compile(docURL)
	if err != nil {
		return nil, compileError(doc, err)
	}
	anchored, embedded := scan(c, doc)
	g, err := analyze(s, anchored, embedded)
	if err != nil {
		return nil, err
	}
	return &Schema{s: s, g: g}, nil
}

// docURL is where a compiled document lives; it never leaves this package's messages.
const docURL = "urn:ringfence:pinned-schema"

// maxProblems bounds the problems one CompileError keeps.
const maxProblems = 8

// CompileError says why a schema does not compile, place by place.
type CompileError struct {
	// Problems are sorted by location, one per location, at most maxProblems.
	Problems []Problem
	// More counts the locations left out.
	More int
}

// Problem is what is wrong at one place of a schema.
type Problem struct {
	// Pointer is the place as JSON Pointer tokens into the schema; empty is the whole schema.
	Pointer []string
	Message string
}

// Where renders Pointer as a JSON Pointer ("/properties/a/type"; "" for the whole schema).
func (p Problem) Where() string {
	var b strings.Builder
	for _, tok := range p.Pointer {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(tok))
	}
	return b.String()
}

func (e *CompileError) Error() string {
	parts := make([]string, 0, len(e.Problems)+1)
	for _, p := range e.Problems {
		where := p.Where()
		if where == "" {
			where = "the root"
		}
		parts = append(parts, fmt.Sprintf("at %s: %s", where, p.Message))
	}
	if e.More > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", e.More))
	}
	return "schemas: the pinned schema does not compile: " + strings.Join(parts, "; ")
}

// compileError turns the compiler's error into one problem per place in the schema. The
// compiler's own text names an internal URL and nests every cause; this names the place and
// what is wrong there, in a stable order.
func compileError(doc any, err error) *CompileError {
	var sve *jsonschema.SchemaValidationError
	var ve *jsonschema.ValidationError
	var le *jsonschema.LoadURLError
	switch {
	case errors.As(err, &sve) && errors.As(sve.Err, &ve):
		return metaSchemaProblems(ve)
	case errors.As(err, &le) && le.URL == metaSchemaOf(doc):
		return &CompileError{Problems: []Problem{{Pointer: []string{"$schema"},
			Message: fmt.Sprintf("%q names a meta-schema that is not built in (drafts 4, 6, 7, 2019-09 and 2020-12 are); meta-schemas are never fetched", le.URL)}}}
	case errors.As(err, &le):
		return &CompileError{Problems: []Problem{{Message: le.Err.Error()}}}
	}
	return &CompileError{Problems: []Problem{{Message: strings.ReplaceAll(err.Error(), docURL, "")}}}
}

// metaSchemaProblems reads the leaves of a document's validation against its meta-schema:
// each names a place and what is wrong there. Leaves of one place come from branches such as
// anyOf and are joined; places and messages are sorted, so a schema reads the same on every run.
func metaSchemaProblems(ve *jsonschema.ValidationError) *CompileError {
	var leaves []*jsonschema.ValidationError
	leavesOf(ve, &leaves)
	byPlace := map[string]*Problem{}
	msgs := map[string][]string{}
	for _, l := range leaves {
		key := strings.Join(l.InstanceLocation, "\x00")
		if _, ok := byPlace[key]; !ok {
			byPlace[key] = &Problem{Pointer: l.InstanceLocation}
		}
		msgs[key] = append(msgs[key], l.ErrorKind.LocalizedString(printer))
	}
	out := &CompileError{}
	for key, p := range byPlace {
		m := msgs[key]
		sort.Strings(m)
		p.Message = strings.Join(slices.Compact(m), "; ")
		out.Problems = append(out.Problems, *p)
	}
	slices.SortFunc(out.Problems, func(a, b Problem) int { return strings.Compare(a.Where(), b.Where()) })
	if len(out.Problems) > maxProblems {
		out.More = len(out.Problems) - maxProblems
		out.Problems = out.Problems[:maxProblems]
	}
	return out
}

func leavesOf(ve *jsonschema.ValidationError, out *[]*jsonschema.ValidationError) {
	if len(ve.Causes) == 0 {
		*out = append(*out, ve)
		return
	}
	for _, c := range ve.Causes {
		leavesOf(c, out)
	}
}

// metaSchemaOf returns the document's "$schema" string, without an empty fragment.
func metaSchemaOf(doc any) string {
	m, _ := doc.(map[string]any)
	s, _ := m["$schema"].(string)
	return strings.TrimSuffix(s, "#")
}

// Validate checks a decoded JSON value (from encoding/json, numbers as json.Number or
// float64). The error names every failing location, e.g. "/path: missing property". A value
// that would take more than bounded work is refused with a *BudgetError before validation.
func (s *Schema) Validate(v any) error {
	if err := s.checkBudget(v); err != nil {
		return err
	}
	err := s.s.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	var problems []string
	collect(ve, &problems)
	sort.Strings(problems)
	// Branches of one schema (allOf, anyOf, if/else) often fail at the same place for the same
	// reason: say it once.
	problems = slices.Compact(problems)
	if len(problems) > 8 {
		problems = append(problems[:8], fmt.Sprintf("and %d more", len(problems)-8))
	}
	return &Error{Problems: problems}
}

var printer = message.NewPrinter(language.English)

// collect gathers the leaf causes, which name the deepest location that failed.
func collect(ve *jsonschema.ValidationError, out *[]string) {
	if len(ve.Causes) == 0 {
		loc := "/" + strings.Join(ve.InstanceLocation, "/")
		*out = append(*out, fmt.Sprintf("%s: %s", loc, ve.ErrorKind.LocalizedString(printer)))
		return
	}
	for _, c := range ve.Causes {
		collect(c, out)
	}
}

// Error lists what failed, by location in the instance.
type Error struct {
	Problems []string
}

func (e *Error) Error() string { return strings.Join(e.Problems, "; ") }

// Decode parses JSON the way the validator expects (numbers kept exact).
func Decode(raw []byte) (any, error) {
	return jsonschema.UnmarshalJSON(bytes.NewReader(raw))
}
