package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestPrintErrorHintsAtTheConnectionMistake(t *testing.T) {
	for _, tc := range []struct {
		name    string
		msg     string
		usedTLS bool
		hint    string
	}{
		{"plaintext client, TLS server", `connection error: desc = "error reading server preface: EOF"`, false,
			"hint: the server speaks TLS: pass --ca-file (RINGFENCE_CA_FILE)"},
		{"TLS client, plaintext server", `connection error: desc = "transport: authentication handshake failed: tls: first record does not look like a TLS handshake"`, true,
			"hint: the server speaks plaintext: drop --ca-file (RINGFENCE_CA_FILE)"},
		{"nothing listening", `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`, false,
			"hint: is the server running?"},
		{"TLS client, server gone mid-handshake", `connection error: desc = "error reading server preface: EOF"`, true,
			"hint: is the server running?"},
		{"the server is up, a peer behind it is not", `auth: the registry cannot verify API keys right now: rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:9: connect: connection refused"`, true,
			"hint: the server at --addr answered"},
		{"a certificate from another CA", `connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"`, true,
			"hint: the server's certificate does not verify"},
		{"another service at --addr", `connection error: desc = "transport: authentication handshake failed: mtls: expected peer identity spiffe://ringfence/service/registry, but the server presented spiffe://ringfence/service/audit"`, true,
			"hint: another service answers at --addr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			printError(&out, status.Error(codes.Unavailable, tc.msg), tc.usedTLS)
			require.Contains(t, out.String(), tc.hint)
			require.Equal(t, 1, bytes.Count(out.Bytes(), []byte("hint:")), out.String())
		})
	}
}

// TestPrintErrorNamesTheServiceToAsk: in a split deployment each binary serves some
// commands; asking the wrong one says which serves what.
func TestPrintErrorNamesTheServiceToAsk(t *testing.T) {
	var out bytes.Buffer
	printError(&out, status.Error(codes.Unimplemented, "unknown service ringfence.publisher.v1.PublisherService"), false)
	require.Contains(t, out.String(), "the server at --addr does not serve ringfence.publisher.v1.PublisherService")
	require.Contains(t, out.String(), "graphs and mcp-import: ringfence-publisher")
}

// TestHelpNeverPrintsTheAPIKey: the key set in the environment is read after the flags, so
// --help shows no default for it.
func TestHelpNeverPrintsTheAPIKey(t *testing.T) {
	const key = "help-must-not-show-0123456789"
	t.Setenv("RINGFENCE_API_KEY", key)
	var stdout, stderr bytes.Buffer
	Execute([]string{"audit", "verify", "--help"}, nil, &stdout, &stderr)
	require.Contains(t, stdout.String(), "--api-key")
	require.NotContains(t, stdout.String()+stderr.String(), key)
}
