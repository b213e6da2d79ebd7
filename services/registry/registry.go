// Package registry is the registry service: operators register MCP servers (what to run, its
// secrets, and the capabilities graphs may ask of it) and manage API keys. It owns the grants
// that are the publish-time and run-time ceiling, so every call needs mcp:admin, a permission
// the graph-authoring operator role deliberately lacks.
package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/services/registry/internal/store"
)

// Discoverer lists a registered server's tools by starting it in isolation: the pool.
type Discoverer interface {
	// ExploreTools lists the tools and, when asked, calls one (ListServerTools, ExploreServer).
	ExploreTools(ctx context.Context, req discovery.ExploreRequest) (*discovery.Listing, *typesv1.ExploreCallResult, error)
}

// WarmReporter says how many warm containers the pool holds per registration: the pool
// in-process, or peers.Pool over the internal plane.
type WarmReporter interface {
	WarmStatus(ctx context.Context, refs []string) (map[string]mcpserver.WarmStatus, error)
}

// Config holds the service's dependencies.
type Config struct {
	// DBPath is the registry's bbolt file. With Etcd set, nothing is kept there (a file left
	// from bbolt is moved to etcd at Open, then renamed); the audit quarantine file is still
	// named after it (<DBPath>.audit-quarantine.jsonl).
	DBPath string
	// Etcd, when set, keeps the registry's state in etcd under <EtcdRoot>/registry/, shared
	// by every replica that names the same cluster and root, instead of the bbolt file.
	Etcd     *clientv3.Client
	EtcdRoot string
	// Secrets seals env values and secrets at rest; SecretsKeyFile is where its key is kept,
	// named in errors.
	Secrets        *secretbox.Box
	SecretsKeyFile string
	Roles          *auth.Roles
	// AllowedEnvKeys is the operator's env allowlist for registrations.
	AllowedEnvKeys []string
	// Discoverer answers ListServerTools and ExploreServer: the pool, which starts servers
	// in isolation. nil (a registry started alone, without peers.pool_addr) refuses them.
	Discoverer Discoverer
	// Strands names the published graphs a narrowing of grants leaves asking for more than
	// their server grants, for UpdateServer's warnings: the publisher in-process. nil (split
	// deployments) makes the warning say how to find them.
	Strands StrandFinder
	// OAuthCallbackURL is where authorization servers send users back to the pool
	// (oauth.callback_url), shown with each registration that signs users in.
	OAuthCallbackURL string
	// Warm reports the pool's warm containers in GetServer and ListServers; nil (no pool)
	// leaves a registration's warm status out.
	Warm WarmReporter
	// AuditSink receives the admin events (the audit service in-process, or peers.Audit);
	// SpoolMaxRecords and OnSpoolFull bound the outbox that holds them meanwhile.
	AuditSink       audit.Sink
	SpoolMaxRecords int
	OnSpoolFull     audit.FullPolicy
	Logger          *slog.Logger
}

// Service implements RegistryService and KeyService.
type Service struct {
	registryv1.UnsafeRegistryServiceServer
	registryv1.UnsafeKeyServiceServer

	cfg       Config
	store     Store
	spool     *audit.Spool
	forwarder *audit.Forwarder
	log       *slog.Logger
	errors    grpcserver.ErrorTable
}

var (
	_ registryv1.RegistryServiceServer = (*Service)(nil)
	_ registryv1.KeyServiceServer      = (*Service)(nil)
	_ auth.KeyVerifier                 = (*Service)(nil)
)

// Domain errors, each with a message a person can act on; errorCodes maps them to codes.
var (
	errServerExists     = errors.New("registry: a server with this ref already exists: use PUT /v1/mcp/servers/{ref} (UpdateServer) to reconfigure it")
	errServerNotFound   = fmt.Errorf("registry: %w", mcpserver.ErrNotRegistered)
	errSecretNotFound   = errors.New("registry: no secret has this name: ListSecrets (ringfence secrets list) shows the secrets that exist")
	errKeyNotFound      = errors.New("registry: no API key has this id: ListKeys (ringfence keys list) shows the keys")
	errStaleRevision    = errors.New("registry: the registration changed since the revision you sent: get it again, reapply your change, and send the new revision")
	errBadPageToken     = errors.New("registry: page_token is not one this server issued: start again without it")
	errMissingSecret    = errors.New("registry: a header references a secret that does not exist")
	errUnknownRole      = errors.New("registry: unknown role")
	errKeyEscalation    = errors.New("registry: a key may mint keys only with permissions it holds itself, and a tenant-bound key only for its own tenant")
	errRevokeEscalation = errors.New("registry: a key may revoke only keys whose every permission it holds itself")
	errUnrecordable     = errors.New("registry: the change cannot be recorded in the audit log, so nothing was changed")
)

// errorFields names the field of each INVALID_ARGUMENT sentinel, for its BadRequest detail.
var errorFields = map[error]string{errBadPageToken: "page_token"}

var errorCodes = grpcserver.MergeCodes(etcdstore.ErrorCodes, map[error]codes.Code{
	errServerExists:                codes.AlreadyExists,
	errServerNotFound:              codes.NotFound,
	errSecretNotFound:              codes.NotFound,
	errKeyNotFound:                 codes.NotFound,
	errStaleRevision:               codes.Aborted,
	errBadPageToken:                codes.InvalidArgument,
	errMissingSecret:               codes.FailedPrecondition,
	errUnknownRole:                 codes.InvalidArgument,
	errKeyEscalation:               codes.PermissionDenied,
	errRevokeEscalation:            codes.PermissionDenied,
	errUnrecordable:                codes.InvalidArgument,
	auth.ErrTenantMismatch:         codes.PermissionDenied,
	discovery.ErrIsolationRequired: codes.Unavailable,
	auth.ErrUnknownKey:             codes.Unauthenticated,
	audit.ErrSpoolFull:             codes.Unavailable,
})

// detailed is a domain error whose message names the values involved; it matches its
// sentinel, so errorCodes still gives it the sentinel's code.
type detailed struct {
	msg      string
	sentinel error
}

func (e *detailed) Error() string { return e.msg }
func (e *detailed) Unwrap() error { return e.sentinel }

func serverExists(ref string) error {
	return &detailed{sentinel: errServerExists,
		msg: fmt.Sprintf("registry: a server with ref %q already exists: use PUT /v1/mcp/servers/%s (UpdateServer, ringfence servers update %s) to reconfigure it", ref, ref, ref)}
}

func serverNotFound(ref string) error {
	return &detailed{sentinel: errServerNotFound,
		msg: fmt.Sprintf("registry: no server is registered with ref %q: ListServers (ringfence servers list) shows the registered refs", ref)}
}

// serverStoreErr is storeErr for the RPCs whose callers may list every ref anyway: an
// unregistered ref is answered with the registered ref nearest to it, when one is close
// enough to be what was meant. The refs are read only for that error.
func (s *Service) serverStoreErr(err error, ref string) error {
	if !errors.Is(err, store.ErrNotFound) {
		return storeErr(err, nil)
	}
	if near := s.store.ClosestRef(ref); near != "" {
		return &detailed{sentinel: errServerNotFound,
			msg: fmt.Sprintf("registry: no server is registered with ref %q: did you mean %q? (ringfence servers list shows the registered refs)", ref, near)}
	}
	return serverNotFound(ref)
}

// unrecordable is a change whose audit record the log would refuse: the request is refused
// before anything is written, naming the record's problem (which never quotes the change).
func unrecordable(err error) error {
	return &detailed{sentinel: errUnrecordable, msg: fmt.Sprintf("%s: %v", errUnrecordable.Error(), err)}
}

// unknownHeaderSecret refuses a registration (or an ad-hoc exploration) whose header names a
// secret that does not exist. The name sent is not quoted: it may be the credential itself,
// pasted where its secret's name belongs.
func unknownHeaderSecret(header string) error {
	return &detailed{sentinel: errMissingSecret,
		msg: fmt.Sprintf("registry: header %q names a secret that does not exist (the value sent is not shown: it may be a credential): create the secret first with ringfence secrets set NAME (PutSecret), then send its name; ringfence secrets list shows the secrets that exist", header)}
}

// missingSecret answers resolving a registration whose header names a secret deleted since
// it was registered. It names the header and the server, whose answer shows the secret's name.
func missingSecret(ref, header string) error {
	return &detailed{sentinel: errMissingSecret,
		msg: fmt.Sprintf("registry: header %q of server %q names a secret that no longer exists: ringfence servers show %s names it; create it again with PutSecret (ringfence secrets set NAME)", header, ref, ref)}
}

// Open opens the registry's store and builds the service; Close releases it.
func Open(cfg Config) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
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
		log:       cfg.Logger,
		errors:    grpcserver.ErrorTable{Service: "registry", Codes: errorCodes, Fields: errorFields, Logger: cfg.Logger},
	}, nil
}

// openStore opens the back end cfg names, with the audit spool beside its data.
func openStore(cfg Config) (Store, error) {
	spool := store.SpoolConfig{
		Sink: cfg.AuditSink, Producer: "registry",
		MaxPending: cfg.SpoolMaxRecords, OnFull: cfg.OnSpoolFull, Logger: cfg.Logger,
	}
	if cfg.Etcd == nil {
		return store.OpenBolt(cfg.DBPath, cfg.Secrets, spool)
	}
	spool.QuarantinePath = cfg.DBPath + ".audit-quarantine.jsonl"
	// A registry.db left from bbolt is read, and its seals checked against this host's key,
	// before etcd is touched: a wrong key refuses the start before it is written to etcd as
	// the key every replica must have.
	var local *store.BoltState
	if _, err := os.Stat(cfg.DBPath); err == nil {
		if local, err = store.ReadBolt(cfg.DBPath, cfg.Secrets, cfg.SecretsKeyFile); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("registry: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdstore.RequestTimeout)
	defer cancel()
	st, err := store.OpenEtcd(ctx, store.EtcdConfig{Client: cfg.Etcd, Root: cfg.EtcdRoot, Box: cfg.Secrets, Logger: cfg.Logger, HoldResealLog: local != nil}, spool)
	if err != nil {
		return nil, err
	}
	if local == nil {
		etcdstore.WarnMovedElsewhere(ctx, cfg.Logger, "registry", cfg.DBPath, st.Prefix(), "no registration, secret or API key", "every API key of before is refused", st.Empty)
		return st, nil
	}
	if err := moveBolt(st, local, cfg.Logger); err != nil {
		_ = st.Close() // the move's error is the one to report
		return nil, err
	}
	st.LogResealed(local) // only now may it say that the old key's lines can go
	return st, nil
}

// moveTimeout bounds the copy of a registry.db into etcd at start.
const moveTimeout = 10 * time.Minute

// moveBolt copies the state a registry.db kept into etcd, before the registry serves, and
// renames the file (store.Etcd.MoveBolt; docs/operations.md, "Moving from bbolt").
func moveBolt(st *store.Etcd, local *store.BoltState, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), moveTimeout)
	defer cancel()
	m, err := st.MoveBolt(ctx, local)
	if err != nil {
		return err
	}
	name := filepath.Base(local.Path)
	for _, sk := range m.Skipped {
		log.Warn(fmt.Sprintf("registry: an entry of %s was not moved to etcd: the registry never writes one like it, so the file was damaged or altered; it stays in %s. Set it again through the API if it is wanted", name, filepath.Base(m.RenamedTo)),
			"kind", sk.Kind, "name", sk.Name, "reason", sk.Reason)
	}
	log.Info(fmt.Sprintf("moved the registry's state kept in %s to etcd, and renamed the file to %s", name, filepath.Base(m.RenamedTo)),
		"servers_copied", m.ServersCopied, "servers_already_in_etcd", m.ServersInEtcd,
		"secrets_copied", m.SecretsCopied, "secrets_already_in_etcd", m.SecretsInEtcd,
		"keys_copied", m.KeysCopied, "keys_already_in_etcd", m.KeysInEtcd,
		"audit_records_moved", m.AuditRecords, "audit_dropped_count_moved", m.AuditDropped, "skipped", len(m.Skipped))
	return nil
}

// Spool is the registry's audit spool (tests flush it).
func (s *Service) Spool() *audit.Spool { return s.spool }

// errNoPool answers a listing asked of a registry that has no pool to start servers in.
const errNoPool = "this registry has no pool to start MCP servers in: set RINGFENCE_PEERS__POOL_ADDR to a ringfence-pool's gRPC address (servers only ever start in a pool's isolation)"

// SetDiscoverer wires the pool in after both are built (they refer to each other). Call it
// before serving.
func (s *Service) SetDiscoverer(d Discoverer) { s.cfg.Discoverer = d }

// SetWarmReporter wires in the pool that reports warm containers, as SetDiscoverer does.
func (s *Service) SetWarmReporter(w WarmReporter) { s.cfg.Warm = w }

// Close stops the audit forwarder (pending events stay durable in the outbox and are sent
// after the next start) and closes the store.
func (s *Service) Close() error {
	s.forwarder.Stop(2 * time.Second)
	return s.store.Close()
}

// storeErr translates store errors into the service's domain errors.
func storeErr(err error, notFound error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return notFound
	case errors.Is(err, store.ErrExists):
		return errServerExists
	case errors.Is(err, store.ErrBadPageToken):
		return errBadPageToken
	}
	return err
}

// ResolveRegistration returns a registration with its env and header secrets in clear: what
// the pool needs to start it. In-process callers use it directly; split deployments reach it
// through the internal ResolveServer RPC.
func (s *Service) ResolveRegistration(ctx context.Context, ref string) (*mcpserver.Resolved, error) {
	reg, err := s.store.GetServer(ctx, ref)
	if err != nil {
		return nil, storeErr(err, serverNotFound(ref))
	}
	values, err := s.headerValues(ctx, reg.Headers, func(header string) error { return missingSecret(ref, header) })
	if err != nil {
		return nil, err
	}
	res := &mcpserver.Resolved{Registration: *reg, HeaderValues: values}
	if o := reg.OAuth; o != nil && o.ClientSecretRef != "" {
		v, err := s.store.SecretValue(ctx, o.ClientSecretRef)
		if errors.Is(err, store.ErrNotFound) {
			return nil, missingSecret(ref, "oauth.client_secret_ref")
		}
		if err != nil {
			return nil, err
		}
		res.ClientSecret = v
	}
	return res, nil
}

// headerValues resolves each header's named secret to its clear value; a header whose secret
// does not exist is answered with missing(header), the first in name order.
func (s *Service) headerValues(ctx context.Context, headers map[string]string, missing func(header string) error) (map[string]string, error) {
	values := make(map[string]string, len(headers))
	for _, header := range slices.Sorted(maps.Keys(headers)) {
		v, err := s.store.SecretValue(ctx, headers[header])
		if errors.Is(err, store.ErrNotFound) {
			return nil, missing(header)
		}
		if err != nil {
			return nil, err
		}
		values[header] = v
	}
	return values, nil
}

// checkHeaderSecrets refuses a registration whose header (or OAuth client secret) names a
// secret that does not exist: the server could never start, and a value that names no secret
// is most likely the credential itself, which would otherwise be stored and shown as a name.
func (s *Service) checkHeaderSecrets(ctx context.Context, reg *mcpserver.Registration) error {
	if len(reg.Headers) == 0 && (reg.OAuth == nil || reg.OAuth.ClientSecretRef == "") {
		return nil
	}
	secrets, err := s.store.ListSecrets(ctx)
	if err != nil {
		return err
	}
	exists := func(name string) bool {
		return slices.ContainsFunc(secrets, func(sec store.Secret) bool { return sec.Name == name })
	}
	for _, header := range slices.Sorted(maps.Keys(reg.Headers)) {
		if !exists(reg.Headers[header]) {
			return unknownHeaderSecret(header)
		}
	}
	if reg.OAuth != nil && reg.OAuth.ClientSecretRef != "" && !exists(reg.OAuth.ClientSecretRef) {
		return &detailed{sentinel: errMissingSecret,
			msg: "registry: oauth.client_secret_ref names a secret that does not exist (the value sent is not shown: it may be the secret itself): create it first with ringfence secrets set NAME (PutSecret), then send its name"}
	}
	return nil
}

// ServerPolicy returns what a registration allows, without secrets.
func (s *Service) ServerPolicy(ctx context.Context, ref string) (mcpserver.Policy, error) {
	p, err := s.store.ServerPolicy(ctx, ref)
	if err != nil {
		return mcpserver.Policy{}, storeErr(err, serverNotFound(ref))
	}
	return p, nil
}
