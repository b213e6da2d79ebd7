// Package mcpserver is the domain type of an MCP server registration, shared by the registry
// (which stores it), the pool (which runs it) and the publisher (which checks its grants),
// with the one validation every front end applies.
package mcpserver

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/mcpgate/capability"
	"github.com/ringfence/ringfence/mcpgate/sanitize"
)

// ErrNotRegistered is wrapped by every "no such server" error, so consumers of the registry
// (the pool, the publisher) can tell an unregistered ref from other failures.
var ErrNotRegistered = errors.New("no server is registered with this ref")

// SecretMask replaces every secret value wherever one would otherwise be shown (responses, CLI
// output, logs, audit records, stderr tails): the same for all values, so it reveals neither a
// value nor its length.
const SecretMask = "********"

// Transports.
const (
	TransportStdio          = "stdio"
	TransportStreamableHTTP = "streamable_http"
	TransportSSE            = "sse"
)

// NormalizeTransport returns the transport t names: the seed's names are accepted for the
// canonical ones (http and streamable-http for streamable_http, http-sse for sse), so a
// registration stores, and every read returns, only stdio, streamable_http or sse. Other
// values come back unchanged for Validate to refuse.
func NormalizeTransport(t string) string {
	switch t {
	case "http", "streamable-http":
		return TransportStreamableHTTP
	case "http-sse":
		return TransportSSE
	}
	return t
}

// Defaults for the per-registration timeouts.
const (
	DefaultClientSessionTimeout = 2 * time.Second
	DefaultToolCallTimeout      = 30 * time.Second
	// DefaultMaxResultBytes bounds an answer to tools/call when the registration sets no
	// max_result_bytes.
	DefaultMaxResultBytes = 16 << 20
)

// Limits on a registration, stated so clients can check before they send.
const (
	MaxDescription         = 2048
	MaxCommand             = 1024
	MaxArgs                = 64
	MaxArg                 = 4096
	MaxEnv                 = 64
	MaxEnvValue            = 8192
	MaxURL                 = 2048
	MaxHeaders             = 32
	MaxGrants              = 64
	MaxFilterEntries       = 256
	MaxToolName            = 128
	MaxToolPermissionTools = 256
	MaxToolRequirements    = 16
	MaxClientSessionTimout = 60 * time.Second
	MaxToolCallTimeout     = 10 * time.Minute
	// MaxPrewarm bounds the warm containers one registration may ask for; the pool's own
	// cap (pool.max_warm) bounds them all together.
	MaxPrewarm = 16
	// MinMaxResultBytes and MaxMaxResultBytes bound max_result_bytes. The upper bound leaves
	// a result room to double when it is HTML-escaped and still fit the 64 MiB every
	// Ringfence client accepts in one response (grpcserver.MaxResponseBytes).
	MinMaxResultBytes = 1 << 10
	MaxMaxResultBytes = 32 << 20
)

// Registration is an operator's record of one MCP server.
type Registration struct {
	Ref         string
	Description string
	Transport   string
	Command     string
	Args        []string
	// Env holds clear values only in memory; the registry stores them sealed.
	Env map[string]string
	URL string
	// Headers maps an HTTP header to the name of a registry secret.
	Headers map[string]string
	Grants  []string
	Filter  ToolFilter
	// ToolPermissions maps a tool name to argument-scoped requirements like "fs.read:{path}".
	ToolPermissions      map[string][]string
	ClientSessionTimeout time.Duration
	ToolCallTimeout      time.Duration
	KeepMarkup           bool
	// StrictInputs refuses arguments the tool's input schema does not declare.
	StrictInputs bool
	// Prewarm is how many warm containers the pool keeps ready for this server's next runs
	// (stdio only).
	Prewarm int
	// MaxResultBytes bounds an answer to tools/call as the server writes it (its JSON-RPC
	// message); 0 means DefaultMaxResultBytes.
	MaxResultBytes int64
	// OAuth, when set, signs each user in to the (remote) server: see OAuth.
	OAuth      *OAuth
	Revision   int64
	CreateTime time.Time
	UpdateTime time.Time
}

// WarmTarget is a registration that asks for warm containers, as the pool polls them.
type WarmTarget struct {
	Ref      string
	Prewarm  int
	Revision int64
}

// FloorMissing returns the floor capabilities (process_spawn, external_api_call) grants do
// not cover. Every node that calls a server must declare the floor, and the grants must cover
// what a node declares (the ceiling), so grants that miss one deny every call to the server.
// Grants that do not parse count as covering nothing.
func FloorMissing(grants []string) []string {
	set, err := capability.ParseSet(grants)
	if err != nil {
		set = nil
	}
	return set.Missing(capability.MustParseSet(capability.Floor))
}

// CheckPrewarm refuses warm containers no call could take: prewarm above 0 on a registration
// whose grants miss the floor (FloorMissing), which denies every call to the server. The
// registry checks it when a registration is created or updated (an ad-hoc exploration keeps
// nothing warm, so Validate does not).
func (r *Registration) CheckPrewarm() error {
	if r.Prewarm <= 0 {
		return nil
	}
	missing := FloorMissing(r.Grants)
	if len(missing) == 0 {
		return nil
	}
	return fielderr.New("prewarm", "is %d, but grants do not grant %s, which every call to the server needs, so no call could take a warm container: add %s to grants (the CLI's --grant, listing every grant to keep), or set prewarm to 0",
		r.Prewarm, strings.Join(missing, " and "), strings.Join(missing, " and "))
}

// WarmStatus is what a pool holds of a registration's warm containers.
type WarmStatus struct {
	// Ready are started, past the handshake and listed; Starting are being started.
	Ready, Starting int
}

// ToolFilter narrows the tools a registration exposes; excludes win.
type ToolFilter struct {
	Include []string
	Exclude []string
}

// Allows reports whether the filter lets tool through.
func (f ToolFilter) Allows(tool string) bool {
	if slices.Contains(f.Exclude, tool) {
		return false
	}
	return len(f.Include) == 0 || slices.Contains(f.Include, tool)
}

// SessionTimeout is the handshake bound, defaulted.
func (r *Registration) SessionTimeout() time.Duration {
	if r.ClientSessionTimeout > 0 {
		return r.ClientSessionTimeout
	}
	return DefaultClientSessionTimeout
}

// CallTimeout is the tools/call bound, defaulted.
func (r *Registration) CallTimeout() time.Duration {
	if r.ToolCallTimeout > 0 {
		return r.ToolCallTimeout
	}
	return DefaultToolCallTimeout
}

// ResultCap is the bound on an answer to tools/call, defaulted.
func (r *Registration) ResultCap() int64 {
	if r.MaxResultBytes > 0 {
		return r.MaxResultBytes
	}
	return DefaultMaxResultBytes
}

// Policy is what a registration allows, without secrets: what the publisher and the pool's
// gates read.
type Policy struct {
	Ref string
	// Description is what the server is for: an agent whose tools of it are deferred sees it.
	Description     string
	Grants          []string
	Filter          ToolFilter
	ToolPermissions map[string][]string
	// StrictInputs refuses arguments the tool's pinned input schema does not declare.
	StrictInputs bool
	// SignIn is the registration's SignInFingerprint: non-empty for a server that signs each
	// user in (OAuth), whose tools a run's user reaches only once connected.
	SignIn   string
	Revision int64
}

// Resolved is a registration with its secrets in clear, for the pool to start it.
type Resolved struct {
	Registration
	// HeaderValues maps each header to its secret's clear value.
	HeaderValues map[string]string
	// ClientSecret is the clear value of OAuth.ClientSecretRef (empty without one).
	ClientSecret string
}

var (
	toolNamePattern   = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)
	headerNamePattern = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
)

// ValidateRef checks a server ref.
func ValidateRef(ref string) error {
	return ident.Ref.Check("ref", ref)
}

// NamespaceSeparator joins a server's ref and a tool's name into the name an agent calls the
// tool by: <ref>__<tool>.
const NamespaceSeparator = "__"

// ValidateNewRef is ValidateRef for a new registration, which may also not contain the
// namespace separator: server a__b's tool c and server a's tool b__c would both be a__b__c.
// Refs stored before this rule stay readable, since every other RPC checks only ValidateRef.
func ValidateNewRef(ref string) error {
	if err := ValidateRef(ref); err != nil {
		return err
	}
	if strings.Contains(ref, NamespaceSeparator) {
		return fielderr.New("ref", "%q contains %q, which joins a ref and a tool name into the name agents call (<ref>__<tool>), so such a ref could name another server's tool; use a single '_' or '-'", ref, NamespaceSeparator)
	}
	return nil
}

// checkNotNamespaced refuses a tool named the way agents see it, <ref>__<tool>: a registration
// names its server's own tools, and an exclude entry written namespaced would match nothing
// and let the tool through.
func checkNotNamespaced(field, ref, tool string) error {
	if bare, ok := strings.CutPrefix(tool, ref+NamespaceSeparator); ok && bare != "" {
		return fielderr.New(field, "%q is the name agents call the tool by; the registration names the server's own tools: write %q", tool, bare)
	}
	return nil
}

// ValidateSecretName checks a secret name.
func ValidateSecretName(field, name string) error {
	return ident.SecretName.Check(field, name)
}

// Validate checks every field of a registration, fills defaults (transport stdio) and writes
// a transport alias as its canonical name (NormalizeTransport).
// allowedEnvKeys is the operator's allowlist.
func (r *Registration) Validate(allowedEnvKeys []string) error {
	if err := ValidateRef(r.Ref); err != nil {
		return err
	}
	if r.Transport == "" {
		r.Transport = TransportStdio
	}
	r.Transport = NormalizeTransport(r.Transport)
	if err := checkText("description", r.Description, MaxDescription); err != nil {
		return err
	}
	if err := checkShownToAgents("description", r.Description); err != nil {
		return err
	}
	switch r.Transport {
	case TransportStdio:
		if strings.TrimSpace(r.Command) == "" {
			return fielderr.New("command", "is required for the stdio transport: name the program inside the isolation image, e.g. \"mcp-server-filesystem\"")
		}
		if r.URL != "" {
			return fielderr.New("url", "applies to the streamable_http and sse transports only; remove url and headers, or set transport")
		}
		if len(r.Headers) > 0 {
			return fielderr.New("headers", "apply to the streamable_http and sse transports only; remove them, or set transport")
		}
	case TransportStreamableHTTP, TransportSSE:
		if r.Command != "" || len(r.Args) > 0 {
			return fielderr.New("command", "applies to the stdio transport only; remove command and args for %s", r.Transport)
		}
		if len(r.Env) > 0 {
			return fielderr.New("env", "applies to the stdio transport only; send credentials to remote servers with headers that name secrets")
		}
		if err := checkURL(r.URL); err != nil {
			return err
		}
	default:
		return fielderr.New("transport", "%s is not a transport: use stdio, streamable_http or sse", fielderr.Quote(r.Transport))
	}
	if err := checkText("command", r.Command, MaxCommand); err != nil {
		return err
	}
	if len(r.Args) > MaxArgs {
		return fielderr.New("args", "has %d entries; at most %d", len(r.Args), MaxArgs)
	}
	for i, a := range r.Args {
		if err := checkText(fmt.Sprintf("args[%d]", i), a, MaxArg); err != nil {
			return err
		}
	}
	if len(r.Env) > MaxEnv {
		return fielderr.New("env", "has %d keys; at most %d", len(r.Env), MaxEnv)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Env)) {
		if err := CheckEnvKey(k, allowedEnvKeys); err != nil {
			return fielderr.New("env."+truncate(k), "%s", strings.TrimPrefix(err.Error(), ErrEnvKeyRefused.Error()+": "))
		}
		if err := checkText("env."+k, r.Env[k], MaxEnvValue); err != nil {
			return err
		}
		// The mask keeps a stored value (RestoreMasked); an empty value is a value.
		if v := r.Env[k]; v != SecretMask && strings.TrimSpace(v) != "" {
			if p := Placeholder(v); p != "" {
				return fielderr.New("env."+k, "%s, not a value a server can use (the value is not shown): send the real one", p)
			}
		}
	}
	if len(r.Headers) > MaxHeaders {
		return fielderr.New("headers", "has %d entries; at most %d", len(r.Headers), MaxHeaders)
	}
	canonical := make(map[string]string, len(r.Headers))
	for _, h := range slices.Sorted(maps.Keys(r.Headers)) {
		if !headerNamePattern.MatchString(h) {
			return fielderr.New("headers", "%s: a header name is 1 to 128 letters, digits and !#$%%&'*+-.^_`|~", headerNameProblem(h))
		}
		if ReservedHeader(h) {
			return fielderr.New("headers."+h, "is set by the HTTP client or the MCP transport, and a registration cannot replace it: remove it")
		}
		// Header names are case-insensitive: two spellings of one name would leave which
		// secret the pool sends to chance.
		canon := http.CanonicalHeaderKey(h)
		if other, dup := canonical[canon]; dup {
			return fielderr.New("headers."+h, "names the same header as %q (header names are case-insensitive): keep one", other)
		}
		canonical[canon] = h
		// The value may be the credential itself, pasted where its secret's name belongs: the
		// problem is named, never the value.
		if !ident.SecretName.Valid(r.Headers[h]) {
			return fielderr.New("headers."+h, "must be the name of a registry secret (^[A-Za-z0-9_.-]{1,128}$), never the credential itself: put the value in a secret (ringfence secrets set NAME, or PutSecret) and send its name; the value sent is not shown")
		}
	}
	if len(r.Grants) > MaxGrants {
		return fielderr.New("grants", "has %d entries; at most %d", len(r.Grants), MaxGrants)
	}
	for i, g := range r.Grants {
		if _, err := capability.Parse(g); err != nil {
			return fielderr.New(fmt.Sprintf("grants[%d]", i), "%s", err.Error())
		}
	}
	for name, list := range map[string][]string{"tool_filter.include": r.Filter.Include, "tool_filter.exclude": r.Filter.Exclude} {
		if len(list) > MaxFilterEntries {
			return fielderr.New(name, "has %d entries; at most %d", len(list), MaxFilterEntries)
		}
		for i, t := range list {
			if !toolNamePattern.MatchString(t) {
				return fielderr.New(fmt.Sprintf("%s[%d]", name, i), "%s is not a tool name ([A-Za-z0-9_.-]{1,128})", fielderr.Quote(t))
			}
			if err := checkNotNamespaced(fmt.Sprintf("%s[%d]", name, i), r.Ref, t); err != nil {
				return err
			}
		}
	}
	if len(r.ToolPermissions) > MaxToolPermissionTools {
		return fielderr.New("tool_permissions", "has %d tools; at most %d", len(r.ToolPermissions), MaxToolPermissionTools)
	}
	for _, tool := range slices.Sorted(maps.Keys(r.ToolPermissions)) {
		field := "tool_permissions." + truncate(tool)
		if err := checkNotNamespaced(field, r.Ref, tool); err != nil {
			return err
		}
		if !toolNamePattern.MatchString(tool) {
			return fielderr.New("tool_permissions", "%s is not a tool name ([A-Za-z0-9_.-]{1,128})", fielderr.Quote(tool))
		}
		reqs := r.ToolPermissions[tool]
		if len(reqs) == 0 || len(reqs) > MaxToolRequirements {
			return fielderr.New(field, "must list 1 to %d requirements", MaxToolRequirements)
		}
		for i, req := range reqs {
			// Placeholders stand for argument values; the shape is checked with a stand-in.
			if err := capability.CheckTemplate(req); errors.Is(err, capability.ErrMalformedPlaceholder) {
				return fielderr.New(fmt.Sprintf("%s[%d]", field, i), "%s has a malformed {argument} placeholder", fielderr.Quote(req))
			} else if err != nil {
				return fielderr.New(fmt.Sprintf("%s[%d]", field, i), "%s", err.Error())
			}
		}
	}
	if r.ClientSessionTimeout < 0 || r.ClientSessionTimeout > MaxClientSessionTimout {
		return fielderr.New("client_session_timeout", "must be between 0 (default 2s) and %s", MaxClientSessionTimout)
	}
	if r.ToolCallTimeout < 0 || r.ToolCallTimeout > MaxToolCallTimeout {
		return fielderr.New("tool_call_timeout", "must be between 0 (default 30s) and %s", MaxToolCallTimeout)
	}
	if r.Prewarm < 0 || r.Prewarm > MaxPrewarm {
		return fielderr.New("prewarm", "must be between 0 (no warm containers) and %d", MaxPrewarm)
	}
	if r.Prewarm > 0 && r.Transport != TransportStdio {
		return fielderr.New("prewarm", "applies to the stdio transport only (warm containers); a %s server has no container to keep warm: remove prewarm", r.Transport)
	}
	if r.OAuth != nil {
		if err := r.OAuth.validate(r.Transport, r.Headers); err != nil {
			return err
		}
	}
	if r.MaxResultBytes != 0 && (r.MaxResultBytes < MinMaxResultBytes || r.MaxResultBytes > MaxMaxResultBytes) {
		return fielderr.New("max_result_bytes", "must be 0 (default %d, 16 MiB) or between %d (1 KiB) and %d (32 MiB); it is %d", DefaultMaxResultBytes, MinMaxResultBytes, MaxMaxResultBytes, r.MaxResultBytes)
	}
	return nil
}

// checkURL checks a remote server's URL as the pool will (CheckRemoteURL), and refuses what a
// URL must not carry: userinfo (credentials belong in a header secret) and a fragment (never
// sent to the server, so at best dead text and at worst a token pasted from a browser).
// Problems never quote the URL's query, userinfo or fragment: they may hold a credential.
func checkURL(raw string) error {
	if raw == "" {
		return fielderr.New("url", "is required for remote transports, e.g. https://mcp.example.com/mcp")
	}
	// A masked URL (one a response showed, sent back) can be longer than the URL it stands
	// for, since a short value becomes the mask: it is held to the bound its stored URL can
	// reach masked, and the stored URL, which replaces it, to MaxURL.
	if max := MaxURL; len(raw) > max && (!HasMaskedQuery(raw) || len(raw) > maxMaskedURL) {
		return fielderr.New("url", "is longer than %d bytes", max)
	}
	if !utf8.ValidString(raw) || strings.ContainsFunc(raw, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fielderr.New("url", "contains a control character or invalid UTF-8")
	}
	u, err := CheckRemoteURL(raw)
	if err != nil {
		return fielderr.New("url", "%s", err.Error())
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return fielderr.New("url", "must not have a fragment (#...): it is never sent to the server; remove it, and put a credential in a secret referenced from headers")
	}
	return nil
}

func checkText(field, s string, max int) error {
	if len(s) > max {
		return fielderr.New(field, "is %d bytes; at most %d", len(s), max)
	}
	if !utf8.ValidString(s) {
		return fielderr.New(field, "is not valid UTF-8")
	}
	if strings.ContainsRune(s, 0) {
		return fielderr.New(field, "contains a NUL byte")
	}
	return nil
}

// checkShownToAgents refuses text an agent is shown (a deferred server's description) that
// holds what the pool would strip from a server's own text: control and invisible characters
// (a terminal escape, a bidirectional override, a zero-width space) or a chat role marker
// (__system__, <|im_start|>). Line breaks and tabs stay welcome.
func checkShownToAgents(field, s string) error {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	if sanitize.String(s, sanitize.Options{KeepMarkup: true}) != s {
		return fielderr.New(field, "holds control or invisible characters, or a chat role marker such as __system__ or <|im_start|>, which agents must not be shown: remove them")
	}
	return nil
}

// headerNameProblem says what is wrong with a header name that is not one, quoting it only
// up to the first byte a name may not hold: a header pasted whole ("Authorization: Bearer …")
// would otherwise quote its credential.
func headerNameProblem(h string) string {
	if len(h) > 128 {
		return fmt.Sprintf("a header name of %d bytes is too long (it is not shown)", len(h))
	}
	for i := 0; i < len(h); i++ {
		if headerNamePattern.MatchString(h[i : i+1]) {
			continue
		}
		if i == 0 {
			return fmt.Sprintf("a header name starts with %q, which no header name holds (the rest is not shown)", h[:1])
		}
		return fmt.Sprintf("header name %q is followed by %q, which no header name holds (the rest is not shown)", h[:i], h[i:i+1])
	}
	return "a header name is empty"
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}
