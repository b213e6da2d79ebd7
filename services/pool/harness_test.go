package pool

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/documents"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/secretbox"
	rftestutil "github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
	auditsvc "github.com/ringfence/ringfence/services/audit"
	"github.com/ringfence/ringfence/services/pool/spawner"
	"github.com/ringfence/ringfence/services/publisher"
	"github.com/ringfence/ringfence/services/registry"
)

// harness runs the real registry, publisher and pool in one process against the real Docker
// engine and the fixture image (or, where a test says so, the fixture as a host process, or
// in-process servers); only the audit log is an in-memory recorder, unless the test asks for
// the real one (realAudit).
type harness struct {
	t        testing.TB
	ctx      context.Context
	reg      *registry.Service
	pub      *publisher.Service
	pool     *Service
	audit    *rftestutil.AuditRecorder
	auditLog *auditsvc.Service // the real audit log (realAudit), read back as its callers do
	poolID   string
	versions *overridableVersions
	budget   *spawner.Budget
	// poolCfg and spawner are what the pool was opened with, for reopen.
	poolCfg Config
	spawner func() Spawner
}

type harnessOpts struct {
	// noImage gives the pool no back end of stdio servers: they are refused.
	noImage bool
	// host runs the fixture servers as host processes (the host back end, as development
	// allows): no Docker engine is needed, for tests of gates that do not depend on the
	// container.
	host bool
	// backend, when set, is the back end of stdio servers (an in-process one).
	backend     spawner.Backend
	driftMaxAge time.Duration
	idle        time.Duration
	paused      time.Duration // pool.paused_run_timeout; 0 keeps paused runs
	maxRuns     int
	maxSessions int
	// realAudit forwards to a real audit log (benchmarks) instead of the in-memory recorder.
	realAudit bool
	// beforeOpen prepares the data directory before the pool opens it.
	beforeOpen func(dir string)
	// allowInline publishes and runs inline mcp_servers (dev.allow_inline_mcp_servers).
	allowInline bool
	// allowAdvisory honours graphs in advisory mode (pool.allow_advisory).
	allowAdvisory bool
	// registry, when set, wraps the real registry as the pool sees it (a fake that fails).
	registry func(Registry) Registry
	// spoolMaxRecords bounds the pool's audit spool (0: the default).
	spoolMaxRecords int
	// poolSink, when set, wraps the audit sink the pool's spool forwards to (one that is down).
	poolSink func(audit.Sink) audit.Sink
	// maxWarm, warmRefresh and warmMaxAge are the warm settings (0: no warm containers, and
	// the defaults).
	maxWarm     int
	warmRefresh time.Duration
	warmMaxAge  time.Duration
	// resultBudget and budgetWait are pool.result_budget and pool.result_budget_wait (0: the
	// defaults without GOMEMLIMIT, 256 MiB and 10s).
	resultBudget int64
	budgetWait   time.Duration
	// approvalTimeout is pool.approval_timeout (0: the default).
	approvalTimeout time.Duration
	// documents, when set, resolves my-documents:// references instead of the built-in store.
	documents documents.Resolver
	// oauthCallback turns sign-in on with this callback URL (the secrets key seals the tokens);
	// now is the clock tokens' expiry is judged by (nil: time.Now).
	oauthCallback string
	now           func() time.Time
	// elapsed is the monotonic clock (nil: Go's).
	elapsed func() time.Duration
	// logTo receives every service's log (nil: discarded).
	logTo io.Writer
}

// overridableVersions serves the publisher's versions, or a hand-made one a test injects to
// reach a gate that publish already guards (the run-time agent floor).
type overridableVersions struct {
	pub *publisher.Service
	mu  sync.Mutex
	fix map[string]*graph.Version
}

func (o *overridableVersions) PublishedVersion(ctx context.Context, tenant, graphID string, version int64) (*graph.Version, error) {
	o.mu.Lock()
	v, ok := o.fix[graphID]
	o.mu.Unlock()
	if ok {
		return v, nil
	}
	return o.pub.PublishedVersion(ctx, tenant, graphID, version)
}

func newHarness(t testing.TB, opts ...harnessOpts) *harness {
	t.Helper()
	var o harnessOpts
	if len(opts) > 0 {
		o = opts[0]
	}
	docker := !o.noImage && !o.host && o.backend == nil
	image := ""
	if docker {
		image = dockertest.FixtureImage(t)
	}
	dir := t.TempDir()
	quiet := slog.New(slog.NewTextHandler(cmp.Or(o.logTo, io.Discard), &slog.HandlerOptions{Level: slog.LevelDebug}))
	box, err := secretbox.LoadOrCreate(filepath.Join(dir, "secrets.key"))
	require.NoError(t, err)
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	rec := rftestutil.NewAuditRecorder()
	var sink audit.Sink = rec
	var auditLog *auditsvc.Service
	if o.realAudit {
		log, err := auditsvc.Open(auditsvc.Config{DBPath: filepath.Join(dir, "audit.db"), Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(func() { log.Close() })
		sink, auditLog = log.Sink(), log
	}
	reg, err := registry.Open(registry.Config{DBPath: filepath.Join(dir, "registry.db"), Secrets: box, Roles: roles,
		AllowedEnvKeys: []string{"APP_TOKEN"}, AuditSink: sink, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { reg.Close() })

	versions := &overridableVersions{fix: map[string]*graph.Version{}}
	poolID := "pooltest-" + randomHex()
	if o.beforeOpen != nil {
		o.beforeOpen(dir)
	}
	drift := o.driftMaxAge
	var poolReg Registry = reg
	if o.registry != nil {
		poolReg = o.registry(reg)
	}
	poolSinkTo := sink
	if o.poolSink != nil {
		poolSinkTo = o.poolSink(sink)
	}
	budget, err := spawner.NewBudget(cmp.Or(o.resultBudget, 256<<20), o.budgetWait)
	require.NoError(t, err)
	sc := spawner.Config{Image: image, Network: "none", AllowedEnvKeys: []string{"APP_TOKEN"}, PoolID: poolID,
		NanoCPUs: 1e9, MemoryBytes: 512 << 20, PidsLimit: 64, TmpfsSizeBytes: 16 << 20, Logger: quiet, ResultBudget: budget}
	if o.host {
		sc.AllowUnisolated = true
		sc.HostPATH = filepath.Dir(fixtures.Binaries(t).Path(t, fixtures.MCPFixture)) + ":" + spawner.DefaultHostPATH
	}
	newSpawner := func() Spawner {
		backends, err := spawner.DefaultBackends(sc)
		require.NoError(t, err)
		if o.backend != nil {
			backends = append([]spawner.Backend{o.backend}, backends...)
		}
		sp, err := spawner.NewRouter(sc, backends...)
		require.NoError(t, err)
		return sp
	}
	cfg := Config{
		DBPath: filepath.Join(dir, "pool.db"), Registry: poolReg, Versions: versions, AuditSink: poolSinkTo,
		SpoolMaxRecords: o.spoolMaxRecords, Spawner: newSpawner(),
		DriftMaxAge: drift, RunIdleTimeout: o.idle, PausedRunTimeout: o.paused, MaxRuns: o.maxRuns, MaxSessions: o.maxSessions,
		AllowInlineMCPServers: o.allowInline, AllowAdvisory: o.allowAdvisory, Logger: quiet,
		Warm: reg, MaxWarm: o.maxWarm, WarmRefresh: o.warmRefresh, WarmMaxAge: o.warmMaxAge,
		ApprovalTimeout: o.approvalTimeout, Documents: o.documents, FrontDoorURL: "http://127.0.0.1:8000/mcp",
		OAuthCallbackURL: o.oauthCallback, Now: o.now, Elapsed: o.elapsed,
	}
	if o.oauthCallback != "" {
		cfg.Secrets = box
	}
	pl, err := Open(t.Context(), cfg)
	require.NoError(t, err)
	h := &harness{t: t, reg: reg, pool: pl, audit: rec, auditLog: auditLog, poolID: poolID, versions: versions, poolCfg: cfg, spawner: newSpawner, budget: budget}
	t.Cleanup(func() {
		require.NoError(t, h.pool.Close(context.Background()))
		if docker {
			requireNoContainers(t, poolID)
		}
	})
	reg.SetDiscoverer(pl)
	pub, err := publisher.Open(publisher.Config{DBPath: filepath.Join(dir, "publisher.db"), Policies: reg, Discoverer: pl, AuditSink: sink,
		AllowInlineMCPServers: o.allowInline, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	versions.pub = pub
	// Handlers are called directly, so the context carries what the interceptor resolves.
	h.ctx = auth.WithTenancy(auth.WithPrincipal(t.Context(), auth.Principal{KeyID: "key_test", Role: auth.RoleAdmin, Permissions: auth.AllPermissions}),
		auth.Tenancy{Tenant: auth.DefaultTenant})
	h.pub = pub
	return h
}

// reopen restarts the pool on its data directory, as a new process would: its runs, loaded
// tools and approvals are read back, and no session survives.
func (h *harness) reopen() {
	h.t.Helper()
	require.NoError(h.t, h.pool.Close(context.Background()))
	cfg := h.poolCfg
	cfg.Spawner = h.spawner()
	pl, err := Open(h.t.Context(), cfg)
	require.NoError(h.t, err)
	h.pool = pl
	h.reg.SetDiscoverer(pl)
}

func randomHex() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// server registers a fixture server with the floor granted.
func (h *harness) server(ref string, mutate func(r *registryv1.CreateServerRequest), args ...string) {
	h.t.Helper()
	req := &registryv1.CreateServerRequest{Ref: ref, Command: "mcpfixture", Args: args, Grants: []string{"process_spawn", "external_api_call"}}
	if mutate != nil {
		mutate(req)
	}
	_, err := h.reg.CreateServer(h.ctx, req)
	require.NoError(h.t, err)
}

// publish creates a graph with agents, imports tools of servers into the first agent (or the
// agent named in each import), applies edit to the draft, and publishes version 1.
func (h *harness) publish(graphID string, agents []string, imports []imp, edit func(d *publisherv1.Graph)) int64 {
	h.t.Helper()
	_, err := h.pub.CreateGraph(h.ctx, &publisherv1.CreateGraphRequest{GraphId: graphID, Agents: agents})
	require.NoError(h.t, err)
	for _, im := range imports {
		_, err := h.pub.Import(h.ctx, publisher.ImportRequest{Tenant: auth.DefaultTenant, GraphID: graphID, ServerRef: im.server, Agent: im.agent, Tools: im.tools})
		require.NoError(h.t, err)
	}
	if edit != nil {
		d, err := h.pub.GetDraft(h.ctx, &publisherv1.GetDraftRequest{GraphId: graphID})
		require.NoError(h.t, err)
		edit(d.GetDraft())
		_, err = h.pub.ReplaceDraft(h.ctx, &publisherv1.ReplaceDraftRequest{GraphId: graphID, Draft: d.GetDraft()})
		require.NoError(h.t, err)
	}
	resp, err := h.pub.Publish(h.ctx, &publisherv1.PublishRequest{GraphId: graphID})
	require.NoError(h.t, err)
	return resp.GetVersion()
}

type imp struct {
	server, agent string
	tools         []string
}

func (h *harness) start(graphID string) string {
	h.t.Helper()
	info, err := h.pool.StartRun(h.ctx, auth.DefaultTenant, graphID, 0, "")
	require.NoError(h.t, err)
	return info.Run.ID
}

func (h *harness) call(run, agent, tool string, args any) (*CallResult, error) {
	h.t.Helper()
	raw, err := json.Marshal(args)
	require.NoError(h.t, err)
	return h.pool.CallTool(h.ctx, CallRequest{RunID: run, Agent: agent, Tool: tool, Arguments: raw})
}

// attempts flushes the spool and returns the tool-call records that arrived.
// attempts returns the final record of every attempt, in order: refusals, and dispatched calls'
// outcomes (their pending records are in pendings).
func (h *harness) attempts() []*audit.ToolCallAttempt {
	h.t.Helper()
	return h.toolCallRecords(func(tc *audit.ToolCallAttempt) bool { return tc.Result != audit.ResultPending })
}

// pendings returns the records written just before each dispatch.
func (h *harness) pendings() []*audit.ToolCallAttempt {
	h.t.Helper()
	return h.toolCallRecords(func(tc *audit.ToolCallAttempt) bool { return tc.Result == audit.ResultPending })
}

// toolCallRecords returns the tool-call records keep selects, each attempt in the order it was
// made: a dispatched call's outcome is spooled after the answer, so it may land after a later
// call's records; it is placed right after the pending record it names.
func (h *harness) toolCallRecords(keep func(*audit.ToolCallAttempt) bool) []*audit.ToolCallAttempt {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(h.t, h.pool.Spool().Flush(ctx))
	type placed struct {
		at, then int
		tc       *audit.ToolCallAttempt
	}
	var all []placed
	pendingAt := map[string]int{}
	for i, r := range h.audit.Records() {
		if r.ToolCall == nil {
			continue
		}
		require.Equal(h.t, audit.OperationSupportAtLeastOnce, r.ToolCall.OperationSupport)
		require.True(h.t, r.ToolCall.OperationResidualDuplicateRisk)
		p := placed{at: i, tc: r.ToolCall}
		if r.ToolCall.Result == audit.ResultPending {
			pendingAt[r.ID] = i
		} else if at, ok := pendingAt[r.ToolCall.PendingID]; ok {
			p.at, p.then = at, 1
		}
		all = append(all, p)
	}
	slices.SortStableFunc(all, func(a, b placed) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.then, b.then)) })
	var out []*audit.ToolCallAttempt
	for _, p := range all {
		if keep(p.tc) {
			out = append(out, p.tc)
		}
	}
	return out
}

// reaped waits for the idle reaper to end run as failed and returns it as ended.
func (h *harness) reaped(run string) *RunInfo {
	h.t.Helper()
	var info *RunInfo
	require.Eventually(h.t, func() bool {
		got, err := h.pool.GetRun(h.ctx, run, "")
		if err != nil || got.Run.State != StateFailed {
			return false
		}
		info = got
		return true
	}, 30*time.Second, 20*time.Millisecond, "run %s is reaped", run)
	return info
}

func (h *harness) last() *audit.ToolCallAttempt {
	h.t.Helper()
	all := h.attempts()
	require.NotEmpty(h.t, all)
	return all[len(all)-1]
}

func (h *harness) spawned() float64 { return testutil.ToFloat64(h.pool.metrics.sessionsSpawned) }
func (h *harness) stopped() float64 { return testutil.ToFloat64(h.pool.metrics.sessionsStopped) }

// requireFreshServer calls echo in run and requires that it succeeds on a server spawned for
// it: one more than before (h.spawned() read before the server was broken). msgAndArgs
// explain a failed call.
func (h *harness) requireFreshServer(t *testing.T, run string, before float64, msgAndArgs ...any) {
	t.Helper()
	res, err := h.call(run, "a", "fx__echo", map[string]any{"text": "fresh"})
	require.NoError(t, err, msgAndArgs...)
	require.Equal(t, "fresh", res.Content[0]["text"])
	require.Equal(t, before+1, h.spawned(), "the run's next call starts a fresh server")
}
func (h *harness) listings() float64 {
	return testutil.ToFloat64(h.pool.metrics.listings)
}

// requireRefused asserts a refusal before dispatch with reason.
func requireRefused(t *testing.T, err error, reason string) *RefusedError {
	t.Helper()
	var ref *RefusedError
	require.ErrorAs(t, err, &ref, "want a refusal (%s), got %v", reason, err)
	require.Equal(t, reason, ref.Reason, "%v", err)
	return ref
}

// requireFailed asserts a dispatched failure of class.
func requireFailed(t *testing.T, err error, class string) {
	t.Helper()
	var f *FailedError
	require.ErrorAs(t, err, &f, "want a dispatched failure (%s), got %v", class, err)
	require.Equal(t, class, f.Class, "%v", err)
}

func poolContainers(t testing.TB, poolID string) int {
	t.Helper()
	docker := dockertest.RequireEngine(t)
	f := client.Filters{}
	f.Add("label", "io.ringfence.pool="+poolID)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	require.NoError(t, err)
	return len(list.Items)
}

func requireNoContainers(t testing.TB, poolID string) {
	t.Helper()
	require.Eventually(t, func() bool { return poolContainers(t, poolID) == 0 }, 20*time.Second, 100*time.Millisecond,
		"containers of pool %s were left behind", poolID)
}

func agentBindings(d *publisherv1.Graph, agent string, caps ...string) {
	for _, n := range d.GetNodes() {
		if n.GetId() == agent {
			n.GetAgent().CapabilityBindings = append(n.GetAgent().CapabilityBindings, caps...)
		}
	}
}

func toolPerms(tool string, reqs ...string) func(r *registryv1.CreateServerRequest) {
	return func(r *registryv1.CreateServerRequest) {
		r.ToolPermissions = map[string]*registryv1.ToolPermissions{tool: {Required: reqs}}
	}
}

func callTimeout(d time.Duration) func(r *registryv1.CreateServerRequest) {
	return func(r *registryv1.CreateServerRequest) { r.ToolCallTimeout = durationpb.New(d) }
}

func env(kv ...string) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.Fields[kv[i]] = structpb.NewStringValue(kv[i+1])
	}
	return s
}
