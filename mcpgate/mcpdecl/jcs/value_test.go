package jcs

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// decodeBoth decodes in as encoding/json does, with float64 numbers and with json.Number.
func decodeBoth(t testing.TB, in string) (floats, numbers any) {
	require.NoError(t, json.Unmarshal([]byte(in), &floats))
	d := json.NewDecoder(strings.NewReader(in))
	d.UseNumber()
	require.NoError(t, d.Decode(&numbers))
	return floats, numbers
}

func TestAppendValueWritesWhatCanonicalizeWrites(t *testing.T) {
	for _, in := range []string{
		// RFC 8785 section 3.2.2.3 and 3.2.3's examples.
		`{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
		  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/", "literals": [null, true, false]}`,
		`{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh", "1": "One",
		  "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"}`,
		`{"content":[{"type":"text","text":"a\u2028b <i>x</i>"}],"isError":false,"structuredContent":{"n":-0,"big":12345678901234567890,"e":1e21}}`,
		`[]`, `{}`, `"x"`, `0`, `null`, `[{"b":[{"d":1,"c":2}],"a":{}}]`,
		strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth),
	} {
		want, err := Canonicalize([]byte(in))
		require.NoError(t, err)
		floats, numbers := decodeBoth(t, in)
		for _, v := range []any{floats, numbers} {
			got, err := AppendValue([]byte("prefix"), v)
			require.NoError(t, err, in)
			require.Equal(t, "prefix"+string(want), string(got), in)
		}
	}
}

func TestAppendValueTakesAListOfObjects(t *testing.T) {
	v := map[string]any{"content": []map[string]any{{"type": "text", "text": "hi"}}, "isError": true}
	got, err := AppendValue(nil, v)
	require.NoError(t, err)
	require.Equal(t, `{"content":[{"text":"hi","type":"text"}],"isError":true}`, string(got))
	got, err = AppendValue(nil, map[string]any{"m": map[string]any(nil)})
	require.NoError(t, err)
	require.Equal(t, `{"m":null}`, string(got), "a nil map is null, as encoding/json writes it")
}

func TestAppendValueRefuses(t *testing.T) {
	deep := any("x")
	for range MaxDepth + 1 {
		deep = []any{deep}
	}
	for _, tt := range []struct {
		name string
		v    any
		want error
	}{
		{"NaN", map[string]any{"n": math.NaN()}, ErrNumber},
		{"infinity", []any{math.Inf(1)}, ErrNumber},
		{"invalid UTF-8 string", []any{"a\xffb"}, ErrInvalidUTF8},
		{"invalid UTF-8 key", map[string]any{"k\xff": 1.0}, ErrInvalidUTF8},
		{"json.Number not JSON", json.Number("0x10"), ErrSyntax},
		{"json.Number with trailing data", json.Number("1 2"), ErrSyntax},
		{"json.Number overflowing", json.Number("1e400"), ErrNumber},
		{"Go int", map[string]any{"n": 1}, ErrType},
		{"[]string", []any{[]string{"a"}}, ErrType},
		{"too deep", deep, ErrTooDeep},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AppendValue(nil, tt.v)
			require.ErrorIs(t, err, tt.want)
			require.Nil(t, got)
			var e *Error
			require.True(t, errors.As(err, &e))
		})
	}
}

func FuzzAppendValue(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[1,2.5,-0,1e300,"x\u0000"]}`,
		`{"\u20ac":1,"\ud83d\ude00":2,"\ufb33":3}`,
		`[333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001]`,
		`"\u2028\/\""`, `null`, `{"a":{"a":{"a":[]}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		want, err := Canonicalize(in)
		if err != nil {
			return
		}
		floats, numbers := decodeBoth(t, string(in))
		for _, v := range []any{floats, numbers} {
			got, err := AppendValue(nil, v)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "AppendValue %s, Canonicalize %s", got, want)
		}
	})
}

func BenchmarkAppendValue(b *testing.B) {
	var v any
	in := `{"type":"object","properties":{"path":{"type":"string","description":"Path of the file to read, relative to an allowed root"},"encoding":{"type":"string","enum":["utf-8","latin1","base64"],"default":"utf-8"},"offset":{"type":"integer","minimum":0},"limit":{"type":"integer","minimum":1,"maximum":1048576}},"required":["path"],"additionalProperties":false}`
	require.NoError(b, json.Unmarshal([]byte(in), &v))
	b.SetBytes(int64(len(in)))
	buf := make([]byte, 0, 1024)
	for b.Loop() {
		if _, err := AppendValue(buf[:0], v); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzAppendString: AppendString writes what Canonicalize writes for the string's JSON
// encoding, and refuses what is not valid UTF-8.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "a\"b\\c\x00\x1f\x7f", "\u2028€😀\ufb33", "tab\there\nnl", "bad\xffbyte", "\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := AppendString([]byte("x"), s)
		if !utf8.ValidString(s) {
			require.ErrorIs(t, err, ErrInvalidUTF8)
			return
		}
		require.NoError(t, err)
		encoded, err := json.Marshal(s)
		require.NoError(t, err)
		want, err := Canonicalize(encoded)
		require.NoError(t, err)
		require.Equal(t, "x"+string(want), string(got))
	})
}

func BenchmarkAppendString(b *testing.B) {
	s := strings.Repeat("lorem ipsum dolor sit amet, \"quoted\"\n", 2000)
	b.SetBytes(int64(len(s)))
	buf := make([]byte, 0, 2*len(s))
	for b.Loop() {
		if _, err := AppendString(buf[:0], s); err != nil {
			b.Fatal(err)
		}
	}
}
