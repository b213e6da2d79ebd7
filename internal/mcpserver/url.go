package mcpserver

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/ringfence/ringfence/internal/fielderr"
)

// MaskURL returns raw with every query value replaced by SecretMask: scheme, host, path and
// query keys stay, so a reader still sees where the server is and which parameters it takes,
// but not an api_key or token passed in the query. A query part without "=" (a bare
// "?TOKEN") is masked whole, and so are userinfo and a fragment (registration refuses both,
// but an error about such a URL must not show them either). Empty values are masked too, so
// the mask says nothing about a value's length or presence.
//
// Userinfo is taken to run to the last "@" anywhere in the text: a password may hold "/", "?"
// or "#" ("https://svc:pa55?word@host"), which would otherwise leave its start outside the
// mask. (Registration refuses "@" altogether, so a URL it stored masks as the parts suggest.)
//
// It works on the text as written, without parsing and re-encoding, so it never fails, and
// masking the same stored URL always gives the same text: a client that sends that text back
// means "keep the stored URL" (RestoreMaskedURL).
func MaskURL(raw string) string {
	if raw == "" {
		return ""
	}
	var b strings.Builder
	b.Grow(len(raw) + 16)
	rest := raw
	if scheme, after, ok := strings.Cut(raw, "://"); ok {
		b.WriteString(scheme + "://")
		rest = after
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		b.WriteString(SecretMask)
		rest = rest[i:]
	}
	rest, frag, hasFrag := strings.Cut(rest, "#")
	rest, query, hasQuery := strings.Cut(rest, "?")
	b.WriteString(rest)
	if hasQuery {
		b.WriteByte('?')
		for i, part := range strings.Split(query, "&") {
			if i > 0 {
				b.WriteByte('&')
			}
			if part == "" {
				continue
			}
			if key, _, ok := strings.Cut(part, "="); ok {
				b.WriteString(key + "=" + SecretMask)
			} else {
				b.WriteString(SecretMask)
			}
		}
	}
	if hasFrag {
		b.WriteByte('#')
		if frag != "" {
			b.WriteString(SecretMask)
		}
	}
	return b.String()
}

// maxMaskedURL bounds MaskURL of a URL of at most MaxURL bytes: at worst every query part is
// one byte ("a&b&…", or "a=&…" at two), which the mask makes 8 (or 10) bytes.
const maxMaskedURL = 8 * MaxURL

// HasMaskedQuery reports whether raw carries SecretMask where a query value would be: a URL
// a client read from a response and sent back.
func HasMaskedQuery(raw string) bool {
	_, query, ok := strings.Cut(raw, "?")
	if !ok {
		return false
	}
	query, _, _ = strings.Cut(query, "#")
	for _, part := range strings.Split(query, "&") {
		_, v, ok := strings.Cut(part, "=")
		if !ok {
			v = part
		}
		if v == SecretMask {
			return true
		}
	}
	return false
}

// RestoreMaskedURL is RestoreMasked for a URL. Every response shows a URL through MaskURL, so a
// client that sends back exactly the masked form of the stored URL means "keep it", and gets
// stored back. A URL with a masked query value that is not that form (the client changed the
// host, path or parameters and left the mask in) is refused rather than completed from the
// stored URL: the query's credential was meant for the stored URL's server, and the mask itself
// must never be stored. So is a mask with no URL stored behind it. sent without a mask is
// returned as it is.
func RestoreMaskedURL(field, sent, stored string) (string, error) {
	if !HasMaskedQuery(sent) {
		return sent, nil
	}
	if stored == "" {
		return "", fielderr.New(field, "has the mask %q as a query value, and no URL is stored for it: send the URL itself", SecretMask)
	}
	if MaskURL(stored) != sent {
		return "", fielderr.New(field, "has the mask %q as a query value but differs from the stored URL (%s): send it back unchanged to keep the stored URL, or send the whole new URL with its values", SecretMask, truncate(MaskURL(stored)))
	}
	return stored, nil
}

// CheckRemoteURL parses a remote server's endpoint and applies the rule the registry checks at
// registration and the pool again before it connects: an absolute https URL, or plain http to
// a loopback address only (development servers), since header values and query values are
// secrets that must not cross a network in clear. A URL with an "@" is refused: what precedes
// it reads as user:password, and a password holding "/" or "?" parses as a host and a path (or
// query) instead, which would send it in clear to a host nobody meant. The error is a problem
// statement that never quotes the URL's query, userinfo or fragment.
func CheckRemoteURL(raw string) (*url.URL, error) {
	if strings.Contains(raw, "@") {
		return nil, fmt.Errorf(`must not contain "@": text before it reads as credentials (user:password@host), which a URL must not carry; put them in a secret referenced from headers, and write an "@" that belongs to the path or a query value as %%40`)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Scheme == "" {
		return nil, fmt.Errorf("%s is not an absolute https URL, e.g. https://mcp.example.com/mcp", fielderr.Quote(MaskURL(raw)))
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !IsLoopback(u.Hostname()) {
			return nil, fmt.Errorf("must use https: plain http is allowed only to loopback addresses (localhost, 127.0.0.0/8, ::1), and %s is not one; use https://%s", truncate(u.Host), truncate(u.Host))
		}
	default:
		return nil, fmt.Errorf("has scheme %s: use https (or http to a loopback address)", fielderr.Quote(u.Scheme))
	}
	return u, nil
}

// ValidateURL checks a remote registration's URL as Validate does: for a URL that was not
// part of a validated registration, such as a stored one a masked URL stood for.
func ValidateURL(raw string) error { return checkURL(raw) }

// IsLoopback reports whether host (without port) is localhost or a loopback IP.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
