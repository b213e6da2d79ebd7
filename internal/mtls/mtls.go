// Package mtls gives each Ringfence service an identity for split deployments: a certificate
// whose URI SAN is spiffe://ringfence/service/<name>, verified against one CA. Internal RPCs
// are authorized by that identity, never by an API key.
package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// TrustDomain is the SPIFFE trust domain of service identities.
const TrustDomain = "ringfence"

// Service names, as they appear in identities and internal-RPC allowlists.
const (
	Registry  = "registry"
	Publisher = "publisher"
	Pool      = "pool"
	Audit     = "audit"
)

// Etcd names the certificate InitDevCA writes for etcd's members; it is no service identity.
const Etcd = "etcd"

// Services lists every service identity.
var Services = []string{Registry, Publisher, Pool, Audit}

// ServiceURI is the identity URI of a service.
func ServiceURI(name string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/service/" + name}
}

// ServiceFromCert returns the service a verified certificate identifies: its one SPIFFE ID,
// which must name a service of this trust domain. A certificate with several SPIFFE IDs
// identifies nobody, as when dialing (verifyPeer): the first one must not decide.
func ServiceFromCert(cert *x509.Certificate) (string, bool) {
	var name string
	n := 0
	for _, u := range cert.URIs {
		if !strings.EqualFold(u.Scheme, "spiffe") {
			continue
		}
		n++
		if u.Scheme == "spiffe" && u.Host == TrustDomain && strings.HasPrefix(u.Path, "/service/") {
			name = strings.TrimPrefix(u.Path, "/service/")
		}
	}
	if n != 1 || name == "" || strings.Contains(name, "/") {
		return "", false
	}
	return name, true
}

// PeerService returns the service identity of the caller, when it presented a certificate
// that chained to the configured CA. Unverified certificates never count.
func PeerService(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return "", false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", false
	}
	return ServiceFromCert(info.State.VerifiedChains[0][0])
}

// Files names a certificate, its key and the CA bundle peers must chain to.
type Files struct {
	CertFile, KeyFile, CAFile string
}

// ServerConfig is the TLS configuration of a gRPC server: it always serves its certificate and
// verifies a client certificate when one is given (API-key clients present none).
func ServerConfig(f Files) (*tls.Config, error) {
	cert, pool, err := load(f)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// InternalServerConfig is the TLS configuration of the internal listener, where services call
// each other: mutual TLS only. The handshake fails unless the client presents a certificate
// that chains to the CA and carries one Ringfence service identity, so an API-key client, or
// a stranger, is refused before any request is read. Which service may call which RPC is
// decided after, by the authorization rules.
func InternalServerConfig(f Files) (*tls.Config, error) {
	cfg, err := ServerConfig(f)
	if err != nil {
		return nil, err
	}
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
			return errors.New("mtls: the internal listener takes service certificates only")
		}
		if _, ok := ServiceFromCert(cs.VerifiedChains[0][0]); !ok {
			return fmt.Errorf("mtls: the internal listener takes service certificates only: the client's certificate carries no identity spiffe://ringfence/service/<name> of %s", strings.Join(Services, ", "))
		}
		return nil
	}
	return cfg, nil
}

// ClientConfig is the TLS configuration of a service calling the peer service named peer
// (Registry, Publisher, Pool or Audit): it presents its own certificate and accepts the server
// only when its certificate chains to the CA and carries exactly the identity
// spiffe://ringfence/service/<peer>. Chaining alone is not enough: every service certificate
// chains to the same CA and the development set shares its hostnames, so without the identity
// check any service's certificate could answer as the registry (key verification, grants) or as
// the pool (ad-hoc secrets). A mismatch fails the handshake naming both identities.
func ClientConfig(f Files, peer string) (*tls.Config, error) {
	if !slices.Contains(Services, peer) {
		return nil, fmt.Errorf("mtls: unknown peer service %q: expected one of %s", peer, strings.Join(Services, ", "))
	}
	cert, pool, err := load(f)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		MinVersion:   tls.VersionTLS13,
		// Hostname verification stays as it was (gRPC sets ServerName from the dial target):
		// it binds the certificate to the address the operator configured, and the identity
		// check below binds it to the service. Both must hold. VerifyConnection runs after the
		// chain and hostname are verified, and on resumed sessions too.
		VerifyConnection: verifyPeer(peer),
	}, nil
}

// verifyPeer accepts a verified server certificate whose one SPIFFE ID is peer's.
func verifyPeer(peer string) func(tls.ConnectionState) error {
	want := ServiceURI(peer).String()
	return func(cs tls.ConnectionState) error {
		if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
			return fmt.Errorf("mtls: expected %s, but the server's certificate was not verified", want)
		}
		ids := spiffeIDs(cs.VerifiedChains[0][0])
		switch {
		case len(ids) == 1 && ids[0] == want:
			return nil
		case len(ids) == 0:
			return fmt.Errorf("mtls: expected peer identity %s, but the server presented no SPIFFE ID", want)
		default:
			// More than one ID is refused even when one matches: an X.509 SVID carries exactly
			// one, and a certificate naming several services is nobody's.
			return fmt.Errorf("mtls: expected peer identity %s, but the server presented %s", want, strings.Join(ids, ", "))
		}
	}
}

// spiffeIDs lists a certificate's spiffe:// URI SANs.
func spiffeIDs(cert *x509.Certificate) []string {
	var ids []string
	for _, u := range cert.URIs {
		if strings.EqualFold(u.Scheme, "spiffe") {
			ids = append(ids, u.String())
		}
	}
	return ids
}

// CAOnlyConfig verifies a server against caFile without presenting a certificate (the CLI).
// With peer set, the server must also carry that service's identity, as between services:
// the CLI sends an API key, which no other service's certificate should be able to collect.
func CAOnlyConfig(caFile, serverName, peer string) (*tls.Config, error) {
	if peer != "" && !slices.Contains(Services, peer) {
		return nil, fmt.Errorf("mtls: unknown server identity %q: expected one of %s", peer, strings.Join(Services, ", "))
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS13}
	if peer != "" {
		cfg.VerifyConnection = verifyPeer(peer)
	}
	return cfg, nil
}

func load(f Files) (tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("mtls: load certificate %s with key %s: %w", f.CertFile, f.KeyFile, err)
	}
	pool, err := loadPool(f.CAFile)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return cert, pool, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("mtls: read CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("mtls: CA bundle " + caFile + " holds no PEM certificate")
	}
	return pool, nil
}
