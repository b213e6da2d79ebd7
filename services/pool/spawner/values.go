package spawner

import "bytes"

// maxMessageValues bounds the JSON values in one message a stdio server sends (every object,
// array, string, number and literal, an object's keys included), checked on the raw message
// before the SDK decodes it. The byte bound alone lets a 16 MiB message carry some 8 million
// values ({"a":[1,1,…]}), and the pool pays for every value several times over: the SDK decodes
// it, the output-schema check encodes and decodes it again, then sanitization and the proto
// form copy it. Measured through the pool (services/pool, a warm session, structured content of
// n numbers, n from 100,000 to 2 million), one value costs 70 to 100 bytes of peak heap and
// about 200 bytes allocated, so one call of 7.5 million values peaked at some 630 MiB. At this
// bound a result peaks at about 20 MiB (16 to 24 MiB measured), near what a message at the byte
// bound takes in bytes, and it still holds a table of 25,000 rows of ten columns. A message
// refused by it costs only its bytes (the 7.5 million values: 68 MiB peak, refused in 2.5 s).
const maxMessageValues = 250_000

// jsonValues counts the values in b, a valid JSON text (the SDK decoded the message around
// it), as maxMessageValues counts them, stopping once the count passes limit. It allocates
// nothing: it looks only at the bytes that start a value, and skips strings whole.
func jsonValues(b []byte, limit int) int {
	n := 0
	for i := 0; i < len(b) && n <= limit; i++ {
		switch c := b[i]; {
		case c == '"':
			n++
			i = closingQuote(b, i+1)
		case c == '{' || c == '[':
			n++
		case c == '-' || c >= '0' && c <= '9' || c == 't' || c == 'f' || c == 'n':
			n++
			for i+1 < len(b) && inLiteral(b[i+1]) {
				i++
			}
		}
	}
	return n
}

// closingQuote is the index of the quote that ends the string whose contents start at i (or
// len(b) when there is none).
func closingQuote(b []byte, i int) int {
	for {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return len(b)
		}
		i += j
		// An odd run of backslashes before it escapes it. The run cannot reach past the
		// string's opening quote.
		k := i
		for b[k-1] == '\\' {
			k--
		}
		if (i-k)%2 == 0 {
			return i
		}
		i++
	}
}

// inLiteral reports whether c may continue a number or a literal (true, false, null).
func inLiteral(c byte) bool {
	switch c {
	case ',', ':', ']', '}', ' ', '\t', '\r', '\n':
		return false
	}
	return true
}
