package runeclass

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOf(t *testing.T) {
	tests := []struct {
		r    rune
		want Kind
	}{
		{'a', Visible}, {' ', Visible}, {'~', Visible}, {'\u00e9', Visible}, {'\u4e2d', Visible},
		{'\U0001F600', Visible}, {'\u0430', Visible}, {'\u00a0', Visible},
		{'\n', Control}, {'\t', Control}, {'\r', Control}, {0, Control}, {0x1B, Control}, {0x7F, Control}, {0x85, Control}, {0x9F, Control},
		{0x2028, LineBreak}, {0x2029, LineBreak},
		{0x202A, Bidi}, {0x202E, Bidi}, {0x2066, Bidi}, {0x2069, Bidi}, {0x200E, Bidi}, {0x200F, Bidi}, {0x061C, Bidi},
		{0xE0000, Tag}, {0xE0001, Tag}, {0xE0041, Tag}, {0xE007F, Tag},
		{0x200B, Invisible}, {0x200C, Invisible}, {0x200D, Invisible}, {0x2060, Invisible}, {0x2064, Invisible},
		{0xFEFF, Invisible}, {0x00AD, Invisible}, {0xFE0F, Invisible}, {0xE0100, Invisible}, {0xE01EF, Invisible},
		{0x034F, Invisible}, {0x115F, Invisible}, {0x3164, Invisible}, {0x180E, Invisible}, {0x206A, Invisible}, {0xFFF9, Invisible},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("U+%04X", tt.r), func(t *testing.T) {
			require.Equal(t, tt.want, Of(tt.r))
		})
	}
}

func TestHidden(t *testing.T) {
	require.False(t, Hidden('\n'))
	require.False(t, Hidden('\t'))
	require.False(t, Hidden('x'))
	require.True(t, Hidden('\r'))
	require.True(t, Hidden(0x200B))
	require.True(t, Hidden(0x2028))
}

func TestTagASCII(t *testing.T) {
	require.Equal(t, byte('A'), TagASCII(0xE0041))
	require.Equal(t, byte(' '), TagASCII(0xE0020))
	require.Equal(t, byte('~'), TagASCII(0xE007E))
	require.Equal(t, byte(0), TagASCII(0xE0001))
	require.Equal(t, byte(0), TagASCII(0xE007F))
	require.Equal(t, byte(0), TagASCII('A'))
}

func TestFold(t *testing.T) {
	for in, want := range map[rune]rune{
		'A': 'a', 'z': 'z', '_': '_', '\uff3f': '_', '\ufe4f': '_', '\uff5c': '|', '\uff1c': '<', '\uff1e': '>',
		'\uff33': 's', '\uff53': 's', '\ufe64': '<', '\ufe65': '>', '\uff3b': '[', '\u0430': '\u0430',
	} {
		require.Equal(t, want, Fold(in), "U+%04X", in)
	}
}
