package cli

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCertsInitHostAddsToTheLoopbackNames: a certificate made for a deployment's host names
// still serves the CLI and probes on the same machine.
func TestCertsInitHostAddsToTheLoopbackNames(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	var stdout, stderr bytes.Buffer
	code := Execute([]string{"certs", "init", "--dir", dir, "--host", "registry.internal", "--host", "localhost"}, nil, &stdout, &stderr)
	require.Equal(t, ExitOK, code, stderr.String())
	data, err := os.ReadFile(filepath.Join(dir, "registry.pem"))
	require.NoError(t, err)
	block, _ := pem.Decode(data)
	require.NotNil(t, block)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	require.Equal(t, []string{"localhost", "registry.internal"}, cert.DNSNames)
	var ips []string
	for _, ip := range cert.IPAddresses {
		ips = append(ips, ip.String())
	}
	require.ElementsMatch(t, []string{"127.0.0.1", "::1"}, ips)
}
