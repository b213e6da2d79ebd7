package screen

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/ringfence/ringfence/mcpgate/internal/runeclass"
)

// hit is a flag found in one string, before it gets a location.
type hit struct{ code, msg string }

type scanKind uint8

const (
	scanText scanKind = iota // titles, descriptions, schema keys and strings
	scanName                 // a tool name read as words: no cross_reference
)

// maxCached bounds the strings whose scan results are memoized; schemas
// repeat short strings ("type", "string", "description") endlessly.
const maxCached = 256

// session holds what one Screen call shares across its tools.
type session struct {
	others *nameIndex // for cross_reference: other names minus the listing's own
	all    *nameIndex // for name_collision: every other name
	cache  map[string][]hit
	words  map[string]string // cross_reference verdict per word
	ws     wordSet           // scratch for phrases
	cands  []leadRef         // scratch for phrases
}

func newSession(ctx Context, own map[string]bool) *session {
	return &session{
		others: newNameIndex(ctx.OtherNames, own),
		all:    newNameIndex(ctx.OtherNames, nil),
		cache:  map[string][]hit{},
		words:  map[string]string{},
		ws:     wordSet{},
	}
}

// scan runs every text heuristic on s, which must be valid UTF-8.
func (s *session) scan(text string, kind scanKind) []hit {
	cacheable := kind == scanText && len(text) <= maxCached
	if cacheable {
		if h, ok := s.cache[text]; ok {
			return h
		}
	}
	hits := s.scanUncached(text, kind)
	if cacheable {
		s.cache[text] = hits
	}
	return hits
}

func (s *session) scanUncached(text string, kind scanKind) []hit {
	var hits []hit
	var (
		hidden, bidi, tags int
		samples            []rune
		tagText            []byte
		visible, spaced    strings.Builder
	)
	clean := true
	for i, r := range text {
		k := runeclass.Of(r)
		switch {
		case k == runeclass.Visible, r == '\n', r == '\t', r == '\r', k == runeclass.LineBreak:
			// U+2028 and U+2029 show as line breaks: neither hidden nor
			// a control.
			if !clean {
				visible.WriteRune(r)
				spaced.WriteRune(r)
			}
			continue
		}
		if clean {
			clean = false
			visible.Grow(len(text))
			visible.WriteString(text[:i])
			spaced.Grow(len(text))
			spaced.WriteString(text[:i])
		}
		// A hidden code point may join two words ("ignore<ZWSP>previous")
		// or split one ("ig<ZWSP>nore"); the text is scanned both ways.
		spaced.WriteByte(' ')
		switch k {
		case runeclass.Tag:
			tags++
			if c := runeclass.TagASCII(r); c != 0 {
				tagText = append(tagText, c)
			}
		case runeclass.Bidi:
			bidi++
		default: // Control, Invisible
			hidden++
			if len(samples) < 4 && !containsRune(samples, r) {
				samples = append(samples, r)
			}
		}
	}
	if hidden > 0 {
		hits = append(hits, hit{CodeHiddenUnicode, fmt.Sprintf("%d invisible or control code points (%s)", hidden, codePoints(samples))})
	}
	if bidi > 0 {
		hits = append(hits, hit{CodeBidiOverride, fmt.Sprintf("%d bidirectional control code points", bidi)})
	}
	if tags > 0 {
		hits = append(hits, hit{CodeTagCharacters, fmt.Sprintf("%d Unicode Tag characters spelling hidden text %s", tags, excerpt(string(tagText)))})
	}
	if clean {
		hits = s.detect(hits, norm.NFKC.String(text), kind, "")
	} else {
		hits = s.detect(hits, norm.NFKC.String(visible.String()), kind, "")
		hits = s.detect(hits, norm.NFKC.String(spaced.String()), kind, "")
	}
	if len(tagText) > 0 {
		hits = s.detect(hits, string(tagText), kind, " (in text hidden by Unicode Tag characters)")
	}
	return hits
}

func containsRune(rs []rune, r rune) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

func codePoints(rs []rune) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("U+%04X", r)
	}
	return strings.Join(parts, ", ")
}

// detect runs the phrase, pattern and word heuristics on folded text.
func (s *session) detect(hits []hit, text string, kind scanKind, suffix string) []hit {
	add := func(code, msg string) { hits = append(hits, hit{code, msg + suffix}) }
	lower := strings.ToLower(text)
	if strings.ContainsAny(lower, "\u2019\u02bc") {
		lower = apostrophes.Replace(lower)
	}

	lower = collapseSpace(lower)
	s.phrases(lower, add)
	if m := findURL(lower); m != "" {
		add(CodeURLOrEmail, "URL "+excerpt(withoutCredentials(m)))
	} else if m := findEmail(lower); m != "" {
		add(CodeURLOrEmail, "e-mail address "+excerpt(m))
	}
	if what, ok := embeddedSecret(text); ok {
		add(CodeEmbeddedSecret, "looks like an embedded "+what+" (value not shown)")
	}
	if n := longestBase64Run(text); n >= MinBase64Run {
		add(CodeBase64Run, fmt.Sprintf("a %d-character base64-looking run", n))
	}
	if word, scripts, ok := mixedScript(text); ok {
		add(CodeMixedScript, fmt.Sprintf("word %s mixes %s", excerpt(word), scripts))
	}
	if target, verb, ok := sensitiveTarget(lower); ok {
		add(CodeSensitiveTarget, fmt.Sprintf("%s next to %q", excerpt(target), verb))
	}
	if kind == scanText {
		if word, name, ok := s.crossReference(lower); ok {
			if word == name {
				add(CodeCrossReference, fmt.Sprintf("mentions %s, a name of another server or tool", excerpt(name)))
			} else {
				add(CodeCrossReference, fmt.Sprintf("word %s looks like %s, a name of another server or tool", excerpt(word), excerpt(name)))
			}
		}
	}
	return hits
}

var apostrophes = strings.NewReplacer("\u2019", "'", "\u02bc", "'")

// withoutCredentials drops the user information, query and fragment of a
// URL before it is quoted: they are where tokens live.
func withoutCredentials(u string) string {
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		u = u[:i]
	}
	scheme, rest, _ := strings.Cut(u, "://")
	authority, path, hasPath := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		authority = authority[i+1:]
	}
	if hasPath {
		return scheme + "://" + authority + "/" + path
	}
	return scheme + "://" + authority
}

// secretShapes matches every embedded-secret pattern in any letter case,
// for redaction of text that has been lowercased.
var secretShapes = func() *regexp.Regexp {
	parts := make([]string, len(secretRules))
	for i, r := range secretRules {
		parts[i] = r.re.String()
	}
	return regexp.MustCompile(`(?i)(?:` + strings.Join(parts, "|") + `)`)
}()

var anyURL = regexp.MustCompile(`(?i)[a-z][a-z0-9+.-]*://[^\s"'<>]*`)

// redactSecrets replaces secret-shaped values and the credentials, query
// and fragment of URLs.
func redactSecrets(s string) string {
	if mayHoldSecret(s) {
		s = secretShapes.ReplaceAllString(s, "[redacted]")
	}
	if strings.Contains(s, "://") {
		s = anyURL.ReplaceAllStringFunc(s, withoutCredentials)
	}
	return s
}

// mayHoldSecret is a cheap necessary condition for secretShapes: every
// shape has a run of at least 14 token characters, except the PEM header,
// which says "private key".
func mayHoldSecret(s string) bool {
	run := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			if run++; run >= 14 {
				return true
			}
			continue
		}
		run = 0
	}
	return strings.Contains(strings.ToLower(s), "private key")
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

var urlSchemes = []string{"http", "https", "ftp", "ws", "wss", "file", "gopher", "ldap", "smb"}

// findURL returns the first scheme://… URL in lowercased text. It scans
// from each "://" instead of running an unanchored regexp.
func findURL(lower string) string {
	for off := 0; ; {
		i := strings.Index(lower[off:], "://")
		if i < 0 {
			return ""
		}
		i += off
		off = i + 3
		start := i
		for start > 0 && lower[start-1] >= 'a' && lower[start-1] <= 'z' {
			start--
		}
		if start > 0 && isWordByte(lower[start-1]) {
			continue
		}
		scheme := lower[start:i]
		found := false
		for _, s := range urlSchemes {
			if s == scheme {
				found = true
				break
			}
		}
		end := i + 3
		for end < len(lower) && !strings.ContainsRune(" \t\n\r\f\v<>\"'`])}", rune(lower[end])) {
			end++
		}
		if found && end > i+3 {
			return lower[start:end]
		}
	}
}

// findEmail returns the first address-shaped local@domain.tld.
func findEmail(lower string) string {
	for off := 0; ; {
		i := strings.IndexByte(lower[off:], '@')
		if i < 0 {
			return ""
		}
		i += off
		off = i + 1
		start := i
		for start > 0 && isLocalByte(lower[start-1]) {
			start--
		}
		for start < i && !(lower[start] >= 'a' && lower[start] <= 'z' || lower[start] >= '0' && lower[start] <= '9') {
			start++
		}
		end := i + 1
		lastDot := -1
		for end < len(lower) && (isDomainByte(lower[end]) || lower[end] == '.' && end+1 < len(lower) && isDomainByte(lower[end+1])) {
			if lower[end] == '.' {
				lastDot = end
			}
			end++
		}
		if start == i || lastDot < 0 || lastDot == i+1 {
			continue
		}
		tld := lower[lastDot+1 : end]
		if len(tld) >= 2 && isLetters(tld) {
			return lower[start:end]
		}
	}
}

func isLocalByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("._%+-", c) >= 0
}

func isDomainByte(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' }

func isLetters(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 'a' || s[i] > 'z' {
			return false
		}
	}
	return true
}

type secretRule struct {
	kind     string
	triggers []string
	re       *regexp.Regexp
}

var secretRules = []secretRule{
	{"AWS access key id", words("AKIA ASIA AGPA AIDA AROA ANPA ANVA AIPA"), regexp.MustCompile(`\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b`)},
	{"GitHub token", words("ghp_ gho_ ghu_ ghs_ ghr_"), regexp.MustCompile(`\bgh[pousr]_[A-Za-z0-9]{36,}\b`)},
	{"GitHub fine-grained token", []string{"github_pat_"}, regexp.MustCompile(`\bgithub_pat_[A-Za-z0-9_]{22,}`)},
	{"GitLab token", []string{"glpat-"}, regexp.MustCompile(`\bglpat-[A-Za-z0-9_-]{20,}`)},
	{"sk- secret key", []string{"sk-"}, regexp.MustCompile(`\bsk-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{20,}`)},
	{"Stripe key", []string{"_live_"}, regexp.MustCompile(`\b(?:sk|rk)_live_[0-9A-Za-z]{24,}`)},
	{"Slack token", []string{"xox"}, regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}`)},
	{"npm token", []string{"npm_"}, regexp.MustCompile(`\bnpm_[A-Za-z0-9]{36}\b`)},
	{"Google API key", []string{"AIza"}, regexp.MustCompile(`\bAIza[0-9A-Za-z_-]{35}`)},
	{"JSON Web Token", []string{"eyJ"}, regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}`)},
	{"PEM private key", []string{"PRIVATE KEY"}, regexp.MustCompile(`-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----`)},
}

func embeddedSecret(text string) (string, bool) {
	for _, r := range secretRules {
		if containsAny(text, r.triggers) && r.re.MatchString(text) {
			return r.kind, true
		}
	}
	return "", false
}

// longestBase64Run returns the length of the longest run of base64 (or
// base64url) characters that mixes upper case, lower case and digits;
// identifiers and prose do not.
func longestBase64Run(text string) int {
	best := 0
	run, upper, lower, digit := 0, false, false, false
	end := func() {
		if upper && lower && digit && run > best {
			best = run
		}
		run, upper, lower, digit = 0, false, false, false
	}
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case c >= 'A' && c <= 'Z':
			upper = true
		case c >= 'a' && c <= 'z':
			lower = true
		case c >= '0' && c <= '9':
			digit = true
		case c == '+' || c == '/' || c == '=' || c == '-' || c == '_':
		default:
			end()
			continue
		}
		run++
	}
	end()
	return best
}

// Scripts the mixed-script check tells apart.
var knownScripts = []struct {
	name  string
	table *unicode.RangeTable
}{
	{"Latin", unicode.Latin}, {"Cyrillic", unicode.Cyrillic}, {"Greek", unicode.Greek},
	{"Armenian", unicode.Armenian}, {"Cherokee", unicode.Cherokee}, {"Georgian", unicode.Georgian},
	{"Coptic", unicode.Coptic}, {"Hebrew", unicode.Hebrew}, {"Arabic", unicode.Arabic},
	{"Han", unicode.Han}, {"Hiragana", unicode.Hiragana}, {"Katakana", unicode.Katakana},
	{"Hangul", unicode.Hangul}, {"Bopomofo", unicode.Bopomofo}, {"Thai", unicode.Thai},
	{"Devanagari", unicode.Devanagari},
}

var cjkScripts = map[string]bool{"Han": true, "Hiragana": true, "Katakana": true, "Hangul": true, "Bopomofo": true}

// greekLookalikes are Greek letters that pass for Latin ones.
const greekLookalikes = "ΑΒΕΖΗΙΚΜΝΟΡΤΥΧαγικνορυχϲϳ"

func scriptOf(r rune) string {
	if r < utf8.RuneSelf {
		return "Latin"
	}
	for _, s := range knownScripts {
		if unicode.Is(s.table, r) {
			return s.name
		}
	}
	if unicode.In(r, unicode.Common, unicode.Inherited) {
		return ""
	}
	// Any other script counts as one: a word mixing Latin with, say,
	// Ethiopic is flagged all the same, and the lookup stays bounded.
	return "another script"
}

// mixedScript finds the first word whose letters come from scripts that
// are not normally written together.
func mixedScript(text string) (word, scripts string, found bool) {
	if isASCII(text) {
		return "", "", false
	}
	start := -1
	check := func(end int) bool {
		if start >= 0 {
			if s, ok := wordScripts(text[start:end]); ok {
				word, scripts = text[start:end], s
				return true
			}
			start = -1
		}
		return false
	}
	for i, r := range text {
		if unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) {
			if start < 0 {
				start = i
			}
			continue
		}
		if check(i) {
			return word, scripts, true
		}
	}
	if check(len(text)) {
		return word, scripts, true
	}
	return "", "", false
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func wordScripts(w string) (string, bool) {
	if isASCII(w) {
		return "", false
	}
	var seen []string
	greekLookalike := false
	for _, r := range w {
		if !unicode.IsLetter(r) {
			continue
		}
		s := scriptOf(r)
		if s == "" {
			continue
		}
		if cjkScripts[s] {
			s = "CJK"
		}
		if s == "Greek" && strings.ContainsRune(greekLookalikes, r) {
			greekLookalike = true
		}
		if !containsString(seen, s) {
			seen = append(seen, s)
		}
	}
	if len(seen) < 2 {
		return "", false
	}
	if len(seen) == 2 && containsString(seen, "Latin") {
		if containsString(seen, "CJK") || (containsString(seen, "Greek") && !greekLookalike) {
			return "", false
		}
	}
	return strings.Join(seen, " and "), true
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// excerpt quotes at most 60 characters of s in ASCII, with hidden code
// points removed and anything shaped like a secret replaced, so a finding
// can be shown and logged safely.
func excerpt(s string) string {
	return strconv.QuoteToASCII(visible(s, 60))
}

// visible returns at most max characters of s, with hidden code points
// removed and anything shaped like a secret replaced.
func visible(s string, max int) string {
	if len(s) > 4*max+256 {
		s = strings.ToValidUTF8(s[:4*max+256], "")
	}
	// Hidden code points go first, so one cannot split a secret from the redaction's view.
	s = redactSecrets(strings.Map(func(r rune) rune {
		if runeclass.Hidden(r) {
			return -1
		}
		return r
	}, s))
	var b strings.Builder
	n := 0
	for _, r := range s {
		if n == max {
			b.WriteString("…")
			break
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}

// printable spells s in printable ASCII, other characters as \u escapes and
// the ellipsis visible adds as "...", for text that is mostly a library's
// message but may quote the schema.
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		case r == '…':
			b.WriteString("...")
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	return b.String()
}
