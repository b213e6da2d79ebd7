// Package pool is the pool service: the only part of Ringfence that starts MCP servers. It
// runs on hardened hosts, apart from the authoring plane. Discovery starts a registered server
// in isolation, lists its tools with their pins and screen findings, and stops it; runs get
// their own sessions, and every call passes every gate before anything reaches a server, and
// lands in the audit log whatever its outcome.
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/documents"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/mcpgate/schemas"
	"github.com/ringfence/ringfence/services/pool/internal/store"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// Registry is what the pool needs from the registry: registrations with their secrets (to
// start servers) and their policies (the ceiling, re-checked before every call). The registry
// service implements it in-process; peers.Registry over mutual TLS.
type Registry interface {
	ResolveRegistration(ctx context.Context, ref string) (*mcpserver.Resolved, error)
	ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error)
}

// Versions serves published graph versions (version 0 means the latest): the publisher
// in-process, or peers.Publisher.
type Versions interface {
	PublishedVersion(ctx context.Context, tenant, graphID string, version int64) (*graph.Version, error)
}

// Spawner starts the MCP servers of discovery and runs: a spawner.Router over the back ends
// the deployment chose (internal/app wires it; the pool never builds an engine client
// itself). The pool owns it once it is passed to Open: Close closes it, and so does an Open
// that fails.
type Spawner interface {
	Spawn(ctx context.Context, spec spawner.Spec) (*spawner.Session, error)
	Preflight(ctx context.Context) (spawner.Report, error)
	Close(ctx context.Context) error
}

var _ Spawner = (*spawner.Router)(nil)

// Config holds the service's dependencies and limits.
type Config struct {
	// DBPath is the pool's bbolt file (runs, approvals, agent tokens, users' OAuth sign-ins,
	// documents). With Etcd set, the run records, agent tokens and sign-ins live in etcd
	// instead, and the rest stays here.
	DBPath string
	// Etcd, when set, keeps the run records in etcd under <EtcdRoot>/pool/, shared by every
	// pool host, with the hosts' leases, the agent tokens and the users' OAuth sign-ins
	// (store.backend=etcd).
	Etcd     *clientv3.Client
	EtcdRoot string
	// HostID names this pool host among the hosts sharing Etcd: the owner written in each run
	// it hosts, and its lease's key (pool.host_id). HostAddr is where the other hosts reach its
	// internal plane (pool.advertise_addr), and Peers how they are reached. HostLeaseTTL is how
	// long the cluster waits to hear from a host before its runs fail (DefaultHostLeaseTTL when
	// zero). All required with Etcd, except the TTL; unused without.
	HostID       string
	HostAddr     string
	HostLeaseTTL time.Duration
	Peers        HostPeers
	// SpoolDir holds the audit spool's segment files; empty means pool-audit-spool beside
	// DBPath. Every call waits for its record there, so it has files of its own (one fdatasync
	// per commit) instead of a bucket in DBPath.
	SpoolDir string
	Registry Registry
	Versions Versions
	// AuditSink receives the spooled attempt records: the audit service in-process, or
	// peers.Audit.
	AuditSink audit.Sink
	// SpoolMaxRecords and OnSpoolFull bound the audit spool.
	SpoolMaxRecords int
	OnSpoolFull     audit.FullPolicy
	Spawner         Spawner
	// DriftMaxAge: a listing older than this is taken again before a call; 0 re-lists before
	// every call.
	DriftMaxAge    time.Duration
	RunIdleTimeout time.Duration
	// PausedRunTimeout ends a run paused for longer (an approval that never came), so paused
	// runs cannot hold MaxRuns forever; 0 keeps them until they are ended.
	PausedRunTimeout time.Duration
	MaxRuns          int
	MaxSessions      int
	// AllowAdvisory honours a graph's capability_mode advisory: the agent floor is recorded
	// rather than enforced. Off (the default), every graph is enforced: advisory is the
	// deployment's choice, not a graph author's.
	AllowAdvisory bool
	// AllowInlineMCPServers runs the deprecated inline mcp_servers of an agent
	// (dev.allow_inline_mcp_servers; production refuses it at start). They have no registry
	// row, so no ceiling, and nothing about their tools is pinned.
	AllowInlineMCPServers bool
	// Warm lists the registrations that ask for warm containers (prewarm): the registry
	// in-process, or peers.Registry. nil keeps none.
	Warm WarmSource
	// MaxWarm caps the warm sessions of all registrations together (pool.max_warm); 0 keeps
	// none. Each also counts under MaxSessions.
	MaxWarm int
	// WarmMaxAge recycles a warm session that waited this long (pool.warm_max_age; zero means
	// DefaultWarmMaxAge).
	WarmMaxAge time.Duration
	// WarmRefresh is how often the registry is asked which registrations want warm sessions
	// and the warm sets are checked (zero means 2s).
	WarmRefresh time.Duration
	// ApprovalTimeout expires a call that waits for an approval nobody gave (refused as
	// approval_expired), and is how long an approved call's outcome waits for the caller's
	// retry; default 15 minutes.
	ApprovalTimeout time.Duration
	// Documents resolves my-documents:// references: a platform's document service
	// (documents.HTTP, documents.url_template); nil is the pool's built-in store, which
	// PutDocument fills (and which is off when Documents is set).
	Documents documents.Resolver
	// DocumentMaxBytes bounds one document (stored or fetched); DocumentMaxCallBytes the
	// documents one call receives together; DocumentMaxTenantBytes what one tenant stores.
	// Defaults: 10 MiB, 16 MiB, 1 GiB.
	DocumentMaxBytes       int64
	DocumentMaxCallBytes   int64
	DocumentMaxTenantBytes int64
	// FrontDoorURL is where the MCP front door serves /mcp (what CreateAgentToken answers and
	// a client configuration names); empty means the front door is off, and no agent token is
	// minted.
	FrontDoorURL string
	// AgentTokenTTL is an agent token's lifetime when CreateAgentToken names none, and
	// AgentTokenMaxTTL the longest it may ask for (defaults: DefaultAgentTokenTTL,
	// DefaultAgentTokenMaxTTL).
	AgentTokenTTL    time.Duration
	AgentTokenMaxTTL time.Duration
	// Secrets seals the users' OAuth tokens and the PKCE verifiers of pending sign-ins in
	// pool.db, or etcd (the deployment's secrets key: every pool host sharing etcd needs the
	// same one); nil turns sign-in off: servers that sign users in are refused.
	Secrets *secretbox.Box
	// OAuthCallbackURL is the redirect URI of every sign-in: /v1/oauth/callback on the HTTP
	// listener as the user's browser reaches it (oauth.callback_url). Empty turns sign-in off.
	OAuthCallbackURL string
	// OAuthClientMetadataURL is the URL of the pool's client ID metadata document, and the
	// client id it stands for (oauth.client_metadata_url); empty is the callback's origin with
	// OAuthClientMetadataPath. Authorization servers accept only an https one.
	OAuthClientMetadataURL string
	// OAuthStateTTL is how long an authorization URL is good (default
	// DefaultOAuthStateTTL); OAuthRefreshBefore how long before its expiry a user's token is
	// refreshed (default DefaultOAuthRefreshBefore).
	OAuthStateTTL      time.Duration
	OAuthRefreshBefore time.Duration
	// OAuthHTTPClient, when set, makes the metadata, token and refresh requests (tests: a
	// client that trusts their CA); nil is a bounded client that follows no redirect.
	OAuthHTTPClient *http.Client
	// Now, when set, is the wall clock (tests): the times the pool stores and shows, and the
	// expiries it reads back (clock.go); nil is time.Now.
	Now func() time.Time
	// Elapsed, when set, is the monotonic clock (tests): the time since the service opened,
	// which a step of the wall clock does not move; nil is Go's monotonic clock.
	Elapsed func() time.Duration
	Logger  *slog.Logger
}

// Service implements PoolService.
type Service struct {
	cfg     Config
	log     *slog.Logger
	errors  grpcserver.ErrorTable
	spawner Spawner
	// stdio is whether a back end starts stdio servers (isolated, or unisolated where
	// development allows it); without one they are refused before anything starts.
	stdio bool
	store *store.Store
	// runStore keeps the run records: store (bbolt) or etcd. host is the owner this pool
	// writes in its runs: Config.HostID on etcd, empty on bbolt (one host).
	runStore RunStore
	host     string
	// tokens keeps the agent tokens, and oauth the users' sign-ins: store (bbolt), or etcd
	// beside the runs.
	tokens TokenStore
	oauth  OAuthStore
	// hosts is the deployment of several pool hosts on etcd (hosts.go); nil on bbolt.
	hosts     *hosts
	spool     *audit.Spool
	forwarder *audit.Forwarder
	watchers  sync.WaitGroup // one per live session, until it ends (watch)
	inflight  *inflight      // tool calls in progress
	schemas   *schemas.Cache
	metrics   *metrics
	// documents resolves my-documents:// references: Config.Documents, else the built-in
	// store.
	documents documents.Resolver

	runs         runs
	liveSessions atomic.Int64 // run sessions and warm ones, under MaxSessions

	// opened starts the monotonic clock (clock.go); tokenLives, oauthLives and signInLives
	// are the lifetimes this process has judged of agent tokens (by id), of users' tokens
	// until their refresh (by the access token's hash) and of the sign-ins it began (by the
	// state's hash).
	opened                              time.Time
	tokenLives, oauthLives, signInLives lifetimes
	// lockWait, when set (tests), replaces refreshLockWait.
	lockWait time.Duration

	// warm holds the warm sessions (warm.go); warmWork is its keeper and what the keeper
	// started, which warmCancel ends.
	warm       *warmSet
	warmWork   sync.WaitGroup
	warmCancel context.CancelFunc

	cancel context.CancelFunc
	bg     sync.WaitGroup

	// onToolsChanged hears that an agent's listing in a run changed (the MCP front door tells
	// the agents' clients); nil without a front door.
	onToolsChanged atomic.Pointer[func(tenant, runID, agent, serverRef string)]
	// toolWatches are the WatchAgentTools streams this host serves to other hosts' front
	// doors, and heldWatches counts those it holds open to other hosts (toolwatch.go).
	toolWatches listingWatches
	heldWatches atomic.Int64

	// bgCtx is the context of background work, which goBackground starts under bg until
	// Close; bgClosed says Close began.
	bgCtx    context.Context
	bgMu     sync.Mutex
	bgClosed bool
}

// toolsChanged passes a change of a run's listings on: agent's (every agent's for ""), because
// server ref said its tools changed or gained them, or because tools were loaded (ref ""). The
// front door here and the watches of other hosts' front doors hear it.
func (s *Service) toolsChanged(id runIdentity, agent, ref string) {
	if f := s.onToolsChanged.Load(); f != nil {
		(*f)(id.Tenant, id.ID, agent, ref)
	}
	s.listingChanged(runKey{id.Tenant, id.ID}, toolChange{agent: agent, ref: ref})
}

// goBackground runs fn under the service's background context until Close, which waits for
// it; after Close began it runs nothing and says so.
func (s *Service) goBackground(fn func(context.Context)) bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgClosed {
		return false
	}
	s.bg.Go(func() { fn(s.bgCtx) })
	return true
}

var errorCodes = grpcserver.MergeCodes(etcdstore.ErrorCodes, map[error]codes.Code{
	mcpserver.ErrNotRegistered:     codes.NotFound,
	discovery.ErrIsolationRequired: codes.Unavailable,
	errRunNotFound:                 codes.NotFound,
	errRunExists:                   codes.AlreadyExists,
	errRunNotRunning:               codes.FailedPrecondition,
	errRunNotPaused:                codes.FailedPrecondition,
	errRunEnded:                    codes.FailedPrecondition,
	errRunLeft:                     codes.Unavailable,
	errTooManyRuns:                 codes.ResourceExhausted,
	errVersionGone:                 codes.NotFound,
	errUnknownAgent:                codes.NotFound,
	errApprovalNotFound:            codes.NotFound,
	errApprovalDecided:             codes.FailedPrecondition,
	errDocumentNotFound:            codes.NotFound,
	errDocumentsElsewhere:          codes.FailedPrecondition,
	errDocumentQuota:               codes.ResourceExhausted,
	errRegistryUnavailable:         codes.Unavailable,
	errTokenNotFound:               codes.NotFound,
	errTooManyTokens:               codes.ResourceExhausted,
	errFrontDoorOff:                codes.FailedPrecondition,
	errRunElsewhere:                codes.Unavailable,
	store.ErrNotOwner:              codes.Unavailable,
	audit.ErrSpoolFull:             codes.Unavailable,
	errServerUnreachable:           codes.Unavailable,
	errNoClient:                    codes.FailedPrecondition,
	errNoCallback:                  codes.FailedPrecondition,
	errNoSignIn:                    codes.FailedPrecondition,
	errScopeNotGranted:             codes.FailedPrecondition,
})

// Open builds the service: its store, its audit spool and forwarder, and its spawner, whose
// isolation image is checked (missing, or declaring a VOLUME, stops the start) and whose
// orphans from an earlier instance are swept. Runs from before a restart are restored.
func Open(ctx context.Context, cfg Config) (_ *Service, err error) {
	if cfg.Spawner == nil {
		return nil, errors.New("pool: Config.Spawner is required (a spawner.Router over the deployment's back ends)")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxRuns <= 0 {
		cfg.MaxRuns = 256
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 512
	}
	if cfg.RunIdleTimeout <= 0 {
		cfg.RunIdleTimeout = 15 * time.Minute
	}
	if cfg.WarmMaxAge <= 0 {
		cfg.WarmMaxAge = DefaultWarmMaxAge
	}
	if cfg.WarmRefresh <= 0 {
		cfg.WarmRefresh = defaultWarmRefresh
	}
	if cfg.ApprovalTimeout <= 0 {
		cfg.ApprovalTimeout = 15 * time.Minute
	}
	if cfg.AgentTokenMaxTTL <= 0 {
		cfg.AgentTokenMaxTTL = DefaultAgentTokenMaxTTL
	}
	if cfg.AgentTokenTTL <= 0 {
		cfg.AgentTokenTTL = min(DefaultAgentTokenTTL, cfg.AgentTokenMaxTTL)
	}
	if cfg.DocumentMaxBytes <= 0 {
		cfg.DocumentMaxBytes = DefaultDocumentMaxBytes
	}
	if cfg.DocumentMaxCallBytes <= 0 {
		cfg.DocumentMaxCallBytes = 16 << 20
	}
	if cfg.DocumentMaxTenantBytes <= 0 {
		cfg.DocumentMaxTenantBytes = 1 << 30
	}
	s := &Service{
		cfg:         cfg,
		log:         cfg.Logger,
		errors:      grpcserver.ErrorTable{Service: "pool", Codes: errorCodes, Logger: cfg.Logger},
		schemas:     schemas.NewCache(),
		metrics:     newMetrics(),
		runs:        runs{byKey: make(map[runKey]*run), starting: make(map[runKey]bool)},
		toolWatches: listingWatches{byRun: make(map[runKey]map[*toolWatch]struct{})},
		inflight:    newInflight(),
		warm:        newWarmSet(),
		opened:      time.Now(),
	}
	closers := []func() error{func() error { return cfg.Spawner.Close(context.Background()) }}
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				_ = closers[i]()
			}
		}
	}()

	if s.store, err = store.Open(cfg.DBPath); err != nil {
		return nil, err
	}
	s.documents = cfg.Documents
	if s.documents == nil {
		s.documents = builtinDocuments{s.store}
	}
	closers = append(closers, s.store.Close)
	s.runStore, s.tokens, s.oauth = s.store, s.store, s.store
	var lease *store.HostLease
	if cfg.Etcd != nil {
		if cfg.HostID == "" || cfg.HostAddr == "" || cfg.Peers == nil {
			return nil, errors.New("pool: Config.HostID, HostAddr and Peers are required with Etcd (each pool host sharing etcd has an id, an internal address, and reaches the others)")
		}
		if cfg.HostLeaseTTL <= 0 {
			cfg.HostLeaseTTL = DefaultHostLeaseTTL
		}
		er, err := store.OpenEtcd(ctx, cfg.Etcd, cfg.EtcdRoot)
		if err != nil {
			return nil, err
		}
		s.host, s.runStore, s.tokens, s.oauth = cfg.HostID, er, er, er
		// Without a secrets key sign-in is off, and pool.db's sign-ins stay there: nothing
		// could tell whether the other hosts open them.
		if cfg.Secrets != nil {
			shared, err := checkSecretsKey(ctx, er, cfg.Secrets, cfg.Logger)
			if err != nil {
				return nil, err
			}
			if err := s.moveSignIns(ctx, er, shared); err != nil {
				return nil, err
			}
		}
		// Run records are not moved: those a host kept on bbolt stay in pool.db, unserved.
		if n, err := s.store.ActiveRunCount(ctx); err != nil {
			return nil, fmt.Errorf("pool: reading the runs in pool.db: %w", err)
		} else if n > 0 {
			s.log.Warn("pool.db holds running or paused runs from store.backend=bbolt, which are not moved to etcd: no pool host serves them (their requests answer NotFound); "+
				"to finish them, start this host once more on bbolt and end them (`ringfence runs end`), or start them again on etcd", "runs", n)
		}
		s.hosts = &hosts{runs: er, ttl: cfg.HostLeaseTTL, peers: cfg.Peers,
			self: store.Host{ID: cfg.HostID, Addr: cfg.HostAddr, Capacity: cfg.MaxRuns, StartTime: time.Now().UTC()}}
		// The lease first: once it is held, no other host fails the runs restored below.
		rctx, cancel := context.WithTimeout(ctx, cfg.HostLeaseTTL+5*time.Second)
		lease, err = s.hosts.register(rctx)
		cancel()
		if err != nil {
			return nil, err
		}
		closers = append(closers, lease.Close)
	}
	if err := s.resealSignIns(ctx); err != nil {
		return nil, err
	}
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = filepath.Join(filepath.Dir(cfg.DBPath), "pool-audit-spool")
	}
	if s.spool, err = audit.NewSpool(audit.SpoolConfig{
		Dir: cfg.SpoolDir, Sink: cfg.AuditSink, Producer: "pool",
		MaxPending: cfg.SpoolMaxRecords, OnFull: cfg.OnSpoolFull, Logger: cfg.Logger,
	}); err != nil {
		return nil, err
	}
	closers = append(closers, s.spool.Close)
	if n, err := s.spool.Adopt(s.store.DB(), string(store.LegacyOutboxBucket)); err != nil {
		return nil, err
	} else if n > 0 {
		cfg.Logger.Info("moved audit records from the pool's database to its spool directory", "records", n, "spool", cfg.SpoolDir)
	}
	if err := s.restoreRuns(ctx); err != nil {
		return nil, err
	}

	s.spawner = cfg.Spawner
	report, err := s.spawner.Preflight(ctx)
	if err != nil {
		return nil, fmt.Errorf("pool: the isolation profile cannot be used: %w", err)
	}
	switch report.Isolation {
	case "none":
		cfg.Logger.Warn("no isolation image: discovery and calls of stdio MCP servers are refused until RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE is set")
	case "unisolated":
		s.stdio = true
	default:
		s.stdio = true
		cfg.Logger.Info("isolation ready", "backend", report.Isolation, "runtime", report.Runtime, "image", report.ImageRef, "id", report.ImageID,
			"env", strings.Join(report.ImageEnvKeys, ","), "swept_orphans", report.Swept)
		// PATH is in every image (ringfence image build sets PATH=/bin) and configures
		// nothing a server could read as a setting or a secret; any other key does.
		if keys := slices.DeleteFunc(slices.Clone(report.ImageEnvKeys), func(k string) bool { return k == "PATH" }); len(keys) > 0 {
			cfg.Logger.Warn("the isolation image sets its own ENV beyond PATH; every MCP server sees these keys", "keys", strings.Join(keys, ","))
		}
	}

	s.forwarder = s.spool.StartForwarding()
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel, s.bgCtx = cancel, bg
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.reapIdle(bg)
	}()
	if s.hosts != nil {
		s.bg.Add(2)
		go func() {
			defer s.bg.Done()
			s.keepHost(bg, lease)
		}()
		go func() {
			defer s.bg.Done()
			s.sweepLostHosts(bg)
		}()
	}
	wctx, wcancel := context.WithCancel(bg)
	s.warmCancel = wcancel
	if cfg.Warm != nil && cfg.MaxWarm > 0 && s.stdio {
		s.warmWork.Go(func() { s.keepWarm(wctx) })
	}
	return s, nil
}

// Collectors are the pool's Prometheus metrics, for the binary's /metrics.
func (s *Service) Collectors() []prometheus.Collector { return s.metrics.collectors(s) }

// Spool is the pool's audit spool (tests flush it).
func (s *Service) Spool() *audit.Spool { return s.spool }

// Close ends the background work, stops every session, warm ones included (runs stay recorded,
// with their call counts, and get fresh sessions after a restart), removes what this instance
// started, and closes the store.
// Records still in the spool stay durable and are forwarded after the next start.
//
// Calls that arrive from then on are refused (and recorded) as shutting_down, and so are calls
// in progress that come to need a session (session refuses once Close began, so nothing is
// started); dispatched ones end as their sessions stop (as failed: they may have taken
// effect), and Close waits for them, within ctx, before it closes the spool their records go to.
func (s *Service) Close(ctx context.Context) error {
	s.inflight.close()
	s.closeWarm()
	var all []map[string]*session
	s.runs.mu.Lock()
	for _, r := range s.runs.byKey {
		r.mu.Lock()
		all = append(all, r.takeSessions())
		r.mu.Unlock()
	}
	s.runs.mu.Unlock()
	for _, m := range all {
		s.stopSessions(m)
	}
	s.watchers.Wait()
	if err := s.inflight.wait(ctx); err != nil {
		s.log.Warn("closing with tool calls still in progress; their outcomes may be missing from the audit log (their pending records are not)", "err", err)
	}
	s.saveCallCounts(ctx)
	s.forwarder.Stop(2 * time.Second)
	s.bgMu.Lock()
	s.bgClosed = true
	s.bgMu.Unlock()
	s.cancel()
	s.bg.Wait()
	return errors.Join(s.spawner.Close(ctx), s.spool.Close(), s.store.Close())
}

// checkSecretsKey logs an error when this host's secrets key cannot open what the first pool
// host sharing etcd sealed with its own: users' tokens and pending sign-ins sealed on one host
// would not open on the other, so a callback or a run reaching the other would fail. The host
// starts all the same: nothing else it does needs the key. shared reports whether the key
// opens it.
func checkSecretsKey(ctx context.Context, er *store.Etcd, box *secretbox.Box, log *slog.Logger) (shared bool, err error) {
	aad := []byte("pool/oauth/secrets_check")
	first, err := er.SecretsCheck(ctx, box.Seal([]byte("the secrets key of the pool hosts sharing etcd"), aad))
	if err != nil {
		return false, err
	}
	resealed, changed, err := box.Reseal(first, aad)
	if err != nil {
		log.Error("this pool host's secrets key is not the one the other pool hosts sharing etcd seal users' OAuth tokens and sign-ins with: "+
			"a sign-in begun on one of them cannot finish here, nor a token they stored be sent from here; give every pool host the same secrets_key_file "+
			"(a copy of the first host's), or, if every host's key was replaced on purpose, delete the key named here from etcd",
			"key", er.SecretsCheckKey())
		return false, nil
	}
	if changed { // sealed under an older key of the file: the first seals it from now on
		if err := er.ReplaceSecretsCheck(ctx, first, resealed); err != nil {
			return false, err
		}
	}
	return true, nil
}

// resealSignIns re-seals under the first key of the secrets key file, when it holds more than
// one, the users' tokens, pending sign-ins and client secrets that only a later key opens
// (docs/operations.md, "Rotating the secrets key"), and logs what it did.
//
// On etcd, pool.db's own sign-ins are re-sealed too: those a move left there (this host's key
// was not the other hosts', docs/oauth.md, "Moving a host to etcd") wait for a later start to
// move them, which opens them with this host's key file. Left under an older key, they would
// open with none once the log said its line could go.
func (s *Service) resealSignIns(ctx context.Context) error {
	box := s.cfg.Secrets
	if box == nil || box.Keys() < 2 {
		return nil
	}
	r := store.Resealer{Reseal: box.Reseal, Token: tokenContext, Verifier: verifierContext, Client: clientContext}
	n, err := s.oauth.ResealSignIns(ctx, r)
	if err != nil {
		return fmt.Errorf("pool: re-seal the users' sign-ins under the first key of the secrets key file: %w", err)
	}
	if s.cfg.Etcd != nil {
		left, err := s.store.ResealSignIns(ctx, r)
		if err != nil {
			return fmt.Errorf("pool: re-seal the users' sign-ins left in pool.db under the first key of the secrets key file: %w", err)
		}
		n.Resealed, n.Unopened = n.Resealed+left.Resealed, n.Unopened+left.Unopened
	}
	box.LogResealed(s.log, "pool", n.Resealed, n.Unopened)
	return nil
}

func fieldError(field, format string, args ...any) error { return fielderr.New(field, format, args...) }

// isNotFound recognizes a missing graph or version from the publisher, local or remote.
func isNotFound(err error) bool { return errors.Is(err, graph.ErrNotPublished) }
