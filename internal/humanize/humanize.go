// Package humanize renders things for the messages people read: lists of names that stay
// short, sizes, text cut short, and the distance behind a "did you mean".
package humanize

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// List joins items with commas, naming at most the first most of them and how many more;
// empty is what an empty list reads as (e.g. "none").
func List(items []string, most int, empty string) string {
	switch {
	case len(items) == 0:
		return empty
	case len(items) > most:
		return strings.Join(items[:most], ", ") + fmt.Sprintf(", and %d more", len(items)-most)
	}
	return strings.Join(items, ", ")
}

// Bytes renders a size: in MiB or KiB when it is a whole number of them, else in bytes.
func Bytes(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// Cut is s when it is at most n bytes; else the longest start of s that ends at a character
// boundary and leaves room for mark within n bytes, followed by mark ("…", "...", or "" to cut
// without a mark). An n shorter than mark gives the mark alone.
func Cut(s string, n int, mark string) string {
	if len(s) <= n {
		return s
	}
	cut := max(n-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// EditDistance is the Levenshtein distance between a and b, over bytes (keys, capability
// and tool names are ASCII).
func EditDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
