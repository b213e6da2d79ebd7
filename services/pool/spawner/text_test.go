package spawner

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSafeText: server-chosen text is masked, stripped, bounded and escaped, in that order, so
// no step can bring back what an earlier one removed.
func TestSafeText(t *testing.T) {
	const secret = "s3cr3t-value-42"
	secrets := []string{secret}
	tests := []struct {
		name, in, want string
		n              int
	}{
		{name: "markup escaped", in: "<script>alert(1)</script>", want: "&lt;script&gt;alert(1)&lt;/script&gt;", n: 100},
		{name: "role marker and hidden characters removed", in: "a __system__ b\u200b\u202ec<|im_start|>", want: "a  bc", n: 100},
		{name: "secret masked", in: "token=" + secret, want: "token=" + Mask, n: 100},
		{name: "an invisible character does not shield a secret", in: "token=s3cr3t-\u200bvalue-42", want: "token=" + Mask, n: 100},
		{name: "a role marker does not shield a secret", in: "token=s3cr3t-__system__value-42", want: "token=" + Mask, n: 100},
		{name: "bounded before escaping", in: strings.Repeat("x", 50), want: strings.Repeat("x", 10) + "…", n: 10},
		{name: "a cut never shows part of a secret", in: "abc" + secret, want: "abc" + Mask[:7] + "…", n: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, safeText(tt.in, secrets, tt.n))
		})
	}
}
