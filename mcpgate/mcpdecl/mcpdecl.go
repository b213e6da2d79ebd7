// Package mcpdecl holds an MCP tool declaration exactly as its server sent
// it, and the pin that Ringfence records for it.
//
// A pin is what makes a rug pull visible: discovery and import hash the
// declaration an author approved, and the pool re-hashes the live
// declaration before every call (DESIGN.md, "Pin" and "Drift"). The hash
// covers name, title, description, inputSchema, outputSchema and
// annotations, in RFC 8785 canonical form, behind a domain and version tag,
// so no encoding detail of the server can move it and no change of meaning
// can keep it. Screening (package screen) never alters what is hashed.
//
// The hashed document is the JSON object
//
//	{"name":…, "title":…, "description":…, "inputSchema":…, "outputSchema":…, "annotations":…}
//
// where title and description are omitted when empty, outputSchema and
// annotations are omitted when absent or JSON null, and inputSchema is
// required. The SHA-256 input is HashDomain followed by the canonical bytes;
// the pin is "v1:sha256:" and 64 lowercase hex digits. _meta, icons and any
// other tool fields are deliberately outside the pin: they do not describe
// what the tool does or accepts.
package mcpdecl

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ringfence/ringfence/mcpgate/mcpdecl/jcs"
)

// Declaration is one tool as listed by its server. The raw fields hold the
// JSON the server sent; nil OutputSchema or Annotations means absent, and an
// empty Title or Description means absent.
type Declaration struct {
	Name         string
	Title        string
	Description  string
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage
	Annotations  json.RawMessage
}

const (
	// HashDomain prefixes the canonical bytes inside the SHA-256 input, so a
	// declaration hash can never equal the hash of some other Ringfence
	// object that happens to share the canonical JSON.
	HashDomain = "ringfence.tool-declaration.v1\x00"
	// HashPrefix starts every pin of this version.
	HashPrefix = "v1:sha256:"
	// MaxDeclarationBytes bounds the summed size of a declaration's fields
	// that Hash accepts. It is far above what the declaration screen lets
	// through, so every declaration that passes the screen can be pinned,
	// while a hostile live listing cannot make the drift check do unbounded
	// work.
	MaxDeclarationBytes = 4 << 20
)

var (
	// ErrInvalidDeclaration: the declaration cannot be hashed (missing
	// input schema, a field that is not canonical JSON, invalid UTF-8, too
	// large). Drift checks treat it as drift: they fail closed.
	ErrInvalidDeclaration = errors.New("mcpdecl: invalid declaration")
	// ErrInvalidHash: a pin string is not of the form HashPrefix+64 hex.
	ErrInvalidHash = errors.New("mcpdecl: malformed declaration hash")
	// ErrDrift: the declaration does not hash to the pin.
	ErrDrift = errors.New("mcpdecl: declaration does not match its pin")
)

// FromTool converts a tool as the go-sdk holds it. On a client the SDK has
// already decoded the server's JSON, which loses two things that FromJSON
// keeps: invalid UTF-8 has been replaced by U+FFFD, and annotations pass
// through mcp.ToolAnnotations, so unknown annotation keys are dropped and an
// absent readOnlyHint or idempotentHint reads as false. Annotations are
// re-encoded here with a fixed rule (both booleans always present, pointer
// hints only when set) so that the SDK's MCPGODEBUG=hintomitempty switch
// cannot move a pin. Pins taken with FromTool must be checked with FromTool.
func FromTool(t *mcp.Tool) (Declaration, error) {
	if t == nil {
		return Declaration{}, fmt.Errorf("%w: nil tool", ErrInvalidDeclaration)
	}
	d := Declaration{Name: t.Name, Title: t.Title, Description: t.Description}
	var err error
	if d.InputSchema, err = marshalField(t.InputSchema); err != nil {
		return Declaration{}, fmt.Errorf("%w: input schema: %v", ErrInvalidDeclaration, err)
	}
	if d.OutputSchema, err = marshalField(t.OutputSchema); err != nil {
		return Declaration{}, fmt.Errorf("%w: output schema: %v", ErrInvalidDeclaration, err)
	}
	if a := t.Annotations; a != nil {
		fixed := struct {
			DestructiveHint *bool  `json:"destructiveHint,omitempty"`
			IdempotentHint  bool   `json:"idempotentHint"`
			OpenWorldHint   *bool  `json:"openWorldHint,omitempty"`
			ReadOnlyHint    bool   `json:"readOnlyHint"`
			Title           string `json:"title,omitempty"`
		}{a.DestructiveHint, a.IdempotentHint, a.OpenWorldHint, a.ReadOnlyHint, a.Title}
		if d.Annotations, err = json.Marshal(fixed); err != nil {
			return Declaration{}, fmt.Errorf("%w: annotations: %v", ErrInvalidDeclaration, err)
		}
	}
	return d, nil
}

func marshalField(v any) (json.RawMessage, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if v == nil {
			return nil, nil
		}
		return bytes.Clone(v), nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		// The marshal error names Go types only, never values.
		return nil, err
	}
	if string(b) == "null" {
		return nil, nil
	}
	return b, nil
}

// FromJSON reads one tool object as it appears in a tools/list result,
// keeping the schemas and annotations byte for byte. It refuses input that
// parsers could read differently (duplicate keys, invalid UTF-8), because
// the screen and the model must see the very declaration that is pinned.
// Fields other than the six hashed ones are ignored.
func FromJSON(raw []byte) (Declaration, error) {
	if len(raw) > MaxDeclarationBytes {
		return Declaration{}, fmt.Errorf("%w: larger than %d bytes", ErrInvalidDeclaration, MaxDeclarationBytes)
	}
	c, err := jcs.Canonicalize(raw)
	if err != nil {
		return Declaration{}, fmt.Errorf("%w: %w", ErrInvalidDeclaration, err)
	}
	if c[0] != '{' {
		return Declaration{}, fmt.Errorf("%w: tool is not a JSON object", ErrInvalidDeclaration)
	}
	var wire struct {
		Name         *string         `json:"name"`
		Title        *string         `json:"title"`
		Description  *string         `json:"description"`
		InputSchema  json.RawMessage `json:"inputSchema"`
		OutputSchema json.RawMessage `json:"outputSchema"`
		Annotations  json.RawMessage `json:"annotations"`
	}
	if err := json.Unmarshal(raw, &wire); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Declaration{}, fmt.Errorf("%w: field %q has the wrong JSON type", ErrInvalidDeclaration, te.Field)
		}
		return Declaration{}, fmt.Errorf("%w: tool is not valid JSON", ErrInvalidDeclaration)
	}
	if wire.Name == nil {
		return Declaration{}, fmt.Errorf("%w: tool has no name", ErrInvalidDeclaration)
	}
	d := Declaration{
		Name:         *wire.Name,
		InputSchema:  nullToNil(wire.InputSchema),
		OutputSchema: nullToNil(wire.OutputSchema),
		Annotations:  nullToNil(wire.Annotations),
	}
	if wire.Title != nil {
		d.Title = *wire.Title
	}
	if wire.Description != nil {
		d.Description = *wire.Description
	}
	return d, nil
}

func nullToNil(r json.RawMessage) json.RawMessage {
	if r == nil || string(bytes.TrimSpace(r)) == "null" {
		return nil
	}
	return r
}

// Canonical returns the RFC 8785 bytes that Hash digests (without
// HashDomain). It exists for diagnostics and for tests that pin the format.
func Canonical(d Declaration) ([]byte, error) {
	size := len(d.Name) + len(d.Title) + len(d.Description) +
		len(d.InputSchema) + len(d.OutputSchema) + len(d.Annotations)
	if size > MaxDeclarationBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrInvalidDeclaration, MaxDeclarationBytes)
	}
	input, err := canonicalRaw(d.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("%w: input schema: %w", ErrInvalidDeclaration, err)
	}
	if input == nil {
		return nil, fmt.Errorf("%w: input schema is missing", ErrInvalidDeclaration)
	}
	output, err := canonicalRaw(d.OutputSchema)
	if err != nil {
		return nil, fmt.Errorf("%w: output schema: %w", ErrInvalidDeclaration, err)
	}
	annotations, err := canonicalRaw(d.Annotations)
	if err != nil {
		return nil, fmt.Errorf("%w: annotations: %w", ErrInvalidDeclaration, err)
	}

	// Members in RFC 8785 order; all keys are ASCII, so byte order is
	// UTF-16 order. Each raw member is canonicalized on its own first, so a
	// field holding `{}, "name": …` cannot smuggle extra members in.
	out := make([]byte, 0, size+96)
	out = append(out, '{')
	sep := func() {
		if len(out) > 1 {
			out = append(out, ',')
		}
	}
	if annotations != nil {
		sep()
		out = append(out, `"annotations":`...)
		out = append(out, annotations...)
	}
	if d.Description != "" {
		sep()
		out = append(out, `"description":`...)
		if out, err = jcs.AppendString(out, d.Description); err != nil {
			return nil, fmt.Errorf("%w: description: %w", ErrInvalidDeclaration, err)
		}
	}
	sep()
	out = append(out, `"inputSchema":`...)
	out = append(out, input...)
	out = append(out, `,"name":`...)
	if out, err = jcs.AppendString(out, d.Name); err != nil {
		return nil, fmt.Errorf("%w: name: %w", ErrInvalidDeclaration, err)
	}
	if output != nil {
		out = append(out, `,"outputSchema":`...)
		out = append(out, output...)
	}
	if d.Title != "" {
		out = append(out, `,"title":`...)
		if out, err = jcs.AppendString(out, d.Title); err != nil {
			return nil, fmt.Errorf("%w: title: %w", ErrInvalidDeclaration, err)
		}
	}
	return append(out, '}'), nil
}

// canonicalRaw returns nil for an absent field (no bytes, or JSON null).
func canonicalRaw(raw json.RawMessage) ([]byte, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	c, err := jcs.Canonicalize(raw)
	if err != nil {
		return nil, err
	}
	if string(c) == "null" {
		return nil, nil
	}
	return c, nil
}

// Hash returns the pin of d: "v1:sha256:" and the lowercase hex SHA-256 of
// HashDomain followed by Canonical(d).
func Hash(d Declaration) (string, error) {
	c, err := Canonical(d)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write([]byte(HashDomain))
	h.Write(c)
	return HashPrefix + hex.EncodeToString(h.Sum(nil)), nil
}

// ParseHash checks that s is a pin of this version and returns its digest.
// Only the lowercase spelling is accepted, so equal pins are equal strings.
func ParseHash(s string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	hexPart, ok := strings.CutPrefix(s, HashPrefix)
	if !ok || len(hexPart) != 2*sha256.Size {
		return sum, ErrInvalidHash
	}
	for i := 0; i < len(hexPart); i++ {
		if c := hexPart[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return sum, ErrInvalidHash
		}
	}
	if _, err := hex.Decode(sum[:], []byte(hexPart)); err != nil {
		return sum, ErrInvalidHash
	}
	return sum, nil
}

// Verify reports whether d still hashes to pin. It fails closed: a
// malformed pin yields ErrInvalidHash, a declaration that cannot be hashed
// yields ErrInvalidDeclaration, and a mismatch yields ErrDrift.
func Verify(d Declaration, pin string) error {
	if _, err := ParseHash(pin); err != nil {
		return err
	}
	got, err := Hash(d)
	if err != nil {
		return err
	}
	if got != pin {
		return ErrDrift
	}
	return nil
}
