package store

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/audit"
)

// mappedResident is how much of the file at path this process has resident through its
// memory maps (the Rss of its mappings in /proc/self/smaps), in bytes.
func mappedResident(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	var total int64
	inFile := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			inFile = strings.HasSuffix(line, " "+path)
			continue
		}
		if inFile && len(fields) == 3 && fields[0] == "Rss:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			require.NoError(t, err)
			total += kb << 10
		}
	}
	require.NoError(t, sc.Err())
	return total
}

// TestTheLogLetsGoOfItsMappedPages: each commit writes the last pages of the log's trees
// afresh and the next reads them through the memory map, so what the log keeps mapped grows
// with its commits; it lets go of it as it writes and after a verify, and the records read
// back whole afterwards.
func TestTheLogLetsGoOfItsMappedPages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	s, err := Open(path, Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	// Small commits, as a steady stream of calls makes them.
	const batches, perBatch = 4000, 10
	for b := range batches {
		recs := make([]audit.Record, perBatch)
		for i := range recs {
			recs[i] = toolRec(call{tenant: "acme", run: fmt.Sprintf("run-%d", b), server: "files", tool: "read"}, fmt.Sprintf("c-%d-%d", b, i))
		}
		appendAll(t, s, recs...)
	}
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Greater(t, info.Size(), int64(3*releaseStep), "the log outgrew what it may keep mapped")
	require.Less(t, mappedResident(t, path), int64(releaseStep+releaseStep/2), "pages written before the last release are let go")

	requireVerified(t, s, batches*perBatch)
	require.Less(t, mappedResident(t, path), int64(releaseStep/2), "a verify maps the whole file, and lets it go")

	page, err := s.List(t.Context(), Filter{RunID: "run-3"}, 10, "")
	require.NoError(t, err)
	require.Len(t, recordsOf(page), 10, "what was let go reads back")
}
