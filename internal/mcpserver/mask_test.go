package mcpserver

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/fielderr"
)

func TestRestoreMasked(t *testing.T) {
	stored := map[string]string{"TOKEN": "s3cret", "REGION": "eu"}
	for _, tc := range []struct {
		name      string
		values    map[string]string
		want      map[string]string
		wantField string
	}{
		{name: "nil stays nil", values: nil, want: nil},
		{name: "no mask is kept as sent", values: map[string]string{"TOKEN": "new"}, want: map[string]string{"TOKEN": "new"}},
		{name: "a mask keeps the stored value", values: map[string]string{"TOKEN": SecretMask, "REGION": "us"},
			want: map[string]string{"TOKEN": "s3cret", "REGION": "us"}},
		{name: "a mask with nothing stored is refused", values: map[string]string{"TOKEN": SecretMask, "OTHER": SecretMask, "ZED": SecretMask},
			wantField: "env.OTHER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := map[string]string(nil)
			if tc.values != nil {
				in = make(map[string]string, len(tc.values))
				for k, v := range tc.values {
					in[k] = v
				}
			}
			got, err := RestoreMasked("env", in, stored)
			require.Equal(t, tc.values, in, "the input is not modified")
			if tc.wantField != "" {
				fe, ok := fielderr.As(err)
				require.True(t, ok, "%v", err)
				require.Equal(t, tc.wantField, fe.Field, "the first masked key without a value, in key order")
				require.Contains(t, fe.Problem, "send the value itself")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	_, err := RestoreMasked("env", map[string]string{"TOKEN": SecretMask}, nil)
	require.Error(t, err, "nothing stored at all (a new registration)")
}
