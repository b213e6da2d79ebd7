package screen

import (
	"fmt"
	"math/bits"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxFuzzyRunes bounds the names compared by edit distance.
const maxFuzzyRunes = 64

type nameEntry struct {
	name  string // lowercase
	runes []rune
	mask  uint64
}

// nameIndex finds other servers' and tools' names in text.
type nameIndex struct {
	exact map[string]bool
	byLen map[int][]nameEntry
}

func newNameIndex(names []string, exclude map[string]bool) *nameIndex {
	ix := &nameIndex{exact: map[string]bool{}, byLen: map[int][]nameEntry{}}
	addOne := func(n string) {
		n = strings.ToLower(n)
		if !utf8.ValidString(n) || exclude[n] || ix.exact[n] || !distinctive(n) {
			return
		}
		ix.exact[n] = true
		rs := []rune(n)
		if len(rs) >= MinFuzzyLen && len(rs) <= maxFuzzyRunes {
			ix.byLen[len(rs)] = append(ix.byLen[len(rs)], nameEntry{name: n, runes: rs, mask: runeMask(rs)})
		}
	}
	for _, n := range names {
		addOne(n)
		// Qualified names (server__tool) are also matched by their parts.
		if a, b, ok := strings.Cut(n, "__"); ok {
			addOne(a)
			addOne(b)
		}
	}
	return ix
}

// distinctive reports whether a name is specific enough to match in prose:
// at least 3 characters, and a single word of letters needs at least
// MinFuzzyLen ("add", "echo", "list" are everyday words).
func distinctive(n string) bool {
	l := utf8.RuneCountInString(n)
	if l < 3 {
		return false
	}
	if l >= MinFuzzyLen {
		return true
	}
	for _, r := range n {
		if !unicode.IsLetter(r) {
			return true
		}
	}
	return false
}

func runeMask(rs []rune) uint64 {
	var m uint64
	for _, r := range rs {
		switch {
		case r >= 'a' && r <= 'z':
			m |= 1 << (r - 'a')
		case r >= '0' && r <= '9':
			m |= 1 << (26 + r - '0')
		case r == '_':
			m |= 1 << 36
		case r == '-':
			m |= 1 << 37
		case r == '.':
			m |= 1 << 38
		default:
			m |= 1 << (39 + uint(r)%24)
		}
	}
	return m
}

// lookup returns the indexed name that w equals or resembles, or "".
// With allowPrefix false, a word that extends a name or is extended by it
// ("searches" and "search") is not a look-alike but an inflection.
func (ix *nameIndex) lookup(w string, allowPrefix bool) string {
	if ix.exact[w] {
		return w
	}
	rs := []rune(w)
	if len(rs) < MinFuzzyLen || len(rs) > maxFuzzyRunes+MaxEditDistance {
		return ""
	}
	mask := runeMask(rs)
	for l := len(rs) - MaxEditDistance; l <= len(rs)+MaxEditDistance; l++ {
		for _, e := range ix.byLen[l] {
			// Each edit adds or removes at most one distinct character.
			if bits.OnesCount64(mask&^e.mask) > MaxEditDistance || bits.OnesCount64(e.mask&^mask) > MaxEditDistance {
				continue
			}
			if !allowPrefix && (strings.HasPrefix(w, e.name) || strings.HasPrefix(e.name, w)) {
				continue
			}
			if withinDistance(rs, e.runes, MaxEditDistance) {
				return e.name
			}
		}
	}
	return ""
}

// withinDistance reports whether the Levenshtein distance of a and b is at
// most k, filling only the diagonal band that can stay within k.
func withinDistance(a, b []rune, k int) bool {
	if d := len(a) - len(b); d > k || -d > k {
		return false
	}
	const inf = 1 << 30
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		lo, hi := max(1, i-k), min(len(b), i+k)
		for j := range cur {
			cur[j] = inf
		}
		if lo == 1 {
			cur[0] = i
		}
		rowMin := cur[0]
		for j := lo; j <= hi; j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			v := prev[j-1] + cost
			if prev[j]+1 < v {
				v = prev[j] + 1
			}
			if cur[j-1]+1 < v {
				v = cur[j-1] + 1
			}
			cur[j] = v
			rowMin = min(rowMin, v)
		}
		if rowMin > k {
			return false
		}
		prev, cur = cur, prev
	}
	return prev[len(b)] <= k
}

// crossReference looks for another server's or tool's name among the words
// of lowercased text.
func (s *session) crossReference(lower string) (word, name string, found bool) {
	if len(s.others.exact) == 0 {
		return "", "", false
	}
	for start, i := -1, 0; i <= len(lower); {
		r, size := rune(0), 1
		if i < len(lower) {
			r, size = utf8.DecodeRuneInString(lower[i:])
		}
		if i < len(lower) && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-' || r == '.') {
			if start < 0 {
				start = i
			}
			i += size
			continue
		}
		if start >= 0 {
			if w := strings.Trim(lower[start:i], ".-"); w != "" {
				m, cached := s.words[w]
				if !cached {
					m = s.others.lookup(w, false)
					s.words[w] = m
				}
				if m != "" {
					return w, m, true
				}
			}
			start = -1
		}
		i += size
	}
	return "", "", false
}

// nameCollisions compares a tool's own name with every other name.
func (s *session) nameCollisions(name string) []hit {
	n := strings.ToLower(name)
	m := s.all.lookup(n, true)
	switch m {
	case "":
		return nil
	case n:
		return []hit{{CodeNameCollision, fmt.Sprintf("name %s is also a name of another server or tool", excerpt(name))}}
	default:
		return []hit{{CodeNameCollision, fmt.Sprintf("name %s looks like %s, a name of another server or tool", excerpt(name), excerpt(m))}}
	}
}
