package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/services/pool/internal/store"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// Several pool hosts share one etcd cluster (store.backend=etcd). Each registers itself under a
// lease (its id, the address of its internal plane, its capacity); each run is owned by one
// host, written in its record. A request about a run that reaches another host is forwarded to
// the owner over the internal plane (ForwardRun; ForwardCallTool for a call of the MCP front
// door, which streams the server's progress back), as the caller's, and served there through
// the same gates. When a host's lease expires, any live host fails its runs with the reason,
// and ResumeRun re-homes such a run on a live host, with fresh sessions.

// DefaultHostLeaseTTL is pool.host_lease_ttl when none is set.
const DefaultHostLeaseTTL = 10 * time.Second

// HostPeers reaches other pool hosts' internal plane (peers.PoolHosts over mutual TLS).
type HostPeers interface {
	ForwardRun(ctx context.Context, addr string, req *poolinternalv1.ForwardRunRequest) (*poolinternalv1.ForwardRunResponse, error)
	// ForwardCallTool makes a front door's call on the host at addr and returns its response,
	// handing each progress report the host streams meanwhile to progress, one at a time on
	// the calling goroutine, before reading the next; cancelling ctx cancels the call there.
	ForwardCallTool(ctx context.Context, addr string, req *poolinternalv1.ForwardCallToolRequest, progress func(*poolinternalv1.CallProgress)) (*poolv1.CallToolResponse, error)
	// WatchAgentTools holds a watch of a run's listings open on the host at addr, handing each
	// message to changes on the calling goroutine, until ctx ends (nil) or the stream does (its
	// error).
	WatchAgentTools(ctx context.Context, addr string, req *poolinternalv1.WatchAgentToolsRequest, changes func(*poolinternalv1.WatchAgentToolsResponse)) error
}

// errRunElsewhere: the run (or, for StartRun, the placement) is another host's.
var errRunElsewhere = errors.New("pool: the run is owned by another pool host")

// elsewhereError names the host a request belongs on.
type elsewhereError struct{ host string }

func (e *elsewhereError) Error() string { return fmt.Sprintf("%v (%s)", errRunElsewhere, e.host) }
func (e *elsewhereError) Unwrap() error { return errRunElsewhere }

// hosts is the pool's part in a deployment of several hosts; nil on bbolt.
type hosts struct {
	runs  *store.Etcd
	self  store.Host
	ttl   time.Duration
	peers HostPeers
}

// register takes this host's lease, waiting for the lease of an earlier process with the same
// id (one killed without revoking it) to expire, within ctx.
func (h *hosts) register(ctx context.Context) (*store.HostLease, error) {
	for {
		lease, err := h.runs.Register(ctx, h.self, h.ttl)
		if !errors.Is(err, store.ErrHostTaken) {
			return lease, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pool: %w within %s: another pool host runs with pool.host_id %q (give each host its own), or an earlier process of this one held it and its lease has not expired", err, h.ttl+5*time.Second, h.self.ID)
		case <-time.After(h.ttl / 4):
		}
	}
}

// keepHost holds the host's lease until ctx ends. A lease that expires under it (the cluster
// did not hear from this process within pool.host_lease_ttl) may have let the other hosts fail
// its runs, so every run in memory is dropped (their sessions stop; their records say what
// became of them) before the host registers again; runs still its own are read back on their
// next request.
func (s *Service) keepHost(ctx context.Context, lease *store.HostLease) {
	for {
		select {
		case <-ctx.Done():
			_ = lease.Close() // the key goes now, not a TTL later
			return
		case <-lease.Done():
		}
		s.log.Error("this pool host lost its lease in etcd; dropping its runs from memory and registering again", "host", s.host)
		s.dropAllRuns()
		for {
			rctx, cancel := context.WithTimeout(ctx, s.hosts.ttl*2)
			next, err := s.hosts.register(rctx)
			cancel()
			if err == nil {
				lease = next
				break
			}
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("registering this pool host again failed; retrying", "host", s.host, "err", err)
		}
	}
}

// forgetRun drops one run from memory and stops its sessions, writing nothing: its record says
// it is another host's now, or the host lost its lease.
func (s *Service) forgetRun(r *run) {
	key := runKey{r.id.Tenant, r.id.ID}
	s.runs.mu.Lock()
	if s.runs.byKey[key] == r {
		delete(s.runs.byKey, key)
		s.runs.count--
	}
	s.runs.mu.Unlock()
	s.endListingWatches(key, errRunLeft)
	r.mu.Lock()
	old := r.takeSessions()
	r.mu.Unlock()
	s.stopSessions(old)
}

// dropAllRuns forgets every run in memory.
func (s *Service) dropAllRuns() {
	s.runs.mu.Lock()
	all := slices.Collect(maps.Values(s.runs.byKey))
	s.runs.mu.Unlock()
	for _, r := range all {
		s.forgetRun(r)
	}
}

// sweepLostHosts fails, every half lease, the runs of hosts whose lease expired, until ctx
// ends. Every host sweeps; the transactions let one win for each run.
func (s *Service) sweepLostHosts(ctx context.Context) {
	t := time.NewTicker(max(s.hosts.ttl/2, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lost, err := s.hosts.runs.LostHosts(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("could not list the runs of lost pool hosts", "err", err)
			}
			continue
		}
		for _, host := range lost {
			// A lease revoked by a graceful stop and one that expired look the same from here.
			reason := fmt.Sprintf("pool host %s is gone (it was stopped, or stopped answering): its lease in etcd ended (revoked as it stopped, or expired after pool.host_lease_ttl %s); ResumeRun re-homes the run on a live host with fresh sessions", host, s.hosts.ttl)
			failed, err := s.hosts.runs.FailRunsOf(ctx, host, func(r *store.Run) {
				r.State, r.EndReason, r.EndTime = StateFailed, reason, time.Now().UTC()
			})
			for _, r := range failed {
				s.metrics.runsEnded.WithLabelValues(StateFailed).Inc()
				s.log.Warn("failed a run of a lost pool host", "run", r.ID, "tenant", r.Tenant, "host", host)
			}
			if err != nil && ctx.Err() == nil {
				s.log.Warn("could not fail the runs of a lost pool host", "host", host, "err", err)
			}
		}
	}
}

// place chooses the host a new or re-homed run goes to: the live host with the lowest share of
// its capacity in use (pool.max_runs), this one on a tie, then the lowest id. It returns ""
// for this host. A full deployment is errTooManyRuns.
func (s *Service) place(ctx context.Context) (string, error) {
	if s.hosts == nil || isForwarded(ctx) {
		return "", nil
	}
	all, err := s.hosts.runs.Hosts(ctx)
	if err != nil {
		return "", err
	}
	best := -1
	for i, h := range all {
		if h.Capacity <= 0 || h.Load >= h.Capacity {
			continue
		}
		if best < 0 || lessLoaded(h, all[best], s.host) {
			best = i
		}
	}
	switch {
	case best < 0:
		return "", errTooManyRuns
	case all[best].ID == s.host:
		return "", nil
	}
	return all[best].ID, nil
}

// lessLoaded orders hosts by the share of capacity in use, then self first, then id.
func lessLoaded(a, b store.Host, self string) bool {
	la, lb := a.Load*b.Capacity, b.Load*a.Capacity
	if la != lb {
		return la < lb
	}
	if (a.ID == self) != (b.ID == self) {
		return a.ID == self
	}
	return a.ID < b.ID
}

// forwardedKey marks a request that came from another pool host: it is served here, never
// forwarded again, and never placed again.
type forwardedKey struct{}

func isForwarded(ctx context.Context) bool { return ctx.Value(forwardedKey{}) != nil }

// forward sends req, a public PoolService request for method, to the host e names, as the
// caller's, and decodes its answer into resp. The owner's errors come back as they are.
func (s *Service) forward(ctx context.Context, e *elsewhereError, method string, req, resp proto.Message) error {
	addr, caller, tenant, err := s.forwardTo(ctx, e)
	if err != nil {
		return err
	}
	body, err := proto.Marshal(req)
	if err != nil {
		return s.errors.Status(ctx, err)
	}
	out, err := s.hosts.peers.ForwardRun(ctx, addr, &poolinternalv1.ForwardRunRequest{Method: method, Request: body, Tenant: tenant, Caller: caller})
	if err != nil {
		return s.notAnswered(e, err)
	}
	if err := proto.Unmarshal(out.GetResponse(), resp); err != nil {
		return status.Errorf(codes.Internal, "pool: pool host %s answered what does not decode as %T", e.host, resp)
	}
	s.metrics.forwarded.Inc()
	return nil
}

// forwardCall is forward for a front door's CallTool (ForwardCallTool): the server's progress
// reports reach the receiver in ctx (spawner.WithProgress), when there is one, as they reach
// it on the owner.
func (s *Service) forwardCall(ctx context.Context, e *elsewhereError, req *poolv1.CallToolRequest) (*poolv1.CallToolResponse, error) {
	addr, caller, tenant, err := s.forwardTo(ctx, e)
	if err != nil {
		return nil, err
	}
	fn := spawner.ProgressFrom(ctx)
	progress := func(*poolinternalv1.CallProgress) {}
	if fn != nil {
		// The same bound as on the owner: reports the receiver is not ready for are dropped,
		// so the stream is read at once and a slow client holds up neither host.
		relay := spawner.NewProgressRelay(fn)
		defer relay.Close() // before the response is handed on: the reports come first
		progress = func(p *poolinternalv1.CallProgress) {
			relay.Deliver(spawner.Progress{Progress: p.GetProgress(), Total: p.GetTotal(), Message: p.GetMessage()})
		}
	}
	resp, err := s.hosts.peers.ForwardCallTool(ctx, addr, &poolinternalv1.ForwardCallToolRequest{Request: req, Caller: caller, Tenant: tenant, Progress: fn != nil}, progress)
	if err != nil {
		return nil, s.notAnswered(e, err)
	}
	s.metrics.forwarded.Inc()
	return resp, nil
}

// forwardTo is where and as whom a request goes to the host e names: the host's address, the
// caller and the tenant this host resolved. A request that was forwarded here is not sent on.
func (s *Service) forwardTo(ctx context.Context, e *elsewhereError) (addr string, caller *poolinternalv1.Caller, tenant string, err error) {
	if isForwarded(ctx) {
		return "", nil, "", status.Error(codes.Unavailable, "pool: the run moved to another pool host while this request travelled to it: send it again")
	}
	h, err := s.hosts.runs.Host(ctx, e.host)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil, "", status.Errorf(codes.Unavailable, "pool: the run's pool host %s does not answer (its lease lapsed): within pool.host_lease_ttl (%s) its runs fail, and ResumeRun then re-homes them on a live host", e.host, s.hosts.ttl)
	}
	if err != nil {
		return "", nil, "", s.errors.Status(ctx, err)
	}
	p, err := auth.PrincipalFrom(ctx)
	if err != nil {
		return "", nil, "", err
	}
	if tenant, err = auth.TenantFrom(ctx); err != nil {
		return "", nil, "", err
	}
	perms := make([]string, len(p.Permissions))
	for i, perm := range p.Permissions {
		perms[i] = string(perm)
	}
	caller = &poolinternalv1.Caller{KeyId: p.KeyID, KeyName: p.KeyName, Role: p.Role, Permissions: perms,
		KeyTenant: p.Tenant, Service: p.Service, AgentToken: p.AgentToken}
	return h.Addr, caller, tenant, nil
}

// notAnswered is a forwarded request's error: the owner's status as it is, or UNAVAILABLE
// naming the host when it was never reached.
func (s *Service) notAnswered(e *elsewhereError, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Errorf(codes.Unavailable, "pool: the run's pool host %s does not answer (%v): if it stopped, its runs fail within pool.host_lease_ttl (%s), and ResumeRun then re-homes them on a live host", e.host, err, s.hosts.ttl)
}

// tokenDecides says a forwarded ApproveCall or DenyCall that an agent token made decides a
// call of the token's own run: the front door that received it put the call to its client's
// user (frontdoor.client_approvals), as it does in-process on the owner.
func (s *Service) tokenDecides(ctx context.Context, p auth.Principal, tenant, method string, body []byte) bool {
	var req interface {
		proto.Message
		GetRunId() string
	}
	switch method {
	case poolv1.PoolService_ApproveCall_FullMethodName:
		req = &poolv1.ApproveCallRequest{}
	case poolv1.PoolService_DenyCall_FullMethodName:
		req = &poolv1.DenyCallRequest{}
	default:
		return false
	}
	if proto.Unmarshal(body, req) != nil {
		return false
	}
	t, ok := s.runToken(ctx, tenant, req.GetRunId(), p.AgentToken)
	return ok && !s.tokenOver(t)
}

// runToken finds one token of a run.
func (s *Service) runToken(ctx context.Context, tenant, runID, id string) (store.AgentToken, bool) {
	have, err := s.tokens.RunAgentTokens(ctx, tenant, runID)
	if err != nil {
		return store.AgentToken{}, false
	}
	i := slices.IndexFunc(have, func(t store.AgentToken) bool { return t.ID == id })
	if i < 0 {
		return store.AgentToken{}, false
	}
	return have[i], true
}

// approver names who decides an approval: the caller, or, for an agent token whose front door
// forwarded the decision, its client's user as the front door names them in-process.
func (s *Service) approver(ctx context.Context, p auth.Principal, tenant, runID string) string {
	if p.AgentToken != "" && isForwarded(ctx) {
		if t, ok := s.runToken(ctx, tenant, runID, p.AgentToken); ok {
			tok := tokenFromStore(t)
			return approverName(&tok)
		}
	}
	return p.Actor()
}

// callerContext is the context a forwarded request is served in: the caller and the tenant
// the receiving host resolved, marked as forwarded.
func callerContext(ctx context.Context, c *poolinternalv1.Caller, tenant string) (context.Context, error) {
	if c == nil || tenant == "" {
		return nil, status.Error(codes.InvalidArgument, "pool: a forwarded request names its caller and tenant")
	}
	p := auth.Principal{KeyID: c.GetKeyId(), KeyName: c.GetKeyName(), Role: c.GetRole(), Tenant: c.GetKeyTenant(),
		Service: c.GetService(), AgentToken: c.GetAgentToken()}
	for _, perm := range c.GetPermissions() {
		p.Permissions = append(p.Permissions, auth.Permission(perm))
	}
	ctx = auth.WithTenancy(auth.WithPrincipal(ctx, p), auth.Tenancy{Tenant: tenant})
	return context.WithValue(ctx, forwardedKey{}, true), nil
}
