package pool

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/audit"
)

// TestEachServersCallsAreTimedByResult: every dispatched call is one sample of
// ringfence_pool_server_call_duration_seconds under its server and result (a tool error and an
// answer the output gate refused are failed ones); a call refused before dispatch never
// reached a server and is none.
func TestEachServersCallsAreTimedByResult(t *testing.T) {
	mem := &memoryBackend{}
	mem.servers = map[string]*mcp.Server{"docs-mcp": memoryDocs(mem)}
	h := newHarness(t, harnessOpts{backend: mem})
	h.server("docs", func(r *registryv1.CreateServerRequest) { r.Command = "docs-mcp" })
	h.publish("g", []string{"a"}, []imp{{"docs", "a", []string{"report", "fail"}}}, nil)
	run := h.start("g")
	samples := func(result string) uint64 {
		var m dto.Metric
		require.NoError(t, h.pool.metrics.serverCalls.WithLabelValues("docs", result).(prometheus.Metric).Write(&m))
		return m.GetHistogram().GetSampleCount()
	}

	for range 2 {
		_, err := h.call(run, "a", "docs__report", map[string]any{"n": 1})
		require.NoError(t, err)
	}
	res, err := h.call(run, "a", "docs__fail", map[string]any{})
	require.NoError(t, err)
	require.True(t, res.IsError)
	_, err = h.call(run, "a", "docs__report", map[string]any{"n": -1})
	requireFailed(t, err, failureOutputInvalid)
	_, err = h.call(run, "a", "docs__report", map[string]any{"n": "one"})
	requireRefused(t, err, reasonInvalidInput)

	require.Equal(t, uint64(2), samples(audit.ResultSucceeded))
	require.Equal(t, uint64(2), samples(audit.ResultFailed))
	require.Equal(t, int64(4), mem.calls.Load(), "the refused call reached no server")
}
