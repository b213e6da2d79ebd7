package mtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// devFiles is the certificate set of svc in a directory written by InitDevCA.
func devFiles(dir, svc string) Files {
	return Files{
		CertFile: filepath.Join(dir, svc+".pem"),
		KeyFile:  filepath.Join(dir, svc+"-key.pem"),
		CAFile:   filepath.Join(dir, "ca.pem"),
	}
}

// serveTLS runs a gRPC health server on loopback with cfg and returns its address.
func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// check makes one RPC to addr with cfg; the handshake's verdict is its error.
func check(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	return err
}

// TestClientConfigChecksThePeerIdentity: every service certificate chains to the CA and is valid
// for 127.0.0.1, so only the identity tells the registry from the audit service.
func TestClientConfigChecksThePeerIdentity(t *testing.T) {
	dir := t.TempDir()
	_, err := InitDevCA(dir, DevCAOptions{})
	require.NoError(t, err)
	addrs := map[string]string{}
	for _, svc := range Services {
		cfg, err := ServerConfig(devFiles(dir, svc))
		require.NoError(t, err)
		addrs[svc] = serveTLS(t, cfg)
	}

	for _, peer := range Services {
		for _, served := range Services {
			t.Run("dial "+peer+" answered by "+served, func(t *testing.T) {
				cfg, err := ClientConfig(devFiles(dir, Pool), peer)
				require.NoError(t, err)
				err = check(t, addrs[served], cfg)
				if peer == served {
					require.NoError(t, err)
					return
				}
				require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
				require.ErrorContains(t, err, "expected peer identity spiffe://ringfence/service/"+peer)
				require.ErrorContains(t, err, "the server presented spiffe://ringfence/service/"+served)
			})
		}
	}
}

// TestClientConfigRefusesAnUnknownPeer: an empty or misspelt peer (or an address passed where
// the name belongs) would otherwise check nothing or fail every handshake obscurely.
func TestClientConfigRefusesAnUnknownPeer(t *testing.T) {
	dir := t.TempDir()
	_, err := InitDevCA(dir, DevCAOptions{})
	require.NoError(t, err)
	for _, peer := range []string{"", "Registry", "registry/", "127.0.0.1:50051"} {
		_, err := ClientConfig(devFiles(dir, Pool), peer)
		require.ErrorContains(t, err, "unknown peer service", "peer %q", peer)
	}
}

// TestClientConfigKeepsHostnameVerification: the right identity at an address the certificate
// is not valid for is still refused.
func TestClientConfigKeepsHostnameVerification(t *testing.T) {
	dir := t.TempDir()
	_, err := InitDevCA(dir, DevCAOptions{Hosts: []string{"registry.ringfence.test"}})
	require.NoError(t, err)
	srvCfg, err := ServerConfig(devFiles(dir, Registry))
	require.NoError(t, err)
	addr := serveTLS(t, srvCfg)

	cfg, err := ClientConfig(devFiles(dir, Pool), Registry)
	require.NoError(t, err)
	err = check(t, addr, cfg)
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "127.0.0.1")
	require.NotContains(t, err.Error(), "peer identity", "the hostname fails before the identity is looked at")
}

// TestClientConfigWantsExactlyTheIdentity: certificates from the deployment's CA that carry no
// SPIFFE ID, several, or the registry's name in another trust domain are all refused.
func TestClientConfigWantsExactlyTheIdentity(t *testing.T) {
	dir := t.TempDir()
	_, err := InitDevCA(dir, DevCAOptions{})
	require.NoError(t, err)
	ca, caKey := loadDevCA(t, dir)
	client, err := ClientConfig(devFiles(dir, Pool), Registry)
	require.NoError(t, err)

	for _, tc := range []struct {
		name     string
		uris     []*url.URL
		presents string
	}{
		{"no identity", nil, "presented no SPIFFE ID"},
		{"two identities", []*url.URL{ServiceURI(Registry), ServiceURI(Audit)},
			"presented spiffe://ringfence/service/registry, spiffe://ringfence/service/audit"},
		{"another trust domain", []*url.URL{{Scheme: "spiffe", Host: "elsewhere", Path: "/service/registry"}},
			"presented spiffe://elsewhere/service/registry"},
		{"a sub-path", []*url.URL{ServiceURI("registry/admin")},
			"presented spiffe://ringfence/service/registry/admin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert := issue(t, ca, caKey, tc.uris)
			addr := serveTLS(t, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
			err := check(t, addr, client)
			require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			require.ErrorContains(t, err, "expected peer identity spiffe://ringfence/service/registry")
			require.ErrorContains(t, err, tc.presents)
		})
	}
}

func loadDevCA(t *testing.T, dir string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	require.NoError(t, err)
	block, _ := pem.Decode(certPEM)
	ca, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	require.NoError(t, err)
	block, _ = pem.Decode(keyPEM)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	require.NoError(t, err)
	return ca, key.(*ecdsa.PrivateKey)
}

// issue signs a server certificate for 127.0.0.1 with the given URI SANs.
func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, uris []*url.URL) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "test"},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		URIs:         uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestServiceFromCertWantsExactlyOneIdentity: on the receiving side too, a certificate naming
// several services (or a foreign trust domain beside ours) identifies nobody.
func TestServiceFromCertWantsExactlyOneIdentity(t *testing.T) {
	for _, tc := range []struct {
		name string
		uris []*url.URL
		want string
	}{
		{"one", []*url.URL{ServiceURI(Pool)}, Pool},
		{"none", nil, ""},
		{"two", []*url.URL{ServiceURI(Audit), ServiceURI(Pool)}, ""},
		{"foreign beside ours", []*url.URL{{Scheme: "spiffe", Host: "elsewhere", Path: "/x"}, ServiceURI(Pool)}, ""},
		{"another trust domain", []*url.URL{{Scheme: "spiffe", Host: "elsewhere", Path: "/service/pool"}}, ""},
		{"a sub-path", []*url.URL{ServiceURI("pool/admin")}, ""},
		{"https beside it", []*url.URL{{Scheme: "https", Host: "pool.example"}, ServiceURI(Pool)}, Pool},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ServiceFromCert(&x509.Certificate{URIs: tc.uris})
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.want != "", ok)
		})
	}
}

// TestCAOnlyConfigCanPinTheServerIdentity: the CLI presents no certificate but sends an API
// key; with a server identity set, only that service's certificate receives it.
func TestCAOnlyConfigCanPinTheServerIdentity(t *testing.T) {
	dir := t.TempDir()
	_, err := InitDevCA(dir, DevCAOptions{})
	require.NoError(t, err)
	serve := func(svc string) string {
		cfg, err := ServerConfig(devFiles(dir, svc))
		require.NoError(t, err)
		return serveTLS(t, cfg)
	}
	registry, audit := serve(Registry), serve(Audit)
	ca := filepath.Join(dir, "ca.pem")

	pinned, err := CAOnlyConfig(ca, "", Registry)
	require.NoError(t, err)
	require.NoError(t, check(t, registry, pinned))
	err = check(t, audit, pinned)
	require.ErrorContains(t, err, "expected peer identity spiffe://ringfence/service/registry")

	unpinned, err := CAOnlyConfig(ca, "", "")
	require.NoError(t, err)
	require.NoError(t, check(t, audit, unpinned), "without an identity, the CA and host name decide")

	_, err = CAOnlyConfig(ca, "", "regsitry")
	require.ErrorContains(t, err, "unknown server identity")
}

// TestForceRewritesKeysPrivate: a forced re-initialisation leaves every private key readable
// by its owner only, even one whose file had been opened up since.
func TestForceRewritesKeysPrivate(t *testing.T) {
	dir := t.TempDir()
	files, err := InitDevCA(dir, DevCAOptions{})
	require.NoError(t, err)
	for _, f := range files {
		if f.Private {
			require.NoError(t, os.Chmod(f.Path, 0o644))
		}
	}
	files, err = InitDevCA(dir, DevCAOptions{Force: true})
	require.NoError(t, err)
	for _, f := range files {
		st, err := os.Stat(f.Path)
		require.NoError(t, err)
		if f.Private {
			require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), f.Path)
		}
	}
}
