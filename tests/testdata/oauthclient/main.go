// Command oauthclient is the client the official MCP conformance suite runs in its client-mode
// auth scenarios (conformance client --scenario auth/... --command oauthclient): the suite
// starts an MCP server that takes only its authorization server's tokens, and an authorization
// server that approves every authorization at once by redirecting to the client's redirect
// URI, then runs this command with the MCP server's URL as its last argument, the scenario in
// MCP_CONFORMANCE_SCENARIO and its context (pre-registered credentials) in
// MCP_CONFORMANCE_CONTEXT.
//
// Ringfence is the MCP client under test, so this command only drives a running ringfenced
// through its public surfaces, as an operator, a user and an agent would: it registers the
// server with sign-in (with the scenario's pre-registered client, or none, leaving the client
// to the pool), connects it for a user, opens the authorization URL the pool answers as the
// user's browser would (the redirect lands on the pool's /v1/oauth/callback), imports the
// tools the server declared to the user, and lists and calls them through a run of that user.
// It exits non-zero, saying why, when any step fails: a sign-in the pool refuses (an iss
// mix-up, a foreign resource) ends here.
//
// Environment: RINGFENCE_CLI (the ringfence binary), RINGFENCE_ADDR and RINGFENCE_API_KEY
// (for the CLI).
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"
)

const user = "conformance-user"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "oauthclient:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) < 2 {
		return errors.New("usage: oauthclient <server-url>")
	}
	serverURL := os.Args[len(os.Args)-1]
	scenario := os.Getenv("MCP_CONFORMANCE_SCENARIO")
	var sctx struct {
		ClientID     string `json:"client_id"`
		ClientSecret string `json:"client_secret"`
	}
	if c := os.Getenv("MCP_CONFORMANCE_CONTEXT"); c != "" {
		if err := json.Unmarshal([]byte(c), &sctx); err != nil {
			return fmt.Errorf("MCP_CONFORMANCE_CONTEXT: %v", err)
		}
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	ref := "cf-" + suffix
	graph, run := "g-"+suffix, "r-"+suffix

	add := []string{"servers", "add", ref, "--transport", "http", "--url", serverURL,
		"--grant", "process_spawn", "--grant", "external_api_call", "--oauth"}
	if sctx.ClientID != "" {
		// A pre-registered client: the operator stores its secret and names the
		// authorization server it is registered at (a secret goes nowhere else). The operator
		// knows it; here it is read where the server publishes it.
		issuer, err := authorizationServer(serverURL)
		if err != nil {
			return err
		}
		secret := "cf-client-" + suffix
		if _, err := cli(strings.NewReader(sctx.ClientSecret), "secrets", "set", secret); err != nil {
			return err
		}
		add = append(add, "--oauth-client-id", sctx.ClientID, "--oauth-client-secret-ref", secret, "--oauth-authorization-server", issuer)
	}
	if _, err := cli(nil, add...); err != nil {
		return err
	}
	defer func() { _, _ = cli(nil, "servers", "remove", ref) }()

	// Connecting answers the authorization URL; the user's browser opens it, and connecting
	// again completes. A server that refuses the new token at once (its authorization server
	// moved) answers another URL, which the user opens too.
	out, err := cli(nil, "servers", "connect", ref, "--user", user)
	if err == nil {
		return fmt.Errorf("servers connect %s: connected before any sign-in: %s", ref, out)
	}
	for signIns := 0; err != nil; signIns++ {
		authURL := authorizationURL(out)
		if authURL == "" || signIns == 3 {
			return fmt.Errorf("servers connect %s: no authorization URL after %d sign-ins: %v", ref, signIns, err)
		}
		if err := browse(authURL); err != nil {
			return fmt.Errorf("scenario %s: the sign-in failed: %v", scenario, err)
		}
		out, err = cli(nil, "servers", "connect", ref, "--user", user)
	}
	fmt.Println(strings.TrimSpace(out))

	// The user's run lists and calls the tools the server declared to the user.
	if _, err := cli(nil, "graphs", "create", "--graph", graph, "--agent", "client"); err != nil {
		return err
	}
	if _, err := cli(nil, "mcp-import", "--server", ref, "--graph", graph, "--agent", "client", "--user", user); err != nil {
		return err
	}
	if _, err := cli(nil, "graphs", "publish", "--graph", graph); err != nil {
		return err
	}
	if _, err := cli(nil, "runs", "start", "--graph", graph, "--run", run, "--user", user); err != nil {
		return err
	}
	defer func() { _, _ = cli(nil, "runs", "end", "--run", run) }()
	tools, err := cli(nil, "runs", "tools", "--run", run, "--agent", "client")
	if err != nil {
		return err
	}
	tool := ref + "__test-tool"
	if !strings.Contains(tools, tool) {
		return fmt.Errorf("the run's listing has no %s:\n%s", tool, tools)
	}
	out, err = cli(nil, "runs", "call", "--run", run, "--agent", "client", "--tool", tool, "--args", "{}")
	if err != nil && strings.Contains(err.Error(), "sign_in_required") {
		// The server refused the user's token (revoked, or its authorization server moved):
		// the refusal carries a new authorization URL, which the user opens, and the call is
		// made again, as a model that showed the user the URL would.
		again := authorizationURL(err.Error())
		if again == "" {
			return fmt.Errorf("a sign_in_required refusal without an authorization URL: %v", err)
		}
		if err := browse(again); err != nil {
			return fmt.Errorf("scenario %s: signing in again failed: %v", scenario, err)
		}
		out, err = cli(nil, "runs", "call", "--run", run, "--agent", "client", "--tool", tool, "--args", "{}")
	}
	if err != nil {
		return err
	}
	fmt.Println(strings.TrimSpace(out))
	return nil
}

// authorizationURL is the first http(s) URL in text, up to a space or a quote.
func authorizationURL(text string) string {
	i := strings.Index(text, "http://")
	if j := strings.Index(text, "https://"); j >= 0 && (i < 0 || j < i) {
		i = j
	}
	if i < 0 {
		return ""
	}
	rest := text[i:]
	if k := strings.IndexAny(rest, " \n\"'()"); k >= 0 {
		rest = rest[:k]
	}
	return rest
}

// cli runs the ringfence CLI and answers its output; an error carries both streams.
func cli(stdin io.Reader, args ...string) (string, error) {
	cmd := exec.Command(os.Getenv("RINGFENCE_CLI"), args...)
	cmd.Stdin = stdin
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("ringfence %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// browse opens authURL as a browser would, following the authorization server's redirect to
// the pool's callback, whose page must say the user signed in.
func browse(authURL string) error {
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Get(authURL)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "Signed in") {
		return fmt.Errorf("%s answered HTTP %d: %s", resp.Request.URL.Path, resp.StatusCode, strings.TrimSpace(string(page)))
	}
	return nil
}

// authorizationServer is the first authorization server of the server's protected resource
// metadata (RFC 9728) at its path-suffixed well-known URL.
func authorizationServer(serverURL string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", err
	}
	resp, err := http.Get(u.Scheme + "://" + u.Host + "/.well-known/oauth-protected-resource" + u.Path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var prm struct {
		AuthorizationServers []string `json:"authorization_servers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&prm); err != nil || len(prm.AuthorizationServers) == 0 {
		return "", fmt.Errorf("the server's protected resource metadata names no authorization server (HTTP %d)", resp.StatusCode)
	}
	return prm.AuthorizationServers[0], nil
}
