package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
)

// --url without --transport is a usage error naming the flag to add, before anything is
// dialed, rather than a prompt (or a refusal) for the stdio command.
func TestURLNeedsAnExplicitTransport(t *testing.T) {
	for _, args := range [][]string{
		{"servers", "add", "tickets", "--url", "https://mcp.example.com/mcp"},
		{"servers", "explore", "--url", "https://mcp.example.com/mcp"},
	} {
		t.Run(args[1], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Execute(append(args, "--addr", "127.0.0.1:1"), strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, ExitUsage, code, stderr.String())
			require.Contains(t, stderr.String(), "--url needs --transport streamable_http (or sse)")
		})
	}
}

func TestTransportFor(t *testing.T) {
	for _, tc := range []struct {
		name      string
		f         serverFlags
		transport string
	}{
		{"default", serverFlags{command: "x"}, "stdio"},
		{"alias", serverFlags{transport: "http", url: "https://mcp.example.com/mcp"}, "streamable_http"},
		{"sse", serverFlags{transport: "sse", url: "https://mcp.example.com/sse"}, "sse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.f.transportFor()
			require.NoError(t, err)
			require.Equal(t, tc.transport, got)
		})
	}
}

func TestWarnGrantTypos(t *testing.T) {
	for _, tc := range []struct {
		grant, want string
	}{
		{"proces_spawn", "did you mean process_spawn?"},
		{"process-spawn", "did you mean process_spawn?"},
		{"external_api_cal", "did you mean external_api_call?"},
		{"externl_api_calls", "did you mean external_api_call?"},
		{"process_spawn", ""},
		{"external_api_call", ""},
		{"fs.read:/srv/**", ""},
		{"process", ""},
	} {
		t.Run(tc.grant, func(t *testing.T) {
			var out bytes.Buffer
			warnGrantTypos(&out, []string{tc.grant})
			if tc.want == "" {
				require.Empty(t, out.String())
				return
			}
			require.Contains(t, out.String(), "warning: --grant "+tc.grant+" is not a floor capability; "+tc.want)
		})
	}
}

// A server's URL is printed with its query values masked, in the table and in JSON, even
// when the registry answered it in full (one from before URL masking).
func TestServerURLIsPrintedMasked(t *testing.T) {
	const canary = "canary-cli-url-8d0e"
	s := &registryv1.Server{Ref: "tickets", Transport: "streamable_http", Url: "https://mcp.example.com/mcp?api_key=" + canary}
	for _, output := range []string{"", "json"} {
		t.Run("output="+output, func(t *testing.T) {
			var out bytes.Buffer
			g := &globals{stdout: &out, output: output}
			require.NoError(t, g.printServer(s))
			require.NotContains(t, out.String(), canary)
			require.Contains(t, out.String(), "https://mcp.example.com/mcp?api_key=********")
		})
	}
	require.Contains(t, s.GetUrl(), canary, "the caller's message is not modified")
}

// TestPairFlagsShowTheirShape: a malformed repeatable flag says which entry and how it reads.
func TestPairFlagsShowTheirShape(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tool-permission", "read_doc"}, `--tool-permission "read_doc" must be TOOL=CAPABILITY, e.g. --tool-permission 'read_doc=docs.read:{path}'`},
		{[]string{"--header-secret", "Authorization"}, "--header-secret entry 1 must be HEADER=SECRET_NAME, e.g. --header-secret Authorization=tickets-token"},
		{[]string{"--env", "=x"}, "--env entry 1 must be KEY=VALUE, e.g. --env REGION=eu-west-1"},
		// A value typed without its KEY= is not a variable name: it is never echoed.
		{[]string{"--env", "REGION=eu", "--env", "sk-live-9f8e7d6c5b4a"}, "--env entry 2 must be KEY=VALUE, or a variable name alone to take its value from this shell's environment; it is neither (not shown, in case it is a secret)"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"servers", "add", "docs", "--command", "docs-mcp", "--addr", "127.0.0.1:1"}, tc.args...)
		require.Equal(t, ExitUsage, Execute(args, strings.NewReader(""), &stdout, &stderr), stderr.String())
		require.Contains(t, stderr.String(), tc.want)
		require.NotContains(t, stderr.String(), "sk-live")
	}
}

// TestAddWarnsWhenGrantsMissTheFloor: a registration short of the floor is accepted, and the
// operator learns at once that mcp-import will refuse it, with an update that keeps every grant.
func TestAddWarnsWhenGrantsMissTheFloor(t *testing.T) {
	var out bytes.Buffer
	warnBelowFloor(&out, "docs", "stdio", []string{"process_spawn", "docs.read"})
	require.Equal(t, "warning: docs does not grant external_api_call, which every imported tool needs: mcp-import will refuse it until it does (ringfence servers update docs --grant process_spawn --grant docs.read --grant external_api_call)\n", out.String())
	out.Reset()
	warnBelowFloor(&out, "docs", "stdio", []string{"external_api_call", "process_spawn"})
	require.Empty(t, out.String())
	// A remote server is told why a floor that reads as local applies to it.
	warnBelowFloor(&out, "tickets", "streamable_http", nil)
	require.Contains(t, out.String(), "warning: tickets does not grant process_spawn and external_api_call")
	require.Contains(t, out.String(), "; the floor is the same for a remote server: process_spawn stands for code running outside Ringfence")
}

// --max-result-bytes takes a size with a unit; an unreadable one is a usage error before
// anything is dialed, and servers show renders the default.
func TestMaxResultBytesFlag(t *testing.T) {
	req, err := (&serverFlags{command: "x", maxResult: "4MiB"}).createRequest("docs")
	require.NoError(t, err)
	require.Equal(t, int64(4<<20), req.GetMaxResultBytes())
	req, err = (&serverFlags{command: "x"}).createRequest("docs")
	require.NoError(t, err)
	require.Zero(t, req.GetMaxResultBytes(), "omitted: the registry's default")

	var stdout, stderr bytes.Buffer
	code := Execute([]string{"servers", "add", "docs", "--command", "x", "--max-result-bytes", "lots", "--addr", "127.0.0.1:1"}, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, ExitUsage, code, stderr.String())
	require.Contains(t, stderr.String(), `--max-result-bytes "lots"`)
	require.Equal(t, "16MiB (default)", maxResult(0))
	require.Equal(t, "1KiB", maxResult(1<<10))
}

// TestOAuthFlags: --oauth (or any --oauth-* flag) signs users in; without a client id the
// pool brings its own client. An update keeps the stored sign-in but for the flags given, so
// an empty --oauth-client-id hands the client to the pool.
func TestOAuthFlags(t *testing.T) {
	remote := serverFlags{transport: "http", url: "https://mcp.example.com/mcp"}
	req, err := remote.createRequest("wiki")
	require.NoError(t, err)
	require.Nil(t, req.GetOauth(), "no flag, no sign-in")

	own := remote
	own.oauthOn = true
	req, err = own.createRequest("wiki")
	require.NoError(t, err)
	require.NotNil(t, req.GetOauth())
	require.Empty(t, req.GetOauth().GetClientId(), "the pool's own client")

	scoped := remote
	scoped.oauthScopes = []string{"wiki.read"}
	req, err = scoped.createRequest("wiki")
	require.NoError(t, err)
	require.Equal(t, []string{"wiki.read"}, req.GetOauth().GetScopes(), "an --oauth-* flag implies --oauth")

	cur := &registryv1.OAuthSignIn{ClientId: "ringfence", Scopes: []string{"wiki.read"}}
	f := serverFlags{}
	got := f.oauth(cur, func(name string) bool { return name == "oauth-client-id" })
	require.Empty(t, got.GetClientId())
	require.Equal(t, []string{"wiki.read"}, got.GetScopes(), "the other settings are kept")
	require.Contains(t, signInLine(got), "of the pool's own")
}

// TestShowPrintsEverySettingAFlagSets: --call-timeout, --session-timeout and --keep-markup
// are shown by servers show as the other settings are, with the defaults named.
func TestShowPrintsEverySettingAFlagSets(t *testing.T) {
	var out bytes.Buffer
	g := &globals{stdout: &out}
	require.NoError(t, g.printServer(&registryv1.Server{Ref: "docs", Transport: "stdio", Command: "docs-mcp", KeepMarkup: true, ToolCallTimeout: durationpb.New(10 * time.Second)}))
	require.Regexp(t, `(?m)^keep markup:\s+true$`, out.String())
	require.Regexp(t, `(?m)^session timeout:\s+2s \(default\)$`, out.String())
	require.Regexp(t, `(?m)^call timeout:\s+10s$`, out.String())
}

// TestTimesReadAlike: servers show, secrets list and the rest print a time the same way, in
// the local zone, as keys list and runs show do.
func TestTimesReadAlike(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	want := at.Local().Format(time.DateTime)
	var out bytes.Buffer
	g := &globals{stdout: &out}
	require.NoError(t, g.printServer(&registryv1.Server{Ref: "docs", Transport: "stdio", Command: "docs-mcp", UpdateTime: timestamppb.New(at)}))
	require.Regexp(t, `(?m)^updated:\s+`+want+`$`, out.String())
}

// TestTransportHelpNamesTheSeedsNames: --transport's help names every name the registry takes
// for a transport (mcpserver.NormalizeTransport: the seed's http-sse too), on add and update.
func TestTransportHelpNamesTheSeedsNames(t *testing.T) {
	for _, verb := range []string{"add", "update"} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, ExitOK, Execute([]string{"servers", verb, "--help"}, nil, &stdout, &stderr), stderr.String())
		var line string
		for l := range strings.Lines(stdout.String()) {
			if strings.Contains(l, "--transport string") {
				line = l
			}
		}
		for _, name := range []string{"stdio", "streamable_http", "sse", "http", "streamable-http", "http-sse"} {
			require.Contains(t, line, name, verb)
		}
	}
}
