package mcpserver

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/fielderr"
)

const urlCanary = "canary-url-5b2e"

func TestMaskURL(t *testing.T) {
	m := SecretMask
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"https://mcp.example.com/mcp", "https://mcp.example.com/mcp"},
		{"https://mcp.example.com:8443/a/b", "https://mcp.example.com:8443/a/b"},
		{"https://mcp.example.com/mcp?api_key=" + urlCanary, "https://mcp.example.com/mcp?api_key=" + m},
		{"https://h/p?a=1&b=" + urlCanary + "&c=", "https://h/p?a=" + m + "&b=" + m + "&c=" + m},
		{"https://h/p?" + urlCanary, "https://h/p?" + m},
		{"https://h/p?a=1&" + urlCanary, "https://h/p?a=" + m + "&" + m},
		{"https://h/p?a=x=" + urlCanary, "https://h/p?a=" + m},
		{"https://h/p?a=1;b=" + urlCanary, "https://h/p?a=" + m},
		{"https://h/p?a=1&&b=2", "https://h/p?a=" + m + "&&b=" + m},
		{"https://h/p?", "https://h/p?"},
		{"https://h/p?=" + urlCanary, "https://h/p?=" + m},
		{"https://user:" + urlCanary + "@h/p", "https://" + m + "@h/p"},
		// A password holding "/", "?" or "#" is masked whole, not cut where the path, query
		// or fragment would start.
		{"https://svc:Zm9v/" + urlCanary + "@mcp.example.com/mcp", "https://" + m + "@mcp.example.com/mcp"},
		{"https://svc:pa55?" + urlCanary + "@mcp.example.com/mcp?k=v", "https://" + m + "@mcp.example.com/mcp?k=" + m},
		{"https://svc:pa55#" + urlCanary + "@mcp.example.com/mcp", "https://" + m + "@mcp.example.com/mcp"},
		{"svc:" + urlCanary + "@mcp.example.com", m + "@mcp.example.com"},
		{"https://h/p#" + urlCanary, "https://h/p#" + m},
		{"https://h/p?k=v#" + urlCanary, "https://h/p?k=" + m + "#" + m},
		{"not a url ?token=" + urlCanary, "not a url ?token=" + m},
		{"%zz://h/?k=" + urlCanary, "%zz://h/?k=" + m},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got := MaskURL(tc.in)
			require.Equal(t, tc.want, got)
			require.NotContains(t, got, urlCanary)
			require.Equal(t, got, MaskURL(got), "masking is idempotent")
		})
	}
}

func TestRestoreMaskedURL(t *testing.T) {
	stored := "https://mcp.example.com/mcp?api_key=" + urlCanary + "&region=eu"
	masked := MaskURL(stored)
	for _, tc := range []struct {
		name, sent, stored, want, problem string
	}{
		{name: "a URL without the mask is kept as sent", sent: "https://other.example.com/mcp?k=v", stored: stored, want: "https://other.example.com/mcp?k=v"},
		{name: "the masked form keeps the stored URL", sent: masked, stored: stored, want: stored},
		{name: "a changed host with the mask left in is refused", sent: strings.Replace(masked, "mcp.example.com", "evil.example.com", 1), stored: stored,
			problem: "differs from the stored URL"},
		{name: "a changed key with the mask left in is refused", sent: "https://mcp.example.com/mcp?api_key=" + SecretMask, stored: stored,
			problem: "differs from the stored URL"},
		{name: "a bare masked query part counts as a mask", sent: "https://mcp.example.com/mcp?" + SecretMask, stored: "",
			problem: "no URL is stored"},
		{name: "a mask with nothing stored is refused", sent: masked, stored: "", problem: "no URL is stored"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RestoreMaskedURL("url", tc.sent, tc.stored)
			if tc.problem != "" {
				fe, ok := fielderr.As(err)
				require.True(t, ok, "%v", err)
				require.Equal(t, "url", fe.Field)
				require.Contains(t, fe.Problem, tc.problem)
				require.NotContains(t, fe.Problem, urlCanary)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestCheckURL(t *testing.T) {
	remote := func(u string) *Registration {
		return &Registration{Ref: "r", Transport: TransportStreamableHTTP, URL: u}
	}
	for _, tc := range []struct {
		url     string
		problem string // "" accepts
	}{
		{url: "https://mcp.example.com/mcp?api_key=" + urlCanary},
		{url: "http://localhost:8080/mcp"},
		{url: "http://127.0.0.1:8080/mcp?k=" + urlCanary},
		{url: "http://[::1]:8080/mcp"},
		{url: "http://mcp.example.com/mcp?api_key=" + urlCanary, problem: "must use https"},
		{url: "http://10.0.0.8/mcp", problem: "use https://10.0.0.8"},
		{url: "ftp://mcp.example.com/?k=" + urlCanary, problem: "use https"},
		{url: "mcp.example.com/mcp?k=" + urlCanary, problem: "not an absolute https URL"},
		{url: "https://%zz/?k=" + urlCanary, problem: "not an absolute https URL"},
		{url: "https://user:" + urlCanary + "@mcp.example.com/mcp", problem: `must not contain "@"`},
		// Passwords that hold "/", "?" or "#": they parse as a host and a path, query or
		// fragment, and were refused quoting their start, or stored whole.
		{url: "https://svc:Zm9v/" + urlCanary + "@mcp.example.com/mcp", problem: `must not contain "@"`},
		{url: "https://svc:4711/" + urlCanary + "@mcp.example.com/mcp", problem: `must not contain "@"`},
		{url: "https://svc:4711?" + urlCanary + "@mcp.example.com/mcp", problem: `must not contain "@"`},
		{url: "https://svc:pa55#" + urlCanary + "@mcp.example.com/mcp", problem: `must not contain "@"`},
		{url: "https://mcp.example.com/mcp?email=a@example.com", problem: "%40"},
		{url: "https://mcp.example.com/mcp#" + urlCanary, problem: "must not have a fragment"},
		{url: "https://mcp.example.com/mcp?k=v#", problem: "must not have a fragment"},
		{url: "https://mcp.example.com/mcp?k=" + urlCanary + "\n", problem: "control character"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			err := remote(tc.url).Validate(nil)
			if tc.problem == "" {
				require.NoError(t, err)
				return
			}
			fe, ok := fielderr.As(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, "url", fe.Field)
			require.Contains(t, fe.Problem, tc.problem)
			require.NotContains(t, err.Error(), urlCanary, "the problem quotes the URL's credential")
		})
	}
}

// A URL at the length limit made of short query values masks to a longer text; sent back, it
// must still be taken (and then stand for the stored URL), while an unmasked URL that long
// is refused.
func TestAMaskedURLMayBeLongerThanTheLimit(t *testing.T) {
	base := "https://mcp.example.com/mcp?"
	u := base + strings.Repeat("a&", (MaxURL-len(base))/2)
	require.LessOrEqual(t, len(u), MaxURL)
	masked := MaskURL(u)
	require.Greater(t, len(masked), MaxURL)
	reg := &Registration{Ref: "r", Transport: TransportStreamableHTTP, URL: masked}
	require.NoError(t, reg.Validate(nil))
	got, err := RestoreMaskedURL("url", masked, u)
	require.NoError(t, err)
	require.Equal(t, u, got)

	reg.URL = base + strings.Repeat("a", MaxURL)
	fe, ok := fielderr.As(reg.Validate(nil))
	require.True(t, ok)
	require.Contains(t, fe.Problem, "is longer than")
}
