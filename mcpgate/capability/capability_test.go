package capability

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCovers(t *testing.T) {
	for _, tc := range []struct {
		held, required string
		want           bool
	}{
		{"process_spawn", "process_spawn", true},
		{"fs.read", "fs.read:/srv/docs/a.txt", true},
		{"fs.read:/srv/docs/*", "fs.read:/srv/docs/a.txt", true},
		{"fs.read:/srv/docs/*", "fs.read:/srv/docs/sub/a.txt", false},
		{"fs.read:/srv/docs/**", "fs.read:/srv/docs/sub/a.txt", true},
		{"fs.read:/srv/**/a.txt", "fs.read:/srv/x/y/a.txt", true},
		{"fs.read:/srv/docs/*", "fs.read", false},
		{"fs.read:/srv/docs/*", "fs.write:/srv/docs/a.txt", false},
		{"fs.read:/secrets/*", "fs.read:/secrets/api-key", true},
		{"db.kb_facts:read", "db.kb_facts:write", false},
		{"external_api_call", "process_spawn", false},
		// Both sides globs: the held glob must match every scope the required one may name.
		{"fs.read:/srv/*", "fs.read:/srv/**", false},
		{"fs.read:/srv/**", "fs.read:/srv/*", true},
		{"fs.read:/srv/*", "fs.read:/srv/*", true},
		{"fs.read:/srv/*", "fs.read:/srv/a*", true},
		{"fs.read:/srv/a*", "fs.read:/srv/*", false},
		{"fs.read:/srv/*", "fs.read:/srv/*/a", false},
		{"fs.read:/srv/**/a", "fs.read:/srv/*/a", true},
		{"fs.read:/srv/**", "fs.read:/etc/**", false},
	} {
		t.Run(tc.held+" covers "+tc.required, func(t *testing.T) {
			h, err := Parse(tc.held)
			require.NoError(t, err)
			r, err := Parse(tc.required)
			require.NoError(t, err)
			require.Equal(t, tc.want, Covers(h, r))
		})
	}
}

func TestParseRefusals(t *testing.T) {
	for _, bad := range []string{"", "Process", "fs.read:", "fs read", "fs.read:a b", strings.Repeat("a", 300), "9lives"} {
		_, err := Parse(bad)
		require.Error(t, err, bad)
	}
}

// FuzzValidNameIsThePattern: the hand-written name check accepts exactly what namePattern,
// the rule the error states, matches.
func FuzzValidNameIsThePattern(f *testing.F) {
	for _, s := range []string{"", "a", "process_spawn", "fs.read", "docs-search.v2", "Process", "9lives", "a b", "a:b", "é", strings.Repeat("a", 64), strings.Repeat("a", 65), "a\n", "a\x00"} {
		f.Add(s)
	}
	re := regexp.MustCompile(namePattern)
	f.Fuzz(func(t *testing.T, name string) {
		if validName(name) != re.MatchString(name) {
			t.Fatalf("validName(%q) = %v, the pattern says %v", name, validName(name), re.MatchString(name))
		}
	})
}

func TestMissing(t *testing.T) {
	held := MustParseSet([]string{"process_spawn", "fs.read:/srv/*"})
	req := MustParseSet([]string{"process_spawn", "external_api_call", "fs.read:/srv/a", "fs.read:/etc/passwd", "external_api_call"})
	require.Equal(t, []string{"external_api_call", "fs.read:/etc/passwd"}, held.Missing(req))
}

func TestMatchGlobIsBounded(t *testing.T) {
	// A pathological pattern that is exponential for a naive backtracker.
	p := strings.Repeat("*a", 40) + "b"
	s := strings.Repeat("a", 200)
	require.False(t, MatchGlob(p, s))
}

func FuzzMatchGlob(f *testing.F) {
	f.Add("/srv/**/x", "/srv/a/b/x")
	f.Add("*", "a/b")
	f.Fuzz(func(t *testing.T, p, s string) {
		if len(p) > 64 || len(s) > 256 {
			return
		}
		got := MatchGlob(p, s)
		if p == s && !strings.Contains(p, "*") {
			require.True(t, got)
		}
		if p == "**" {
			require.True(t, got)
		}
	})
}

func TestEffective(t *testing.T) {
	eff := Effective{
		Held:    MustParseSet([]string{"process_spawn", "external_api_call", "fs.read"}),
		Revoked: MustParseSet([]string{"fs.read:/etc/**", "external_api_call:internal.*"}),
	}
	for _, tc := range []struct {
		required string
		want     bool
	}{
		{"process_spawn", true},
		{"fs.read:/srv/a.txt", true},
		{"fs.read:/etc/passwd", false},
		// A bare requirement asks for every scope; one of them is revoked.
		{"fs.read", false},
		{"fs.read:/etc/*", false},
		{"external_api_call:api.example.com", true},
		{"external_api_call:internal.example", false},
		{"external_api_call", false},
		{"fs.write:/srv/a.txt", false},
		// A glob requirement is taken away when any scope it names is revoked.
		{"fs.read:/**", false},
		{"fs.read:/et*/x", false},
		{"fs.read:/srv/**", true},
	} {
		t.Run(tc.required, func(t *testing.T) {
			r, err := Parse(tc.required)
			require.NoError(t, err)
			require.Equal(t, tc.want, eff.Covers(r))
		})
	}
	require.Equal(t, []string{"external_api_call", "fs.read:/etc/passwd", "fs.write"},
		eff.Missing(MustParseSet([]string{"process_spawn", "fs.write", "fs.read:/etc/passwd", "external_api_call", "fs.write"})))
	require.Equal(t, []string{"fs.read:/etc/**"}, eff.RevokedBy(MustParseSet([]string{"fs.read:/etc/hosts"})[0]))
}

func TestTakesAwayPartialOverlaps(t *testing.T) {
	for _, tc := range []struct {
		revoked, required string
		want              bool
	}{
		{"fs.read:/srv/x/*", "fs.read:/srv/*/a", true},
		{"fs.read:/srv/secret/*", "fs.read:/srv/**", true},
		{"fs.read:/srv/*.key", "fs.read:/srv/a.*", true},
		{"fs.read:/srv/*", "fs.read:/srv/a/b", false},
		{"fs.read:/srv/a/*", "fs.read:/srv/b/*", false},
		{"fs.read", "fs.read:/x", true},
		{"fs.read:/x", "fs.read", true},
		{"fs.write", "fs.read", false},
	} {
		t.Run(tc.revoked+" takes away "+tc.required, func(t *testing.T) {
			require.Equal(t, tc.want, TakesAway(MustParseSet([]string{tc.revoked})[0], MustParseSet([]string{tc.required})[0]))
		})
	}
}

// FuzzGlobComparisons checks the glob-against-glob decisions against MatchGlob on strings
// the required glob matches: covering must hold for each, and overlap must find each.
func FuzzGlobComparisons(f *testing.F) {
	f.Add("/srv/*", "/srv/**", "ab/c")
	f.Add("/srv/**/a", "/srv/*/a", "x")
	f.Add("*.key", "a.*", "key")
	f.Fuzz(func(t *testing.T, held, required, fill string) {
		if len(held) > 32 || len(required) > 32 || len(fill) > 8 {
			return
		}
		// One string required matches: each "**" becomes fill, each "*" fill without "/".
		segFill := strings.ReplaceAll(fill, "/", "")
		sample := strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(required, "**", "\x00"), "*", segFill), "\x00", fill)
		if !MatchGlob(required, sample) {
			return // fill held a "*" of its own, which MatchGlob reads literally
		}
		if scopeCovers(held, required) {
			require.True(t, MatchGlob(held, sample), "%q covers %q but not %q", held, required, sample)
		}
		if MatchGlob(held, sample) {
			require.True(t, scopesOverlap(held, required), "%q and %q both match %q", held, required, sample)
		}
		require.Equal(t, scopesOverlap(held, required), scopesOverlap(required, held))
	})
}

func TestEffectiveWithoutRevocationsIsTheHeldSet(t *testing.T) {
	held := MustParseSet([]string{"process_spawn", "fs.read:/srv/*"})
	req := MustParseSet([]string{"process_spawn", "external_api_call", "fs.read:/srv/a", "fs.read:/etc/passwd"})
	require.Equal(t, held.Missing(req), Effective{Held: held}.Missing(req))
}

func TestNearFloor(t *testing.T) {
	for s, want := range map[string]string{"proces_spawn": ProcessSpawn, "external_api_cal": ExternalAPICall, "process_spawn": "", "fs.read": ""} {
		got, ok := NearFloor(s)
		require.Equal(t, want, got, s)
		require.Equal(t, want != "", ok, s)
	}
}
