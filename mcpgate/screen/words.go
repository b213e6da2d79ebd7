package screen

import (
	"strings"
	"unicode"
)

// strongTargets are paths and key material that no tool description has a
// reason to steer a model toward; any action verb nearby is enough.
var strongTargets = []string{
	".ssh", "id_rsa", "id_ed25519", "id_ecdsa", "id_dsa", ".aws/credentials", ".netrc",
	".npmrc", ".pypirc", ".git-credentials", ".kube/config", "kubeconfig", "/etc/shadow",
	"/etc/passwd", "/etc/sudoers", "mcp.json", "claude_desktop_config", ".cursor/", ".gnupg",
	"authorized_keys", ".bash_history", ".zsh_history", "wallet.dat", ".docker/config.json",
	"keychain",
}

// strongPairs and weakPairs are two-word targets.
var strongPairs = map[string][]string{
	"private": {"key", "keys"}, "ssh": {"key", "keys"}, "seed": {"phrase"},
	"recovery": {"phrase"}, "secret": {"key", "keys"},
}

var weakPairs = map[string][]string{
	"api": {"key", "keys", "token", "tokens"}, "access": {"key", "keys", "token", "tokens"},
	"auth": {"token", "tokens"}, "bearer": {"token", "tokens"}, "session": {"cookie", "cookies", "token"},
}

// weakTargets are ordinary words that only matter next to an
// exfiltration verb ("token" in a tokenizer's description is not news).
var weakTargets = map[string]bool{
	"token": true, "tokens": true, "password": true, "passwords": true, "passwd": true,
	"secret": true, "secrets": true, "credential": true, "credentials": true, "cookie": true,
	"cookies": true, "api_key": true, "apikey": true, "api-key": true, "access_token": true,
	"refresh_token": true,
}

// exfilVerbs move data somewhere; accessVerbs merely touch it.
var exfilVerbs, accessVerbs = verbForms(
	"read reads reading cat send sends sending sent upload uploads uploaded uploading "+
		"exfiltrate exfiltrates exfiltrated exfiltrating include includes included including "+
		"pass passes passed passing post posts posted posting forward forwards forwarded forwarding "+
		"transmit transmits transmitted transmitting share shares shared sharing leak leaks leaked leaking "+
		"steal steals stole stolen stealing copy copies copied copying attach attaches attached attaching "+
		"dump dumps dumped dumping extract extracts extracted extracting email emails emailed emailing "+
		"collect collects collected collecting append appends appended appending embed embeds embedded embedding",
	"open opens opened opening load loads loaded loading access accesses accessed accessing "+
		"fetch fetches fetched fetching retrieve retrieves retrieved retrieving")

func verbForms(exfil, access string) (map[string]bool, map[string]bool) {
	e, a := map[string]bool{}, map[string]bool{}
	for _, w := range strings.Fields(exfil) {
		e[w] = true
	}
	for _, w := range strings.Fields(access) {
		a[w] = true
	}
	return e, a
}

// targetAt reports whether words[i] starts a sensitive target.
func targetAt(words []string, i int) (target string, strong bool) {
	w := words[i]
	for _, t := range strongTargets {
		if strings.Contains(w, t) {
			return w, true
		}
	}
	// .env and .aws only as a path element, not process.env or foo.aws.
	for _, t := range []string{".env", ".aws"} {
		if j := strings.Index(w, t); j >= 0 && (j == 0 || w[j-1] == '/' || w[j-1] == '~') {
			end := j + len(t)
			if end == len(w) || w[end] == '/' || w[end] == '.' {
				return w, true
			}
		}
	}
	if i+1 < len(words) {
		for _, next := range strongPairs[w] {
			if words[i+1] == next {
				return w + " " + next, true
			}
		}
		for _, next := range weakPairs[w] {
			if words[i+1] == next {
				return w + " " + next, false
			}
		}
	}
	if weakTargets[w] {
		return w, false
	}
	return "", false
}

// sensitiveTarget looks, sentence by sentence, for a sensitive target
// within four words of a verb that would touch it.
func sensitiveTarget(lower string) (target, verb string, found bool) {
	if !containsAny(lower, targetTriggers) {
		return "", "", false
	}
	for _, sentence := range sentences(lower) {
		words := strings.FieldsFunc(sentence, func(r rune) bool {
			return !(unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("_./~-", r))
		})
		for i := range words {
			// Keep a leading dot: ".env" and ".ssh" are the point.
			words[i] = strings.TrimRight(words[i], ".-")
		}
		for i := range words {
			t, strong := targetAt(words, i)
			if t == "" {
				continue
			}
			lo, hi := max(0, i-5), min(len(words), i+6)
			for j := lo; j < hi; j++ {
				if j == i {
					continue
				}
				if exfilVerbs[words[j]] || strong && accessVerbs[words[j]] {
					return t, words[j], true
				}
			}
		}
	}
	return "", "", false
}

// targetTriggers lets text without any target skip the word split.
var targetTriggers = []string{
	".ssh", "id_", ".aws", ".env", ".netrc", ".npmrc", ".pypirc", "credential", "kube", "/etc/",
	"mcp.json", "claude_desktop", ".cursor", ".gnupg", "authorized_keys", "history", "wallet",
	".docker", "keychain", "key", "phrase", "token", "passw", "secret", "cookie",
}

// sentences splits at ! ? and newlines, and at a period followed by space
// or the end, so "~/.ssh/id_rsa" and "mcp.json" stay whole.
func sentences(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '!', '?', '\n':
		case '.':
			if i+1 < len(s) && s[i+1] != ' ' && s[i+1] != '\t' {
				continue
			}
		default:
			continue
		}
		out = append(out, s[start:i])
		start = i + 1
	}
	return append(out, s[start:])
}

// exfiltrationParameter returns why a property name looks like a side
// channel for data the model holds, or "".
func exfiltrationParameter(name string) string {
	n := strings.Map(func(r rune) rune {
		switch r {
		case '_', '-', '.', ' ':
			return -1
		}
		return unicode.ToLower(r)
	}, name)
	switch n {
	case "sidenote", "sidenotes", "sidechannel", "notetoself", "hiddennote":
		return "is a known side channel for smuggling data out"
	case "conversationhistory", "chathistory", "messagehistory", "previousmessages", "allmessages",
		"fullconversation", "conversation", "chatlog", "transcript", "priormessages", "contextwindow":
		return "asks for the conversation"
	case "systemprompt", "systemmessage", "instructions", "yourinstructions", "modelinstructions":
		return "asks for the model's instructions"
	}
	for _, p := range []string{"contentfrom", "contentsfrom", "contentof", "contentsof", "datafrom", "filecontentof"} {
		if strings.HasPrefix(n, p) && len(n) > len(p) {
			return "asks for the content of something else"
		}
	}
	return ""
}
