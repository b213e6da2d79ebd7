package mcpserver

import (
	"net/http"
	"strings"
)

// reservedHeaders are set by the HTTP client or the MCP transport (canonical form). The
// registry refuses them in a registration and the pool again before it connects.
var reservedHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Content-Type": true, "Accept": true,
	"Connection": true, "Transfer-Encoding": true, "Upgrade": true, "Te": true,
	"Trailer": true, "Keep-Alive": true, "Proxy-Authorization": true, "Proxy-Connection": true,
	"Mcp-Session-Id": true, "Mcp-Protocol-Version": true, "Last-Event-Id": true,
}

// ReservedHeader reports whether a registration may not set the header name (in any case):
// the HTTP client or the MCP transport sets it, and so does the browser-only Sec- family.
func ReservedHeader(name string) bool {
	canon := http.CanonicalHeaderKey(name)
	return reservedHeaders[canon] || strings.HasPrefix(canon, "Sec-")
}

// HeaderValueHasControl reports whether v holds a byte no HTTP header value may carry: a
// control character other than tab (a line break, above all). The registry refuses such a
// secret when it is stored, and the pool such a header value before it connects.
func HeaderValueHasControl(v string) bool {
	return strings.ContainsFunc(v, func(r rune) bool { return r != '\t' && (r < 0x20 || r == 0x7f) })
}
