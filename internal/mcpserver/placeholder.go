package mcpserver

import (
	"regexp"
	"strings"
)

// Placeholder says what v looks like when it is a placeholder rather than a value someone
// meant ("" when it is not): what documentation writes where a credential belongs ("...",
// "<token>", "changeme", "xxx"), a shell variable that was never expanded ("$TOKEN",
// "${TOKEN}"), or an authorization scheme with nothing after it ("Bearer ", which
// printf 'Bearer $TOKEN' sends when TOKEN is unset). It is checked on secrets and env values,
// which would otherwise be stored and fail only when a server rejects them; the description
// never quotes v.
func Placeholder(v string) string {
	s := strings.TrimSpace(v)
	if scheme, rest, ok := authScheme(s); ok {
		if rest == "" {
			return "is the authorization scheme " + scheme + " with no credential after it (was the shell variable meant to follow it unset?)"
		}
		if what := placeholderText(rest); what != "" {
			return "is the authorization scheme " + scheme + " followed by a placeholder: the credential " + what
		}
		return ""
	}
	return placeholderText(s)
}

// authSchemes are the HTTP authorization schemes a header secret starts with.
var authSchemes = []string{"Bearer", "Basic", "Token", "ApiKey", "Bot"}

// authScheme splits "Bearer xyz" into its scheme and the rest.
func authScheme(s string) (scheme, rest string, ok bool) {
	for _, sc := range authSchemes {
		if len(s) >= len(sc) && strings.EqualFold(s[:len(sc)], sc) && (len(s) == len(sc) || s[len(sc)] == ' ') {
			return sc, strings.TrimSpace(s[len(sc):]), true
		}
	}
	return "", "", false
}

var (
	// template matches <token>, {{token}}, ${TOKEN}, $TOKEN and %TOKEN%.
	template = regexp.MustCompile(`^(?:<[^<>]+>|\{\{[^{}]*\}\}|\$\{[A-Za-z_][A-Za-z0-9_]*\}|\$[A-Za-z_][A-Za-z0-9_]*|%[A-Za-z_][A-Za-z0-9_]*%)$`)
	// placeholderWords are what documentation writes instead of a value, compared without
	// case, spaces, "-" and "_".
	placeholderWords = regexp.MustCompile(`^(?:changeme|replaceme|placeholder|todo|tbd|fixme|redacted|(?:insert)?your(?:own)?(?:api)?(?:token|key|secret|password|credential)(?:here)?)$`)
)

func placeholderText(s string) string {
	switch {
	case s == "":
		return "is blank"
	case strings.Trim(s, ".…") == "":
		return "is an ellipsis"
	case len(s) >= 3 && strings.Trim(s, "xX-_ ") == "" && strings.ContainsAny(s, "xX"):
		return "is a run of x"
	case len(s) >= 3 && strings.Trim(s, "*") == "":
		return "is a mask (asterisks)"
	case template.MatchString(s):
		return "is a template or an unexpanded shell variable"
	case placeholderWords.MatchString(strings.ToLower(strings.NewReplacer("-", "", "_", "", " ", "").Replace(s))):
		return "is a placeholder word"
	}
	return ""
}
