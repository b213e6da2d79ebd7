// Package publisher is the publisher service: tenants' agent graphs, each with one editable
// draft and numbered published versions that never change. mcp-import pins a registered
// server's tool declarations into a draft; publish proves every capability rule (the floor,
// the registry's ceiling, the agent floor) against the registry's current grants before a
// version exists, and the pool loads versions from here for its runs.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/publisher/internal/store"
)

// Policies returns a registered server's grants and tool filter: the registry service
// in-process, or its internal GetServerPolicy RPC. An unregistered ref is an error wrapping
// mcpserver.ErrNotRegistered.
type Policies interface {
	ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error)
}

// Discoverer lists a registered server's tools by starting it in isolation: the pool.
type Discoverer interface {
	DiscoverTools(ctx context.Context, ref string) (*discovery.Listing, error)
}

// UserDiscoverer is a Discoverer that also lists a server that signs each user in as one
// user sees it: the pool, in-process or over the internal plane.
type UserDiscoverer interface {
	DiscoverToolsAs(ctx context.Context, tenant, user, ref string) (*discovery.Listing, error)
}

// Config holds the service's dependencies.
type Config struct {
	// DBPath is the publisher's bbolt file. With Etcd set, nothing is kept there (a file left
	// from bbolt is moved to etcd at Open, then renamed); the audit quarantine file is still
	// named after it (<DBPath>.audit-quarantine.jsonl).
	DBPath string
	// Etcd, when set, keeps the publisher's state in etcd under <EtcdRoot>/publisher/, shared
	// by every replica that names the same cluster and root, instead of the bbolt file.
	Etcd     *clientv3.Client
	EtcdRoot string
	// EtcdInlineBytes and EtcdChunkBytes, when positive, replace etcdstore.InlineBytes and
	// ChunkBytes (tests make them small, and with them what etcd keeps of one draft).
	EtcdInlineBytes, EtcdChunkBytes int
	// Policies resolves grants for publish and import; required, because a publisher without
	// it would have no ceiling.
	Policies Policies
	// Discoverer answers imports; nil means isolation is not configured, and imports refuse
	// instead of ever running a server on the host.
	Discoverer Discoverer
	// AllowInlineMCPServers turns the refusal of inline mcp_servers into a warning
	// (dev.allow_inline_mcp_servers; production refuses it at start).
	AllowInlineMCPServers bool
	// CacheBytes bounds the decoded drafts and versions kept in memory, by encoded size
	// (0: 128 MiB, negative: none). Decoding a 10,000-node draft costs more than validating it.
	CacheBytes int
	// AuditSink receives the admin events (the audit service in-process, or peers.Audit);
	// SpoolMaxRecords and OnSpoolFull bound the outbox that holds them meanwhile.
	AuditSink       audit.Sink
	SpoolMaxRecords int
	OnSpoolFull     audit.FullPolicy
	Logger          *slog.Logger
}

// Service implements PublisherService.
type Service struct {
	publisherv1.UnsafePublisherServiceServer

	cfg       Config
	store     Store
	spool     *audit.Spool
	forwarder *audit.Forwarder
	validator *graph.Validator
	log       *slog.Logger
	errors    grpcserver.ErrorTable
}

var (
	_ publisherv1.PublisherServiceServer = (*Service)(nil)
	_ graph.GrantsResolver               = Policies(nil)
)

// Errors a caller in the same process (the pool) can test for with errors.Is.
var (
	ErrGraphNotFound   = errors.New("no such graph in this tenant (ringfence graphs list shows the tenant's graphs)")
	ErrVersionNotFound = errors.New("no published version with this number (ringfence graphs versions lists them)")
)

// Domain errors, each with a message a person can act on; errorCodes maps them to codes.
var (
	errGraphExists   = errors.New("publisher: a graph with this id already exists in this tenant: edit its draft (ringfence graphs edit) or choose another id")
	errStaleRevision = errors.New("publisher: the draft changed since the revision you sent: get it again (ringfence graphs show), reapply your change, and send the new revision")
	errDraftChanged  = errors.New("publisher: the draft changed while it was being validated or imported into; run the command again")
	errBadPageToken  = errors.New("publisher: page_token is not one this server issued: start again without it")
	errAgentNotFound = errors.New("publisher: the draft has no agent node with this id: add it to the draft (ringfence graphs show -o json, then ringfence graphs edit), or name it with --agent when the graph is created")
	errImportRefused = errors.New("publisher: mcp-import refused")
)

// errorFields names the field of each INVALID_ARGUMENT sentinel, for its BadRequest detail.
var errorFields = map[error]string{errBadPageToken: "page_token"}

var errorCodes = grpcserver.MergeCodes(etcdstore.ErrorCodes, map[error]codes.Code{
	ErrGraphNotFound:               codes.NotFound,
	ErrVersionNotFound:             codes.NotFound,
	errGraphExists:                 codes.AlreadyExists,
	errStaleRevision:               codes.Aborted,
	errDraftChanged:                codes.Aborted,
	errBadPageToken:                codes.InvalidArgument,
	errAgentNotFound:               codes.NotFound,
	errImportRefused:               codes.FailedPrecondition,
	errActForUser:                  codes.PermissionDenied,
	auth.ErrTenantMismatch:         codes.PermissionDenied,
	discovery.ErrIsolationRequired: codes.Unavailable,
	audit.ErrSpoolFull:             codes.Unavailable,
	store.ErrDamaged:               codes.DataLoss,
})

// Open opens the publisher's store and builds the service; Close releases it.
func Open(cfg Config) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	v, err := graph.NewValidator(cfg.Policies, graph.AllowInlineMCPServers(cfg.AllowInlineMCPServers))
	if err != nil {
		return nil, err
	}
	st, err := openStore(cfg)
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg:       cfg,
		store:     st,
		spool:     st.Spool(),
		forwarder: st.Spool().StartForwarding(),
		validator: v,
		log:       cfg.Logger,
		errors:    grpcserver.ErrorTable{Service: "publisher", Codes: errorCodes, Fields: errorFields, Logger: cfg.Logger},
	}, nil
}

// openStore opens the back end cfg names, with the audit spool beside its data.
func openStore(cfg Config) (Store, error) {
	spool := store.SpoolConfig{
		Sink: cfg.AuditSink, Producer: "publisher",
		MaxPending: cfg.SpoolMaxRecords, OnFull: cfg.OnSpoolFull, Logger: cfg.Logger,
	}
	if cfg.Etcd == nil {
		return store.OpenBolt(cfg.DBPath, cfg.CacheBytes, spool)
	}
	spool.QuarantinePath = cfg.DBPath + ".audit-quarantine.jsonl"
	ctx, cancel := context.WithTimeout(context.Background(), etcdstore.RequestTimeout)
	defer cancel()
	st, err := store.OpenEtcd(ctx, store.EtcdConfig{Client: cfg.Etcd, Root: cfg.EtcdRoot, CacheBytes: cfg.CacheBytes,
		InlineBytes: cfg.EtcdInlineBytes, ChunkBytes: cfg.EtcdChunkBytes, Logger: cfg.Logger}, spool)
	if err != nil {
		return nil, err
	}
	_, statErr := os.Stat(cfg.DBPath)
	if err := moveBolt(st, cfg.DBPath, cfg.Logger); err != nil {
		_ = st.Close() // the move's error is the one to report
		return nil, err
	}
	if errors.Is(statErr, fs.ErrNotExist) { // nothing was moved at this start
		etcdstore.WarnMovedElsewhere(ctx, cfg.Logger, "publisher", cfg.DBPath, st.Prefix(), "no graph", "every graph of before is missing", st.Empty)
	}
	return st, nil
}

// moveTimeout bounds the copy of a publisher.db into etcd at start.
const moveTimeout = 10 * time.Minute

// moveBolt copies the graphs a publisher.db left from bbolt kept into etcd, before the
// publisher serves, and renames the file (store.Etcd.MoveBolt; docs/operations.md, "Moving
// from bbolt"). Without the file it does nothing.
func moveBolt(st *store.Etcd, path string, log *slog.Logger) error {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("publisher: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), moveTimeout)
	defer cancel()
	m, err := st.MoveBolt(ctx, path)
	if err != nil {
		return err
	}
	name := filepath.Base(path)
	for _, sk := range m.Skipped {
		log.Warn(fmt.Sprintf("publisher: a graph of %s was not moved to etcd: no publisher writes one like it, so the file was damaged or altered; it stays in %s. Publish it again if it is wanted", name, filepath.Base(m.RenamedTo)),
			"key", sk.Key, "reason", sk.Reason)
	}
	log.Info(fmt.Sprintf("moved the publisher's state kept in %s to etcd, and renamed the file to %s", name, filepath.Base(m.RenamedTo)),
		"graphs_copied", m.GraphsCopied, "graphs_already_in_etcd", m.GraphsInEtcd,
		"versions_copied", m.VersionsCopied, "audit_records_moved", m.AuditRecords, "audit_dropped_count_moved", m.AuditDropped, "skipped", len(m.Skipped))
	return nil
}

// Spool is the publisher's audit spool (tests flush it).
func (s *Service) Spool() *audit.Spool { return s.spool }

// Close stops the audit forwarder (pending events stay durable and are sent after the next
// start) and closes the store.
func (s *Service) Close() error {
	s.forwarder.Stop(2 * time.Second)
	return s.store.Close()
}

// PublishedVersion returns a published version (0: the latest) with inline env values in
// clear: what the pool loads for a run. In-process callers use it directly; split deployments
// reach it through the internal GetPublishedVersion RPC. Unknown graphs and versions are
// ErrGraphNotFound and ErrVersionNotFound.
func (s *Service) PublishedVersion(ctx context.Context, tenant, graphID string, version int64) (*graph.Version, error) {
	if err := graph.ValidateTenant(tenant); err != nil {
		return nil, err
	}
	if err := graph.ValidateGraphID("graph_id", graphID); err != nil {
		return nil, err
	}
	if version < 0 {
		return nil, fielderrNegative("version")
	}
	v, err := s.store.Version(ctx, tenant, graphID, version)
	if err != nil {
		err = s.versionErr(ctx, tenant, graphID, version, err)
		if errors.Is(err, ErrGraphNotFound) || errors.Is(err, ErrVersionNotFound) {
			err = notPublished{err}
		}
		return nil, err
	}
	return v, nil
}

// notPublished is a missing graph or version as the pool asks for it (graph.ErrNotPublished),
// saying why in the publisher's words only: GetVersion answers it to people, whom the sentinel's
// own text ("graph: no such published version: publisher: …") told nothing more.
type notPublished struct{ error }

func (e notPublished) Is(target error) bool { return target == graph.ErrNotPublished }
func (e notPublished) Unwrap() error        { return e.error }

// versionErr tells a missing graph from a missing version, and a graph with nothing
// published yet (the latest, version 0, of a draft-only graph: the usual first run) from a
// version number that does not exist.
func (s *Service) versionErr(ctx context.Context, tenant, graphID string, version int64, err error) error {
	if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if _, derr := s.store.Draft(ctx, tenant, graphID); errors.Is(derr, store.ErrNotFound) {
		return graphNotFound(graphID)
	}
	if version == 0 {
		return &wrapped{msg: "publisher: graph " + quote(graphID) + " has no published version yet: publish its draft first (ringfence graphs publish --graph " + graphID + ")", err: ErrVersionNotFound}
	}
	return &wrapped{msg: fmt.Sprintf("publisher: graph %s has no published version %d (ringfence graphs versions --graph %s lists them)", quote(graphID), version, graphID), err: ErrVersionNotFound}
}

// actingTenant returns the tenant a request acts for, as the server's interceptor resolved it
// (auth.TenantFrom): a tenant-bound key always acts for its own, and another tenant's graphs
// are simply not found. A call without one is refused.
func actingTenant(ctx context.Context) (string, error) {
	t, err := auth.TenantFrom(ctx)
	if err != nil {
		return "", err
	}
	if err := graph.ValidateTenant(t); err != nil {
		return "", err
	}
	return t, nil
}

// storeErr translates store errors into the service's domain errors.
func storeErr(err error, graphID string) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return graphNotFound(graphID)
	case errors.Is(err, store.ErrExists):
		return errGraphExists
	case errors.Is(err, store.ErrBadPageToken):
		return errBadPageToken
	case errors.Is(err, store.ErrStaleRevision):
		return errDraftChanged
	}
	return err
}

func graphNotFound(graphID string) error {
	return &wrapped{msg: "publisher: graph " + quote(graphID) + ": " + ErrGraphNotFound.Error(), err: ErrGraphNotFound}
}

// wrapped carries its own message and a sentinel for the error table.
type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.err }
