// Package schemas validates tool arguments and structured results against the pinned JSON
// Schemas (draft 2020-12). Compiled schemas are cached by pin, and nothing is ever loaded from
// outside the schema itself: a $ref that leaves the document is refused, never fetched, and
// never read from disk.
package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
}

// refuseLoader is the only loader a compiler gets: every external document is refused.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schemas: the schema refers to %q outside itself; remote and file references are never loaded", url)
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
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	if ok {
		return e.s, e.err
	}
	s, err := Compile(raw)
	c.mu.Lock()
	if len(c.entries) >= maxCacheEntries {
		clear(c.entries)
	}
	c.entries[key] = cacheEntry{s, err}
	c.mu.Unlock()
	return s, err
}

// Compile compiles one schema document.
func Compile(raw json.RawMessage) (*Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schemas: the schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(refuseLoader{})
	const loc = "urn:ringfence:pinned-schema"
	if err := c.AddResource(loc, doc); err != nil {
		return nil, fmt.Errorf("schemas: %w", err)
	}
	s, err := c.Compile(loc)
	if err != nil {
		return nil, fmt.Errorf("schemas: the pinned schema does not compile: %w", err)
	}
	return &Schema{s: s}, nil
}

// Validate checks a decoded JSON value (from encoding/json, numbers as json.Number or
// float64). The error names every failing location, e.g. "/path: missing property".
func (s *Schema) Validate(v any) error {
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
