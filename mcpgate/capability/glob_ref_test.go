package capability

// The table walk glob.go replaced, kept verbatim (renamed) as the oracle the differential
// tests and fuzz targets compare the bit-parallel walk against: the two must agree on every
// pair, including the corner cases of "*" against "**" and of "/".

const (
	refStar     = -1 // "*": any run of bytes other than "/"
	refStarStar = -2 // "**": any run of bytes
)

// refTokens splits a glob the way MatchGlob reads it: "**" first, then "*".
func refTokens(glob string) []int {
	out := make([]int, 0, len(glob))
	for i := 0; i < len(glob); i++ {
		switch {
		case glob[i] == '*' && i+1 < len(glob) && glob[i+1] == '*':
			out = append(out, refStarStar)
			i++
		case glob[i] == '*':
			out = append(out, refStar)
		default:
			out = append(out, int(glob[i]))
		}
	}
	return out
}

func refMatchGlob(pattern, s string) bool {
	literal := make([]int, len(s))
	for i := range len(s) {
		literal[i] = int(s[i])
	}
	return refCovers(refTokens(pattern), literal)
}

func refCovers(held, required []int) bool {
	memo := refMemo(len(held), len(required))
	var covers func(i, j int) bool
	covers = func(i, j int) bool {
		if v := memo[i][j]; v != 0 {
			return v == 1
		}
		var ok bool
		switch {
		case i == len(held):
			ok = j == len(required)
		case held[i] == refStarStar:
			ok = covers(i+1, j) || (j < len(required) && covers(i, j+1))
		case held[i] == refStar:
			ok = covers(i+1, j) || (j < len(required) && required[j] != refStarStar && required[j] != '/' && covers(i, j+1))
		default:
			ok = j < len(required) && held[i] == required[j] && covers(i+1, j+1)
		}
		memo[i][j] = refVerdict(ok)
		return ok
	}
	return covers(0, 0)
}

func refOverlap(a, b []int) bool {
	memo := refMemo(len(a), len(b))
	accepts := func(wild, c int) bool { return wild == refStarStar || (wild == refStar && c != '/') }
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
		memo[i][j] = refVerdict(ok)
		return ok
	}
	return overlap(0, 0)
}

func refMemo(n, m int) [][]uint8 {
	memo := make([][]uint8, n+1)
	for i := range memo {
		memo[i] = make([]uint8, m+1)
	}
	return memo
}

func refVerdict(ok bool) uint8 {
	if ok {
		return 1
	}
	return 2
}
