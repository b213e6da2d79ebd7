package spawner

import (
	"encoding/base64"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
)

// minDerivedSecret is the shortest derived form (an encoding, a header's credential, a URL's
// query value) that is masked: shorter ones are not credentials, and masking them would
// garble ordinary text. The values themselves are masked at any length.
const minDerivedSecret = 8

// secretsOf lists what the spawner must never show, longest first, so that a form containing
// another is masked whole: every env and header value; the credential in a header value
// ("Bearer X", and a Basic pair decoded) and the URL's password and query values; and the
// forms a server is likely to print them in: upper and lower case, percent-encoded, escaped
// for JSON, and base64 (standard and URL alphabets, at each of the three alignments a value
// can have inside a longer encoded text, as in a Basic "user:secret" pair).
func secretsOf(spec *Spec) []string {
	var values, parts []string
	for _, v := range spec.Env {
		values = append(values, v)
	}
	for _, v := range spec.Headers {
		values = append(values, v)
		parts = append(parts, headerCredentials(v)...)
	}
	if u, err := url.Parse(spec.URL); err == nil && spec.URL != "" {
		if p, ok := u.User.Password(); ok {
			parts = append(parts, p)
		}
		for _, vs := range u.Query() {
			parts = append(parts, vs...)
		}
	}
	seen := make(map[string]bool)
	var out []string
	add := func(s string, derived bool) {
		if s == "" || seen[s] || derived && len(s) < minDerivedSecret {
			return
		}
		seen[s] = true
		out = append(out, s)
	}
	for _, v := range values {
		add(v, false)
	}
	for _, v := range append(values, parts...) {
		if len(v) < minDerivedSecret {
			continue
		}
		add(v, true)
		for _, f := range secretForms(v) {
			add(f, true)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// headerCredentials is the credential part of a header value with an auth scheme: the
// token after "Bearer " (or any scheme), and for Basic the decoded pair and its password.
func headerCredentials(v string) []string {
	scheme, cred, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok {
		return nil
	}
	cred = strings.TrimSpace(cred)
	out := []string{cred}
	if strings.EqualFold(scheme, "basic") {
		if pair, err := base64.StdEncoding.DecodeString(cred); err == nil {
			out = append(out, string(pair))
			if _, pass, ok := strings.Cut(string(pair), ":"); ok {
				out = append(out, pass)
			}
		}
	}
	return out
}

// secretForms are the encodings of v a server is likely to print it in.
func secretForms(v string) []string {
	forms := []string{strings.ToUpper(v), strings.ToLower(v), url.QueryEscape(v), url.PathEscape(v)}
	if j, err := json.Marshal(v); err == nil {
		js := string(j[1 : len(j)-1])
		forms = append(forms, js, strings.ReplaceAll(js, "/", `\/`))
	}
	// A value that starts k bytes into a 3-byte group of a longer text: its bytes from the
	// next group boundary on encode the same wherever it sits.
	for k := range 3 {
		core := v[k:]
		core = core[:len(core)/3*3]
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			forms = append(forms, enc.EncodeToString([]byte(core)))
		}
	}
	return forms
}
