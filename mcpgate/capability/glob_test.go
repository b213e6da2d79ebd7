package capability

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// requireAgrees checks the bit-parallel walks against the table walk they replaced.
func requireAgrees(t testing.TB, a, b string) {
	t.Helper()
	require.Equal(t, refMatchGlob(a, b), MatchGlob(a, b), "MatchGlob(%q, %q)", a, b)
	require.Equal(t, refCovers(refTokens(a), refTokens(b)), scopeCovers(a, b), "scopeCovers(%q, %q)", a, b)
	require.Equal(t, refOverlap(refTokens(a), refTokens(b)), scopesOverlap(a, b), "scopesOverlap(%q, %q)", a, b)
}

// Every pair of globs of up to 4 bytes over "a", "b", "/" and "*": the corner cases of "*"
// against "**" and "/", and of empty and all-wildcard globs, exhaustively.
func TestGlobWalksAgreeWithTheTableWalkOnShortGlobs(t *testing.T) {
	var globs []string
	var grow func(prefix string)
	grow = func(prefix string) {
		globs = append(globs, prefix)
		if len(prefix) == 4 {
			return
		}
		for _, c := range []string{"a", "b", "/", "*"} {
			grow(prefix + c)
		}
	}
	grow("")
	for _, a := range globs {
		for _, b := range globs {
			requireAgrees(t, a, b)
		}
	}
}

// Long globs, so the state sets span several words and carries cross them.
func TestGlobWalksAgreeWithTheTableWalkOnLongGlobs(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"a", "a", "b", "/", "*", "**", "aa*", "/*/", "*a"}
	glob := func(n int) string {
		var sb strings.Builder
		for sb.Len() < n {
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		return sb.String()
	}
	for i := range 3000 {
		a, b := glob(1+rng.IntN(300)), glob(1+rng.IntN(300))
		if i%3 == 0 {
			// Shared ends, which trimming strips, around different middles.
			a, b = "/srv/"+a+"/x.txt", "/srv/"+b+"/x.txt"
		}
		requireAgrees(t, a, b)
	}
	// A run of wildcards across a word boundary and the end at a word's last bit.
	for _, n := range []int{62, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256} {
		requireAgrees(t, strings.Repeat("*", n), strings.Repeat("a", n))
		requireAgrees(t, strings.Repeat("a", n)+"*", strings.Repeat("a", n+3))
		requireAgrees(t, "*"+strings.Repeat("a", n), strings.Repeat("a", n)+"*")
		requireAgrees(t, "*"+strings.Repeat("a", n-1)+"b", strings.Repeat("a", n)+"*")
		requireAgrees(t, strings.Repeat("*/", n/2)+"*", strings.Repeat("*/", n/2-1)+"*")
	}
}

// FuzzGlobWalksAgainstTheTableWalk compares every decision with the table walk on globs up
// to 300 bytes (longer than a capability: the walks span several words).
func FuzzGlobWalksAgainstTheTableWalk(f *testing.F) {
	f.Add("/srv/*", "/srv/**")
	f.Add("/srv/**/a", "/srv/*/a")
	f.Add("*.key", "a.*")
	f.Add("***", "a/b")
	f.Add(strings.Repeat("a*", 40), strings.Repeat("*a", 41))
	f.Fuzz(func(t *testing.T, a, b string) {
		if len(a) > 300 || len(b) > 300 {
			return
		}
		requireAgrees(t, a, b)
	})
}

// The reported exhaustion: one requirement against 256 revoke entries of near-maximal globs,
// once as reported and once with wildcards at both ends (no literal end decides). The table
// walk visited up to 254 × 254 cells per comparison (16.5 million for the 256); the
// bit-parallel walk's work is bounded by 254 tokens × 4 words plus setting up, per
// comparison.
func TestPathologicalRevocationsTakeBoundedWork(t *testing.T) {
	for _, shape := range []string{"repro", "open"} {
		t.Run(shape, func(t *testing.T) {
			eff, req := pathological(shape)
			m := &Meter{}
			for _, r := range eff.Revoked {
				require.False(t, m.TakesAway(r, req), r.String())
			}
			perComparison := int64(maxComparisonWork)
			require.LessOrEqual(t, m.Spent(), int64(len(eff.Revoked))*perComparison)
			t.Logf("%s: %d units for %d comparisons (the table walk: %d cells)", shape, m.Spent(), len(eff.Revoked),
				len(eff.Revoked)*(len(refTokens(req.Scope))+1)*(len(refTokens(eff.Revoked[0].Scope))+1))
		})
	}
}

// maxComparisonWork bounds one comparison of two scopes of at most 254 bytes: trimming reads
// each byte at most once; compiling sets up, reads the glob and clears at most 6+254 sets of
// 4 words; and the walk takes a step of at most 4 words per token of the other glob, and one
// more at the end.
const maxComparisonWork = scopeWork + 2*254 + (walkWork + 2*254 + (6+254)*4) + 255*(stepWork+4)

func TestComparisonWorkIsBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	// Wide alphabets (one equality set per distinct byte) and long wildcard runs.
	alphabet := []byte("*/abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.-_~")
	glob := func() string {
		b := make([]byte, 254)
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	worst := 0
	for range 2000 {
		a, b := glob(), glob()
		if rng.IntN(2) == 0 {
			a, b = "*"+a[1:], b[:253]+"*"
		}
		_, w1 := coverWork(a, b, false)
		_, w2 := overlapWork(a, b)
		_, w3 := coverWork(a, b, true)
		worst = max(worst, w1, w2, w3)
	}
	require.LessOrEqual(t, worst+scopeWork, maxComparisonWork)
	t.Logf("worst work seen: %d (bound %d)", worst, maxComparisonWork)
}

func TestMeterStopsClosedOnceItsLimitIsSpent(t *testing.T) {
	eff, req := pathological("open")
	m := &Meter{Limit: 10_000}
	taken := 0
	for _, r := range eff.Revoked {
		if m.TakesAway(r, req) {
			taken++
		}
	}
	require.True(t, m.Exceeded())
	require.Positive(t, taken, "past its limit a meter answers that revoke entries take away")
	require.False(t, m.Covers(MustParseSet([]string{"fs.read"})[0], req), "nor does anything cover")
	require.Less(t, m.Spent(), int64(10_000+maxComparisonWork+1), "nothing is compared past the limit")
}

// A caller with many comparisons to make for one request (the pool's argument-scope gate)
// meters Effective.Covers and refuses once the limit is spent.
func TestCoversMeteredAgreesAndStops(t *testing.T) {
	eff, req := pathological("open")
	m := &Meter{}
	require.Equal(t, eff.Covers(req), eff.CoversMetered(req, m))
	require.False(t, m.Exceeded())
	require.Positive(t, m.Spent())

	limited := &Meter{Limit: m.Spent() / 2}
	require.False(t, eff.CoversMetered(req, limited), "past its limit nothing is covered")
	require.True(t, limited.Exceeded())
	require.Less(t, limited.Spent(), m.Spent())
}
