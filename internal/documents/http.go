package documents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// HTTP resolves references through a platform's own document service: one GET per
// reference, to the URL template with {tenant} and {id} filled in (path-escaped), with the
// bearer token read from TokenFile (read again on every request, so a rotated token takes
// effect without a restart). 200 is the document; 404, 403 and 410 mean the tenant has no
// such document; anything else, a redirect included (it is not followed: the token must not
// travel to another host), is a service that cannot answer. Every failure wraps
// ErrUnavailable and names neither the token nor the response body.
type HTTP struct {
	template  string
	tokenFile string
	client    *http.Client
}

// HTTPTimeout bounds one document request.
const HTTPTimeout = 10 * time.Second

// CheckURLTemplate checks a documents.url_template: an absolute http or https URL that
// names both {tenant} and {id}, so the service is asked for the run's tenant's document and
// a reference can never reach another tenant's.
func CheckURLTemplate(t string) error {
	if !strings.Contains(t, "{id}") || !strings.Contains(t, "{tenant}") {
		return errors.New("must contain {tenant} and {id}, e.g. https://docs.internal/api/{tenant}/{id}")
	}
	u, err := url.Parse(strings.NewReplacer("{tenant}", "t", "{id}", "d").Replace(t))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("must be an absolute http:// or https:// URL, e.g. https://docs.internal/api/{tenant}/{id}")
	}
	if u.User != nil {
		return errors.New("must not carry credentials: put the bearer token in documents.token_file")
	}
	return nil
}

// NewHTTP returns the resolver of a checked URL template; tokenFile may be empty (no
// Authorization header).
func NewHTTP(template, tokenFile string) (*HTTP, error) {
	if err := CheckURLTemplate(template); err != nil {
		return nil, fmt.Errorf("documents: url_template %s", err)
	}
	return &HTTP{template: template, tokenFile: tokenFile, client: &http.Client{
		Timeout:       HTTPTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// Document implements Resolver.
func (h *HTTP) Document(ctx context.Context, tenant, id string, limit int64) ([]byte, error) {
	u := strings.NewReplacer("{tenant}", url.PathEscape(tenant), "{id}", url.PathEscape(id)).Replace(h.template)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: the document service's URL cannot be built: %v", ErrUnavailable, err)
	}
	if h.tokenFile != "" {
		token, err := os.ReadFile(h.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("%w: the document service's token cannot be read (documents.token_file): %v", ErrUnavailable, err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: the document service could not be reached: %v", ErrUnavailable, redactURL(err))
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusGone:
		return nil, fmt.Errorf("%w: this tenant has no document %q", ErrUnavailable, id)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%w: the document service answered %d for document %q", ErrUnavailable, resp.StatusCode, id)
	case resp.ContentLength > limit:
		return nil, tooLarge(id, resp.ContentLength, limit)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading document %q from the document service: %v", ErrUnavailable, id, redactURL(err))
	}
	if int64(len(body)) > limit {
		return nil, tooLarge(id, -1, limit)
	}
	return body, nil
}

func tooLarge(id string, size, limit int64) error {
	if size < 0 {
		return fmt.Errorf("%w: document %q is larger than the %d bytes this call may still receive", ErrUnavailable, id, limit)
	}
	return fmt.Errorf("%w: document %q is %d bytes, more than the %d this call may still receive", ErrUnavailable, id, size, limit)
}

// redactURL keeps a transport error's cause and drops the URL it names (a query string may
// carry a signature).
func redactURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
