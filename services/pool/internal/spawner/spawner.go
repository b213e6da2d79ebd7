// Package spawner is the only code in Ringfence that starts MCP server
// processes. It turns a resolved registration (a Spec) into a connected MCP
// client session, on one of three back ends:
//
//   - docker (the default for stdio servers): the command runs inside the
//     operator's digest-pinned isolation image under a fixed, hardened
//     container profile that nothing in a registration can change;
//   - host (development only, behind AllowUnisolated): the command runs as a
//     host process with nothing but the allowlisted environment;
//   - remote (streamable HTTP and SSE servers): no process at all, an HTTPS
//     client that adds the registration's resolved headers.
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
)

// ProtocolVersion is the MCP version every session asks for. Pinning it makes
// the client open with initialize, which every server speaks; go-sdk's newer
// default first sends server/discover, which a stdio server that ignores
// unknown methods never answers.
const ProtocolVersion = "2025-11-25"

// IsolationImageEnv names the setting an operator must provide before any
// stdio server can run.
const IsolationImageEnv = "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE"

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
	// Purpose is PurposeDiscovery or PurposeRun.
	Purpose string
	// RunID labels the container; it may be empty.
	RunID string
	// OnToolListChanged, when set, is called on notifications/tools/list_changed.
	// It may call Session.ListTools.
	OnToolListChanged func()
}

// Spawner starts servers. *Router is the implementation.
type Spawner interface {
	Spawn(ctx context.Context, spec Spec) (*Session, error)
}

var _ Spawner = (*Router)(nil)

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
	// InstanceID names this process; random when empty.
	InstanceID string

	Logger *slog.Logger
	// Docker is the engine client; nil means client.New(client.FromEnv),
	// created when an Image is configured and closed by Router.Close.
	Docker DockerAPI
	// RootCAs, when set, replaces the system roots for remote servers.
	RootCAs *x509.CertPool

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

// Router picks a back end per spec and keeps track of the sessions it
// started, so that Close can stop them all.
type Router struct {
	cfg    Config
	image  *ImageRef
	docker *dockerBackend
	log    *slog.Logger

	mu       sync.Mutex
	sessions map[*Session]struct{}
	closed   bool
}

// New validates cfg and returns a Router. It does not contact the engine;
// call Preflight for that.
func New(cfg Config) (*Router, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	r := &Router{cfg: cfg, log: cfg.Logger, sessions: map[*Session]struct{}{}}
	if cfg.Image != "" {
		ref, err := ParseImageRef(cfg.Image)
		if err != nil {
			return nil, err
		}
		r.image = &ref
		d, err := newDockerBackend(r)
		if err != nil {
			return nil, err
		}
		r.docker = d
	}
	return r, nil
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
	var (
		s   *Session
		err error
	)
	switch spec.Transport {
	case TransportStdio:
		switch {
		case r.docker != nil:
			s, err = r.docker.spawn(ctx, &spec)
		case r.cfg.AllowUnisolated:
			s, err = r.spawnHost(ctx, &spec)
		default:
			return nil, newError(ClassIsolationRequired,
				"stdio MCP servers run only inside the isolation image and none is configured: set %s to a pinned image (build one with `ringfence image build`)", IsolationImageEnv)
		}
	default:
		s, err = r.spawnRemote(ctx, &spec)
	}
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

// Close stops every session this Router started, removes any container of
// this instance that is still left, and closes an engine client it created.
// It is bounded by the sessions' close bounds, not by ctx alone: a session
// is always torn down.
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
	if r.docker != nil {
		if _, err := r.docker.sweep(context.WithoutCancel(ctx), sweepOwn); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, r.docker.close())
	}
	return errors.Join(errs...)
}

// Report is what Preflight found.
type Report struct {
	// Isolation is "docker", "unisolated" (host processes, development) or
	// "none" (stdio servers are refused with isolation_required).
	Isolation string
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

// Preflight checks that the isolation image exists and can be used, and
// removes every container an earlier instance of this pool left behind. Run
// it at start; it is safe to run again while sessions are open.
func (r *Router) Preflight(ctx context.Context) (Report, error) {
	switch {
	case r.docker != nil:
	case r.cfg.AllowUnisolated:
		r.log.Warn("spawner: no isolation image; stdio MCP servers will run UNISOLATED on the host (development only)")
		return Report{Isolation: "unisolated"}, nil
	default:
		return Report{Isolation: "none"}, nil
	}
	rep := Report{Isolation: "docker", ImageRef: r.image.Ref}
	img, err := r.docker.inspectImage(ctx)
	if err != nil {
		return rep, err
	}
	rep.ImageID, rep.ImageEnvKeys = img.id, img.envKeys
	n, err := r.docker.sweep(ctx, sweepOthers)
	rep.Swept = n
	if err != nil {
		return rep, err
	}
	return rep, nil
}

// Sweep force-removes every container labelled with this PoolID, this
// instance's included: for a pool that shuts down for good, after its
// sessions are closed (Close itself removes only this instance's leftovers;
// Preflight only earlier instances'). It returns how many it removed.
func (r *Router) Sweep(ctx context.Context) (int, error) {
	if r.docker == nil {
		return 0, nil
	}
	return r.docker.sweep(ctx, sweepAll)
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
	case PurposeDiscovery, PurposeRun:
	default:
		return newError(ClassInvalidSpec, "purpose %s must be %q or %q", clipQuote(s.Purpose), PurposeDiscovery, PurposeRun)
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

func clipQuote(s string) string { return fmt.Sprintf("%q", clip(s, 64)) }

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newClient is the one MCP client configuration every back end uses.
func newClient(spec *Spec) *mcp.Client {
	onChanged := spec.OnToolListChanged
	opts := &mcp.ClientOptions{
		// Advertise nothing: the pool serves no roots, sampling or
		// elicitation to a server.
		Capabilities: &mcp.ClientCapabilities{},
		// The multi-round-trip middleware would re-send a call on its own;
		// every call must go through the pool's gate exactly once.
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
	}
	if onChanged != nil {
		opts.ToolListChangedHandler = func(context.Context, *mcp.ToolListChangedRequest) { onChanged() }
	}
	return mcp.NewClient(&mcp.Implementation{Name: "ringfence-pool", Version: "1"}, opts)
}
