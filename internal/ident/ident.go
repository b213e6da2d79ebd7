// Package ident is the one definition of the identifiers callers choose: server refs, graph
// ids and tenants; node, agent and policy ids; run and call ids; API key and secret names.
// Each kind is a Set of characters and a length, checked where a request enters, and every
// refusal names the field and the set. Identifiers made only of dots are refused in every
// set that allows a dot: wherever an id becomes part of a path (a file, a URL, a container
// label, a log query), "." and ".." would name something else.
package ident

import (
	"fmt"
	"strings"

	"github.com/ringfence/ringfence/internal/fielderr"
)

// Set is the characters and length one kind of identifier may have.
type Set struct {
	max   int
	upper bool   // A-Z too, besides a-z and 0-9
	punct string // punctuation allowed besides letters and digits
}

var (
	// Ref is a server ref, a graph id or a tenant: ^[a-z0-9_-]{1,64}$.
	Ref = Set{max: 64, punct: "_-"}
	// Node is a graph node's id (agents and tools) or a policy id: ^[A-Za-z0-9_.:-]{1,128}$,
	// not dots only.
	Node = Set{max: 128, upper: true, punct: "_.:-"}
	// CallID is a tool call's call_id, chosen by the caller to name a call across retries
	// (an LLM provider's tool-use id, a UUID): ^[A-Za-z0-9_.:-]{1,512}$, not dots only.
	CallID = Set{max: 512, upper: true, punct: "_.:-"}
	// Run is a run id: ^[A-Za-z0-9_.-]{1,128}$, not dots only.
	Run = Set{max: 128, upper: true, punct: "_.-"}
	// KeyName is an API key's name: ^[A-Za-z0-9_.@-]{1,64}$, not dots only.
	KeyName = Set{max: 64, upper: true, punct: "_.@-"}
	// SecretName is a registry secret's name: ^[A-Za-z0-9_.-]{1,128}$, not dots only.
	SecretName = Set{max: 128, upper: true, punct: "_.-"}
	// Document is a document id, as my-documents://<id> names it (the pool's own, or a
	// platform document service's): ^[A-Za-z0-9_.-]{1,128}$, not dots only.
	Document = Set{max: 128, upper: true, punct: "_.-"}
	// Approval is an approval id, as the pool makes them (apr-<24 hex>): ^[a-z0-9-]{1,64}$.
	Approval = Set{max: 64, punct: "-"}
	// AgentToken is an agent token's id, as the pool makes them (tok-<16 hex>):
	// ^[a-z0-9-]{1,64}$.
	AgentToken = Set{max: 64, punct: "-"}
	// User is the subject a run acts for (StartRun's user), as an identity provider names
	// people: ^[A-Za-z0-9_.:@|+-]{1,256}$, not dots only.
	User = Set{max: 256, upper: true, punct: "_.:@|+-"}
)

// Pattern is the set as a regular expression, as docs/api.md lists it.
func (s Set) Pattern() string {
	upper := ""
	if s.upper {
		upper = "A-Z"
	}
	return fmt.Sprintf("^[%sa-z0-9%s]{1,%d}$", upper, s.punct, s.max)
}

// Allowed says the set in words, for messages: "1 to 64 of a-z 0-9 _ -".
func (s Set) Allowed() string {
	var b strings.Builder
	fmt.Fprintf(&b, "1 to %d of ", s.max)
	if s.upper {
		b.WriteString("A-Z ")
	}
	b.WriteString("a-z 0-9")
	for _, c := range s.punct {
		b.WriteString(" ")
		b.WriteRune(c)
	}
	if s.dots() {
		b.WriteString(", not only dots")
	}
	return b.String()
}

func (s Set) dots() bool { return strings.IndexByte(s.punct, '.') >= 0 }

func (s Set) allows(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		return true
	case c >= 'A' && c <= 'Z':
		return s.upper
	}
	return strings.IndexByte(s.punct, c) >= 0
}

// Valid reports whether v is an identifier of the set.
func (s Set) Valid(v string) bool { return s.Problem(v) == "" }

// Problem says what is wrong with v ("" for nothing), quoting it bounded, and names the set.
func (s Set) Problem(v string) string {
	switch {
	case v == "":
		return "is empty: use " + s.Allowed()
	case len(v) > s.max:
		return fmt.Sprintf("%s is longer than %d bytes: use %s", fielderr.Quote(v), s.max, s.Allowed())
	}
	for i := 0; i < len(v); i++ {
		if !s.allows(v[i]) {
			return fmt.Sprintf("%s holds %s, which is not allowed: use %s", fielderr.Quote(v), badChar(v, i), s.Allowed())
		}
	}
	if strings.Trim(v, ".") == "" {
		return fmt.Sprintf("%q is only dots, which a path reads as a directory or its parent: use %s", v, s.Allowed())
	}
	return ""
}

// badChar names the character at byte i of v.
func badChar(v string, i int) string {
	r := []rune(v[i:])[0]
	if r == ' ' {
		return "a space"
	}
	return fmt.Sprintf("%q", r)
}

// Check returns a field error naming field when v is not an identifier of the set.
func (s Set) Check(field, v string) error {
	if p := s.Problem(v); p != "" {
		return &fielderr.Error{Field: field, Problem: p}
	}
	return nil
}
