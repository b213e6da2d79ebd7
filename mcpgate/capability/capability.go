// Package capability is the one definition of what a capability is and when a held one covers
// a required one. Publish checks (floor, ceiling, agent floor) and every run-time gate use it.
//
// A capability is "name" or "name:scope". A held "name" covers every scope of that name; a
// held "name:glob" covers "name:s" when s matches the glob, where "*" matches within one path
// segment (never "/") and "**" matches across segments. A held scoped capability never covers
// the bare name.
package capability

import (
	"fmt"
	"sort"
	"strings"
)

// The floor every mcp_tool node must declare: reaching an MCP server spawns a process that
// then calls out to an external service.
const (
	ProcessSpawn    = "process_spawn"
	ExternalAPICall = "external_api_call"
)

// Floor is the capability set every mcp_tool node declares.
var Floor = []string{ProcessSpawn, ExternalAPICall}

// NearFloor reports the floor capability s is probably a typo of (within two edits, and not
// itself): grants are free-form, so "proces_spawn" is a valid capability that covers nothing
// the floor needs.
func NearFloor(s string) (string, bool) {
	for _, f := range Floor {
		if s != f && editDistance(s, f) <= 2 {
			return f, true
		}
	}
	return "", false
}

// editDistance is the Levenshtein distance between a and b, over bytes (capability names are
// ASCII). It is the root module's humanize.EditDistance, kept here so this module needs none
// of Ringfence's own packages.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// MaxLen bounds one capability string.
const MaxLen = 256

// namePattern is the rule a capability's name follows: a lower-case letter, then up to 63
// lower-case letters, digits, '_', '.' or '-'. validName checks it by hand: Parse runs in every
// call's ceiling and floor checks, where a regexp match cost more than the rest of the parse.
const namePattern = `^[a-z][a-z0-9_.-]{0,63}$`

// validName reports whether name matches namePattern.
func validName(name string) bool {
	if len(name) == 0 || len(name) > 64 || name[0] < 'a' || name[0] > 'z' {
		return false
	}
	for i := 1; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// Capability is a parsed capability.
type Capability struct {
	Name  string
	Scope string // empty for a bare name
}

func (c Capability) String() string {
	if c.Scope == "" {
		return c.Name
	}
	return c.Name + ":" + c.Scope
}

// Parse parses "name" or "name:scope".
func Parse(s string) (Capability, error) {
	if len(s) > MaxLen {
		return Capability{}, fmt.Errorf("capability is longer than %d bytes", MaxLen)
	}
	name, scope, hasScope := strings.Cut(s, ":")
	if !validName(name) {
		return Capability{}, fmt.Errorf("capability %q: the name must match %s (e.g. process_spawn or fs.read:/srv/**)", s, namePattern)
	}
	if hasScope {
		if scope == "" {
			return Capability{}, fmt.Errorf("capability %q: the scope after ':' is empty", s)
		}
		for _, r := range scope {
			if r <= ' ' || r == 0x7f {
				return Capability{}, fmt.Errorf("capability %q: the scope holds whitespace or a control character", s)
			}
		}
	}
	return Capability{Name: name, Scope: scope}, nil
}

// Covers reports whether the held capability covers the required one.
func Covers(held, required Capability) bool {
	ok, _ := coversWork(held, required)
	return ok
}

// coversWork is Covers and the work it spent, in Meter's units.
func coversWork(held, required Capability) (bool, int) {
	switch {
	case held.Name != required.Name:
		return false, nameWork
	case held.Scope == "":
		return true, nameWork
	case required.Scope == "":
		return false, nameWork
	}
	ok, work := coverWork(held.Scope, required.Scope, false)
	return ok, scopeWork + work
}

// What a comparison costs in Meter's units before its scopes are read: one decided by the
// names (or a bare scope), and one that goes on to the scopes.
const (
	nameWork  = 2
	scopeWork = 6
)

// Set is a collection of held capabilities.
type Set []Capability

// ParseSet parses every entry, reporting the first invalid one.
func ParseSet(ss []string) (Set, error) {
	out := make(Set, 0, len(ss))
	for _, s := range ss {
		c, err := Parse(s)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// MustParseSet is ParseSet for inputs already validated.
func MustParseSet(ss []string) Set {
	s, err := ParseSet(ss)
	if err != nil {
		panic(err)
	}
	return s
}

// Covers reports whether any held capability covers required.
func (s Set) Covers(required Capability) bool {
	for _, h := range s {
		if Covers(h, required) {
			return true
		}
	}
	return false
}

// Missing returns the entries of required that s does not cover, sorted and deduplicated.
func (s Set) Missing(required Set) []string {
	seen := make(map[string]bool)
	var out []string
	for _, r := range required {
		if !s.Covers(r) && !seen[r.String()] {
			seen[r.String()] = true
			out = append(out, r.String())
		}
	}
	sort.Strings(out)
	return out
}

// Strings returns the capabilities as strings.
func (s Set) Strings() []string {
	out := make([]string, len(s))
	for i, c := range s {
		out[i] = c.String()
	}
	return out
}

// Effective is what a holder may exercise after policies: the capabilities it is bound to,
// minus what revoke entries take away. Agents at publish and every run-time agent gate use it.
type Effective struct {
	Held    Set
	Revoked Set
}

// TakesAway reports whether a revoke entry removes required from a holder: when any scope
// required may name is withdrawn, since a requirement of all of fs.read:/srv/** cannot be met
// once fs.read:/srv/secret/* is, nor fs.read:/srv/*/a once fs.read:/srv/x/* is.
func TakesAway(revoked, required Capability) bool {
	ok, _ := takesAwayWork(revoked, required)
	return ok
}

// takesAwayWork is TakesAway and the work it spent, in Meter's units.
func takesAwayWork(revoked, required Capability) (bool, int) {
	switch {
	case revoked.Name != required.Name:
		return false, nameWork
	case revoked.Scope == "" || required.Scope == "":
		return true, nameWork
	}
	ok, work := overlapWork(revoked.Scope, required.Scope)
	return ok, scopeWork + work
}

// Covers reports whether the holder may exercise required: a held entry covers it and no
// revoke entry takes it away.
func (e Effective) Covers(required Capability) bool { return e.CoversMetered(required, nil) }

// CoversMetered is Covers with its comparisons counted by m (nil: not counted). Past m's
// limit it answers false; the caller must check m.Exceeded and refuse.
func (e Effective) CoversMetered(required Capability, m *Meter) bool {
	held := false
	for _, h := range e.Held {
		if m.covers(h, required) {
			held = true
			break
		}
	}
	if !held {
		return false
	}
	for _, r := range e.Revoked {
		if m.takesAway(r, required) {
			return false
		}
	}
	return true
}

// RevokedBy returns the revoke entries that take required away.
func (e Effective) RevokedBy(required Capability) []string {
	var out []string
	for _, r := range e.Revoked {
		if TakesAway(r, required) {
			out = append(out, r.String())
		}
	}
	return out
}

// Missing returns the entries of required the holder may not exercise, sorted and
// deduplicated.
func (e Effective) Missing(required Set) []string {
	var out []string
	for _, r := range required {
		if !e.Covers(r) && !containsString(out, r.String()) {
			out = append(out, r.String())
		}
	}
	sort.Strings(out)
	return out
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// Meter adds up the work of the comparisons made through it, so a caller that makes many for
// one request (a validation, or a call's gates) can bound their total: the count of
// comparisons grows with the product of bindings and revoke entries, which separate bounds on
// each do not keep small. A unit is about one byte read or one 64-bit word of a comparison's
// state updated, weighted so that a unit takes about the same time (a few nanoseconds)
// whatever the comparison: one decided by the names costs 2, and one of two 254-byte globs at
// most about 3,600.
type Meter struct {
	// Limit, when positive, is the most work the meter allows. Once it is spent, comparisons
	// through the meter answer the closed way without comparing (nothing covers, every revoke
	// entry takes away) and Exceeded reports it; the caller must then refuse the request
	// rather than act on the answers.
	Limit int64
	spent int64
}

// Spent returns the work spent so far.
func (m *Meter) Spent() int64 { return m.spent }

// Exceeded reports whether more than Limit has been spent.
func (m *Meter) Exceeded() bool { return m.Limit > 0 && m.spent > m.Limit }

// Charge adds work done apart from the meter's comparisons, e.g. the same comparisons made
// again to explain a refusal.
func (m *Meter) Charge(work int64) { m.spent += work }

// Covers is Covers, counted.
func (m *Meter) Covers(held, required Capability) bool { return m.covers(held, required) }

// TakesAway is TakesAway, counted.
func (m *Meter) TakesAway(revoked, required Capability) bool { return m.takesAway(revoked, required) }

// covers and takesAway count on m unless it is nil.
func (m *Meter) covers(held, required Capability) bool {
	if m == nil {
		ok, _ := coversWork(held, required)
		return ok
	}
	if m.Exceeded() {
		return false
	}
	ok, work := coversWork(held, required)
	m.spent += int64(work)
	return ok
}

func (m *Meter) takesAway(revoked, required Capability) bool {
	if m == nil {
		ok, _ := takesAwayWork(revoked, required)
		return ok
	}
	if m.Exceeded() {
		return true
	}
	ok, work := takesAwayWork(revoked, required)
	m.spent += int64(work)
	return ok
}
