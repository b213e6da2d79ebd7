// Package etcdtest starts a real etcd cluster inside a test process: members embedded with
// go.etcd.io/etcd/server/v3/embed on loopback, talking mutual TLS to their clients and to each
// other with certificates of a development CA (mtls.InitDevCA), as a deployment does. Tests
// of every store on etcd, and end-to-end tests of binaries pointed at it, use it; members can
// be killed and restarted.
package etcdtest

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringfence/ringfence/internal/etcdstore"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/testutil/freeport"
)

// Cluster is a running test cluster.
type Cluster struct {
	t       testing.TB
	dir     string
	members []*member
	// CertDir holds the development CA (ca.pem) and its certificates: etcd.pem for the
	// members, <service>.pem for clients.
	CertDir string
	prefix  int
	mu      sync.Mutex
}

type member struct {
	name   string
	cfg    *embed.Config
	client string
	etcd   *embed.Etcd // nil while stopped
}

// Start starts a cluster of n members (3 for a quorum that survives one loss) and stops it
// when the test ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t, dir: t.TempDir()}
	c.CertDir = filepath.Join(c.dir, "certs")
	_, err := mtls.InitDevCA(c.CertDir, mtls.DevCAOptions{Hosts: []string{"localhost", "127.0.0.1"}})
	require.NoError(t, err)
	tls := transport.TLSInfo{
		CertFile:       filepath.Join(c.CertDir, "etcd.pem"),
		KeyFile:        filepath.Join(c.CertDir, "etcd-key.pem"),
		TrustedCAFile:  filepath.Join(c.CertDir, "ca.pem"),
		ClientCertAuth: true,
	}
	var initial []string
	for i := range n {
		m := &member{name: fmt.Sprintf("m%d", i)}
		peer := mustURL(t, "https://"+freeport.Addr(t))
		client := mustURL(t, "https://"+freeport.Addr(t))
		cfg := embed.NewConfig()
		cfg.Name = m.name
		cfg.Dir = filepath.Join(c.dir, m.name)
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
		cfg.ClientTLSInfo, cfg.PeerTLSInfo = tls, tls
		cfg.InitialClusterToken = "ringfence-test-" + filepath.Base(c.dir)
		cfg.LogLevel = "error"
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		m.cfg, m.client = cfg, client.String()
		initial = append(initial, m.name+"="+peer.String())
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		m.cfg.InitialCluster = strings.Join(initial, ",")
	}
	// Members wait for each other to form the cluster: start them together.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, m := range c.members {
		wg.Go(func() { errs[i] = c.start(m) })
	}
	wg.Wait()
	t.Cleanup(c.stopAll)
	for _, err := range errs {
		require.NoError(t, err)
	}
	return c
}

func mustURL(t testing.TB, s string) *url.URL {
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

func (c *Cluster) start(m *member) error {
	e, err := embed.StartEtcd(m.cfg)
	if err != nil {
		return fmt.Errorf("etcdtest: start %s: %w", m.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcdtest: %s: %w", m.name, err)
	case <-time.After(60 * time.Second):
		e.Close()
		return fmt.Errorf("etcdtest: %s was not ready within a minute", m.name)
	}
	c.mu.Lock()
	m.etcd = e
	c.mu.Unlock()
	return nil
}

func (c *Cluster) stopAll() {
	for i := range c.members {
		c.Kill(i)
	}
}

// Endpoints are every member's client URL, stopped ones included (as a client is configured).
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.client
	}
	return out
}

// Config is what a client of the cluster needs, with service's certificate (registry,
// publisher, ...) as its client certificate.
func (c *Cluster) Config(service string) etcdstore.Config {
	return etcdstore.Config{
		Endpoints: c.Endpoints(),
		CAFile:    filepath.Join(c.CertDir, "ca.pem"),
		CertFile:  filepath.Join(c.CertDir, service+".pem"),
		KeyFile:   filepath.Join(c.CertDir, service+"-key.pem"),
		Logger:    slog.New(slog.DiscardHandler),
	}
}

// Client dials the cluster as service and closes the client when the test ends.
func (c *Cluster) Client(t testing.TB, service string) *clientv3.Client {
	t.Helper()
	cli, err := etcdstore.Dial(t.Context(), c.Config(service))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Root is a key prefix no other caller of Root on this cluster gets, so tests sharing a
// cluster do not see each other's keys.
func (c *Cluster) Root() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prefix++
	return fmt.Sprintf("/t%d", c.prefix)
}

// Kill stops member i without handing over leadership first, as a crash would.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	e := c.members[i].etcd
	c.members[i].etcd = nil
	c.mu.Unlock()
	if e == nil {
		return
	}
	e.Server.HardStop()
	e.Close()
}

// Restart starts a killed member again on its data.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	require.NoError(c.t, c.start(c.members[i]))
}

// Down kills member i for a test of what callers see while etcd is away, and returns what
// starts it again; that runs once however often it is called, so a test defers it (for the
// paths that end early) and calls it where etcd comes back.
func (c *Cluster) Down(i int) (restart func()) {
	c.Kill(i)
	var once sync.Once
	return func() { once.Do(func() { c.Restart(i) }) }
}

// RequireUnavailable checks that err, what a call answered while etcd was away, is
// UNAVAILABLE and names etcd and what to check (store.etcd_endpoints).
func RequireUnavailable(t testing.TB, err error, what string) {
	t.Helper()
	require.Equal(t, codes.Unavailable, status.Code(err), "%s: %v", what, err)
	msg := status.Convert(err).Message()
	require.Contains(t, msg, "etcd", what)
	require.Contains(t, msg, "store.etcd_endpoints", "%s names what to check: %s", what, msg)
}

// Leader is the index of the member that leads, or -1 while none does.
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.members {
		if m.etcd != nil && m.etcd.Server.Leader() == m.etcd.Server.MemberID() {
			return i
		}
	}
	return -1
}

// WaitLeader waits until a running member leads and every running member knows it.
func (c *Cluster) WaitLeader(t testing.TB) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		if l := c.Leader(); l >= 0 && c.agreed() {
			return l
		}
		select {
		case <-ctx.Done():
			t.Fatalf("etcdtest: no leader within 30s")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (c *Cluster) agreed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	var lead uint64
	for _, m := range c.members {
		if m.etcd == nil {
			continue
		}
		l := uint64(m.etcd.Server.Leader())
		if l == 0 || lead != 0 && l != lead {
			return false
		}
		lead = l
	}
	return lead != 0
}
