package tests

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRESTRequestsRefusedForTheirKeyAreCountedAndLogged: a /v1/ request without a valid key is
// refused before it becomes an RPC; like a gRPC stream refused so (docs/security.md), it is
// counted in ringfence_refused_total{listener="http"} and logged as a refusal naming the peer,
// once per peer and interval, and the key sent is never logged.
func TestRESTRequestsRefusedForTheirKeyAreCountedAndLogged(t *testing.T) {
	d := startDaemon(t, "ringfenced", registryEnv()...)
	for _, key := range []string{"", "rf_" + canary, "rf_" + canary} {
		code, _, raw := rest{t: t, base: "http://" + d.HTTPAddr, key: key}.do("GET", "/v1/mcp/servers", "")
		require.Equal(t, http.StatusUnauthorized, code, raw)
	}
	resp, err := http.Get("http://" + d.HTTPAddr + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, metricLines(string(metrics), "ringfence_refused_total"), `ringfence_refused_total{listener="http",reason="Unauthenticated"} 3`)
	require.Contains(t, d.Logs.String(), `msg="refused a peer before reading a request" listener=http peer=127.0.0.1 reason=Unauthenticated refused=1`)
	require.NotContains(t, d.Logs.String(), canary)
}

// metricLines are the lines of a /metrics page that begin with name, for short failure messages.
func metricLines(page, name string) string {
	var out []string
	for line := range strings.Lines(page) {
		if strings.HasPrefix(line, name) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}
