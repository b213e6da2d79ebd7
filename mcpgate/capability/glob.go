package capability

import (
	"math/bits"
	"sync"
)

// Scopes on both sides of a comparison may be globs: a node declares fs.read:/srv/** and a
// grant or an agent holds fs.read:/srv/*. Deciding "covers" by matching one glob against the
// other's text would let "*" swallow "**" as two literal characters and call the narrower
// grant a ceiling over the wider node. So globs are compared as the sets of strings they
// match: a glob is a token sequence of bytes and two wildcards ("**" read first, then "*").
//
// Each comparison is a walk over pairs (i, j) of token positions, one in each glob. A table of
// every pair made one comparison of two 250-byte scopes cost milliseconds, and the agent floor
// makes one per node capability and revoke entry. So the walk runs bit-parallel instead: the
// positions reachable in one glob are a bit set (one 64-bit word per 64 tokens), advanced by
// a few word operations per token of the other glob, with nothing allocated. A literal prefix
// or suffix both globs share is stripped first, and one that differs decides at once. Work is
// linear in one glob's length times the other's words (for two scopes of a capability, at
// most 254 tokens × 4 words, a few microseconds), and reported so a caller can bound the work
// of a request that makes many comparisons (see Meter).

// Token kinds.
const (
	tokLit      = iota
	tokStar     // "*": any run of bytes other than "/"
	tokStarStar // "**": any run of bytes
)

// token returns the token of g at byte i and the byte after it. In literal mode (the text
// MatchGlob matches) every byte, "*" included, is a literal.
func token(g string, i int, literal bool) (kind int, c byte, next int) {
	c = g[i]
	switch {
	case literal || c != '*':
		return tokLit, c, i + 1
	case i+1 < len(g) && g[i+1] == '*':
		return tokStarStar, 0, i + 2
	default:
		return tokStar, 0, i + 1
	}
}

// MatchGlob matches s, read literally, against pattern: "*" matches any run of bytes other
// than "/" and "**" any run including "/". Work is bounded by len(s) × (len(pattern)/64 + 1).
func MatchGlob(pattern, s string) bool {
	ok, _ := coverWork(pattern, s, true)
	return ok
}

// scopeCovers reports whether every string required matches is matched by held.
func scopeCovers(held, required string) bool {
	ok, _ := coverWork(held, required, false)
	return ok
}

// scopesOverlap reports whether some string matches both globs.
func scopesOverlap(a, b string) bool {
	ok, _ := overlapWork(a, b)
	return ok
}

// trim strips the literal prefix and suffix held and required share (required read
// literally in literal mode). ok is false when a literal byte of one meets a different
// literal of the other at either end: a literal is matched only by the same byte, so neither
// covering nor overlap can hold. Both walks step through such a shared prefix or suffix
// without a choice, so stripping it changes no answer. work counts the bytes compared.
func trim(a, b string, literal bool) (string, string, int, bool) {
	work := 0
	for len(a) > 0 && len(b) > 0 && a[0] != '*' && (literal || b[0] != '*') {
		work++
		if a[0] != b[0] {
			return a, b, work, false
		}
		a, b = a[1:], b[1:]
	}
	for len(a) > 0 && len(b) > 0 && a[len(a)-1] != '*' && (literal || b[len(b)-1] != '*') {
		work++
		if a[len(a)-1] != b[len(b)-1] {
			return a, b, work, false
		}
		a, b = a[:len(a)-1], b[:len(b)-1]
	}
	return a, b, work, true
}

// coverWork reports whether held covers required (read literally in literal mode), and the
// work spent. The walk advances a set of held positions over required's tokens: a held "**"
// absorbs any token, a held "*" any but "/" and "**", a held literal only the same literal,
// and a held wildcard may also match nothing.
func coverWork(held, required string, literal bool) (bool, int) {
	held, required, work, ok := trim(held, required, literal)
	switch {
	case !ok:
		return false, work
	case held == "":
		return required == "", work
	case held[0] != '*' || held[len(held)-1] != '*':
		// A literal end trim left unmatched faces an empty required or a wildcard, which no
		// literal covers.
		return false, work
	case held == "**":
		return true, work
	}
	ok, walk := coverWalk(held, required, literal)
	return ok, work + walk
}

// coverWalk is the walk of coverWork, apart so the cases trimming decides stay cheap.
func coverWalk(held, required string, literal bool) (bool, int) {
	m := matchers.Get().(*matcher)
	defer m.release()
	work := m.compile(held)
	work += m.closure(m.wild)
	for j := 0; j < len(required); {
		kind, c, next := token(required, j, literal)
		j = next
		stay := m.wild
		if kind == tokStarStar || (kind == tokLit && c == '/') {
			stay = m.wildStarStar
		}
		work += m.stepThenClose(m.eq(kind, c), stay, m.wild)
		if m.empty() {
			return false, work
		}
	}
	return m.accepts(), work
}

// overlapWork reports whether some string matches both a and b, and the work spent. The walk
// advances a set of a's positions over b's tokens. At each token of b: a wildcard of a may
// match nothing, and a wildcard of b may absorb a's literals it accepts, staying on b's
// token; then b's token is consumed, by the same literal of a, by a wildcard of a that
// accepts it, or, when it is a wildcard, by matching nothing more.
func overlapWork(a, b string) (bool, int) {
	a, b, work, ok := trim(a, b, false)
	switch {
	case !ok:
		return false, work
	case a == "**" || b == "**":
		return true, work
	}
	ok, walk := overlapWalk(a, b)
	return ok, work + walk
}

// overlapWalk is the walk of overlapWork, apart so the cases trimming decides stay cheap.
func overlapWalk(a, b string) (bool, int) {
	// The walk is symmetric; keep the cheaper orientation (tokens of b × words of a).
	if len(b)*(len(a)/64+1) > len(a)*(len(b)/64+1) {
		a, b = b, a
	}
	m := matchers.Get().(*matcher)
	defer m.release()
	work := m.compile(a)
	for j := 0; j < len(b); {
		kind, c, next := token(b, j, false)
		j = next
		switch kind {
		case tokStarStar:
			work += m.closure(m.all)
		case tokStar:
			work += m.closure(m.starAbsorbs)
		default:
			stay := m.wild
			if c == '/' {
				stay = m.wildStarStar
			}
			work += m.closeThenStep(m.wild, m.eq(tokLit, c), stay)
			if m.empty() {
				return false, work
			}
		}
	}
	work += m.closure(m.wild)
	return m.accepts(), work
}

// matcher holds the bit sets of one compiled glob: bit i stands for token position i, and bit
// n for the end. It is pooled so a comparison allocates nothing.
type matcher struct {
	n     int // tokens
	words int // 64-bit words per set: n+1 bits
	// idx maps a byte to 1 + the index of its equality set in buf; 0: no such literal.
	idx  [256]uint8
	lits []byte // the bytes idx maps, to clear it
	buf  []uint64

	wild         []uint64 // "*" or "**"
	wildStarStar []uint64 // "**"
	starAbsorbs  []uint64 // what a "*" of the other glob may absorb: wildcards and literals other than "/"
	all          []uint64 // every token: what a "**" of the other glob may absorb
	state        []uint64 // the positions the walk has reached
	lo, hi       int      // the words of state that may be nonzero
	none         []uint64 // empty: the equality set of a byte g lacks
}

var matchers = sync.Pool{New: func() any { return new(matcher) }}

// maxPooledWords keeps a matcher compiled for a very long MatchGlob pattern out of the pool.
const maxPooledWords = 1 << 12

func (m *matcher) release() {
	if cap(m.buf) <= maxPooledWords {
		matchers.Put(m)
	}
}

// compile builds the sets of glob g and returns the work spent: setting up, two units per
// byte read, one per word cleared.
func (m *matcher) compile(g string) int {
	for _, c := range m.lits {
		m.idx[c] = 0
	}
	m.lits = m.lits[:0]
	// len(g) bounds the tokens; a glob with "**" may get a word it does not need.
	w := len(g)/64 + 1
	m.words = w
	size := (6 + 8) * w // the fixed sets, then room for 8 literals before growing
	if cap(m.buf) < size {
		m.buf = make([]uint64, size)
	} else {
		m.buf = m.buf[:size]
		clear(m.buf)
	}
	work := walkWork + 2*len(g) + size
	// The fixed sets are built a word at a time in registers; equality sets in place.
	var wild, wildStarStar, starAbsorbs uint64
	flush := func(k int) {
		m.buf[wildSet*w+k], m.buf[wildStarStarSet*w+k], m.buf[starAbsorbsSet*w+k] = wild, wildStarStar, starAbsorbs
		wild, wildStarStar, starAbsorbs = 0, 0, 0
	}
	t := 0
	for i := 0; i < len(g); t++ {
		if t%64 == 0 && t > 0 {
			flush(t/64 - 1)
		}
		kind, c, next := token(g, i, false)
		i = next
		bit := uint64(1) << (t % 64)
		switch kind {
		case tokStarStar:
			wild |= bit
			wildStarStar |= bit
			starAbsorbs |= bit
		case tokStar:
			wild |= bit
			starAbsorbs |= bit
		default:
			if m.idx[c] == 0 {
				// At most 255 distinct literals: "*" is never one.
				m.lits = append(m.lits, c)
				m.idx[c] = uint8(len(m.lits))
				if need := (eqSets + len(m.lits)) * w; need > len(m.buf) {
					for range w {
						m.buf = append(m.buf, 0)
					}
					work += w
				}
			}
			m.buf[(eqSets+int(m.idx[c]-1))*w+t/64] |= bit
			if c != '/' {
				starAbsorbs |= bit
			}
		}
	}
	if t > 0 {
		flush((t - 1) / 64)
	}
	for k := range t / 64 {
		m.buf[allSet*w+k] = ^uint64(0)
	}
	m.buf[allSet*w+t/64] = 1<<(t%64) - 1
	m.n = t
	set := func(i int) []uint64 { return m.buf[i*w : (i+1)*w : (i+1)*w] }
	m.wild, m.wildStarStar, m.starAbsorbs = set(wildSet), set(wildStarStarSet), set(starAbsorbsSet)
	m.all, m.state, m.none = set(allSet), set(stateSet), set(noneSet)
	m.start()
	return work
}

// The sets' places in matcher.buf, words each; equality sets follow.
const (
	wildSet = iota
	wildStarStarSet
	starAbsorbsSet
	allSet
	stateSet
	noneSet
	eqSets
)

// eq returns the positions holding literal c (none for a wildcard or a byte g lacks).
func (m *matcher) eq(kind int, c byte) []uint64 {
	if kind != tokLit || m.idx[c] == 0 {
		return m.none
	}
	e := (eqSets + int(m.idx[c]-1)) * m.words
	return m.buf[e : e+m.words : e+m.words]
}

// The state set's nonzero words lie in [lo, hi] (lo > hi: the set is empty). No position is
// ever left for a lower one, so lo only rises, and each operation below touches the words
// from lo up to hi or as far as a carry reaches: a walk whose live positions are few costs a
// word per token, not the glob's length. Each returns its work: the words it touched, plus
// stepWork for reading the token.

// Work, in Meter's units, besides a byte read or a word touched: reading a token and taking a
// step, and setting up a walk (a pooled matcher). They keep a unit near the same time
// whatever the comparison, so a bound in units is a bound in time.
const (
	stepWork = 2
	walkWork = 16
)

// start makes the state set hold position 0 alone.
func (m *matcher) start() {
	m.state[0] = 1
	m.lo, m.hi = 0, 0
}

func (m *matcher) empty() bool { return m.lo > m.hi }

// accepts reports whether the end position is in the state set.
func (m *matcher) accepts() bool { return m.state[m.n/64]&(1<<(m.n%64)) != 0 }

// closure adds every position reachable from one in the set across positions in mask (each
// may be passed over without consuming anything): from i, i+1 when i is in mask, and on. One
// multi-word addition does it: adding mask to set∩mask carries each set bit through the run of
// mask bits it sits in, up to the first position past the run, and flips the bits it passes.
func (m *matcher) closure(mask []uint64) int {
	s := m.state
	mask = mask[:len(s)]
	var carry uint64
	k := m.lo
	for ; k < len(s) && (k <= m.hi || carry != 0); k++ {
		var sum uint64
		sum, carry = bits.Add64(s[k]&mask[k], mask[k], carry)
		s[k] |= sum ^ mask[k]
	}
	m.hi = max(m.hi, k-1)
	return stepWork + k - m.lo
}

// stepThenClose consumes one token of the other glob (a position in eq moves to the next
// one, a position in stay stays, every other is dropped), then takes the closure across
// mask, in one pass over the words.
func (m *matcher) stepThenClose(eq, stay, mask []uint64) int {
	s := m.state
	eq, stay, mask = eq[:len(s)], stay[:len(s)], mask[:len(s)]
	var moveCarry, addCarry uint64
	lo, hi := len(s), -1
	k := m.lo
	for ; k < len(s) && (k <= m.hi || moveCarry|addCarry != 0); k++ {
		moved := s[k] & eq[k]
		x := moved<<1 | moveCarry | s[k]&stay[k]
		moveCarry = moved >> 63
		var sum uint64
		sum, addCarry = bits.Add64(x&mask[k], mask[k], addCarry)
		x |= sum ^ mask[k]
		s[k] = x
		if x != 0 {
			lo, hi = min(lo, k), k
		}
	}
	work := stepWork + k - m.lo
	m.lo, m.hi = lo, hi
	return work
}

// closeThenStep is the closure across mask, then one token consumed, in one pass.
func (m *matcher) closeThenStep(mask, eq, stay []uint64) int {
	s := m.state
	eq, stay, mask = eq[:len(s)], stay[:len(s)], mask[:len(s)]
	var moveCarry, addCarry uint64
	lo, hi := len(s), -1
	k := m.lo
	for ; k < len(s) && (k <= m.hi || moveCarry|addCarry != 0); k++ {
		var sum uint64
		sum, addCarry = bits.Add64(s[k]&mask[k], mask[k], addCarry)
		x := s[k] | (sum ^ mask[k])
		moved := x & eq[k]
		x = moved<<1 | moveCarry | x&stay[k]
		moveCarry = moved >> 63
		s[k] = x
		if x != 0 {
			lo, hi = min(lo, k), k
		}
	}
	work := stepWork + k - m.lo
	m.lo, m.hi = lo, hi
	return work
}
