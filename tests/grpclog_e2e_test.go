package tests

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGatewayAndGRPCLinesAreSlogLines: what grpc-go and the REST gateway log (here the
// gateway's "Failed to decode request" for a document body that is not base64) is a line of
// the server's own log, JSON with RINGFENCE_LOG_FORMAT=json and at info, not a raw
// `2026/12/04 … ERROR: …` line on stderr that breaks a JSON log reader and calls a caller's
// mistake an error.
func TestGatewayAndGRPCLinesAreSlogLines(t *testing.T) {
	d := startDaemon(t, "ringfenced", append(registryEnv(), "RINGFENCE_LOG_FORMAT=json", "RINGFENCE_LOG_LEVEL=info")...)
	api := rest{t: t, base: d.HTTPBase, key: adminKey}
	code, _, raw := api.do(http.MethodPost, "/v1/documents", `{"name":"a.txt","content":"not base64!"}`)
	require.Equal(t, http.StatusBadRequest, code, raw)

	var line map[string]any
	require.Eventually(t, func() bool {
		for l := range strings.SplitSeq(d.Logs.String(), "\n") {
			if strings.Contains(l, "Failed to decode request") {
				line = nil
				_ = json.Unmarshal([]byte(l), &line)
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the gateway's line reaches the log:\n%s", d.Logs)
	require.NotNil(t, line, "the gateway's line is a JSON log line:\n%s", d.Logs)
	require.Equal(t, "INFO", line["level"], line)
	require.Equal(t, "grpc", line["component"], line)
	for l := range strings.SplitSeq(strings.TrimSpace(d.Logs.String()), "\n") {
		require.True(t, json.Valid([]byte(l)), "every log line is JSON: %q", l)
	}
}
