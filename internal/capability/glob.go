package capability

// Scopes on both sides of a comparison may be globs: a node declares fs.read:/srv/** and a
// grant or an agent holds fs.read:/srv/*. Deciding "covers" by matching one glob against the
// other's text would let "*" swallow "**" as two literal characters and call the narrower
// grant a ceiling over the wider node. So globs are compared as the sets of strings they
// match: a glob is a token sequence of bytes and two wildcards.

const (
	tokStar     = -1 // "*": any run of bytes other than "/"
	tokStarStar = -2 // "**": any run of bytes
)

// globTokens splits a glob the way MatchGlob reads it: "**" first, then "*".
func globTokens(glob string) []int {
	out := make([]int, 0, len(glob))
	for i := 0; i < len(glob); i++ {
		switch {
		case glob[i] == '*' && i+1 < len(glob) && glob[i+1] == '*':
			out = append(out, tokStarStar)
			i++
		case glob[i] == '*':
			out = append(out, tokStar)
		default:
			out = append(out, int(glob[i]))
		}
	}
	return out
}

// MatchGlob matches s, read literally, against pattern: "*" matches any run of bytes other
// than "/" and "**" any run including "/". Work is bounded by len(pattern)*len(s).
func MatchGlob(pattern, s string) bool {
	literal := make([]int, len(s))
	for i := range len(s) {
		literal[i] = int(s[i])
	}
	return scopeCovers(globTokens(pattern), literal)
}

// scopeCovers reports whether every string required matches is matched by held. Work is
// bounded by len(held)*len(required).
func scopeCovers(held, required []int) bool {
	memo := newMemo(len(held), len(required))
	var covers func(i, j int) bool
	covers = func(i, j int) bool {
		if v := memo[i][j]; v != 0 {
			return v == 1
		}
		var ok bool
		switch {
		case i == len(held):
			ok = j == len(required)
		case held[i] == tokStarStar:
			// "**" absorbs any token of required.
			ok = covers(i+1, j) || (j < len(required) && covers(i, j+1))
		case held[i] == tokStar:
			// "*" absorbs a byte other than "/" or a "*", never a "**", which may cross "/".
			ok = covers(i+1, j) || (j < len(required) && required[j] != tokStarStar && required[j] != '/' && covers(i, j+1))
		default:
			ok = j < len(required) && held[i] == required[j] && covers(i+1, j+1)
		}
		memo[i][j] = verdict(ok)
		return ok
	}
	return covers(0, 0)
}

// scopesOverlap reports whether some string matches both globs: a walk of the two globs side
// by side in which a literal byte of one is matched by the same byte or a wildcard of the
// other that accepts it. Work is bounded by len(a)*len(b).
func scopesOverlap(a, b []int) bool {
	memo := newMemo(len(a), len(b))
	accepts := func(wild, c int) bool { return wild == tokStarStar || (wild == tokStar && c != '/') }
	isWild := func(t int) bool { return t < 0 }
	var overlap func(i, j int) bool
	overlap = func(i, j int) bool {
		if v := memo[i][j]; v != 0 {
			return v == 1
		}
		var ok bool
		switch {
		case i == len(a) && j == len(b):
			ok = true
		case i < len(a) && isWild(a[i]) && overlap(i+1, j):
			ok = true
		case j < len(b) && isWild(b[j]) && overlap(i, j+1):
			ok = true
		case i < len(a) && j < len(b) && !isWild(a[i]) && !isWild(b[j]):
			ok = a[i] == b[j] && overlap(i+1, j+1)
		case i < len(a) && j < len(b) && !isWild(a[i]):
			ok = accepts(b[j], a[i]) && overlap(i+1, j)
		case i < len(a) && j < len(b) && !isWild(b[j]):
			ok = accepts(a[i], b[j]) && overlap(i, j+1)
		}
		memo[i][j] = verdict(ok)
		return ok
	}
	return overlap(0, 0)
}

func newMemo(n, m int) [][]uint8 {
	memo := make([][]uint8, n+1)
	for i := range memo {
		memo[i] = make([]uint8, m+1)
	}
	return memo
}

// verdict encodes a memoized result: 1 match, 2 no match (0 is unknown).
func verdict(ok bool) uint8 {
	if ok {
		return 1
	}
	return 2
}
