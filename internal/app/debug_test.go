package app

import (
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestServeProfilesCollectsAndReportsTheHeap(t *testing.T) {
	addr, err := serveProfiles(t.Context(), "127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	resp, err := http.Get("http://" + addr.String() + "/debug/pprof/heap?debug=1&gc=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "# HeapAlloc = ")
	// Only what was asked for is served.
	resp, err = http.Get("http://" + addr.String() + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}
