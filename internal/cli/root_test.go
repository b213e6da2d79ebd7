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
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			printError(&out, status.Error(codes.Unavailable, tc.msg), tc.usedTLS)
			require.Contains(t, out.String(), tc.hint)
			require.Equal(t, 1, bytes.Count(out.Bytes(), []byte("hint:")), out.String())
		})
	}
}
