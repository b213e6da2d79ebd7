// Package spawner is the only code in Ringfence that starts MCP server
// processes. It turns a resolved registration (a Spec) into a connected MCP
// client session on a back end (Backend), chosen per transport by a Router:
//
//   - Docker (stdio servers): the command runs inside the operator's
//     digest-pinned isolation image under a fixed, hardened container profile
//     that nothing in a registration can change, on the OCI runtime the
//     operator chose (runc, runsc, …);
//   - Host (stdio servers, development only, behind AllowUnisolated): the
//     command runs as a host process with nothing but the allowlisted
//     environment;
//   - Remote (streamable HTTP and SSE servers): no process at all, an HTTPS
//     client that adds the registration's resolved headers.
//
// Another back end (a Kubernetes pod, another sandbox) is a package of its
// own: it starts the server and builds the session with the Kit, which holds
// what every session shares (the traffic bounds, the stdout filter and
// stderr tail, the classification of failures).
//
// Every failure is an *Error with a Class an operator can act on and a
// message that is safe to show; every failure path removes what it created.
package spawner

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ringfence/ringfence/internal/mcpserver"
)

// Transports a Spec may name.
const (
	TransportStdio          = "stdio"
	TransportStreamableHTTP = "streamable_http"
	TransportSSE            = "sse"
)

// Purposes a Spec may name (recorded as a container label).
const (
	PurposeDiscovery = "discovery"
	PurposeRun       = "run"
	// PurposeWarm is a container started before any run needs it, which one run takes later.
	// Its labels cannot change after creation, so it keeps purpose warm and an empty run label
	// for life; the pool records the run that took it.
	PurposeWarm = "warm"
)

// ProtocolVersion is the MCP version every session asks for. Pinning it makes
// the client open with initialize, which every server speaks; go-sdk's newer
// default first sends server/discover, which a stdio server that ignores
// unknown methods never answers.
const ProtocolVersion = "2025-11-25"

// IsolationImageEnv names the setting an operator must provide before any
// stdio server can run.
const IsolationImageEnv = "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE"

// RuntimeEnv names the setting that picks the OCI runtime of the isolation containers.
const RuntimeEnv = "RINGFENCE_SANDBOX__RUNTIME"

// Spec is one server to start, resolved from the registry (secrets in
// clear, in memory only).
type Spec struct {
	ServerRef string
	// Transport is TransportStdio, TransportStreamableHTTP or TransportSSE.
	Transport string
	// Command is, for stdio, what runs inside the image, resolved through
	// the image's PATH.
	Command string
	Args    []string
	// Env is, for stdio, already filtered to the operator's allowlist by the
	// caller; the spawner checks it again.
	Env map[string]string
	// URL is, for remote transports, the server's endpoint.
	URL string
	// Headers are, for remote transports, header name to resolved secret.
	Headers map[string]string
	// HandshakeTimeout bounds initialize; zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// Purpose is PurposeDiscovery, PurposeRun or PurposeWarm.
	Purpose string
	// RunID labels the container; it may be empty.
	RunID string
	// OnToolListChanged, when set, is called on notifications/tools/list_changed.
	// It may call Session.ListTools.
	OnToolListChanged func()
	// MaxResultBytes bounds an answer to tools/call, as the server writes it (its JSON-RPC
	// message): the registration's max_result_bytes. Zero means DefaultMaxResultBytes.
	MaxResultBytes int
}

// Defaults for Config and Spec fields left zero.
const (
	DefaultNetwork          = "none"
	DefaultNanoCPUs         = 1_000_000_000
	DefaultMemoryBytes      = 512 << 20
	DefaultPidsLimit        = 128
	DefaultTmpfsSizeBytes   = 64 << 20
	DefaultHostPATH         = "/usr/local/bin:/usr/bin:/bin"
	DefaultHandshakeTimeout = 2 * time.Second
	DefaultStartTimeout     = 30 * time.Second
	DefaultCloseTimeout     = 3 * time.Second
	DefaultListTimeout      = 30 * time.Second
	DefaultCallTimeout      = 5 * time.Minute
	DefaultMaxTools         = 4096
	// DefaultMaxListingBytes bounds a whole tools/list across its pages, as re-encoded:
	// twice the declaration screen's own limit (16 MiB), which can only judge a listing
	// once it is held, so a server paging on cannot grow the pool's memory without end.
	DefaultMaxListingBytes = 32 << 20
	DefaultMaxMessageBytes = 16 << 20
	DefaultMaxResultBytes  = 16 << 20
	DefaultStderrTailBytes = 8 << 10
)

// Config is the operator's side of spawning: the isolation profile's knobs
// and the spawner's bounds. Nothing here comes from a registration.
type Config struct {
	// Image is the isolation image, pinned: "name@sha256:<64 hex>" or
	// "sha256:<64 hex>". Empty means no isolation image is configured.
	Image string
	// Network is the container network; "none" unless the operator names
	// one. "host" and "container:…" are refused.
	Network string
	// AllowedEnvKeys is the operator's environment allowlist.
	AllowedEnvKeys []string
	// Runtime is the engine's OCI runtime the containers run on (e.g. "runsc" for gVisor);
	// empty is the engine's default. Preflight refuses one the engine does not have.
	Runtime string
	// Container limits.
	NanoCPUs       int64
	MemoryBytes    int64
	PidsLimit      int64
	TmpfsSizeBytes int64

	// AllowUnisolated enables the host back end for stdio servers when no
	// Image is set. Development only: the caller refuses it in production.
	AllowUnisolated bool
	// HostPATH is the only PATH a host process gets and the one its command
	// is resolved through.
	HostPATH string

	// PoolID names this pool, stable across its restarts; containers are
	// labelled with it so that a restarted pool can sweep what it orphaned.
	// It must be unique among pools sharing an engine.
	PoolID string
	// InstanceID names this process; random when empty. No two Docker back ends may share
	// one: each removes, while it runs, every container of its instance it does not hold.
	InstanceID string

	Logger *slog.Logger
	// Docker is the engine client; nil means client.New(client.FromEnv),
	// created when an Image is configured and closed by Router.Close.
	Docker DockerAPI
	// RootCAs, when set, replaces the system roots for remote servers.
	RootCAs *x509.CertPool

	// ResultBudget, when set, bounds the bytes of large messages (tool results above all)
	// every session of the Router holds at once; nil bounds only each message.
	ResultBudget *Budget

	// Bounds; zero means the Default… constant.
	StartTimeout    time.Duration
	CloseTimeout    time.Duration
	ListTimeout     time.Duration
	CallTimeout     time.Duration
	MaxTools        int
	MaxListingBytes int
	MaxMessageBytes int
	StderrTailBytes int
}

var labelValue = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

func (c *Config) normalize() error {
	if c.Network == "" {
		c.Network = DefaultNetwork
	}
	if c.Network == "host" || strings.HasPrefix(c.Network, "container:") {
		return fmt.Errorf("spawner: network %q shares a namespace with the host or another container and would undo the isolation; use none or a named network", c.Network)
	}
	if !labelValue.MatchString(c.Network) {
		return fmt.Errorf("spawner: network %q is not a valid network name", c.Network)
	}
	if c.Runtime != "" && !labelValue.MatchString(c.Runtime) {
		return fmt.Errorf("spawner: runtime %q is not a valid runtime name", c.Runtime)
	}
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.NanoCPUs, DefaultNanoCPUs)
	def(&c.MemoryBytes, DefaultMemoryBytes)
	def(&c.PidsLimit, DefaultPidsLimit)
	def(&c.TmpfsSizeBytes, DefaultTmpfsSizeBytes)
	switch {
	case c.NanoCPUs < 0:
		return errors.New("spawner: the CPU limit must be positive")
	case c.MemoryBytes < 6<<20:
		return errors.New("spawner: the memory limit must be at least 6 MiB (the engine's minimum)")
	case c.PidsLimit < 1:
		return errors.New("spawner: the PID limit must be positive")
	case c.TmpfsSizeBytes < 1:
		return errors.New("spawner: the /tmp size must be positive")
	}
	for _, k := range c.AllowedEnvKeys {
		if reason := mcpserver.ControlKeyReason(k); reason != "" {
			return fmt.Errorf("spawner: the isolation allowlist names %s, which is refused: %s", mcpserver.QuoteKey(k), reason)
		}
	}
	if c.HostPATH == "" {
		c.HostPATH = DefaultHostPATH
	}
	if c.InstanceID == "" {
		c.InstanceID = randomID()
	}
	if c.Image != "" {
		if !labelValue.MatchString(c.PoolID) {
			return fmt.Errorf("spawner: PoolID %q must be set (1 to 128 of A-Z a-z 0-9 _ . : -) when an isolation image is configured: it labels the containers a restarted pool sweeps", c.PoolID)
		}
		if !labelValue.MatchString(c.InstanceID) {
			return fmt.Errorf("spawner: InstanceID %q is not a valid label value", c.InstanceID)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defd(&c.StartTimeout, DefaultStartTimeout)
	defd(&c.CloseTimeout, DefaultCloseTimeout)
	defd(&c.ListTimeout, DefaultListTimeout)
	defd(&c.CallTimeout, DefaultCallTimeout)
	defi := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defi(&c.MaxTools, DefaultMaxTools)
	defi(&c.MaxListingBytes, DefaultMaxListingBytes)
	defi(&c.MaxMessageBytes, DefaultMaxMessageBytes)
	defi(&c.StderrTailBytes, DefaultStderrTailBytes)
	return nil
}

// Router hands each spec to the back end that serves its transport and keeps track of the
// sessions it started, so that Close can stop them all.
type Router struct {
	cfg      Config
	log      *slog.Logger
	kit      *Kit
	backends []Backend

	mu       sync.Mutex
	sessions map[*Session]struct{}
	closed   bool
}

// NewRouter validates cfg (the bounds every session keeps) and returns a Router over
// backends; the first that serves a spec's transport starts it. A stdio spec no back end
// serves is refused as isolation_required: stdio servers run only where a back end isolates
// them (or Host, which development allows explicitly). The Router closes the back ends.
func NewRouter(cfg Config, backends ...Backend) (*Router, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	r := &Router{cfg: cfg, log: cfg.Logger, backends: backends, sessions: map[*Session]struct{}{}}
	r.kit = &Kit{r: r}
	return r, nil
}

// New is NewRouter over the back ends cfg describes: Docker when an Image is configured, else
// Host when AllowUnisolated is set, and Remote. It does not contact the engine; call
// Preflight for that.
func New(cfg Config) (*Router, error) {
	// Normalized once, so the Router and its back ends share one InstanceID.
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	backends, err := DefaultBackends(cfg)
	if err != nil {
		return nil, err
	}
	return NewRouter(cfg, backends...)
}

// DefaultBackends are the back ends cfg describes (see New). A Router built over them should
// get the cfg they were given, InstanceID set, so that all agree on it.
func DefaultBackends(cfg Config) ([]Backend, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	var stdio Backend
	switch {
	case cfg.Image != "":
		d, err := NewDocker(cfg)
		if err != nil {
			return nil, err
		}
		stdio = d
	case cfg.AllowUnisolated:
		h, err := NewHost(cfg)
		if err != nil {
			return nil, err
		}
		stdio = h
	}
	remote, err := NewRemote(cfg)
	if err != nil {
		return nil, err
	}
	if stdio == nil {
		return []Backend{remote}, nil
	}
	return []Backend{stdio, remote}, nil
}

// backendFor is the back end that starts servers of transport, or nil.
func (r *Router) backendFor(transport string) Backend {
	for _, b := range r.backends {
		if b.Serves(transport) {
			return b
		}
	}
	return nil
}

// Spawn starts the server described by spec and returns a connected,
// initialized session. On failure nothing it started is left running.
func (r *Router) Spawn(ctx context.Context, spec Spec) (*Session, error) {
	if err := checkSpec(&spec); err != nil {
		return nil, err
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, newError(ClassSpawnFailed, "the spawner is shut down")
	}
	b := r.backendFor(spec.Transport)
	switch {
	case b == nil && spec.Transport == TransportStdio:
		return nil, newError(ClassIsolationRequired,
			"stdio MCP servers run only inside the isolation image and none is configured: set %s to a pinned image (build one with `ringfence image build`)", IsolationImageEnv)
	case b == nil:
		return nil, newError(ClassInvalidSpec, "no back end of this pool serves transport %s", spec.Transport)
	}
	s, err := b.Spawn(ctx, &spec, r.kit)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		_ = s.Close(context.WithoutCancel(ctx))
		return nil, newError(ClassSpawnFailed, "the spawner is shut down")
	}
	// A session may already be closing: the spawner stops a server that breaks a protocol
	// bound on its own, and forget has then run or will find nothing.
	if !s.closing.Load() {
		r.sessions[s] = struct{}{}
	}
	r.mu.Unlock()
	return s, nil
}

func (r *Router) forget(s *Session) {
	r.mu.Lock()
	delete(r.sessions, s)
	r.mu.Unlock()
}

// Close stops every session this Router started, then closes its back ends (which remove any
// container of this instance still left and close the clients they created). It is bounded by
// the sessions' close bounds, not by ctx alone: a session is always torn down.
func (r *Router) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	sessions := make([]*Session, 0, len(r.sessions))
	for s := range r.sessions {
		sessions = append(sessions, s)
	}
	r.mu.Unlock()

	var wg sync.WaitGroup
	errs := make([]error, len(sessions))
	for i, s := range sessions {
		wg.Go(func() { errs[i] = s.Close(ctx) })
	}
	wg.Wait()
	for _, b := range r.backends {
		errs = append(errs, b.Close(ctx))
	}
	return errors.Join(errs...)
}

// Report is what Preflight found.
type Report struct {
	// Isolation names the back end of stdio servers: "docker" (or another isolating back
	// end's name), "unisolated" (host processes, development) or "none" (stdio servers are
	// refused with isolation_required).
	Isolation string
	// Runtime is the OCI runtime containers run on (the configured one, or the engine's
	// default).
	Runtime string
	// ImageRef is the configured reference; ImageID what it resolved to.
	ImageRef string
	ImageID  string
	// ImageEnvKeys are the keys of the image's own ENV (values are not
	// reported: an image may carry secrets).
	ImageEnvKeys []string
	// Swept is how many containers of earlier instances of this pool were
	// removed.
	Swept int
}

// Preflight runs every back end's checks (an image, a runtime) and sweep of what an earlier
// instance of this pool left. Run it at start; it is safe to run again while sessions are
// open. The report is that of the back end of stdio servers.
func (r *Router) Preflight(ctx context.Context) (Report, error) {
	rep := Report{Isolation: "none"}
	for _, b := range r.backends {
		got, err := b.Preflight(ctx)
		if b == r.backendFor(TransportStdio) {
			rep = got
		}
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// Sweep removes everything any instance of this pool left with its back ends, this
// instance's included: for a pool that shuts down for good, after its sessions are closed
// (Close itself removes only this instance's leftovers; Preflight only earlier instances').
// It returns how many it removed.
func (r *Router) Sweep(ctx context.Context) (int, error) {
	total := 0
	var errs []error
	for _, b := range r.backends {
		n, err := b.Sweep(ctx)
		total += n
		errs = append(errs, err)
	}
	return total, errors.Join(errs...)
}

// Reconciled is how many containers of this instance that no session held (a removal that
// failed, a create whose answer was lost) its back ends removed while they ran: those that
// reconcile (Docker) say so with a Reconciled method.
func (r *Router) Reconciled() int64 {
	var n int64
	for _, b := range r.backends {
		if rc, ok := b.(interface{ Reconciled() int64 }); ok {
			n += rc.Reconciled()
		}
	}
	return n
}

var serverRefSyntax = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// Bounds on a spec's command line and headers.
const (
	maxCommandLen = 4 << 10
	maxArgs       = 256
	maxArgLen     = 8 << 10
	maxRunIDLen   = 128
	maxHeaders    = 64
)

func checkSpec(s *Spec) error {
	if !serverRefSyntax.MatchString(s.ServerRef) {
		return newError(ClassInvalidSpec, "server ref %s must match ^[a-z0-9_-]{1,64}$", clipQuote(s.ServerRef))
	}
	switch s.Purpose {
	case PurposeDiscovery, PurposeRun, PurposeWarm:
	default:
		return newError(ClassInvalidSpec, "purpose %s must be %q, %q or %q", clipQuote(s.Purpose), PurposeDiscovery, PurposeRun, PurposeWarm)
	}
	if len(s.RunID) > maxRunIDLen || strings.ContainsFunc(s.RunID, isControl) {
		return newError(ClassInvalidSpec, "run id must be at most %d printable characters", maxRunIDLen)
	}
	if s.HandshakeTimeout <= 0 {
		s.HandshakeTimeout = DefaultHandshakeTimeout
	}
	switch s.Transport {
	case TransportStdio:
		if s.Command == "" || len(s.Command) > maxCommandLen || strings.ContainsFunc(s.Command, isControl) {
			return newError(ClassInvalidSpec, "a stdio server needs a command of 1 to %d printable characters", maxCommandLen)
		}
		if len(s.Args) > maxArgs {
			return newError(ClassInvalidSpec, "%d arguments given, at most %d are allowed", len(s.Args), maxArgs)
		}
		for i, a := range s.Args {
			if len(a) > maxArgLen || strings.IndexByte(a, 0) >= 0 {
				return newError(ClassInvalidSpec, "argument %d is longer than %d bytes or contains a NUL byte", i, maxArgLen)
			}
		}
		if s.URL != "" || len(s.Headers) > 0 {
			return newError(ClassInvalidSpec, "a stdio server takes no URL or headers")
		}
	case TransportStreamableHTTP, TransportSSE:
		if s.Command != "" || len(s.Args) > 0 || len(s.Env) > 0 {
			return newError(ClassInvalidSpec, "a remote server takes no command, arguments or environment")
		}
	default:
		return newError(ClassInvalidSpec, "transport %s must be %q, %q or %q", clipQuote(s.Transport), TransportStdio, TransportStreamableHTTP, TransportSSE)
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// resultCap is the bound on an answer to tools/call of spec's server.
func resultCap(spec *Spec) int {
	if spec.MaxResultBytes > 0 {
		return spec.MaxResultBytes
	}
	return DefaultMaxResultBytes
}

func clipQuote(s string) string { return fmt.Sprintf("%q", clip(s, 64)) }

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newClient is the one MCP client configuration every back end uses.
func newClient(spec *Spec, g *trafficGuard) *mcp.Client {
	onChanged := spec.OnToolListChanged
	opts := &mcp.ClientOptions{
		// Advertise nothing: the pool serves no roots, sampling or
		// elicitation to a server.
		Capabilities: &mcp.ClientCapabilities{},
		// The multi-round-trip middleware would re-send a call on its own;
		// every call must go through the pool's gate exactly once.
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
		// A call's progress goes to its caller alone (progress.go). A watched (stdio)
		// connection delivers it as it reads it, in order with the call's answer.
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			if !g.watched.Load() {
				g.progress.deliver(req.Params)
			}
		},
	}
	if onChanged != nil {
		opts.ToolListChangedHandler = func(context.Context, *mcp.ToolListChangedRequest) { onChanged() }
	}
	return mcp.NewClient(&mcp.Implementation{Name: "ringfence-pool", Version: "1"}, opts)
}
