package screen

import (
	"regexp"
	"slices"
	"strings"
)

// phraseRule finds a phrase in lowercased, NFKC-folded text whose
// whitespace runs are collapsed. Go's RE2 engine is linear but slow on
// unanchored patterns that do not start with a literal, so each rule is
// compiled once per lead (a literal word, phrase or symbol) into a pattern
// that starts with it, and a match must start at a word boundary. A text
// only runs the patterns whose lead's first word it contains (an index
// lookup per word of the text), and a rule's need groups must each have a
// member in the text: words (letters and apostrophes) are looked up in the
// text's word set, anything else is a substring. Ordinary text therefore
// almost never runs a pattern at all.
type phraseRule struct {
	code  string
	what  string
	leads []string
	res   []*regexp.Regexp
	need  [][]string
}

// rule builds one regexp per comma-separated lead: the lead as a
// literal, then rest.
func rule(code, what, leads, rest string, need ...[]string) phraseRule {
	r := phraseRule{code: code, what: what, need: need}
	for _, lead := range strings.Split(leads, ",") {
		r.leads = append(r.leads, lead)
		r.res = append(r.res, regexp.MustCompile(regexp.QuoteMeta(lead)+rest))
	}
	return r
}

// leadRef names one lead of one rule; the order of leadRefs is the order
// in which rules are tried.
type leadRef struct{ rule, lead int }

var (
	// leadsByWord indexes the leads that start with a letter by their
	// first word.
	leadsByWord = map[string][]leadRef{}
	// symbolLeads start with a symbol ("<", "[", "__", …).
	symbolLeads []leadRef
)

func init() {
	for i, r := range phraseRules {
		for j, lead := range r.leads {
			ref := leadRef{i, j}
			if c := lead[0]; c < 'a' || c > 'z' {
				symbolLeads = append(symbolLeads, ref)
				continue
			}
			first := ""
			wordSet(nil).each(lead, func(w string) {
				if first == "" {
					first = w
				}
			})
			leadsByWord[first] = append(leadsByWord[first], ref)
		}
	}
}

// phrases reports the first match of each code's rules in lower.
func (s *session) phrases(lower string, add func(code, msg string)) {
	cands := s.cands[:0]
	wordSet(nil).each(lower, func(w string) { cands = append(cands, leadsByWord[w]...) })
	if strings.ContainsAny(lower, "<[_") {
		cands = append(cands, symbolLeads...)
	}
	s.cands = cands
	if len(cands) == 0 {
		return
	}
	slices.SortFunc(cands, func(a, b leadRef) int {
		if a.rule != b.rule {
			return a.rule - b.rule
		}
		return a.lead - b.lead
	})
	cands = slices.Compact(cands)
	s.ws.fill(lower)
	matched, needed := "", -1
	for _, c := range cands {
		p := &phraseRules[c.rule]
		lead := p.leads[c.lead]
		if p.code == matched || !strings.Contains(lower, lead) {
			continue
		}
		if needed != c.rule {
			if !p.needs(lower, s.ws) {
				continue
			}
			needed = c.rule
		}
		if m := findAtWordStart(p.res[c.lead], lower, lead); m != "" {
			add(p.code, p.what+" "+excerpt(m))
			matched = p.code
		}
	}
}

func (p *phraseRule) needs(lower string, ws wordSet) bool {
	for _, group := range p.need {
		found := false
		for _, n := range group {
			if isWord(n) {
				_, found = ws[n]
			} else {
				found = strings.Contains(lower, n)
			}
			if found {
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// findAtWordStart returns the first match of re that does not start inside
// a word ("because this tool" is not "use this tool"). Leads that start
// with a symbol need no boundary.
func findAtWordStart(re *regexp.Regexp, s, lead string) string {
	boundary := lead[0] >= 'a' && lead[0] <= 'z'
	for pos := 0; pos < len(s); {
		loc := re.FindStringIndex(s[pos:])
		if loc == nil {
			return ""
		}
		start := pos + loc[0]
		if !boundary || start == 0 || !isWordByte(s[start-1]) {
			return s[start : pos+loc[1]]
		}
		pos = start + 1
	}
	return ""
}

func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c >= 0x80
}

// wordSet holds the distinct words of a text; the session reuses one.
type wordSet map[string]struct{}

func (ws wordSet) fill(lower string) {
	clear(ws)
	ws.each(lower, func(w string) { ws[w] = struct{}{} })
}

// each calls f for every run of ASCII letters and apostrophes in lower.
func (wordSet) each(lower string, f func(string)) {
	start := -1
	for i := 0; i <= len(lower); i++ {
		if i < len(lower) && (lower[i] >= 'a' && lower[i] <= 'z' || lower[i] == '\'') {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			f(lower[start:i])
			start = -1
		}
	}
}

func isWord(s string) bool {
	for i := 0; i < len(s); i++ {
		if !(s[i] >= 'a' && s[i] <= 'z' || s[i] == '\'') {
			return false
		}
	}
	return s != ""
}

// collapseSpace turns every whitespace run into one space, or one newline
// when the run holds one, so multi-word leads match and no run of padding
// can stretch a phrase.
func collapseSpace(s string) string {
	needed := false
	for i := 0; i < len(s); i++ {
		if isSpace(s[i]) && (s[i] != ' ' || i+1 < len(s) && isSpace(s[i+1])) {
			needed = true
			break
		}
	}
	if !needed {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		if !isSpace(s[i]) {
			b.WriteByte(s[i])
			i++
			continue
		}
		sep := byte(' ')
		for ; i < len(s) && isSpace(s[i]); i++ {
			if s[i] == '\n' {
				sep = '\n'
			}
		}
		b.WriteByte(sep)
	}
	return b.String()
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func words(s string) []string { return strings.Fields(s) }

const (
	negLeads = "do not,don't,never,must not,should not,shouldn't,mustn't"
)

var toolWords = words("tool tools")

// phraseRules are grouped by code, in the order their codes are reported;
// once a rule of a code matches, the code's other rules are skipped.
var phraseRules = []phraseRule{
	rule(CodeInstructionTag, "instruction markup", "<",
		`\s*/?\s*(?:important|system|instructions?|hidden|secret|admin|critical|prompt|assistant|directive|override)\b[^<>]{0,64}>`,
		words("important system instruction instructions hidden secret admin critical prompt assistant directive override")),
	rule(CodeInstructionTag, "instruction markup", "[", `\s*(?:hidden|system|instructions?|secret)\b`,
		words("hidden system instruction instructions secret")),
	rule(CodeInstructionTag, "instruction markup", "<!--", ``),
	rule(CodeInstructionTag, "chat template token", "<|", `[a-z0-9_.: \x{2581}-]{1,48}\|>`),
	rule(CodeInstructionTag, "chat template token", "[inst],[/inst],<<sys>>,<</sys>>,<start_of_turn>,<end_of_turn>", ``),
	rule(CodeInstructionTag, "role marker", "__", `(?:system|assistant|user|developer|tool|human)__`),

	rule(CodeOverridePhrase, "override phrase", "ignore,disregard,forget,override,bypass",
		`\s+(?:(?:(?:all|any|the|your|of|my|these|those)\s+)*(?:previous|prior|above|earlier|preceding|former|original|system|safety|existing|other|initial)\s+(?:instructions?|prompts?|rules|guidelines|directives|directions|constraints|messages|context|commands)|(?:all\s+|any\s+)?(?:instructions|everything\s+(?:above|before|else)))\b`),
	rule(CodeOverridePhrase, "override phrase", "system", `\s+prompt\b`, []string{"prompt"}),
	rule(CodeOverridePhrase, "override phrase", "developer,dan", `\s+mode\b`, []string{"mode"}),
	rule(CodeOverridePhrase, "override phrase", "jailbreak,jailbreaks,jailbroken,jailbreaking", `\b`),
	rule(CodeOverridePhrase, "override phrase", "you", `\s+are\s+now\s+(?:a|an|in|the|my)\b`, []string{"now"}),
	rule(CodeOverridePhrase, "override phrase", "from", `\s+now\s+on\s*,?\s+you\b`, []string{"now"}),
	rule(CodeOverridePhrase, "override phrase", "new", `\s+instructions?\s*:`, words("instruction instructions")),

	rule(CodeConcealment, "concealment phrase", negLeads, `\s+(?:tell|inform|notify|mention|reveal|disclose)\b`,
		words("tell inform notify mention reveal disclose")),
	rule(CodeConcealment, "concealment phrase", negLeads, `\s+(?:show|alert|let)\b[^.!?\n]{0,40}\b(?:user|human|anyone|operator)\b`,
		words("show alert let")),
	rule(CodeConcealment, "concealment phrase", "without",
		`\s+(?:telling|informing|notifying|alerting|asking|letting|showing)\s+(?:the\s+)?(?:user|human|anyone|operator)`),
	rule(CodeConcealment, "concealment phrase", "secretly,covertly,surreptitiously", `\b`),
	rule(CodeConcealment, "concealment phrase", "hide", `\s+(?:this|it|that|the)\b[^.!?\n]{0,30}\bfrom\s+(?:the\s+)?(?:user|human)`,
		[]string{"from"}),
	rule(CodeConcealment, "concealment phrase", "user,human",
		`\s+(?:(?:should|must|will|may)\s+(?:not|never)\s+(?:know|see|notice|find\s+out|be\s+told)|(?:does|do)\s+not\s+need\s+to\s+know)`,
		words("not never")),
	rule(CodeConcealment, "concealment phrase", "silently",
		`\s+(?:send|upload|include|add|pass|copy|forward|transmit|post|call|read|exfiltrate|share|email|attach|collect|run|execute|invoke|append|embed|leak|store|save|log|record)`),
	rule(CodeConcealment, "concealment phrase", "not,never", `\s+(?:be\s+)?(?:visible|shown|displayed)\s+to\s+the\s+user`,
		words("visible shown displayed"), []string{"user"}),

	rule(CodeCoercion, "coercion phrase", "always", `\s+(?:call|use|invoke|run)\s+(?:this|the\s+\S+)\s+tool\s+(?:first|before)`,
		[]string{"tool"}),
	rule(CodeCoercion, "coercion phrase", "before,prior to", `\s+(?:using|calling|invoking|running)\s+(?:any|all|every)\s+(?:other\s+)?tools?\b`,
		toolWords),
	rule(CodeCoercion, "coercion phrase", "call,use,invoke,run", `\s+this\s+tool\s+(?:first|before\s+(?:any|all|every)|instead)`,
		[]string{"this"}, []string{"tool"}),
	rule(CodeCoercion, "coercion phrase", "this tool", `\s+(?:must|should)\s+(?:always\s+)?be\s+(?:called|used|invoked)\s+(?:first|before)`),
	rule(CodeCoercion, "coercion phrase", "must,should", `\s+(?:always\s+)?(?:be\s+)?(?:called|used|invoked|run)\s+(?:first|before\s+(?:any|all|every))`,
		words("first before")),
	rule(CodeCoercion, "coercion phrase", "do not,don't,never", `\s+(?:use|call|invoke)\s+(?:any\s+)?(?:other|the\s+other)\s+tools?\b`,
		[]string{"other"}, toolWords),
	rule(CodeCoercion, "coercion phrase", "instead of", `\s+(?:using|calling)\s+(?:the\s+)?\S+\s+tool\b`, []string{"tool"}),

	rule(CodeShellExecution, "shell execution", "run,runs,running,execute,executes,executing,exec",
		`\s+(?:arbitrary\s+|any\s+|a\s+|the\s+)?(?:shell|bash|system|terminal|os|console)\s+commands?\b`,
		words("command commands")),
	rule(CodeShellExecution, "shell execution", "sh -c,bash -c,zsh -c,ksh -c,dash -c,fish -c,csh -c", `\b`),
	rule(CodeShellExecution, "shell execution", "powershell", `(?:\.exe)?\s+-(?:c|command|enc|encodedcommand)\b`),
	rule(CodeShellExecution, "shell execution", "cmd", `(?:\.exe)?\s+/c\b`),
	rule(CodeShellExecution, "shell execution", "curl,wget", `\b[^|\n]{0,200}\|\s*(?:sudo\s+)?(?:ba|z)?sh\b`),
	rule(CodeShellExecution, "shell execution", "download,downloads,downloaded,downloading",
		`\b[^.!?\n]{0,40}\b(?:and\s+then|and|then)\s+(?:run|execute|install|exec)(?:s|es)?\b`),
	rule(CodeShellExecution, "shell execution", "os.system,subprocess,child_process,popen,runtime.exec,shell_exec,proc_open", `\b`),
	rule(CodeShellExecution, "shell execution", "eval,exec", `\s*\(`),
	rule(CodeShellExecution, "shell execution", "execute,executes", `\s+(?:arbitrary\s+)?(?:code|commands?|scripts?)\b`),
	rule(CodeShellExecution, "shell execution", "arbitrary", `\s+(?:code|command)\s+execution\b`),
	rule(CodeShellExecution, "shell execution", "rm -rf", `\b`),
	rule(CodeShellExecution, "shell execution", "chmod", `\s+\+x\b`),
}
