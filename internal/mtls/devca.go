package mtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// DevCAOptions shapes a development certificate set.
type DevCAOptions struct {
	// Hosts are the DNS names and IP addresses the service certificates are valid for.
	Hosts []string
	// Validity of the certificates; default one year.
	Validity time.Duration
	// Force overwrites an existing set.
	Force bool
}

// ErrCAExists is InitDevCA's refusal to replace an existing set without Force: nothing was
// written.
var ErrCAExists = errors.New("already holds a CA")

// WrittenFile is one file InitDevCA wrote.
type WrittenFile struct {
	Path    string
	Service string // empty for the CA
	Private bool
}

// InitDevCA writes a development CA (ca.pem, ca-key.pem) and, for every service, <svc>.pem
// and <svc>-key.pem whose identity is spiffe://ringfence/service/<svc>, usable both as server
// and as client certificate; and etcd.pem and etcd-key.pem for the members of an etcd cluster
// (store.backend=etcd: served to clients and peers, which present their own), identity
// spiffe://ringfence/etcd. Private keys are written with mode 0600. It refuses to overwrite
// an existing ca.pem unless Force is set, so a second run cannot silently split a deployment.
func InitDevCA(dir string, opts DevCAOptions) ([]WrittenFile, error) {
	if len(opts.Hosts) == 0 {
		opts.Hosts = []string{"localhost", "127.0.0.1", "::1"}
	}
	if opts.Validity == 0 {
		opts.Validity = 365 * 24 * time.Hour
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("mtls: create %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ca.pem")); err == nil && !opts.Force {
		return nil, fmt.Errorf("mtls: %s %w; pass --force to replace every certificate in it", dir, ErrCAExists)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("mtls: %w", err)
	}

	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("mtls: generate CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "ringfence development CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(opts.Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("mtls: sign CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("mtls: %w", err)
	}
	var written []WrittenFile
	write := func(name, service string, block *pem.Block, private bool) error {
		mode := os.FileMode(0o644)
		if private {
			mode = 0o600
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(block), mode); err != nil {
			return fmt.Errorf("mtls: write %s: %w", path, err)
		}
		// WriteFile keeps the mode of a file it overwrites (--force): a key file that was
		// readable by others would stay so.
		if err := os.Chmod(path, mode); err != nil {
			return fmt.Errorf("mtls: %w", err)
		}
		written = append(written, WrittenFile{Path: path, Service: service, Private: private})
		return nil
	}
	if err := write("ca.pem", "", &pem.Block{Type: "CERTIFICATE", Bytes: caDER}, false); err != nil {
		return nil, err
	}
	if err := writeKey(write, "ca-key.pem", "", caKey); err != nil {
		return nil, err
	}

	var dns []string
	var ips []net.IP
	for _, h := range opts.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	for _, svc := range append(slices.Clone(Services), Etcd) {
		uri := ServiceURI(svc)
		if svc == Etcd {
			// etcd's members are no Ringfence service: an identity outside /service/ calls
			// no internal RPC.
			uri = &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/etcd"}
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("mtls: generate key for %s: %w", svc, err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: "ringfence-" + svc},
			NotBefore:    now.Add(-time.Minute),
			NotAfter:     now.Add(opts.Validity),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:     dns,
			IPAddresses:  ips,
			URIs:         []*url.URL{uri},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return nil, fmt.Errorf("mtls: sign %s: %w", svc, err)
		}
		if err := write(svc+".pem", svc, &pem.Block{Type: "CERTIFICATE", Bytes: der}, false); err != nil {
			return nil, err
		}
		if err := writeKey(write, svc+"-key.pem", svc, key); err != nil {
			return nil, err
		}
	}
	return written, nil
}

func writeKey(write func(string, string, *pem.Block, bool) error, name, service string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("mtls: encode key: %w", err)
	}
	return write(name, service, &pem.Block{Type: "PRIVATE KEY", Bytes: der}, true)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return n
}
