// Package grpcserver is the one way Ringfence binaries serve: a gRPC server with reflection,
// grpc.health.v1, request ids, panic recovery, authorization, access logs and Prometheus
// metrics, and beside it one HTTP server with the grpc-gateway REST routes, /healthz and
// /metrics. REST calls go through the same gRPC server over an in-memory connection, so they
// pass the same interceptors as every other call.
package grpcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/telemetry"
	"github.com/ringfence/ringfence/internal/version"
)

// Authorizer decides whether a call may proceed and returns ctx with the caller attached.
type Authorizer interface {
	Authorize(ctx context.Context, fullMethod string) (context.Context, error)
}

// Authenticator is implemented by an Authorizer that can check an API key on its own. When
// the server's Authorizer has it, every REST request under /v1/ is authenticated before its
// body is read.
type Authenticator interface {
	Authenticate(ctx context.Context, key string) error
}

// Resolver is implemented by an Authorizer that resolves, once per call, what the request
// acts on (auth: its tenant) and attaches it to the context. The server calls it after
// Authorize, with the request message: before a unary handler, and on a stream's first
// received message.
type Resolver interface {
	Resolve(ctx context.Context, fullMethod string, req any) (context.Context, error)
}

// GatewayRegistrar registers one service's REST routes on the gateway mux.
type GatewayRegistrar func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error

// Options configures a Server.
// MaxResponseBytes is what every Ringfence gRPC client (the gateway, the CLI, a service
// calling its peer) accepts in one response. A tool result or a listing may be 16 MiB as
// the server wrote it and grow when sanitized (HTML escaping), and grpc-go's default of
// 4 MiB turned such a result, already dispatched, into RESOURCE_EXHAUSTED (HTTP 429: retry).
const MaxResponseBytes = 64 << 20

type Options struct {
	// Name of the binary, for logs.
	Name     string
	GRPCAddr string
	// HTTPAddr empty disables REST, /healthz and /metrics.
	HTTPAddr string
	// TLS, when set, serves gRPC and HTTP (REST, /healthz, /metrics) over TLS: REST carries
	// API keys in its headers.
	TLS        *tls.Config
	Authorizer Authorizer
	Logger     *slog.Logger
	// ShutdownTimeout bounds graceful shutdown before connections are cut; default 10s.
	ShutdownTimeout time.Duration
	// MaxRecvMsgSize bounds one request; default 4 MiB. grpc-go applies it to every method
	// alike, against the length a message announces, before reading its body.
	MaxRecvMsgSize int
	// InternalAddr, when set, serves the internal plane (ringfence.internal.*) on a listener of
	// its own: what is registered on Internal() is served there and nowhere else, with the same
	// interceptors, over InternalTLS, which must require and verify a client certificate.
	InternalAddr string
	InternalTLS  *tls.Config
	// Tracing, when set, records a span for every call served (telemetry.Tracing).
	Tracing *telemetry.Tracing
	// Limits bound what one peer can hold on the gRPC, internal and HTTP listeners.
	Limits Limits
}

// Server serves gRPC and HTTP until its context ends.
type Server struct {
	opts     Options
	log      *slog.Logger
	grpc     *grpc.Server   // behind the gRPC listener
	gateway  *grpc.Server   // behind inmem, for the REST gateway alone
	health   *health.Server // the public port's, and /healthz
	metrics  *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	byMethod sync.Map // full method → *methodMetrics
	gateways []GatewayRegistrar
	inmem    *bufconn.Listener
	internal *grpc.Server // nil without InternalAddr
	// internalHealth is the internal listener's health service (nil without one).
	internalHealth *health.Server
	extra          map[string]http.Handler
	refusals       *refusalLog
	// onShutdown runs as graceful shutdown begins (OnShutdown).
	onShutdown []func()

	mu           sync.Mutex
	grpcAddr     net.Addr
	httpAddr     net.Addr
	internalAddr net.Addr
	listening    chan struct{}
}

// New builds a Server; register services on GRPC() and routes with AddGateway, then Run.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = 10 * time.Second
	}
	if opts.MaxRecvMsgSize == 0 {
		opts.MaxRecvMsgSize = 4 << 20
	}
	opts.Limits = opts.Limits.withDefaults()
	s := &Server{
		opts:      opts,
		log:       opts.Logger,
		health:    health.NewServer(),
		metrics:   prometheus.NewRegistry(),
		inmem:     bufconn.Listen(1 << 20),
		extra:     make(map[string]http.Handler),
		listening: make(chan struct{}),
		refusals:  newRefusalLog(opts.Logger, 10*time.Second),
	}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringfence_grpc_requests_total",
		Help: "gRPC requests (REST included) by method and status code.",
	}, []string{"method", "code"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ringfence_grpc_request_duration_seconds",
		Help:    "gRPC request latency by method.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"method"})
	s.metrics.MustRegister(s.requests, s.latency, s.refusals.counter,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	serverOpts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
		grpc.MaxRecvMsgSize(opts.MaxRecvMsgSize),
		// Long-lived workers serve streams instead of a fresh goroutine per RPC, whose stack
		// otherwise grows (and is copied) through the interceptor chain on every call. When all
		// are busy, grpc-go starts a goroutine as before.
		grpc.NumStreamWorkers(uint32(max(64, 8*goruntime.GOMAXPROCS(0)))),
	}
	if opts.TLS != nil {
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	serverOpts = append(serverOpts, opts.Tracing.ServerOptions(true)...)
	s.grpc = grpc.NewServer(append(serverOpts, s.networkOptions("grpc", newServedMethods(func() *grpc.Server { return s.grpc }))...)...)
	s.gateway = grpc.NewServer(serverOpts...)
	grpc_health_v1.RegisterHealthServer(s.GRPC(), s.health)
	reflection.Register(s.GRPC())
	if opts.InternalAddr != "" {
		s.internal = s.newInternal()
	}
	return s
}

// GRPC is where services register.
func (s *Server) GRPC() Registrar { return servers{network: s.grpc, gateway: s.gateway} }

// Metrics is the registry behind /metrics, for services that export their own.
func (s *Server) Metrics() *prometheus.Registry { return s.metrics }

// AddGateway adds one service's REST routes.
func (s *Server) AddGateway(r GatewayRegistrar) { s.gateways = append(s.gateways, r) }

// Handle serves an extra HTTP handler at path (e.g. a demo page); REST routes stay under /v1/.
func (s *Server) Handle(path string, h http.Handler) { s.extra[path] = h }

// Addrs reports the bound addresses once Run is listening (useful with port 0).
func (s *Server) Addrs(ctx context.Context) (grpcAddr, httpAddr net.Addr, err error) {
	select {
	case <-s.listening:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grpcAddr, s.httpAddr, nil
}

// Run serves until ctx ends, then shuts down gracefully within ShutdownTimeout.
func (s *Server) Run(ctx context.Context) error {
	internalLis, err := s.listenInternal()
	if err != nil {
		return err
	}
	grpcLis, err := net.Listen("tcp", s.opts.GRPCAddr)
	if err != nil {
		closeListener(internalLis)
		return fmt.Errorf("grpcserver: listen on grpc_addr %s: %w (is another server running there?)", s.opts.GRPCAddr, err)
	}
	grpcLis = limitConns(grpcLis, "grpc", s.opts.Limits.MaxConnsPerAddress, s.refusals)
	var httpSrv *http.Server
	var httpLis net.Listener
	if s.opts.HTTPAddr != "" {
		handler, err := s.httpHandler(ctx)
		if err != nil {
			grpcLis.Close()
			closeListener(internalLis)
			return err
		}
		httpLis, err = net.Listen("tcp", s.opts.HTTPAddr)
		if err != nil {
			grpcLis.Close()
			closeListener(internalLis)
			return fmt.Errorf("grpcserver: listen on http_addr %s: %w (is another server running there?)", s.opts.HTTPAddr, err)
		}
		httpLis = limitConns(httpLis, "http", s.opts.Limits.MaxConnsPerAddress, s.refusals)
		// No ReadTimeout: net/http cancels a handler's context when it expires, which would
		// end audit watch streams and long tool calls. Bodies are read only after the key is
		// authenticated (authenticateFirst) and its permission for the route checked
		// (authorizeRoute), so only a key allowed to send one can hold one. Connections per
		// peer address are bounded (limitConns) before TLS.
		httpSrv = &http.Server{
			Handler: handler, ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		}
		if s.opts.TLS != nil {
			cfg := s.opts.TLS.Clone()
			cfg.NextProtos = []string{"h2", "http/1.1"}
			httpLis = tls.NewListener(httpLis, cfg)
		}
	}
	s.mu.Lock()
	s.grpcAddr = grpcLis.Addr()
	if httpLis != nil {
		s.httpAddr = httpLis.Addr()
	}
	if internalLis != nil {
		s.internalAddr = internalLis.Addr()
	}
	s.mu.Unlock()
	close(s.listening)

	for name := range s.grpc.GetServiceInfo() {
		s.health.SetServingStatus(name, grpc_health_v1.HealthCheckResponse_SERVING)
	}
	s.health.SetServingStatus("", grpc_health_v1.HealthCheckResponse_SERVING)
	if s.internal != nil {
		for name := range s.internal.GetServiceInfo() {
			s.internalHealth.SetServingStatus(name, grpc_health_v1.HealthCheckResponse_SERVING)
		}
		s.internalHealth.SetServingStatus("", grpc_health_v1.HealthCheckResponse_SERVING)
	}

	errc := make(chan error, 4)
	go func() { errc <- s.grpc.Serve(grpcLis) }()
	if internalLis != nil {
		go func() { errc <- s.internal.Serve(internalLis) }()
	}
	go func() { errc <- s.gateway.Serve(s.inmem) }()
	if httpSrv != nil {
		go func() {
			if err := httpSrv.Serve(httpLis); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	attrs := []any{"grpc", grpcLis.Addr().String(), "tls", s.opts.TLS != nil}
	if httpLis != nil {
		attrs = append(attrs, "http", httpLis.Addr().String())
	}
	if internalLis != nil {
		attrs = append(attrs, "internal", internalLis.Addr().String())
	}
	s.log.Info(s.opts.Name+" serving", append(attrs, "commit", version.Revision())...)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
		s.log.Error("server failed", "err", runErr)
	}
	s.shutdown(httpSrv)
	return runErr
}

// OnShutdown has f run as graceful shutdown begins, before the server waits for the RPCs in
// flight: f ends the streams that last until they are told to (a graceful stop waits for
// them until ShutdownTimeout otherwise). Call it before Run.
func (s *Server) OnShutdown(f func()) { s.onShutdown = append(s.onShutdown, f) }

func (s *Server) shutdown(httpSrv *http.Server) {
	s.health.Shutdown()
	if s.internalHealth != nil {
		s.internalHealth.Shutdown()
	}
	for _, f := range s.onShutdown {
		f()
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	if httpSrv != nil {
		if err := httpSrv.Shutdown(ctx); err != nil {
			_ = httpSrv.Close() // cut what did not finish in time; nothing more to do

		}
	}
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		wg.Go(s.grpc.GracefulStop)
		wg.Go(s.gateway.GracefulStop)
		if s.internal != nil {
			wg.Go(s.internal.GracefulStop)
		}
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn("graceful stop timed out; closing connections", "timeout", s.opts.ShutdownTimeout)
		if s.internal != nil {
			s.internal.Stop()
		}
		s.grpc.Stop()
		s.gateway.Stop()
		<-done
	}
	s.log.Info(s.opts.Name + " stopped")
}

func (s *Server) httpHandler(ctx context.Context) (http.Handler, error) {
	// The gateway reaches the gRPC server over an in-process pipe, which the server serves with
	// the same credentials as its network listener: TLS when configured. Nothing else can be
	// at the other end of the pipe, so the server's certificate needs no verification there; and
	// the gateway presents none, so internal RPCs stay out of REST's reach.
	creds := insecure.NewCredentials()
	if s.opts.TLS != nil {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	}
	conn, err := grpc.NewClient("passthrough:///inmem",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.inmem.DialContext(ctx) }),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxResponseBytes)),
		grpc.WithUnaryInterceptor(markRPCSent), grpc.WithStreamInterceptor(markStreamSent),
	)
	if err != nil {
		return nil, fmt.Errorf("grpcserver: gateway connection: %w", err)
	}
	mux := NewGatewayMux(s.authorizeRoute)
	for _, register := range s.gateways {
		if err := register(ctx, mux, conn); err != nil {
			return nil, fmt.Errorf("grpcserver: register gateway: %w", err)
		}
	}
	root := http.NewServeMux()
	api := limitBody(mux, int64(s.opts.MaxRecvMsgSize))
	if a, ok := s.opts.Authorizer.(Authenticator); ok {
		api = authenticateFirst(api, a, s.refusals)
	}
	root.Handle("/v1/", headAsGet(api))
	root.HandleFunc("/healthz", getOnly(s.healthz))
	root.Handle("/metrics", getOnly(promhttp.HandlerFor(s.metrics, promhttp.HandlerOpts{}).ServeHTTP))
	root.HandleFunc("/", noRoute)
	for path, h := range s.extra {
		root.Handle(path, h)
	}
	return httpRequestID(root), nil
}

// headAsGet answers HEAD on every REST route that takes GET as that GET: the same checks,
// status and headers, without the body (monitoring probes and curl -I send HEAD; the gateway
// matches routes by method and answered 405). The route's GET handler runs, which changes
// nothing by definition; net/http drops what it writes to a HEAD response. A stream (a watch)
// is answered as soon as it is admitted, authorized and its request accepted (its RPC sends
// its headers then: answerHeadOnAdmission), or at its refusal, and ends there: an idle watch
// would send its first message only once something is recorded. HEAD on a path with no GET
// route is left to the gateway's 405, whose Allow names the methods the path takes.
func headAsGet(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodHead || !slices.Contains(allowedMethods(r.URL.Path), http.MethodGet) {
			h.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithCancel(context.WithValue(r.Context(), headKey{}, true))
		defer cancel()
		get := r.Clone(ctx)
		get.Method = http.MethodGet
		h.ServeHTTP(&headResponse{ResponseWriter: w, sent: cancel}, get)
	})
}

// headKey marks the context of a HEAD that headAsGet serves as GET.
type headKey struct{}

func isHead(ctx context.Context) bool { v, _ := ctx.Value(headKey{}).(bool); return v }

// headResponse is the response writer of a HEAD served as GET. A flush sends the status and
// headers, after which a HEAD has nothing more to send: it ends the handler's context, so a
// stream that would go on (a watch) stops there, and what the handler writes after it (the
// gateway's error line for the stream it ended) is dropped.
type headResponse struct {
	http.ResponseWriter
	sent context.CancelFunc
	done bool
}

func (h *headResponse) WriteHeader(code int) {
	if !h.done {
		h.ResponseWriter.WriteHeader(code)
	}
}

func (h *headResponse) Write(b []byte) (int, error) {
	if h.done {
		return len(b), nil
	}
	return h.ResponseWriter.Write(b)
}

func (h *headResponse) Flush() {
	http.NewResponseController(h.ResponseWriter).Flush() //nolint:errcheck // nothing to do about a client gone
	h.done = true
	h.sent()
}

// Unwrap lets http.ResponseController reach the connection's other controls.
func (h *headResponse) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// getOnly serves GET and HEAD with h, and answers any other method 405.
func getOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			closeIfBodyUnread(w, r)
			MethodNotAllowed(w, r, http.MethodGet, http.MethodHead)
			return
		}
		h(w, r)
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	resp, err := s.health.Check(r.Context(), &grpc_health_v1.HealthCheckRequest{})
	w.Header().Set("Content-Type", "application/json")
	if err != nil || resp.GetStatus() != grpc_health_v1.HealthCheckResponse_SERVING {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, `{"status":"NOT_SERVING"}`)
		return
	}
	fmt.Fprintln(w, `{"status":"SERVING"}`)
}

// authenticateFirst refuses a request without a valid API key before the gateway matches a
// route: every /v1/ route needs a key, and a path no route takes is named only to a key
// holder. Which permission a route needs is checked next, by authorizeRoute. A refusal never
// becomes an RPC, so it is noted as the gRPC listener's refused streams are: counted in
// ringfence_refused_total and logged at most once per peer and interval.
func authenticateFirst(h http.Handler, a Authenticator, refusals *refusalLog) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := auth.SingleKey(r.Header.Values("X-API-Key"))
		if err == nil && key == "" {
			err = KeyElsewhere(r)
		}
		if err == nil {
			err = a.Authenticate(r.Context(), key)
		}
		if err != nil {
			refusals.note("http", remoteAddr(r), status.Code(err).String())
			refuseUnread(w, r, err)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// KeyElsewhere names where a request without X-API-Key put its key instead, when it did so
// where a REST client would (an Authorization header, the query): "missing API key" alone
// reads as if nothing was sent. A key in the query is never read, since URLs end up in logs.
// Nil when neither.
func KeyElsewhere(r *http.Request) error {
	if r.Header.Get("Authorization") != "" {
		return status.Error(codes.Unauthenticated, "auth: missing API key: the /v1/ routes read it from the X-API-Key header, not Authorization (only the MCP front door, /mcp, reads an Authorization: Bearer agent token)")
	}
	for name := range r.URL.Query() {
		if n := strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(name)); n == "apikey" || n == "xapikey" || n == "key" {
			return status.Errorf(codes.Unauthenticated, "auth: missing API key: send it in the X-API-Key header; a key in the URL (%s) is never read, since URLs end up in logs and browser histories: revoke a key sent so if it may have been logged", fielderr.Quote(name))
		}
	}
	return nil
}

func limitBody(h http.Handler, n int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, n)
		h.ServeHTTP(w, r)
	})
}

// call wraps one RPC: request id, panic recovery, authorization, metrics, the access log, and
// the bound on the status it ends with (boundStatus).
func (s *Server) call(ctx context.Context, method string, run func(context.Context) error) (err error) {
	start := time.Now()
	ctx, info := withRequestID(ctx)
	rid := info.id
	defer func() {
		if r := recover(); r != nil {
			s.log.ErrorContext(ctx, "panic in handler", "method", method, "request_id", rid, "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error (request id %s); the server log has the detail", rid)
		}
		err = boundStatus(err)
		s.finish(ctx, method, info, start, err)
	}()
	if s.opts.Authorizer != nil {
		authCtx, aerr := s.opts.Authorizer.Authorize(ctx, method)
		if aerr != nil {
			return aerr
		}
		ctx = authCtx
	}
	return run(ctx)
}

// finish counts one RPC in the metrics and writes its access log line.
func (s *Server) finish(ctx context.Context, method string, info *requestInfo, start time.Time, err error) {
	code := status.Code(err)
	elapsed := time.Since(start)
	s.observe(method, code, elapsed)
	// Quiet on success: a served call is a Debug line (metrics count it anyway); a
	// refused or failed one is Info, and a server fault is an Error. UNKNOWN is a fault only
	// when the handler returned an error that is no status: as a status it is a tool call that
	// reached its MCP server and failed there (a CallFailure), which is the tool's, not ours.
	level := slog.LevelDebug
	switch _, isStatus := status.FromError(err); {
	case code == codes.OK:
	case code == codes.Internal, code == codes.DataLoss, code == codes.Unknown && !isStatus:
		level = slog.LevelError
	default:
		level = slog.LevelInfo
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("method", method), slog.String("code", code.String()),
		slog.Duration("duration", elapsed), slog.String("request_id", info.id),
	}
	if p, ok := auth.FromContext(ctx); ok {
		attrs = append(attrs, slog.String("actor", p.Actor()))
	}
	if err != nil {
		// What the caller was told, and nothing more: a status message never holds a secret.
		attrs = append(attrs, slog.String("err", status.Convert(err).Message()))
	}
	attrs = append(attrs, info.logAttrs()...)
	s.log.LogAttrs(ctx, level, "rpc", attrs...)
}

// methodMetrics holds one method's series, resolved once: the vectors' label lookup hashes
// and allocates on every call otherwise.
type methodMetrics struct {
	latency prometheus.Observer
	byCode  [codes.Unauthenticated + 1]atomic.Pointer[prometheus.Counter]
}

func (s *Server) observe(method string, code codes.Code, elapsed time.Duration) {
	mm, ok := s.byMethod.Load(method)
	if !ok {
		mm, _ = s.byMethod.LoadOrStore(method, &methodMetrics{latency: s.latency.WithLabelValues(method)})
	}
	m := mm.(*methodMetrics)
	m.latency.Observe(elapsed.Seconds())
	if int(code) >= len(m.byCode) {
		s.requests.WithLabelValues(method, code.String()).Inc()
		return
	}
	c := m.byCode[code].Load()
	if c == nil {
		counter := s.requests.WithLabelValues(method, code.String())
		c = &counter
		m.byCode[code].Store(c)
	}
	(*c).Inc()
}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	err = s.call(ctx, info.FullMethod, func(ctx context.Context) error {
		ctx, rerr := s.resolve(ctx, info.FullMethod, req)
		if rerr != nil {
			return rerr
		}
		var herr error
		resp, herr = handler(ctx, req)
		return herr
	})
	return resp, err
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return s.call(ss.Context(), info.FullMethod, func(ctx context.Context) error {
		return handler(srv, &contextStream{ServerStream: ss, ctx: ctx, method: info.FullMethod, resolve: s.resolve})
	})
}

// resolve applies the Authorizer's Resolver, when it has one, to a call's request.
func (s *Server) resolve(ctx context.Context, method string, req any) (context.Context, error) {
	if r, ok := s.opts.Authorizer.(Resolver); ok {
		return r.Resolve(ctx, method, req)
	}
	return ctx, nil
}

// contextStream is a served stream whose context carries what the interceptors attached, and
// what the Resolver makes of the first message received. A handler reads the context after
// that message (a server-streaming RPC's generated code receives it before calling the
// handler); one that reads it earlier finds no tenancy and fails closed.
type contextStream struct {
	grpc.ServerStream
	method   string
	resolve  func(ctx context.Context, method string, req any) (context.Context, error)
	resolved bool

	mu  sync.Mutex
	ctx context.Context
}

func (c *contextStream) Context() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctx
}

func (c *contextStream) RecvMsg(m any) error {
	if err := c.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.resolved {
		return nil
	}
	ctx, err := c.resolve(c.ctx, c.method, m)
	if err != nil {
		return err
	}
	c.ctx, c.resolved = ctx, true
	return nil
}
