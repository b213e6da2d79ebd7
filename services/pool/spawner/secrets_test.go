package spawner

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSecretFormsAreMasked: a server's text is masked for each secret it was given in the
// forms a server is likely to print it in, not only as the exact value.
func TestSecretFormsAreMasked(t *testing.T) {
	const env = "s3cr3t+T0ken/Value=42"
	const bearer = "VICTIM_TOKEN_777"
	const query = "QUERYSECRET123"
	spec := &Spec{
		Env:     map[string]string{"APP_TOKEN": env, "APP_MODE": "dev"},
		Headers: map[string]string{"Authorization": "Bearer " + bearer, "X-Basic": "Basic " + base64.StdEncoding.EncodeToString([]byte("svc:basicpass99"))},
		URL:     "https://mcp.example.com/mcp?api_key=" + query + "&v=2",
	}
	secrets := secretsOf(spec)
	leaks := map[string]string{
		"exact":                    env,
		"Basic pair, any offset":   "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("svc:"+env)),
		"base64 at offset 1":       base64.StdEncoding.EncodeToString([]byte("x" + env + "y")),
		"base64 URL alphabet":      base64.URLEncoding.EncodeToString([]byte("ab" + env)),
		"percent-encoded":          "GET /api?token=" + url.QueryEscape(env),
		"path-escaped":             "/t/" + url.PathEscape(env),
		"JSON with escaped slash":  `{"token":"s3cr3t+T0ken\/Value=42"}`,
		"upper case":               strings.ToUpper(env),
		"lower case":               strings.ToLower(env),
		"a bearer token alone":     "token " + bearer + " is expired",
		"a Basic password decoded": "password basicpass99 rejected",
		"a URL query value":        "url /mcp?api_key=" + query,
	}
	for name, text := range leaks {
		t.Run(name, func(t *testing.T) {
			got := redactString(text, secrets)
			require.Contains(t, got, Mask)
			for _, s := range []string{env, bearer, query, "basicpass99", "T0ken", "VALUE=42"} {
				require.NotContains(t, strings.ToUpper(got), strings.ToUpper(s), "in %q", got)
			}
		})
	}
	t.Run("short values are masked only as they are", func(t *testing.T) {
		require.Equal(t, "mode "+Mask+", DEV, v=2", redactString("mode dev, DEV, v=2", secrets),
			"a short value has no derived forms, and a short query value is not a secret")
	})
}

// TestACutStdoutLineKeepsNoPartOfASecret: a non-JSON stdout line is cut to maxDivertedLine
// for the tail; a secret the cut splits is dropped whole, not left in part.
func TestACutStdoutLineKeepsNoPartOfASecret(t *testing.T) {
	const secret = "s3cr3t+T0ken/Value=42"
	for _, at := range []int{maxDivertedLine - 19, maxDivertedLine - 1, maxDivertedLine - len(secret)} {
		tl := newTail(1<<16, []string{secret})
		f, _ := newTestFilter(t, tl, 1<<20, 1<<20, nil, nil)
		_, err := f.Write([]byte(strings.Repeat("x", at) + secret + "\n"))
		require.NoError(t, err)
		got := tl.String()
		require.NotContains(t, got, "s3cr3t", "cut at %d: %q", at, got[max(len(got)-40, 0):])
		require.NotContains(t, got, "+T0k")
	}
}
