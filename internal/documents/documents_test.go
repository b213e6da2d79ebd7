package documents

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRefs(t *testing.T) {
	args := map[string]any{
		"b":    "my-documents://doc-2",
		"a":    []any{"my-documents://doc-1", map[string]any{"deep": "my-documents://doc-2"}},
		"text": "see my-documents://doc-3 inline", // not a reference: the whole string is one
		"n":    1,
	}
	ids, err := Refs(args)
	require.NoError(t, err)
	require.Equal(t, []string{"doc-1", "doc-2"}, ids, "distinct, keys in order")

	_, err = Refs(map[string]any{"x": "my-documents://../etc/passwd"})
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "not a document reference")
	_, err = Refs(map[string]any{"x": "my-documents://"})
	require.ErrorIs(t, err, ErrUnavailable)

	many := make([]any, MaxRefs+1)
	for i := range many {
		many[i] = Scheme + "doc-" + strings.Repeat("x", i+1)
	}
	_, err = Refs(map[string]any{"x": many})
	require.ErrorContains(t, err, "more than 32 documents")
}

func TestSubstitute(t *testing.T) {
	args := map[string]any{"file": "my-documents://doc-1", "list": []any{"my-documents://doc-1", "my-documents://other"}, "n": 2.0}
	got := Substitute(args, map[string][]byte{"doc-1": []byte("hello")})
	enc := base64.StdEncoding.EncodeToString([]byte("hello"))
	require.Equal(t, map[string]any{"file": enc, "list": []any{enc, "my-documents://other"}, "n": 2.0}, got)
	require.Equal(t, "my-documents://doc-1", args["file"], "the arguments as written are not changed")
}

func TestCheckURLTemplate(t *testing.T) {
	require.NoError(t, CheckURLTemplate("https://docs.internal/api/{tenant}/{id}"))
	require.NoError(t, CheckURLTemplate("http://127.0.0.1:9000/d?tenant={tenant}&id={id}"))
	for _, bad := range []string{"https://docs.internal/api/{id}", "docs.internal/{tenant}/{id}", "ftp://x/{tenant}/{id}", "https://u:p@x/{tenant}/{id}"} {
		require.Error(t, CheckURLTemplate(bad), bad)
	}
}

// TestHTTP: one authenticated GET per reference to the template's URL; every failure is
// ErrUnavailable, and neither the token nor a redirect's target is followed or told.
func TestHTTP(t *testing.T) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.EscapedPath()+" "+r.Header.Get("Authorization"))
		switch r.URL.Path {
		case "/t/acme/doc-1":
			_, _ = w.Write([]byte("content"))
		case "/t/acme/big":
			_, _ = w.Write([]byte(strings.Repeat("x", 100)))
		case "/t/acme/moved":
			http.Redirect(w, r, "http://elsewhere.invalid/steal", http.StatusFound)
		case "/t/acme/broken":
			http.Error(w, "the token is s3cret", http.StatusInternalServerError)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte("s3cret\n"), 0o600))
	h, err := NewHTTP(srv.URL+"/t/{tenant}/{id}", token)
	require.NoError(t, err)
	ctx := context.Background()

	got, err := h.Document(ctx, "acme", "doc-1", 1<<20)
	require.NoError(t, err)
	require.Equal(t, "content", string(got))
	require.Equal(t, "GET /t/acme/doc-1 Bearer s3cret", seen[0])

	for id, want := range map[string]string{
		"doc-2":  `this tenant has no document "doc-2"`,
		"big":    "more than the 10 this call may still receive",
		"moved":  "answered 302",
		"broken": "answered 500",
	} {
		_, err := h.Document(ctx, "acme", id, 10)
		require.ErrorIs(t, err, ErrUnavailable, id)
		require.ErrorContains(t, err, want, id)
		require.NotContains(t, err.Error(), "s3cret", id)
	}
	_, err = h.Document(ctx, "globex", "doc-1", 1<<20)
	require.ErrorContains(t, err, "no document", "the tenant is part of the URL")

	require.NoError(t, os.Remove(token))
	_, err = h.Document(ctx, "acme", "doc-1", 1<<20)
	require.ErrorContains(t, err, "documents.token_file")
}
