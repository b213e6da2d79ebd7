package spawner

import "github.com/ringfence/ringfence/mcpgate/sanitize"

// maxServerText bounds one message a server chose (a JSON-RPC error's message, a transport
// error it provoked) before it is escaped.
const maxServerText = 512

// cleanText masks every secret value in text a server chose and strips what the sanitize
// package strips (control and invisible characters, role markers), without escaping. Secrets
// are masked before and after stripping, so an invisible character inside a secret does not
// shield it.
func cleanText(text string, secrets []string) string {
	return sanitize.String(text, sanitize.Options{KeepMarkup: true, Redact: func(s string) string { return redactString(s, secrets) }})
}

// safeText makes text a server chose fit for a caller, a log line or an audit record, the way
// the pool treats result strings: secrets masked, stripped, bounded to n bytes, HTML-escaped.
// Apply it once: escaping is not idempotent.
func safeText(text string, secrets []string, n int) string {
	return sanitize.String(clip(cleanText(text, secrets), n), sanitize.Options{})
}

// SafeText makes text that came from this session's server fit to show (see safeText): the
// pool passes every server-chosen string it puts in a message through it exactly once.
func (s *Session) SafeText(text string) string { return safeText(text, s.secrets, maxServerText) }

// Redact masks this session's secrets, in every form secretsOf lists, in text the server
// chose: the pool applies it to every string of a result.
func (s *Session) Redact(text string) string { return redactString(text, s.secrets) }
