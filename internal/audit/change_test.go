package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// registration is a change shaped like the registry's: a server with n args of size bytes.
func registration(n, size int) map[string]any {
	args := make([]any, n)
	for i := range args {
		args[i] = fmt.Sprintf("%03d", i) + strings.Repeat("a", size-3)
	}
	return map[string]any{
		"ref": "mid", "command": "mcp-server", "args": args,
		"env":    map[string]any{"APP_TOKEN": SecretMask},
		"grants": []any{"process_spawn", "external_api_call"},
	}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

// requireStorable: the change fits, and storing it (the spool marshals the record, which
// compacts and HTML-escapes a RawMessage) does not change a byte.
func requireStorable(t *testing.T, out json.RawMessage) {
	t.Helper()
	require.LessOrEqual(t, len(out), MaxChangeBytes)
	stored, err := json.Marshal(out)
	require.NoError(t, err)
	require.Equal(t, string(out), string(stored))
	rec := NewAdminRecord("registry", "", AdminEvent{ActorRole: "admin", Action: "update", ResourceType: "mcp_server", Change: out})
	require.NoError(t, rec.Validate())
}

func TestBoundChangeKeepsAChangeThatFits(t *testing.T) {
	in := json.RawMessage("{\n  \"ref\": \"docs\",  \"description\": \"a <b> & c\", \"n\": 1.50}")
	out, err := BoundChange(in)
	require.NoError(t, err)
	requireStorable(t, out)
	require.Equal(t, `{"ref":"docs","description":"a \u003cb\u003e \u0026 c","n":1.50}`, string(out), "whole, in key order, numbers as written")

	out, err = BoundChange(nil)
	require.NoError(t, err)
	require.Nil(t, out)

	_, err = BoundChange(json.RawMessage(`{"ref":`))
	require.ErrorIs(t, err, ErrInvalidRecord)
}

func TestBoundChangeShortensTheLargestValuesFirst(t *testing.T) {
	before, after := registration(64, 4000), registration(64, 4000)
	after["grants"] = []any{"process_spawn"}
	in := mustJSON(t, map[string]any{"before": before, "after": after})
	require.Greater(t, len(in), 4*MaxChangeBytes)

	out, err := BoundChange(in)
	require.NoError(t, err)
	requireStorable(t, out)
	got := decode(t, out)
	require.Equal(t, true, got[ShortenedKey])

	again, err := BoundChange(in)
	require.NoError(t, err)
	require.Equal(t, string(out), string(again), "shortening is deterministic")

	for _, side := range []string{"before", "after"} {
		reg := got[side].(map[string]any)
		require.Equal(t, "mid", reg["ref"], "small fields stay as they were")
		require.Equal(t, map[string]any{"APP_TOKEN": SecretMask}, reg["env"], "secrets stay masked")
		args := reg["args"].([]any)
		require.Len(t, args, 64, "the list keeps its shape: each long arg is summarized on its own")
		var omitted int
		for i, a := range args {
			want := fmt.Sprintf("%03d", i) + strings.Repeat("a", 3997)
			if s, ok := a.(string); ok {
				require.Equal(t, want, s)
				continue
			}
			omitted++
			sum := a.(map[string]any)
			require.Equal(t, "string", sum[OmittedKey])
			require.Equal(t, float64(4000), sum["bytes"])
			require.Equal(t, sha(want), sum["sha256"], "the digest is the arg's own text")
		}
		require.Positive(t, omitted)
	}
	require.Equal(t, []any{"process_spawn"}, got["after"].(map[string]any)["grants"])
}

// A map of many small entries is summarized as one object once nothing inside it is worth
// replacing on its own, with a digest of its sorted compact JSON.
func TestBoundChangeSummarizesAMapOfSmallEntries(t *testing.T) {
	perms := map[string]any{}
	for i := range 256 {
		perms[fmt.Sprintf("tool_%03d_%s", i, strings.Repeat("x", 100))] = map[string]any{"required": []any{"fs.read:{path}", "net.fetch:<host>"}}
	}
	reg := registration(1, 10)
	reg["tool_permissions"] = perms
	in := mustJSON(t, map[string]any{"before": reg, "after": reg})
	require.Greater(t, len(in), MaxChangeBytes)

	out, err := BoundChange(in)
	require.NoError(t, err)
	requireStorable(t, out)
	got := decode(t, out)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(perms))
	canonical := strings.TrimSuffix(buf.String(), "\n")
	var summarized int
	for _, side := range []string{"before", "after"} {
		p := got[side].(map[string]any)["tool_permissions"].(map[string]any)
		if p[OmittedKey] == nil {
			require.Len(t, p, 256)
			continue
		}
		summarized++
		require.Equal(t, map[string]any{
			OmittedKey: "object", "count": float64(256), "bytes": float64(len(canonical)), "sha256": sha(canonical),
		}, p)
	}
	require.Equal(t, 1, summarized, "one side shortened is enough here")
}

func TestBoundChangeFallsBackToOneSummary(t *testing.T) {
	// Many keys, each too small to replace: only a summary of the whole change fits.
	many := map[string]any{}
	for i := range 20000 {
		many[fmt.Sprintf("k%05d", i)] = i
	}
	in := mustJSON(t, many)
	out, err := BoundChange(in)
	require.NoError(t, err)
	requireStorable(t, out)
	got := decode(t, out)
	require.Equal(t, map[string]any{
		ShortenedKey: true, OmittedKey: "object", "count": float64(20000), "bytes": float64(len(in)), "sha256": sha(string(in)),
	}, got)
}

func TestBoundChangeWrapsAChangeThatIsNotAnObject(t *testing.T) {
	list := make([]any, 40)
	for i := range list {
		list[i] = strings.Repeat("<", 1000) // 6 bytes each once escaped for storage
	}
	in := mustJSON(t, list)
	out, err := BoundChange(in)
	require.NoError(t, err)
	requireStorable(t, out)
	got := decode(t, out)
	require.Equal(t, true, got[ShortenedKey])
	require.Len(t, got["change"], 40)
}

func TestBoundChangeCountsTheStoredForm(t *testing.T) {
	// 20 KiB of '&' is 120 KiB once encoding/json escapes it, which the spool does.
	in := json.RawMessage(`{"description":"` + strings.Repeat("&", 20<<10) + `"}`)
	out, err := BoundChange(in)
	require.NoError(t, err)
	requireStorable(t, out)
	got := decode(t, out)
	require.Equal(t, "string", got["description"].(map[string]any)[OmittedKey])
}
