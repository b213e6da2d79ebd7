package cli

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
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

// TestCertsInitJSONAndAnExistingSet: -o json prints the files as JSON, and a second init into
// the same directory without --force is a command-line mistake (exit 2) that writes nothing.
func TestCertsInitJSONAndAnExistingSet(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	var stdout, stderr bytes.Buffer
	code := Execute([]string{"certs", "init", "--dir", dir, "-o", "json"}, nil, &stdout, &stderr)
	require.Equal(t, ExitOK, code, stderr.String())
	var out struct {
		Dir   string `json:"dir"`
		Files []struct {
			Path    string `json:"path"`
			Service string `json:"service"`
			Private bool   `json:"private"`
		} `json:"files"`
	}
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &out), stdout.String())
	require.Equal(t, dir, out.Dir)
	require.Contains(t, out.Files, struct {
		Path    string `json:"path"`
		Service string `json:"service"`
		Private bool   `json:"private"`
	}{filepath.Join(dir, "pool-key.pem"), "pool", true})

	ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	require.NoError(t, err)
	stdout.Reset()
	stderr.Reset()
	code = Execute([]string{"certs", "init", "--dir", dir}, nil, &stdout, &stderr)
	require.Equal(t, ExitUsage, code, stderr.String())
	require.Contains(t, stderr.String(), "pass --force to replace every certificate in it")
	again, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	require.NoError(t, err)
	require.Equal(t, ca, again)
}
