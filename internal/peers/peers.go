// Package peers lets a service of a split deployment call the others' internal APIs
// (ringfence.internal.*, on their internal listeners) over mutual TLS with its service
// certificate. Each client implements the same Go interface the consumer uses
// in-process (ringfenced wires the services directly), so no service knows whether its peer is
// local or remote.
package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	publisherinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/publisher/v1"
	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/audit/auditpb"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/graph/graphpb"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/telemetry"
)

// Dial connects to the internal listener of the peer service named peer (mtls.Registry,
// mtls.Publisher, mtls.Pool or mtls.Audit) at addr, presenting this service's certificate. The
// handshake fails unless the server's certificate carries that peer's identity, so another
// service's certificate cannot answer in its place. A split deployment without TLS is refused:
// internal RPCs are authorized by certificates only. Every call carries the request id of the
// call being served and, with tracing on, its trace context (traceparent).
func Dial(peer, addr string, files mtls.Files, tracing *telemetry.Tracing) (*grpc.ClientConn, error) {
	if files.CertFile == "" {
		return nil, errors.New("peers: talking to another service needs this service's certificate: set RINGFENCE_TLS__CERT_FILE, RINGFENCE_TLS__KEY_FILE and RINGFENCE_TLS__CLIENT_CA_FILE (`ringfence certs init` writes a development set)")
	}
	tlsCfg, err := mtls.ClientConfig(files, peer)
	if err != nil {
		return nil, err
	}
	unary, stream := grpcserver.PropagateRequestID()
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(grpcserver.MaxResponseBytes)),
		grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream),
	}, tracing.DialOptions()...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("peers: dial %s at %s: %w", peer, addr, err)
	}
	return conn, nil
}

// Registry is the registry seen from another service.
type Registry struct {
	client registryinternalv1.RegistryInternalServiceClient

	// keys caches key verifications briefly, so authorizing a burst of calls costs one round
	// trip; a revocation takes effect within keyCacheTTL.
	mu   sync.Mutex
	keys map[string]cachedKey
}

type cachedKey struct {
	p       auth.Principal
	err     error
	expires time.Time
}

// keyCacheTTL bounds how long a verified (or refused) key is remembered.
const keyCacheTTL = 5 * time.Second

// keyCheckTimeout bounds one AuthenticateKey round trip. A server checks keys on a
// connection's reader before admitting a stream (grpcserver's tap): a registry that stopped
// answering must not stall that connection for longer.
const keyCheckTimeout = 2 * time.Second

// NewRegistry wraps a connection to ringfence-registry.
func NewRegistry(conn *grpc.ClientConn) *Registry {
	return &Registry{client: registryinternalv1.NewRegistryInternalServiceClient(conn), keys: make(map[string]cachedKey)}
}

// ResolveRegistration implements pool.Registry through RegistryInternalService.ResolveServer.
func (r *Registry) ResolveRegistration(ctx context.Context, ref string) (*mcpserver.Resolved, error) {
	resp, err := r.client.ResolveServer(ctx, &registryinternalv1.ResolveServerRequest{Ref: ref})
	if err != nil {
		return nil, notRegistered(err)
	}
	return ResolvedFromProto(resp), nil
}

// ResolvedFromProto is a resolved registration from ResolveServer's answer.
func ResolvedFromProto(resp *registryinternalv1.ResolveServerResponse) *mcpserver.Resolved {
	reg := RegistrationFromProto(resp.GetServer())
	reg.Env = resp.GetEnv()
	return &mcpserver.Resolved{Registration: *reg, HeaderValues: resp.GetHeaderValues(), ClientSecret: resp.GetOauthClientSecret()}
}

// ServerPolicy implements the publisher's and pool's policy lookups through GetServerPolicy.
func (r *Registry) ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error) {
	resp, err := r.client.GetServerPolicy(ctx, &registryinternalv1.GetServerPolicyRequest{Ref: ref})
	if err != nil {
		return mcpserver.Policy{}, notRegistered(err)
	}
	p := mcpserver.Policy{
		Ref: resp.GetRef(), Description: resp.GetDescription(), Grants: resp.GetGrants(), Revision: resp.GetRevision(), StrictInputs: resp.GetStrictInputs(),
		SignIn: resp.GetSignIn(),
		Filter: mcpserver.ToolFilter{Include: resp.GetToolFilter().GetInclude(), Exclude: resp.GetToolFilter().GetExclude()},
	}
	if len(resp.GetToolPermissions()) > 0 {
		p.ToolPermissions = make(map[string][]string, len(resp.GetToolPermissions()))
		for tool, tp := range resp.GetToolPermissions() {
			p.ToolPermissions[tool] = tp.GetRequired()
		}
	}
	return p, nil
}

// WarmTargets implements pool.WarmSource through ListWarmTargets.
func (r *Registry) WarmTargets(ctx context.Context) ([]mcpserver.WarmTarget, error) {
	resp, err := r.client.ListWarmTargets(ctx, &registryinternalv1.ListWarmTargetsRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]mcpserver.WarmTarget, len(resp.GetTargets()))
	for i, t := range resp.GetTargets() {
		out[i] = mcpserver.WarmTarget{Ref: t.GetRef(), Prewarm: int(t.GetPrewarm()), Revision: t.GetRevision()}
	}
	return out, nil
}

// VerifyKey implements auth.KeyVerifier through AuthenticateKey.
func (r *Registry) VerifyKey(ctx context.Context, keySHA256 string) (auth.Principal, error) {
	now := time.Now()
	r.mu.Lock()
	if c, ok := r.keys[keySHA256]; ok && now.Before(c.expires) {
		r.mu.Unlock()
		return c.p, c.err
	}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, keyCheckTimeout)
	defer cancel()
	resp, err := r.client.AuthenticateKey(ctx, &registryinternalv1.AuthenticateKeyRequest{KeySha256: keySHA256})
	var c cachedKey
	switch status.Code(err) {
	case codes.OK:
		c.p = auth.Principal{KeyID: resp.GetKeyId(), KeyName: resp.GetKeyName(), Role: resp.GetRole(), Tenant: resp.GetTenant()}
		for _, p := range resp.GetPermissions() {
			c.p.Permissions = append(c.p.Permissions, auth.Permission(p))
		}
	case codes.Unauthenticated:
		c.err = auth.ErrUnknownKey
	default:
		// The registry could not answer: do not cache, let the caller retry.
		return auth.Principal{}, status.Errorf(codes.Unavailable, "auth: the registry cannot verify API keys right now: %v", status.Convert(err).Message())
	}
	c.expires = now.Add(keyCacheTTL)
	r.mu.Lock()
	if len(r.keys) > 10000 {
		clear(r.keys) // bound memory against key-spraying
	}
	r.keys[keySHA256] = c
	r.mu.Unlock()
	return c.p, c.err
}

func notRegistered(err error) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%s: %w", status.Convert(err).Message(), mcpserver.ErrNotRegistered)
	}
	return err
}

// RegistrationFromProto reads a registration (env values are masked in a Server message).
func RegistrationFromProto(s *registryv1.Server) *mcpserver.Registration {
	reg := &mcpserver.Registration{
		Ref: s.GetRef(), Description: s.GetDescription(), Transport: s.GetTransport(),
		Command: s.GetCommand(), Args: s.GetArgs(), URL: s.GetUrl(), Headers: s.GetHeaders(),
		Grants: s.GetGrants(), KeepMarkup: s.GetKeepMarkup(), StrictInputs: s.GetStrictInputs(), Prewarm: int(s.GetPrewarm()),
		MaxResultBytes: s.GetMaxResultBytes(),
		Revision:       s.GetRevision(),
		Filter:         mcpserver.ToolFilter{Include: s.GetToolFilter().GetInclude(), Exclude: s.GetToolFilter().GetExclude()},
	}
	if o := s.GetOauth(); o != nil {
		reg.OAuth = &mcpserver.OAuth{AuthorizationServer: o.GetAuthorizationServer(), ClientID: o.GetClientId(), ClientSecretRef: o.GetClientSecretRef(), Scopes: o.GetScopes()}
	}
	if d := s.GetClientSessionTimeout(); d != nil {
		reg.ClientSessionTimeout = d.AsDuration()
	}
	if d := s.GetToolCallTimeout(); d != nil {
		reg.ToolCallTimeout = d.AsDuration()
	}
	if len(s.GetToolPermissions()) > 0 {
		reg.ToolPermissions = make(map[string][]string, len(s.GetToolPermissions()))
		for tool, tp := range s.GetToolPermissions() {
			reg.ToolPermissions[tool] = tp.GetRequired()
		}
	}
	return reg
}

// Pool is the pool seen from the control plane.
type Pool struct {
	client poolinternalv1.PoolInternalServiceClient
}

// NewPool wraps a connection to ringfence-pool.
func NewPool(conn *grpc.ClientConn) *Pool {
	return &Pool{client: poolinternalv1.NewPoolInternalServiceClient(conn)}
}

// DiscoverTools implements registry.Discoverer and the publisher's discoverer through Discover.
func (p *Pool) DiscoverTools(ctx context.Context, ref string) (*discovery.Listing, error) {
	listing, _, err := p.ExploreTools(ctx, discovery.ExploreRequest{Ref: ref})
	return listing, err
}

// DiscoverToolsAs implements the publisher's UserDiscoverer through Discover.
func (p *Pool) DiscoverToolsAs(ctx context.Context, tenant, user, ref string) (*discovery.Listing, error) {
	listing, _, err := p.ExploreTools(ctx, discovery.ExploreRequest{Ref: ref, Tenant: tenant, User: user})
	return listing, err
}

// ExploreTools implements registry.Discoverer through Discover.
func (p *Pool) ExploreTools(ctx context.Context, req discovery.ExploreRequest) (*discovery.Listing, *typesv1.ExploreCallResult, error) {
	resp, err := p.client.Discover(ctx, &poolinternalv1.DiscoverRequest{
		ServerRef: req.Ref, Call: req.Call, Adhoc: req.Adhoc, Tenant: req.Tenant, ActorKeyId: req.ActorKeyID, Actor: req.Actor,
		User: req.User,
	})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return nil, nil, notRegistered(err)
		}
		return nil, nil, discovery.FromStatus(err)
	}
	listing := &discovery.Listing{ServerRef: req.Ref, Revision: resp.GetRegistrationRevision(), Findings: discovery.FindingsFromProto(resp.GetListingFindings())}
	for _, t := range resp.GetTools() {
		listing.Tools = append(listing.Tools, discovery.ToolFromProto(t))
	}
	return listing, resp.GetCall(), nil
}

// WarmStatus implements registry.WarmReporter through GetWarmStatus.
func (p *Pool) WarmStatus(ctx context.Context, refs []string) (map[string]mcpserver.WarmStatus, error) {
	resp, err := p.client.GetWarmStatus(ctx, &poolinternalv1.GetWarmStatusRequest{ServerRefs: refs})
	if err != nil {
		return nil, err
	}
	out := make(map[string]mcpserver.WarmStatus, len(resp.GetWarm()))
	for ref, st := range resp.GetWarm() {
		out[ref] = mcpserver.WarmStatus{Ready: int(st.GetReady()), Starting: int(st.GetStarting())}
	}
	return out, nil
}

// Publisher is the publisher seen from the pool.
type Publisher struct {
	client publisherinternalv1.PublisherInternalServiceClient
}

// NewPublisher wraps a connection to ringfence-publisher.
func NewPublisher(conn *grpc.ClientConn) *Publisher {
	return &Publisher{client: publisherinternalv1.NewPublisherInternalServiceClient(conn)}
}

// PublishedVersion implements the pool's version source through GetPublishedVersion.
func (p *Publisher) PublishedVersion(ctx context.Context, tenant, graphID string, version int64) (*graph.Version, error) {
	resp, err := p.client.GetPublishedVersion(ctx, &publisherinternalv1.GetPublishedVersionRequest{Tenant: tenant, GraphId: graphID, Version: version})
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("%w: %s", graph.ErrNotPublished, status.Convert(err).Message())
	}
	if err != nil {
		return nil, err
	}
	return graphpb.VersionFromProto(resp.GetVersion())
}

// Audit is the audit service seen from a producer's spool: one instance, or several that
// share the log (store.backend=etcd), of which one, the leader, appends. The others answer
// UNAVAILABLE (audit.NotLeaderReason, naming the leader), as does an instance that cannot be
// reached; Append then tries the next instance at once, and keeps to the one that took the
// records until it stops answering.
type Audit struct {
	clients []auditinternalv1.AuditInternalServiceClient
	// current is the index of the instance that last took records.
	current atomic.Int32
}

// NewAudit wraps connections to the instances of ringfence-audit (peers.audit_addr).
func NewAudit(conns ...*grpc.ClientConn) *Audit {
	a := &Audit{}
	for _, c := range conns {
		a.clients = append(a.clients, auditinternalv1.NewAuditInternalServiceClient(c))
	}
	return a
}

var _ audit.Sink = (*Audit)(nil)

// Append implements audit.Sink through the internal Append RPC; the service is idempotent by
// record id, so the spool may resend freely, to any instance.
func (a *Audit) Append(ctx context.Context, recs []audit.Record) error {
	req := &auditinternalv1.AppendRequest{Records: make([]*auditv1.Record, len(recs))}
	for i, r := range recs {
		req.Records[i] = auditpb.RecordToProto(r)
	}
	start := int(a.current.Load())
	var err error
	for i := range a.clients {
		k := (start + i) % len(a.clients)
		_, err = a.clients[k].Append(ctx, req)
		switch status.Code(err) {
		case codes.OK:
			a.current.Store(int32(k))
			return nil
		case codes.InvalidArgument, codes.AlreadyExists:
			// The audit service refuses these records for what they are (invalid, or another
			// record already holds an ID): no retry changes that.
			return fmt.Errorf("%w: %w", audit.ErrRejected, err)
		case codes.Unavailable:
			// A standby, or an instance down: the next one may lead.
			if ctx.Err() == nil {
				continue
			}
		}
		return err
	}
	return err
}

// PoolHosts reaches the other pool hosts of a deployment on etcd (pool.HostPeers), each at
// the internal address it registered, with this host's certificate; a connection per address
// is dialed on first use and kept.
type PoolHosts struct {
	files   mtls.Files
	tracing *telemetry.Tracing

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewPoolHosts returns the client; Close closes its connections.
func NewPoolHosts(files mtls.Files, tracing *telemetry.Tracing) *PoolHosts {
	return &PoolHosts{files: files, tracing: tracing, conns: make(map[string]*grpc.ClientConn)}
}

// ForwardRun forwards a request to the pool host at addr.
func (p *PoolHosts) ForwardRun(ctx context.Context, addr string, req *poolinternalv1.ForwardRunRequest) (*poolinternalv1.ForwardRunResponse, error) {
	client, err := p.client(addr)
	if err != nil {
		return nil, err
	}
	var pr peer.Peer
	resp, err := client.ForwardRun(ctx, req, grpc.Peer(&pr))
	if err != nil && pr.Addr == nil {
		return nil, notReached(addr, err)
	}
	return resp, err
}

// ForwardCallTool forwards a front door's call to the pool host at addr (pool.HostPeers): each
// progress report the host streams goes to progress before the next is read, and the response
// ends the call. Returning cancels the stream, and so the call on that host.
func (p *PoolHosts) ForwardCallTool(ctx context.Context, addr string, req *poolinternalv1.ForwardCallToolRequest, progress func(*poolinternalv1.CallProgress)) (*poolv1.CallToolResponse, error) {
	client, err := p.client(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var pr peer.Peer
	stream, err := client.ForwardCallTool(ctx, req, grpc.Peer(&pr))
	for err == nil {
		var msg *poolinternalv1.ForwardCallToolResponse
		if msg, err = stream.Recv(); err != nil {
			break
		}
		switch ev := msg.GetEvent().(type) {
		case *poolinternalv1.ForwardCallToolResponse_Progress:
			progress(ev.Progress)
		case *poolinternalv1.ForwardCallToolResponse_Response:
			return ev.Response, nil
		}
	}
	if errors.Is(err, io.EOF) {
		return nil, status.Errorf(codes.Internal, "peers: the pool host at %s ended the call's stream without its response", addr)
	}
	if pr.Addr == nil {
		return nil, notReached(addr, err)
	}
	return nil, err
}

// WatchAgentTools watches a run's listings on the pool host at addr (pool.HostPeers): each
// message goes to changes before the next is read. It returns nil once ctx ends, else the
// error that ended the stream.
func (p *PoolHosts) WatchAgentTools(ctx context.Context, addr string, req *poolinternalv1.WatchAgentToolsRequest, changes func(*poolinternalv1.WatchAgentToolsResponse)) error {
	client, err := p.client(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var pr peer.Peer
	stream, err := client.WatchAgentTools(ctx, req, grpc.Peer(&pr))
	for err == nil {
		var msg *poolinternalv1.WatchAgentToolsResponse
		if msg, err = stream.Recv(); err == nil {
			changes(msg)
		}
	}
	switch {
	case ctx.Err() != nil:
		return nil
	case errors.Is(err, io.EOF):
		return status.Errorf(codes.Internal, "peers: the pool host at %s ended a watch without a status", addr)
	case pr.Addr == nil:
		return notReached(addr, err)
	}
	return err
}

// client is the internal API of the pool host at addr, on a connection dialed on first use.
func (p *PoolHosts) client(addr string) (poolinternalv1.PoolInternalServiceClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	conn, ok := p.conns[addr]
	if !ok {
		var err error
		if conn, err = Dial(mtls.Pool, addr, p.files, p.tracing); err != nil {
			return nil, err
		}
		p.conns[addr] = conn
	}
	return poolinternalv1.NewPoolInternalServiceClient(conn), nil
}

// notReached is the error of a request that never reached the host: not its answer, so not
// its status either.
func notReached(addr string, err error) error {
	return fmt.Errorf("peers: the pool host at %s cannot be reached: %s", addr, status.Convert(err).Message())
}

// Close closes every connection.
func (p *PoolHosts) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for addr, conn := range p.conns {
		errs = append(errs, conn.Close())
		delete(p.conns, addr)
	}
	return errors.Join(errs...)
}
