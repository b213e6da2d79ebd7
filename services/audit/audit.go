// Package audit is the audit service: the append-only, hash-chained record of every admin
// change and every tool-call attempt. Producers (registry, publisher, pool) append through
// their own durable spools with their service certificates; readers with audit:read list,
// watch, verify and export it, a tenant-bound key seeing its tenant only.
package audit

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/services/audit/internal/store"
)

// Config holds the service's dependencies.
type Config struct {
	// DBPath is the log's bbolt file: the log itself, or with Etcd this instance's copy of
	// the chain in etcd.
	DBPath string
	// Etcd, when set (store.backend=etcd), holds the chain that several instances share:
	// one of them writes it at a time (see sharedLog), the others stand by and copy it.
	Etcd *clientv3.Client
	// EtcdRoot is store.etcd_prefix.
	EtcdRoot string
	// Instance names this instance to producers a standby sends to the leader.
	Instance string
	Logger   *slog.Logger
}

// Service implements AuditService.
type Service struct {
	auditv1.UnsafeAuditServiceServer

	store    *store.Store
	verifier *verifier
	// shared is the chain in etcd this log is a copy of, or nil (bbolt only).
	shared *sharedLog
	log    *slog.Logger
	errors grpcserver.ErrorTable

	// watches ends the Watch streams in progress when the server stops (EndWatches): they
	// last until told to, and a graceful stop would wait for them until its timeout.
	watchMu  sync.Mutex
	watches  map[*context.CancelCauseFunc]struct{}
	stopping bool
}

var _ auditv1.AuditServiceServer = (*Service)(nil)

// errStopping ends the Watch streams of a server that stops.
var errStopping = errors.New("audit: the audit service is stopping")

// errorFields names the field of each INVALID_ARGUMENT sentinel, for its BadRequest detail.
var errorFields = map[error]string{store.ErrInvalidFilter: "filter", store.ErrInvalidPageToken: "page_token"}

var errorCodes = grpcserver.MergeCodes(etcdstore.ErrorCodes, map[error]codes.Code{
	audit.ErrInvalidRecord:    codes.InvalidArgument,
	store.ErrInvalidFilter:    codes.InvalidArgument,
	store.ErrInvalidPageToken: codes.InvalidArgument,
	store.ErrClosed:           codes.Unavailable,
	store.ErrIDConflict:       codes.AlreadyExists,
	auth.ErrTenantMismatch:    codes.PermissionDenied,
	store.ErrTooManyRecords:   codes.InvalidArgument,
	ErrNotLeader:              codes.Unavailable,
	ErrFenced:                 codes.Unavailable,
})

// Open opens the log.
func Open(cfg Config) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	opts := store.Options{Logger: cfg.Logger}
	var shared *sharedLog
	if cfg.Etcd != nil {
		shared = newSharedLog(sharedConfig{Client: cfg.Etcd, Root: cfg.EtcdRoot, Name: cfg.Instance, Logger: cfg.Logger})
		opts.Chain = shared
	}
	st, err := store.Open(cfg.DBPath, opts)
	if err != nil {
		return nil, err
	}
	if shared != nil {
		shared.Start(st)
	}
	return &Service{
		store: st, verifier: newVerifier(st, cfg.DBPath), shared: shared, log: cfg.Logger,
		errors: grpcserver.ErrorTable{Service: "audit", Codes: errorCodes, Fields: errorFields, Logger: cfg.Logger},
	}, nil
}

// Close stops a Verify in progress, hands the leadership on, and closes the log.
func (s *Service) Close() error {
	s.verifier.close()
	if s.shared != nil {
		s.shared.Close()
	}
	return s.store.Close()
}

// catchUp brings this instance's copy up to the chain in etcd as it is now, so that a read
// answers with every record acknowledged before it, on any instance. Without etcd the log
// is the file, and nothing is to be done.
func (s *Service) catchUp(ctx context.Context) error {
	if s.shared == nil {
		return nil
	}
	return s.shared.CatchUp(ctx)
}

// Sink is where in-process producers' spools forward to (ringfenced).
func (s *Service) Sink() audit.Sink { return s.store.Sink() }

// filterFor turns a request filter into a store filter, confined to the tenancy the server's
// interceptor resolved: a tenant-bound key reads its tenant only (naming another was refused
// there), a key bound to none reads the tenant it names, or every tenant. A call without a
// resolved tenancy is refused.
func filterFor(ctx context.Context, f *auditv1.Filter) (store.Filter, error) {
	t, err := auth.TenancyFrom(ctx)
	if err != nil {
		return store.Filter{}, err
	}
	out := store.Filter{
		Tenant: t.Tenant, RunID: f.GetRunId(), ServerRef: f.GetServerRef(), ToolName: f.GetToolName(),
		Outcome: f.GetOutcome(), Kind: audit.Kind(f.GetKind()), CallID: f.GetCallId(),
	}
	if f.GetSince() != nil {
		out.Since = f.GetSince().AsTime()
	}
	if f.GetUntil() != nil {
		out.Until = f.GetUntil().AsTime()
	}
	return out, nil
}

// List implements AuditService.
func (s *Service) List(ctx context.Context, req *auditv1.ListRequest) (*auditv1.ListResponse, error) {
	f, err := filterFor(ctx, req.GetFilter())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	if req.GetPageSize() < 0 {
		return nil, s.errors.Status(ctx, fieldErr("page_size", "must not be negative"))
	}
	if err := s.catchUp(ctx); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	page, err := s.store.List(ctx, f, int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	resp := &auditv1.ListResponse{NextPageToken: page.NextPageToken}
	for _, e := range page.Entries {
		resp.Records = append(resp.Records, entryToProto(e))
	}
	return resp, nil
}

// Watch implements AuditService: records from from_seq on, then new ones as they land.
func (s *Service) Watch(req *auditv1.WatchRequest, stream auditv1.AuditService_WatchServer) error {
	ctx := stream.Context()
	f, err := filterFor(ctx, req.GetFilter())
	if err != nil {
		return s.errors.Status(ctx, err)
	}
	// Refused at once: a filter nothing can match would watch silently forever.
	if err := f.Validate(); err != nil {
		return s.errors.Status(ctx, err)
	}
	if err := s.catchUp(ctx); err != nil {
		return s.errors.Status(ctx, err)
	}
	ctx, end, err := s.startWatch(ctx)
	if err != nil {
		return err
	}
	defer end()
	// Admitted: the headers go now, not with a first record an idle log may never append, so
	// the caller (and a REST HEAD, answered at this point) knows the watch has begun.
	if err := grpcserver.AdmitStream(stream); err != nil {
		return err
	}
	from := req.GetFromSeq()
	if from == 0 {
		head, _ := s.store.Head()
		from = head + 1
	}
	next := from // the first record the client has not been given (or passed over)
	for e, err := range s.store.Watch(ctx, from) {
		if err != nil {
			if errors.Is(context.Cause(ctx), errStopping) {
				return status.Errorf(codes.Unavailable, "%v: watch again from record %d (ringfence audit tail --from %d) once it is back, or at another audit instance", errStopping, next, next)
			}
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return nil
			}
			return s.errors.Status(ctx, err)
		}
		next = e.Record.Seq + 1
		if !f.Matches(&e.Record) {
			continue
		}
		if err := stream.Send(&auditv1.WatchResponse{Record: entryToProto(e)}); err != nil {
			return err
		}
	}
	return nil
}

// startWatch registers a Watch stream, in a context EndWatches cancels; end unregisters it.
func (s *Service) startWatch(ctx context.Context) (_ context.Context, end func(), _ error) {
	ctx, cancel := context.WithCancelCause(ctx)
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.stopping {
		cancel(nil)
		return nil, nil, status.Errorf(codes.Unavailable, "%v: watch again once it is back, or at another audit instance", errStopping)
	}
	if s.watches == nil {
		s.watches = make(map[*context.CancelCauseFunc]struct{})
	}
	s.watches[&cancel] = struct{}{}
	return ctx, func() {
		s.watchMu.Lock()
		delete(s.watches, &cancel)
		s.watchMu.Unlock()
		cancel(nil)
	}, nil
}

// HeadSeq is the seq of the last record in this service's log (its copy, on etcd): how many
// records it holds.
func (s *Service) HeadSeq() uint64 {
	seq, _ := s.store.Head()
	return seq
}

// EndWatches ends every Watch stream in progress, each with UNAVAILABLE naming the record to
// watch again from, and refuses new ones: the server stops (grpcserver.Server.OnShutdown).
func (s *Service) EndWatches() {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	s.stopping = true
	for cancel := range s.watches {
		(*cancel)(errStopping)
	}
}

// Verify implements AuditService. Concurrent calls share one walk of the chain, and a walk's
// answer is given again while the file is unchanged (see verifier). A tenant-bound key is
// answered about its tenant's records (store.CheckTenant), a key bound to none about the log.
func (s *Service) Verify(ctx context.Context, req *auditv1.VerifyRequest) (*auditv1.VerifyResponse, error) {
	anchor := store.Anchor{Seq: req.GetAnchorSeq()}
	if anchor.Seq > 0 || req.GetAnchorHash() != "" {
		b, err := hex.DecodeString(req.GetAnchorHash())
		if err != nil || len(b) != len(anchor.Hash) || anchor.Seq == 0 {
			return nil, s.errors.Status(ctx, fieldErr("anchor_hash", "an anchor is a sequence number above 0 and a 64-character hex hash, as Verify answers them (head_seq, head_hash)"))
		}
		copy(anchor.Hash[:], b)
	}
	t, err := auth.TenancyFrom(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.catchUp(ctx); err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	var res store.VerifyResult
	if t.All {
		res, err = s.verifier.verify(ctx, anchor)
	} else {
		// The one chain spans every tenant and is walked whole (the walk is shared); a caller
		// confined to a tenant is answered about that tenant's records only.
		if res, err = s.verifier.verify(ctx, store.Anchor{}); err == nil {
			res, err = s.store.CheckTenant(res, t.Tenant, anchor)
		}
	}
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	// The head the walk covered, not the head now: records appended since were not
	// verified, and a head printed as verified is what a caller keeps as an anchor.
	return &auditv1.VerifyResponse{
		Ok: res.OK, Checked: res.Checked, FirstBroken: res.FirstBroken, Reason: res.Reason,
		HeadSeq: res.HeadSeq, HeadHash: hexHash(res.HeadHash),
	}, nil
}

// Export implements AuditService over gRPC: every matching record up to the head when the
// export began. Records appended meanwhile are left out, so an export of a busy log ends
// (Watch follows new records).
func (s *Service) Export(req *auditv1.ExportRequest, stream auditv1.AuditService_ExportServer) error {
	ctx := stream.Context()
	f, err := filterFor(ctx, req.GetFilter())
	if err != nil {
		return s.errors.Status(ctx, err)
	}
	if err := s.catchUp(ctx); err != nil {
		return s.errors.Status(ctx, err)
	}
	head, _ := s.store.Head()
	token := ""
	for {
		page, err := s.store.List(ctx, f, 1000, token)
		if err != nil {
			return s.errors.Status(ctx, err)
		}
		for _, e := range page.Entries {
			if e.Record.Seq > head {
				return nil
			}
			if err := stream.Send(&auditv1.ExportResponse{Record: entryToProto(e)}); err != nil {
				return err
			}
		}
		if token = page.NextPageToken; token == "" {
			return nil
		}
	}
}

// ExportHandler serves GET /v1/audit/export as JSON lines: each line is
// {"hash":"<hex>","record":<the stored body, byte for byte>}, so the chain can be verified
// away from this service. It authorizes exactly like the Export RPC. HEAD answers as GET
// would begin, the same checks, status and headers, without reading the log.
func (s *Service) ExportHandler(authz grpcserver.Authorizer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			grpcserver.MethodNotAllowed(w, r, http.MethodGet, http.MethodHead)
			return
		}
		// Every X-API-Key the request sent: Authorize refuses a key sent twice.
		ctx := metadata.NewIncomingContext(r.Context(), metadata.MD{auth.MetadataKey: r.Header.Values("X-API-Key")})
		ctx, err := authz.Authorize(ctx, auditv1.AuditService_Export_FullMethodName)
		if err != nil && len(r.Header.Values("X-API-Key")) == 0 {
			if elsewhere := grpcserver.KeyElsewhere(r); elsewhere != nil {
				err = elsewhere
			}
		}
		if err != nil {
			grpcserver.WriteHTTPError(w, err)
			return
		}
		q := r.URL.Query()
		// The gateway's routes refuse these in a middleware (grpcserver.refuseInvalidUTF8);
		// this handler sits beside the gateway.
		if err := grpcserver.CheckParamsUTF8(nil, q); err != nil {
			grpcserver.WriteHTTPError(w, err)
			return
		}
		for name := range q {
			if !slices.Contains(exportParams, name) {
				grpcserver.WriteHTTPError(w, s.errors.Status(ctx, fieldErr(name, "is not a filter of the export: use %s", strings.Join(exportParams, ", "))))
				return
			}
		}
		pf := &auditv1.Filter{
			Tenant: q.Get("tenant"), RunId: q.Get("run_id"), ServerRef: q.Get("server_ref"),
			ToolName: q.Get("tool_name"), Outcome: q.Get("outcome"), Kind: q.Get("kind"), CallId: q.Get("call_id"),
		}
		// The tenancy is resolved as the interceptor resolves it for the Export RPC; an
		// authorizer that cannot leaves none, and filterFor refuses.
		if r, ok := authz.(grpcserver.Resolver); ok {
			if ctx, err = r.Resolve(ctx, auditv1.AuditService_Export_FullMethodName, &auditv1.ExportRequest{Filter: pf}); err != nil {
				grpcserver.WriteHTTPError(w, err)
				return
			}
		}
		f, err := filterFor(ctx, pf)
		if err != nil {
			grpcserver.WriteHTTPError(w, s.errors.Status(ctx, err))
			return
		}
		for name, dst := range map[string]*time.Time{"since": &f.Since, "until": &f.Until} {
			if v := q.Get(name); v != "" {
				t, err := time.Parse(time.RFC3339, v)
				if err != nil {
					grpcserver.WriteHTTPError(w, s.errors.Status(ctx, fieldErr(name, "must be an RFC 3339 time, e.g. 2026-11-30T00:00:00Z")))
					return
				}
				*dst = t
			}
		}
		// Refused before the first byte: a 200 with an empty body would read as "no records".
		if err := f.Validate(); err != nil {
			grpcserver.WriteHTTPError(w, s.errors.Status(ctx, err))
			return
		}
		if err := s.catchUp(ctx); err != nil {
			grpcserver.WriteHTTPError(w, s.errors.Status(ctx, err))
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		if r.Method == http.MethodHead {
			return
		}
		if _, err := s.store.Export(ctx, w, f); err != nil && !strings.Contains(err.Error(), "write") {
			s.log.Warn("export failed", "err", err)
			// The status is sent; a last line that is not a record tells the reader the
			// export is incomplete (and fails VerifyExport).
			line, _ := json.Marshal(map[string]string{"error": "export incomplete: " + status.Convert(s.errors.Status(ctx, err)).Message()})
			_, _ = w.Write(append(line, '\n'))
		}
	})
}

// exportParams are the query parameters GET /v1/audit/export takes.
var exportParams = []string{"tenant", "run_id", "server_ref", "tool_name", "outcome", "kind", "call_id", "since", "until"}
