package pool

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/time/rate"

	"github.com/ringfence/ringfence/internal/auth"
)

// The MCP front door: the pool's tools served as MCP over streamable HTTP at /mcp, beside its
// gRPC front end (rpc.go). A client presents an agent token (tokens.go) and sees exactly what
// ListAgentTools shows that agent of that run; each tools/call is a CallTool, through every
// gate and into the audit log. The protocol is the go-sdk's: its StreamableHTTPHandler serves
// the stateful versions (initialize, Mcp-Session-Id) and, for requests that carry protocol
// version 2026-07-28 or later, its stateless one (server/discover, Mcp-Method and Mcp-Name
// checked against the body). What the front door adds is in front of it, in this order, each
// before a byte of the body is read:
//
//  1. DNS-rebinding protection: the Host must be one the deployment answers to, and an Origin,
//     when a browser sends one, one it allows (403).
//  2. The bearer token (401 with WWW-Authenticate, RFC 6750).
//  3. The token's rate limit (429 with Retry-After).
//
// and behind it, in frontdoor_agent.go, one mcp.Server per agent of a run, whose tools are the
// agent's listing, refreshed when it is older than the list TTL.

// FrontDoorConfig configures the MCP front door (the frontdoor.* settings).
type FrontDoorConfig struct {
	// AllowedHosts are the host names (ports aside) a request's Host may name besides the
	// public URL's; on a loopback listener, loopback names are allowed too.
	AllowedHosts []string
	// AllowedOrigins are the browser origins (scheme://host[:port]) allowed besides the public
	// URL's; on a loopback listener, loopback origins are allowed too.
	AllowedOrigins []string
	// ListTTL is how long an agent's listing is served before it is asked for again (the
	// ttlMs of tools/list); default 5s.
	ListTTL time.Duration
	// MaxBodyBytes bounds one request body; default 2 MiB (a call's arguments are at most
	// 1 MiB).
	MaxBodyBytes int64
	// RateLimit and RateBurst bound the requests of one token: RateLimit a second on
	// average, RateBurst at once; defaults 20 and 40.
	RateLimit float64
	RateBurst int
	// SessionIdleTimeout closes a stateful session that received nothing for this long;
	// default 30m.
	SessionIdleTimeout time.Duration
	// MaxSessionsPerAgent bounds the open sessions of one agent of a run; default 16.
	MaxSessionsPerAgent int
	// ClientApprovals lets the client's user approve a call that asks a person first, when
	// the client can be asked (elicitation, or the input_required result of 2026-07-28); off,
	// such a call waits for an approver as it does through the API.
	ClientApprovals bool
	Logger          *slog.Logger
	// Now, when set, is the clock a session's idleness is judged by (tests); nil is time.Now.
	Now func() time.Time
}

// Defaults of the front door.
const (
	DefaultFrontDoorListTTL      = 5 * time.Second
	DefaultFrontDoorMaxBody      = 2 << 20
	DefaultFrontDoorRateLimit    = 20
	DefaultFrontDoorRateBurst    = 40
	DefaultFrontDoorSessionIdle  = 30 * time.Minute
	DefaultFrontDoorMaxSessions  = 16
	statelessProtocolVersion     = "2026-07-28"
	mcpProtocolVersionHeader     = "Mcp-Protocol-Version"
	mcpSessionIDHeader           = "Mcp-Session-Id"
	frontDoorRealm               = "ringfence"
	maxFrontDoorTokenHeaderBytes = 256
)

// sessionEvictIdle is how long an agent's least recently used session must have sent nothing
// for a new session to take its place when the agent has the most it may: a client that quit
// without closing its session (DELETE), as many do, must not lock the agent out until the
// session expires, and clients that all work keep theirs.
const sessionEvictIdle = time.Minute

// FrontDoor serves /mcp. Build it with Service.FrontDoor.
type FrontDoor struct {
	svc *Service
	cfg FrontDoorConfig
	log *slog.Logger
	// sdkLog is what the SDK logs to: its warnings and errors only (it logs a line at info
	// for every session it connects, which a stateless request is).
	sdkLog *slog.Logger
	host   string // the public URL's host name
	orig   string // the public URL's origin

	stateful, stateless http.Handler

	// stateKey signs the request state of an approval question (frontdoor_agent.go).
	stateKey []byte

	mu       sync.Mutex
	agents   map[agentKey]*agentServer
	follows  map[runKey]bool // runs another host owns that keepFollowing watches
	limiters map[string]*tokenLimiter
	pruned   time.Time
}

type agentKey struct{ tenant, run, agent string }

type tokenLimiter struct {
	lim  *rate.Limiter
	used time.Time
}

// FrontDoor builds the MCP front door over this pool. It needs the public URL (Config's
// FrontDoorURL) to know the host it answers to.
func (s *Service) FrontDoor(cfg FrontDoorConfig) (*FrontDoor, error) {
	u, err := url.Parse(s.cfg.FrontDoorURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("pool: the front door's public URL %q is not an http(s) URL with a host (frontdoor.public_url)", s.cfg.FrontDoorURL)
	}
	if cfg.ListTTL <= 0 {
		cfg.ListTTL = DefaultFrontDoorListTTL
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultFrontDoorMaxBody
	}
	if cfg.RateLimit <= 0 {
		cfg.RateLimit = DefaultFrontDoorRateLimit
	}
	if cfg.RateBurst <= 0 {
		cfg.RateBurst = DefaultFrontDoorRateBurst
	}
	if cfg.SessionIdleTimeout <= 0 {
		cfg.SessionIdleTimeout = DefaultFrontDoorSessionIdle
	}
	if cfg.MaxSessionsPerAgent <= 0 {
		cfg.MaxSessionsPerAgent = DefaultFrontDoorMaxSessions
	}
	if cfg.Logger == nil {
		cfg.Logger = s.log
	}
	f := &FrontDoor{svc: s, cfg: cfg, log: cfg.Logger.With("component", "frontdoor"), host: strings.ToLower(u.Hostname()),
		orig: strings.ToLower(u.Scheme + "://" + u.Host), agents: make(map[agentKey]*agentServer), follows: make(map[runKey]bool), limiters: make(map[string]*tokenLimiter),
		stateKey: make([]byte, 32)}
	_, _ = rand.Read(f.stateKey)
	// The SDK's own loopback check is the first half of ours (allowedHost), which also
	// covers listeners that are not on loopback.
	f.sdkLog = slog.New(warnOnly{f.log.Handler()})
	common := mcp.StreamableHTTPOptions{DisableLocalhostProtection: true, MaxRequestBodyBytes: cfg.MaxBodyBytes, Logger: f.sdkLog}
	stateful, stateless := common, common
	stateful.SessionTimeout = cfg.SessionIdleTimeout
	stateless.Stateless, stateless.PropagateRequestCancellation = true, true
	// The SDK binds a stateful session to the TokenInfo's UserID it was opened with (the
	// token's id), so no other token can use it; sessionUser hands it the authenticated token.
	bind := sdkauth.RequireBearerToken(sessionUser, nil)
	f.stateful = bind(mcp.NewStreamableHTTPHandler(f.server, &stateful))
	f.stateless = bind(mcp.NewStreamableHTTPHandler(f.server, &stateless))
	changed := f.toolsChanged
	s.onToolsChanged.Store(&changed)
	return f, nil
}

// toolsChanged: the listing of an agent of a run changed (of every agent for ""): tools were
// loaded, or server ref said its tools changed. Each such agent served here reads its listing
// again, and its clients are told (tools/list_changed) of what changed in it, and, when the
// agent lists tools of ref, that they did: what they list again is the pinned listing, and a
// tool whose live declaration no longer matches its pin is refused at call time (schema_drift).
func (f *FrontDoor) toolsChanged(tenant, runID, agent, ref string) {
	f.mu.Lock()
	var agents []*agentServer
	for k, a := range f.agents {
		if k.tenant == tenant && k.run == runID && (agent == "" || k.agent == agent) {
			agents = append(agents, a)
		}
	}
	f.mu.Unlock()
	for _, a := range agents {
		// Not on the server's reading goroutine, which called this.
		go a.announce(ref)
	}
}

// Bounds of following a run another host owns.
const (
	// followCheck is how often a follow checks that the run still has sessions here: a watch
	// ends within it once the last one closed.
	followCheck = time.Second
	// followRetryMax bounds the wait before a watch that ended is opened again.
	followRetryMax = 10 * time.Second
)

// follow makes sure this front door hears of the changes of the listings of k's run while it
// has sessions of it that can be told (stateful, or listening), when another host owns the
// run: one watch of the run (WatchAgentTools) held open to the owner, whichever of its agents
// and however many sessions.
func (f *FrontDoor) follow(k agentKey) {
	key := runKey{k.tenant, k.run}
	if f.svc.hosts == nil || f.svc.holds(key) {
		return // the run is this host's: toolsChanged hears of its changes
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.follows[key] {
		return
	}
	if f.svc.goBackground(func(ctx context.Context) { f.keepFollowing(ctx, key) }) {
		f.follows[key] = true
	}
}

// keepFollowing holds the watch of a run another host owns while the run has sessions here:
// a watch that ends is opened again (the owner is looked up again: the run may have moved),
// at once the first time and then after a wait that doubles up to followRetryMax, until the
// run ended or is this host's.
func (f *FrontDoor) keepFollowing(ctx context.Context, key runKey) {
	defer func() {
		f.mu.Lock()
		delete(f.follows, key)
		f.mu.Unlock()
	}()
	// On return the watch is cancelled, then waited for.
	var running sync.WaitGroup
	defer running.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var opened atomic.Bool
	changed := func(agent, ref string) {
		opened.Store(true)
		f.toolsChanged(key.tenant, key.id, agent, ref)
	}
	done := make(chan error, 1)
	watch := func() {
		opened.Store(false)
		running.Go(func() { done <- f.svc.followElsewhere(ctx, key, changed) })
	}
	watch()
	check := time.NewTicker(followCheck)
	defer check.Stop()
	var retry <-chan time.Time
	wait := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			if f.runSessions(key) == 0 {
				return
			}
			continue
		case <-retry:
			retry = nil
			watch()
			continue
		case err := <-done:
			if ctx.Err() != nil || errors.Is(err, errRunHere) || errors.Is(err, errRunEnded) || errors.Is(err, errRunNotFound) {
				return
			}
			if opened.Load() {
				wait = 0
			}
			f.log.Debug("a watch of a run another pool host owns ended; opening it again", "run", key.id, "err", err, "wait", wait)
		}
		retry = time.After(wait)
		wait = min(max(2*wait, 250*time.Millisecond), followRetryMax)
	}
}

// runSessions counts the sessions of the run's agents here.
func (f *FrontDoor) runSessions(key runKey) int {
	f.mu.Lock()
	var agents []*agentServer
	for k, a := range f.agents {
		if k.tenant == key.tenant && k.run == key.id {
			agents = append(agents, a)
		}
	}
	f.mu.Unlock()
	n := 0
	for _, a := range agents {
		n += a.sessions()
	}
	return n
}

// tokenCtxKey carries the authenticated token of a request.
type tokenCtxKey struct{}

func tokenFrom(ctx context.Context) (*AgentToken, bool) {
	t, ok := ctx.Value(tokenCtxKey{}).(*AgentToken)
	return t, ok
}

// actingFor is ctx in which the pool's Go API acts for the token: its tenant, RunExecute alone.
func actingFor(ctx context.Context, tok *AgentToken) context.Context {
	p := auth.Principal{AgentToken: tok.ID, Tenant: tok.Tenant, Permissions: []auth.Permission{auth.RunExecute}}
	return auth.WithTenancy(auth.WithPrincipal(ctx, p), auth.Tenancy{Tenant: tok.Tenant})
}

func (f *FrontDoor) now() time.Time {
	if f.cfg.Now != nil {
		return f.cfg.Now()
	}
	return time.Now()
}

// sessionUser is the SDK's token verifier: ServeHTTP authenticated the token already.
func sessionUser(ctx context.Context, _ string, _ *http.Request) (*sdkauth.TokenInfo, error) {
	t, ok := tokenFrom(ctx)
	if !ok {
		return nil, sdkauth.ErrInvalidToken
	}
	return &sdkauth.TokenInfo{UserID: t.ID, Expiration: t.ExpireTime, Scopes: []string{string(auth.RunExecute)}}, nil
}

// ServeHTTP implements http.Handler.
func (f *FrontDoor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if problem := f.rebinding(r); problem != "" {
		http.Error(w, "Forbidden: "+problem, http.StatusForbidden)
		return
	}
	tok, problem := f.authenticate(r)
	if tok == nil {
		f.unauthorized(w, problem)
		return
	}
	if wait, ok := f.admit(tok.ID); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(wait))
		http.Error(w, fmt.Sprintf("Too Many Requests: this token's requests are limited to %g a second (burst %d; frontdoor.rate_limit, frontdoor.rate_burst): retry in %d s", f.cfg.RateLimit, f.cfg.RateBurst, wait), http.StatusTooManyRequests)
		return
	}
	ctx := actingFor(context.WithValue(r.Context(), tokenCtxKey{}, tok), tok)
	r = r.WithContext(ctx)
	if version := r.Header.Get(mcpProtocolVersionHeader); version >= statelessProtocolVersion {
		f.stateless.ServeHTTP(w, r)
		return
	}
	if r.Method == http.MethodPost && r.Header.Get(mcpSessionIDHeader) == "" {
		if a := f.agent(tok); !a.admit(f.cfg.MaxSessionsPerAgent, f.now().Add(-sessionEvictIdle)) {
			w.Header().Set("Retry-After", strconv.Itoa(int(sessionEvictIdle.Seconds())))
			http.Error(w, fmt.Sprintf("Too Many Requests: agent %q of run %s has %d open sessions, the most it may (frontdoor.max_sessions_per_agent), each used in the last %s: close one (DELETE with its Mcp-Session-Id), or retry once one has sent nothing for that long", tok.Agent, tok.RunID, f.cfg.MaxSessionsPerAgent, sessionEvictIdle), http.StatusTooManyRequests)
			return
		}
	}
	if r.Header.Get(mcpSessionIDHeader) != "" {
		w = &boundSessionWriter{ResponseWriter: w}
	}
	f.stateful.ServeHTTP(w, r)
}

// boundSessionWriter words the SDK's refusal of a session opened with another token: its 403
// (the one the stateful handler gives, as neither its Host nor its Origin check is on) says
// "session user mismatch", which tells a client neither why nor what to do.
type boundSessionWriter struct {
	http.ResponseWriter
	refused bool
}

func (w *boundSessionWriter) WriteHeader(code int) {
	if code != http.StatusForbidden || w.refused {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.refused = true
	w.Header().Del("Content-Length")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.ResponseWriter.WriteHeader(code)
	_, _ = io.WriteString(w.ResponseWriter, "Forbidden: this session (Mcp-Session-Id) was opened with another token, and a session is bound to the token that opened it: open a new session with this token (initialize, without Mcp-Session-Id)\n")
}

// Write drops the SDK's own text after a refusal worded above.
func (w *boundSessionWriter) Write(b []byte) (int, error) {
	if w.refused {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *boundSessionWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *boundSessionWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// rebinding is DNS-rebinding protection: a page in a browser that resolved its own name to
// this host must not reach it. The Host must be the public URL's host name, one of
// frontdoor.allowed_hosts, or, on a loopback listener, a loopback name; an Origin, when
// present, must be the public URL's origin, one of frontdoor.allowed_origins, or, on a
// loopback listener, a loopback origin. It returns what is wrong, or "".
func (f *FrontDoor) rebinding(r *http.Request) string {
	loopback := false
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && a != nil {
		loopback = isLoopbackHost(hostOnly(a.String()))
	}
	host := strings.ToLower(hostOnly(r.Host))
	if host != f.host && !slices.Contains(f.cfg.AllowedHosts, host) && !(loopback && isLoopbackHost(host)) {
		return fmt.Sprintf("Host %.100q is not one this server answers to (frontdoor.public_url, frontdoor.allowed_hosts)", r.Host)
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return ""
	}
	o := strings.ToLower(origin)
	if o == f.orig || slices.Contains(f.cfg.AllowedOrigins, o) {
		return ""
	}
	if u, err := url.Parse(o); err == nil && loopback && (u.Scheme == "http" || u.Scheme == "https") && isLoopbackHost(u.Hostname()) {
		return ""
	}
	return fmt.Sprintf("Origin %.100q is not allowed (frontdoor.allowed_origins)", origin)
}

// hostOnly is a host:port's host, without brackets.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}

func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// authenticate reads the bearer token and asks the pool about it. It returns the token, or
// the problem for the 401 ("" when none was presented).
func (f *FrontDoor) authenticate(r *http.Request) (*AgentToken, string) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return nil, ""
	}
	scheme, secret, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" || len(secret) > maxFrontDoorTokenHeaderBytes {
		return nil, "the Authorization header is not Bearer <agent token>"
	}
	t, err := f.svc.AuthenticateAgentToken(r.Context(), strings.TrimSpace(secret))
	if err != nil {
		if r.Context().Err() == nil && !isTokenProblem(err) {
			f.log.Error("an agent token could not be checked", "err", err)
			return nil, "the token could not be checked now; retry"
		}
		return nil, err.Error()
	}
	return t, ""
}

func isTokenProblem(err error) bool {
	for _, e := range []error{errTokenInvalid, errTokenExpired, errTokenRunEnded, errTokenMalformed} {
		if err == e {
			return true
		}
	}
	return false
}

// unauthorized answers 401 as RFC 6750 and the MCP authorization spec expect. Ringfence mints
// its own tokens (ringfence runs connect): there is no authorization server to discover, so
// the challenge names the realm, and, for a token that was presented, why it was refused.
func (f *FrontDoor) unauthorized(w http.ResponseWriter, problem string) {
	challenge := fmt.Sprintf("Bearer realm=%q", frontDoorRealm)
	msg := "Unauthorized: this endpoint takes an agent token (Authorization: Bearer <token>); mint one with ringfence runs connect --run R --agent A"
	if problem != "" {
		challenge += fmt.Sprintf(`, error="invalid_token", error_description=%q`, problem)
		msg = "Unauthorized: " + problem + "; mint a new one with ringfence runs connect --run R --agent A"
	}
	w.Header().Set("WWW-Authenticate", challenge)
	// The body is not read for a stranger: the connection is not kept for another request.
	w.Header().Set("Connection", "close")
	http.Error(w, msg, http.StatusUnauthorized)
}

// admit takes one request from the token's rate limit, or says in how many seconds to retry.
func (f *FrontDoor) admit(tokenID string) (retryAfter int, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	f.pruneLocked(now)
	l, found := f.limiters[tokenID]
	if !found {
		l = &tokenLimiter{lim: rate.NewLimiter(rate.Limit(f.cfg.RateLimit), f.cfg.RateBurst)}
		f.limiters[tokenID] = l
	}
	l.used = now
	res := l.lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return max(1, int(math.Ceil(d.Seconds()))), false
	}
	return 0, true
}

// pruneEvery is how often idle limiters and agent servers are dropped. Must hold f.mu.
const pruneEvery = time.Minute

func (f *FrontDoor) pruneLocked(now time.Time) {
	if now.Sub(f.pruned) < pruneEvery {
		return
	}
	f.pruned = now
	for id, l := range f.limiters {
		if now.Sub(l.used) > 10*time.Minute {
			delete(f.limiters, id)
		}
	}
	for k, a := range f.agents {
		if a.idle(now, f.cfg.SessionIdleTimeout) {
			delete(f.agents, k)
		}
	}
}

// agent is the agent server of a token's run and agent, made on first use.
func (f *FrontDoor) agent(t *AgentToken) *agentServer {
	k := agentKey{t.Tenant, t.RunID, t.Agent}
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.agents[k]
	if !ok {
		a = newAgentServer(f, k)
		f.agents[k] = a
	}
	a.touch(t)
	return a
}

// server is the SDK's getServer: the agent server of the request's token, holding the
// agent's listing before a session connects to it. The SDK tells every connected session of
// each tool added: a listing first read at a session's first tools/list would be followed by
// a tools/list_changed announcing the very tools the client was just given.
func (f *FrontDoor) server(r *http.Request) *mcp.Server {
	t, ok := tokenFrom(r.Context())
	if !ok {
		return nil
	}
	a := f.agent(t)
	if err := a.fill(r.Context()); err != nil {
		f.log.Warn("the agent's listing could not be read before its first session; its first tools/list reads it", "run", t.RunID, "agent", t.Agent, "err", err)
	}
	return a.server
}

// warnOnly passes a handler's warnings and errors on, and nothing below.
type warnOnly struct{ slog.Handler }

func (w warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.Handler.Enabled(ctx, l)
}

func (w warnOnly) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnOnly{w.Handler.WithAttrs(attrs)}
}

func (w warnOnly) WithGroup(name string) slog.Handler { return warnOnly{w.Handler.WithGroup(name)} }
