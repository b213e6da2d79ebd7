package jcs

import (
	"math"
	"strconv"
)

// FormatNumber renders f the way ECMAScript's Number::toString does (ECMA-262,
// Number::toString with radix 10), which is what RFC 8785 section 3.2.2.3
// requires. NaN and the infinities have no JSON form and are refused.
func FormatNumber(f float64) (string, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", ErrNumber
	}
	return string(appendNumber(nil, f)), nil
}

// appendNumber appends the ECMAScript form of f; the caller has already
// refused NaN and the infinities.
func appendNumber(dst []byte, f float64) []byte {
	if f == 0 {
		// Covers -0 too: ECMAScript prints both zeros as "0".
		return append(dst, '0')
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	if f < 1<<53 && f == math.Trunc(f) {
		// An integer every one of whose neighbours is a double too: its own digits are the
		// shortest that round-trip, and ECMAScript prints them without an exponent.
		return strconv.AppendUint(dst, uint64(f), 10)
	}
	// strconv's shortest formatting yields the fewest digits that round-trip
	// and, among those, the closest to f: the same s and k that ECMAScript
	// specifies. Only the layout differs, so we re-lay it out below.
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	// e looks like "d.ddde+XX" or "de-XX".
	var digits [24]byte
	k := 0
	i := 0
	for ; i < len(e) && e[i] != 'e'; i++ {
		if e[i] != '.' {
			digits[k] = e[i]
			k++
		}
	}
	exp, _ := strconv.Atoi(string(e[i+1:])) // strconv produced it; it parses
	n := exp + 1                            // the decimal point sits after n digits
	ds := digits[:k]
	switch {
	case k <= n && n <= 21:
		dst = append(dst, ds...)
		for j := 0; j < n-k; j++ {
			dst = append(dst, '0')
		}
	case 0 < n && n <= 21:
		dst = append(dst, ds[:n]...)
		dst = append(dst, '.')
		dst = append(dst, ds[n:]...)
	case -6 < n && n <= 0:
		dst = append(dst, '0', '.')
		for j := 0; j < -n; j++ {
			dst = append(dst, '0')
		}
		dst = append(dst, ds...)
	default:
		dst = append(dst, ds[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, ds[1:]...)
		}
		dst = append(dst, 'e')
		if n-1 >= 0 {
			dst = append(dst, '+')
		} else {
			dst = append(dst, '-')
		}
		x := n - 1
		if x < 0 {
			x = -x
		}
		dst = strconv.AppendInt(dst, int64(x), 10)
	}
	return dst
}
