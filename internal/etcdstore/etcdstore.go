// Package etcdstore is the plumbing every Ringfence store on etcd shares: the client (mutual
// TLS, its log lines through slog), the key layout, optimistic transactions, watch-fed
// mirrors whose reads are linearizable, values larger than one etcd request, and schema
// versions. It knows no service: a service's store (services/<name>/internal/store) decides
// what its keys hold.
//
// The layout: every key lives under <root>/<service>/ (root is store.etcd_prefix, default
// /ringfence), e.g. /ringfence/registry/servers/<ref>. A service owns its part and nobody
// else writes there.
package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DefaultRoot is the prefix of every Ringfence key when store.etcd_prefix is not set.
const DefaultRoot = "/ringfence"

// DefaultDialTimeout bounds reaching the cluster at start.
const DefaultDialTimeout = 5 * time.Second

// Config says how to reach the cluster.
type Config struct {
	// Endpoints are the members' client URLs (https://etcd-1:2379).
	Endpoints []string
	// CAFile verifies the members' certificates; CertFile and KeyFile are this client's
	// certificate for mutual TLS. All three or none (development only).
	CAFile, CertFile, KeyFile string
	// DialTimeout bounds the first contact with the cluster; 0 is DefaultDialTimeout.
	DialTimeout time.Duration
	Logger      *slog.Logger
}

// Dial connects to the cluster and checks that it answers a linearizable read (a member
// reached over TLS, with a leader) within DialTimeout, so a wrong endpoint, certificate or a
// cluster without quorum stops the start with a reason instead of failing the first request.
// Every request of the client it returns ends within RequestTimeout (Bound).
func Dial(ctx context.Context, cfg Config) (*clientv3.Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcdstore: no endpoints: set RINGFENCE_STORE__ETCD_ENDPOINTS")
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cc := clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		// A stream to a member that lost its connection is noticed within seconds, and the
		// client moves to another member.
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		// Values are at most ChunkBytes plus a little; requests stay below etcd's default
		// --max-request-bytes (1.5 MiB).
		MaxCallSendMsgSize: 3 << 19,
		Logger:             zap.New(slogCore{log: cfg.Logger.With("component", "etcd-client")}),
	}
	if cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" {
		info := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcdstore: TLS to etcd (store.etcd_ca_file, store.etcd_cert_file, store.etcd_key_file): %w", err)
		}
		cc.TLS = tlsCfg
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: client for %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := cli.Get(pctx, DefaultRoot+"/dial-check"); err != nil {
		_ = cli.Close() // the read's error is the one to report
		return nil, fmt.Errorf("etcdstore: etcd at %s did not answer within %s: %w: check store.etcd_endpoints, that the members run with a quorum, and the TLS files (etcd takes mutual TLS: store.etcd_ca_file, store.etcd_cert_file, store.etcd_key_file)",
			strings.Join(cfg.Endpoints, ","), cfg.DialTimeout, err)
	}
	Bound(cli)
	return cli, nil
}

// Space is one service's part of the cluster: every key under <root>/<service>/.
type Space string

// NewSpace returns the space of service under root (DefaultRoot when empty).
func NewSpace(root, service string) Space {
	if root == "" {
		root = DefaultRoot
	}
	return Space(strings.TrimSuffix(root, "/") + "/" + service + "/")
}

// Key joins parts under the space: Key("servers", ref) is <root>/<service>/servers/<ref>.
func (s Space) Key(parts ...string) string { return string(s) + strings.Join(parts, "/") }

// Prefix is Key with a trailing slash: everything below those parts.
func (s Space) Prefix(parts ...string) string {
	if len(parts) == 0 {
		return string(s)
	}
	return s.Key(parts...) + "/"
}

// RangeEnd is the end of the range of every key that starts with prefix.
func RangeEnd(prefix string) string { return clientv3.GetPrefixRangeEnd(prefix) }

// slogCore sends the etcd client's warnings and errors to slog; its info and debug lines (every
// endpoint switch) are not an operator's concern.
type slogCore struct {
	log    *slog.Logger
	fields []zapcore.Field
}

func (c slogCore) Enabled(l zapcore.Level) bool { return l >= zapcore.WarnLevel }

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	return slogCore{log: c.log, fields: append(append([]zapcore.Field(nil), c.fields...), fields...)}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields))
	for k, v := range enc.Fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	level := slog.LevelWarn
	if e.Level >= zapcore.ErrorLevel {
		level = slog.LevelError
	}
	c.log.LogAttrs(context.Background(), level, e.Message, attrs...)
	return nil
}

func (c slogCore) Sync() error { return nil }
