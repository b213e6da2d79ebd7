package jcs

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The expected outputs below are transcribed from the text of RFC 8785.

func TestCanonicalizeRFC8785Section3223(t *testing.T) {
	// RFC 8785 section 3.2.2.3 ("Serialization of Numbers" example input and
	// the canonical output printed after it).
	in := `{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
	want := `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`
	got, err := Canonicalize([]byte(in))
	require.NoError(t, err)
	require.Equal(t, want, string(got))
}

func TestCanonicalizeRFC8785Section323Sorting(t *testing.T) {
	// RFC 8785 section 3.2.3 ("Sorting of Object Properties").
	in := `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`
	want := "{" +
		`"\r":"Carriage Return",` +
		`"1":"One",` +
		"\"\u0080\":\"Control\"," +
		"\"\u00f6\":\"Latin Small Letter O With Diaeresis\"," +
		"\"\u20ac\":\"Euro Sign\"," +
		"\"\U0001F600\":\"Emoji: Grinning Face\"," +
		"\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"" +
		"}"
	got, err := Canonicalize([]byte(in))
	require.NoError(t, err)
	require.Equal(t, want, string(got))
}

func TestFormatNumberRFC8785AppendixB(t *testing.T) {
	// RFC 8785 appendix B: IEEE 754 bit patterns and their serializations.
	tests := []struct {
		bits string
		want string
	}{
		{"0000000000000000", "0"},
		{"8000000000000000", "0"},
		{"0000000000000001", "5e-324"},
		{"8000000000000001", "-5e-324"},
		{"7fefffffffffffff", "1.7976931348623157e+308"},
		{"ffefffffffffffff", "-1.7976931348623157e+308"},
		{"4340000000000000", "9007199254740992"},
		{"c340000000000000", "-9007199254740992"},
		{"4430000000000000", "295147905179352830000"},
		{"44b52d02c7e14af5", "9.999999999999997e+22"},
		{"44b52d02c7e14af6", "1e+23"},
		{"44b52d02c7e14af7", "1.0000000000000001e+23"},
		{"444b1ae4d6e2ef4e", "999999999999999700000"},
		{"444b1ae4d6e2ef4f", "999999999999999900000"},
		{"444b1ae4d6e2ef50", "1e+21"},
		{"3eb0c6f7a0b5ed8c", "9.999999999999997e-7"},
		{"3eb0c6f7a0b5ed8d", "0.000001"},
		{"41b3de4355555553", "333333333.3333332"},
		{"41b3de4355555554", "333333333.33333325"},
		{"41b3de4355555555", "333333333.3333333"},
		{"41b3de4355555556", "333333333.3333334"},
		{"41b3de4355555557", "333333333.33333343"},
		{"becbf647612f3696", "-0.0000033333333333333333"},
		{"43143ff3c1cb0959", "1424953923781206.2"},
	}
	for _, tt := range tests {
		t.Run(tt.bits, func(t *testing.T) {
			b, err := hex.DecodeString(tt.bits)
			require.NoError(t, err)
			f := math.Float64frombits(binary.BigEndian.Uint64(b))
			got, err := FormatNumber(f)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
	for _, bits := range []string{"7fffffffffffffff", "7ff0000000000000", "fff0000000000000"} {
		t.Run(bits, func(t *testing.T) {
			b, err := hex.DecodeString(bits)
			require.NoError(t, err)
			_, err = FormatNumber(math.Float64frombits(binary.BigEndian.Uint64(b)))
			require.ErrorIs(t, err, ErrNumber)
		})
	}
}

func TestCanonicalizeNumbers(t *testing.T) {
	tests := []struct{ in, want string }{
		{"0", "0"},
		{"-0", "0"},
		{"-0.0e-5", "0"},
		{"1", "1"},
		{"1.0", "1"},
		{"10", "10"},
		{"1e2", "100"},
		{"1E+2", "100"},
		{"123456789012345678901", "123456789012345680000"},
		{"1e20", "100000000000000000000"},
		{"1e21", "1e+21"},
		{"1.5e21", "1.5e+21"},
		{"0.1", "0.1"},
		{"1e-6", "0.000001"},
		{"1e-7", "1e-7"},
		{"1.25e-7", "1.25e-7"},
		{"-1.5", "-1.5"},
		{"1e-400", "0"}, // underflows to zero, as in ECMAScript
		{"0.30000000000000004", "0.30000000000000004"},
		{"9007199254740993", "9007199254740992"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Canonicalize([]byte(tt.in))
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}
}

func TestCanonicalizeStrings(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"short escapes", `"\b\f\n\r\t"`, `"\b\f\n\r\t"`},
		{"other controls lowercase hex", `"\u0000\u001F\u000B"`, `"\u0000\u001f\u000b"`},
		{"solidus unescaped", `"\/"`, `"/"`},
		{"DEL and C1 raw", `"\u007f\u0085"`, "\"\u007f\u0085\""},
		{"line separators raw", `"\u2028\u2029"`, "\"\u2028\u2029\""},
		{"surrogate pair", `"\uD83D\uDE00"`, "\"\U0001F600\""},
		{"raw utf8 kept", "\"h\u00e9\U0001F600\"", "\"h\u00e9\U0001F600\""},
		{"quote and backslash", `"\"\\"`, `"\"\\"`},
		{"noncharacter kept", `"\uffff"`, "\"\uffff\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(tt.in))
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}
}

func TestCanonicalizeStructure(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"whitespace removed", " { \"b\" : [ 1 , 2 ] ,\n\t\"a\" : { } } ", `{"a":{},"b":[1,2]}`},
		{"nested sorting", `{"z":{"y":1,"x":2},"a":[{"d":1,"c":2}]}`, `{"a":[{"c":2,"d":1}],"z":{"x":2,"y":1}}`},
		{"keys compared unescaped", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{"prefix sorts first", `{"ab":1,"a":2}`, `{"a":2,"ab":1}`},
		{"empty key", `{"a":1,"":2}`, `{"":2,"a":1}`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"empty array", `[ ]`, `[]`},
		{"supplementary before BMP private use", "{\"\ue000\":1,\"\U00010000\":2}", "{\"\U00010000\":2,\"\ue000\":1}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(tt.in))
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
		})
	}
}

func TestCanonicalizeRefuses(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"empty", ``, ErrSyntax},
		{"trailing data", `{} {}`, ErrSyntax},
		{"trailing comma", `[1,]`, ErrSyntax},
		{"object trailing comma", `{"a":1,}`, ErrSyntax},
		{"leading zero", `01`, ErrSyntax},
		{"plus sign", `+1`, ErrSyntax},
		{"bare fraction", `.5`, ErrSyntax},
		{"empty fraction", `1.`, ErrSyntax},
		{"empty exponent", `1e`, ErrSyntax},
		{"hex number", `0x10`, ErrSyntax},
		{"NaN literal", `NaN`, ErrSyntax},
		{"single quotes", `'a'`, ErrSyntax},
		{"raw control in string", "\"a\x01\"", ErrSyntax},
		{"raw newline in string", "\"a\nb\"", ErrSyntax},
		{"bad escape", `"\x41"`, ErrSyntax},
		{"short unicode escape", `"\u12"`, ErrSyntax},
		{"unterminated string", `"abc`, ErrSyntax},
		{"byte order mark", "\ufeff{}", ErrSyntax},
		{"unquoted key", `{a:1}`, ErrSyntax},
		{"truncated literal", `tru`, ErrSyntax},
		{"comment", `{} // x`, ErrSyntax},
		{"overflow", `1e309`, ErrNumber},
		{"negative overflow", `-1e400`, ErrNumber},
		{"invalid utf8", "\"\xff\"", ErrInvalidUTF8},
		{"invalid utf8 in key", "{\"\xc3\x28\":1}", ErrInvalidUTF8},
		{"utf8 encoded surrogate", "\"\xed\xa0\x80\"", ErrInvalidUTF8},
		{"overlong encoding", "\"\xc0\xaf\"", ErrInvalidUTF8},
		{"lone high surrogate", `"\ud800"`, ErrInvalidUTF8},
		{"lone high surrogate then text", `"\ud800abc"`, ErrInvalidUTF8},
		{"high surrogate then non-low", `"\ud800\u0041"`, ErrInvalidUTF8},
		{"lone low surrogate", `"\udc00"`, ErrInvalidUTF8},
		{"duplicate key", `{"a":1,"a":2}`, ErrDuplicateKey},
		{"duplicate key after unescape", `{"a":1,"\u0061":2}`, ErrDuplicateKey},
		{"duplicate key unsorted", `{"b":1,"a":2,"b":3}`, ErrDuplicateKey},
		{"nested duplicate", `[{"x":{"k":1,"k":1}}]`, ErrDuplicateKey},
		{"too deep arrays", strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), ErrTooDeep},
		{"too deep objects", strings.Repeat(`{"a":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1), ErrTooDeep},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(tt.in))
			require.ErrorIs(t, err, tt.want)
			require.Nil(t, got)
			var e *Error
			require.True(t, errors.As(err, &e))
			require.GreaterOrEqual(t, e.Offset, 0)
			require.LessOrEqual(t, e.Offset, len(tt.in))
		})
	}
}

func TestCanonicalizeDepthLimitIsInclusive(t *testing.T) {
	in := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	got, err := Canonicalize([]byte(in))
	require.NoError(t, err)
	require.Equal(t, in, string(got))
}

func TestErrorNeverQuotesInput(t *testing.T) {
	_, err := Canonicalize([]byte(`{"token":"sk-secret-value","token":"x"}`))
	require.ErrorIs(t, err, ErrDuplicateKey)
	require.NotContains(t, err.Error(), "sk-secret")
	require.NotContains(t, err.Error(), "token")
}

func TestCompareUTF16(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"", "a", -1},
		{"a", "b", -1},
		{"b", "a", 1},
		{"\uffff", "\U00010000", 1},      // 0xFFFF > 0xD800
		{"\ud7ff", "\U00010000", -1},     // 0xD7FF < 0xD800
		{"\U0001F600", "\U0001F601", -1}, // same high surrogate, low decides
		{"\U00010400", "\U0001F600", -1},
	}
	for _, tt := range tests {
		t.Run(tt.a+"|"+tt.b, func(t *testing.T) {
			require.Equal(t, tt.want, compareUTF16(tt.a, tt.b))
		})
	}
}

func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[1,2.5,-0,1e300,"x\u0000"]}`,
		`{"\u20ac":1,"\ud83d\ude00":2,"\ufb33":3}`,
		`[333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001]`,
		`"\u2028\/\""`, `null`, `{"a":{"a":{"a":[]}}}`, `{"a":1,"a":2}`, "\"\xff\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonicalize(in)
		if err != nil {
			require.Nil(t, out)
			return
		}
		require.True(t, json.Valid(in), "accepted input encoding/json calls invalid")
		again, err := Canonicalize(out)
		require.NoError(t, err)
		require.Equal(t, string(out), string(again), "canonical form is not a fixed point")

		var before, after any
		require.NoError(t, json.Unmarshal(in, &before))
		require.NoError(t, json.Unmarshal(out, &after))
		require.Equal(t, before, after, "canonical form decodes to a different value")
	})
}

func BenchmarkCanonicalize(b *testing.B) {
	in := []byte(`{"type":"object","properties":{"path":{"type":"string","description":"Path of the file to read, relative to an allowed root"},"encoding":{"type":"string","enum":["utf-8","latin1","base64"],"default":"utf-8"},"offset":{"type":"integer","minimum":0},"limit":{"type":"integer","minimum":1,"maximum":1048576}},"required":["path"],"additionalProperties":false}`)
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := Canonicalize(in); err != nil {
			b.Fatal(err)
		}
	}
}
