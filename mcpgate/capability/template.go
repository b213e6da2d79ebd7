package capability

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Argument-scoped requirements ("templates") name a tool's arguments in {braces}, e.g.
// "fs.read:{path}": a call needs the requirement with each placeholder replaced by the
// argument's value. They are how a registration (or a ToolSpec's permissions) ties a
// permission to what a call asks for, rather than to the tool as a whole.

// placeholder is one {argument} of a template.
var placeholder = regexp.MustCompile(`\{([A-Za-z0-9_.]{1,64})\}`)

// ErrMalformedPlaceholder: a template has a brace that is not part of an {argument}.
var ErrMalformedPlaceholder = errors.New("capability: malformed {argument} placeholder")

// CheckTemplate checks a requirement that may hold placeholders: with a stand-in for every
// placeholder it must parse as a capability, and no brace may be left outside one
// (ErrMalformedPlaceholder).
func CheckTemplate(requirement string) error {
	if _, err := Parse(placeholder.ReplaceAllString(requirement, "x")); err != nil {
		return err
	}
	if strings.ContainsAny(placeholder.ReplaceAllString(requirement, ""), "{}") {
		return ErrMalformedPlaceholder
	}
	return nil
}

// Placeholders returns the argument names a requirement like "fs.read:{path}" refers to.
func Placeholders(requirement string) []string {
	var out []string
	for _, m := range placeholder.FindAllStringSubmatch(requirement, -1) {
		out = append(out, m[1])
	}
	return out
}

// Expand substitutes argument values into a requirement's placeholders. A value that is not
// a canonical path is refused rather than matched: globs compare text, while the server
// resolves "." and ".." segments, so "/srv/docs/../../etc/shadow" would match "/srv/docs/**"
// and read outside it.
func Expand(requirement string, value func(arg string) (string, bool)) (string, error) {
	var missing string
	var bad error
	out := placeholder.ReplaceAllStringFunc(requirement, func(m string) string {
		name := m[1 : len(m)-1]
		v, ok := value(name)
		if !ok && missing == "" {
			missing = name
		}
		if err := checkScopeValue(v); ok && err != nil && bad == nil {
			bad = fmt.Errorf("argument %q, which scopes %q, %v", name, requirement, err)
		}
		return v
	})
	if missing != "" {
		return "", fmt.Errorf("argument %q, which scopes %q, is missing or not a string", missing, requirement)
	}
	if bad != nil {
		return "", bad
	}
	return out, nil
}

// checkScopeValue refuses argument values a server could resolve to somewhere other than
// what they say: "." or ".." segments (either separator, also percent-encoded), and control
// characters (NUL truncates paths in C libraries).
func checkScopeValue(v string) error {
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("contains a control character (%U): scoped arguments must be plain canonical paths", r)
		}
	}
	forms := []string{v}
	if dec, err := url.PathUnescape(v); err == nil && dec != v {
		forms = append(forms, dec)
	}
	for _, form := range forms {
		for _, seg := range strings.FieldsFunc(form, func(r rune) bool { return r == '/' || r == '\\' }) {
			if seg == "." || seg == ".." {
				return fmt.Errorf("has a %q segment: scoped arguments must be canonical paths, since the server would resolve it outside the claim that matched the text", seg)
			}
		}
	}
	return nil
}
