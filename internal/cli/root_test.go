package cli

import (
	"bytes"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/shlex"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
)

func TestPrintErrorHintsAtTheConnectionMistake(t *testing.T) {
	for _, tc := range []struct {
		name    string
		msg     string
		usedTLS bool
		hint    string
	}{
		{"plaintext client, TLS server", `connection error: desc = "error reading server preface: EOF"`, false,
			"hint: the server speaks TLS: pass --ca-file (RINGFENCE_CA_FILE)"},
		{"the REST port", `connection error: desc = "error reading server preface: http2: failed reading the frame payload: http2: frame too large, note that the frame header looked like an HTTP/1.1 header"`, false,
			"hint: an HTTP/1 server answers at 127.0.0.1:1 (--addr), the REST port perhaps: the CLI speaks gRPC"},
		{"TLS client, plaintext server", `connection error: desc = "transport: authentication handshake failed: tls: first record does not look like a TLS handshake"`, true,
			"hint: the server speaks plaintext: drop --ca-file (RINGFENCE_CA_FILE)"},
		{"a host that does not resolve", `name resolver error: produced zero addresses`, false,
			"hint: the host of 127.0.0.1:1 (--addr) does not resolve"},
		{"a server whose peer does not resolve", `auth: the registry cannot verify API keys right now: rpc error: code = Unavailable desc = name resolver error: produced zero addresses`, false,
			"hint: the server at --addr answered"},
		{"nothing listening", `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`, false,
			"hint: is the server running?"},
		{"TLS client, server gone mid-handshake", `connection error: desc = "error reading server preface: EOF"`, true,
			"hint: is the server running?"},
		{"the server is up, an mcp server's authorization server is not", `pool: the server or its authorization server could not be reached: server "oa": the server's authorization server could not be discovered`, false,
			"hint: the server at --addr answered; what it could not reach is named above: an MCP server or its authorization server (check the registration), or a peer service"},
		{"the server is up, a peer behind it is not", `auth: the registry cannot verify API keys right now: rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:9: connect: connection refused"`, true,
			"hint: the server at --addr answered"},
		{"a certificate from another CA", `connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"`, true,
			"hint: the server's certificate does not verify"},
		{"a split binary's internal listener", `connection error: desc = "error reading server preface: remote error: tls: certificate required"`, true,
			"hint: 127.0.0.1:1 (--addr) is a split binary's internal listener (RINGFENCE_INTERNAL_ADDR, for the other services, mutual TLS only): point --addr or RINGFENCE_ADDR at its gRPC address (RINGFENCE_GRPC_ADDR)"},
		{"another service at --addr", `connection error: desc = "transport: authentication handshake failed: mtls: expected peer identity spiffe://ringfence/service/registry, but the server presented spiffe://ringfence/service/audit"`, true,
			"hint: another service answers at --addr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			printError(&out, status.Error(codes.Unavailable, tc.msg), connection{addr: "127.0.0.1:1", addrFrom: "--addr", usedTLS: tc.usedTLS})
			require.Contains(t, out.String(), tc.hint)
			require.Equal(t, 1, bytes.Count(out.Bytes(), []byte("hint:")), out.String())
		})
	}
}

// TestPrintErrorNamesTheServiceToAsk: in a split deployment each binary serves some
// commands; asking the wrong one says which serves what.
func TestPrintErrorNamesTheServiceToAsk(t *testing.T) {
	var out bytes.Buffer
	printError(&out, status.Error(codes.Unimplemented, "unknown service ringfence.publisher.v1.PublisherService"), connection{})
	require.Contains(t, out.String(), "the server at --addr does not serve ringfence.publisher.v1.PublisherService")
	require.Contains(t, out.String(), "graphs and mcp-import: ringfence-publisher")

	// A Ringfence listener's refusal names the service in an ErrorInfo, whatever its words.
	out.Reset()
	st, err := status.New(codes.Unimplemented, "this listener serves other services").WithDetails(
		&errdetails.ErrorInfo{Reason: "SERVICE_NOT_SERVED", Domain: "ringfence", Metadata: map[string]string{"service": "ringfence.pool.v1.PoolService"}})
	require.NoError(t, err)
	printError(&out, st.Err(), connection{})
	require.Contains(t, out.String(), "the server at --addr does not serve ringfence.pool.v1.PoolService;")
	require.Contains(t, out.String(), "runs, call and documents: ringfence-pool")
}

// TestHelpNeverPrintsTheAPIKey: the key set in the environment is read after the flags, so
// --help shows no default for it.
func TestHelpNeverPrintsTheAPIKey(t *testing.T) {
	const key = "help-must-not-show-0123456789"
	t.Setenv("RINGFENCE_API_KEY", key)
	var stdout, stderr bytes.Buffer
	Execute([]string{"audit", "verify", "--help"}, nil, &stdout, &stderr)
	require.Contains(t, stdout.String(), "--api-key")
	require.NotContains(t, stdout.String()+stderr.String(), key)
}

// TestHelpNamesEveryConnectionVariable: each connection flag that reads the environment says
// which variable, as configuration.md lists them.
func TestHelpNamesEveryConnectionVariable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, ExitOK, Execute([]string{"--help"}, nil, &stdout, &stderr), stderr.String())
	description, flags, ok := strings.Cut(stdout.String(), "\nFlags:\n")
	require.True(t, ok, stdout.String())
	for _, v := range []string{"RINGFENCE_ADDR", "RINGFENCE_API_KEY", "RINGFENCE_CA_FILE", "RINGFENCE_SERVER_NAME", "RINGFENCE_SERVER_IDENTITY"} {
		require.Contains(t, description, v)
		require.Contains(t, flags, "("+v)
	}
	require.Contains(t, flags, "(RINGFENCE_API_KEY, which keeps it out of ps", "--api-key says why the variable is better")
}

// TestUsageMistakesExitTwoWithTheFix: a mistyped command, flag or argument exits 2 and says
// what was meant, before anything is dialed.
func TestUsageMistakesExitTwoWithTheFix(t *testing.T) {
	t.Setenv("RINGFENCE_ADDR", "127.0.0.1:1")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"servres", "list"}, `unknown command "servres" for "ringfence": did you mean "ringfence servers"?`},
		{[]string{"servers", "lsit"}, `unknown command "lsit" for "ringfence servers": did you mean "ringfence servers list"?`},
		{[]string{"audit", "lst"}, `did you mean "ringfence audit list"?`},
		{[]string{"completion", "bsh"}, `did you mean "ringfence completion bash"?`},
		{[]string{"audit", "list", "--limt", "3"}, `unknown flag --limt for "ringfence audit list": did you mean --limit?`},
		{[]string{"runs", "start", "--grph", "g"}, "did you mean --graph?"},
		{[]string{"--adr", "127.0.0.1:1", "servers", "list"}, "did you mean --addr?"},
		{[]string{"--timeout", "0", "servers", "list"}, "--timeout must be more than 0, e.g. 30s or 5m, not 0s"},
		{[]string{"image", "build", "--binary", "/nonexistent/docs-mcp", "--name", "Docs MCP:1"}, `--name "Docs MCP:1" is not an image name (invalid reference format`},
		{[]string{"--ca-file", "/nonexistent/ca.pem", "servers", "list"}, "--ca-file (RINGFENCE_CA_FILE): mtls: read CA bundle: open /nonexistent/ca.pem: no such file or directory: give the CA bundle that signed the server's certificate"},
		{[]string{"--ca-file", "/nonexistent/ca.pem", "--server-identity", "regsitry", "servers", "list"}, `--server-identity "regsitry" (RINGFENCE_SERVER_IDENTITY) is not a service: use one of registry, publisher, pool, audit`},
		{[]string{"--server-identity", "registry", "servers", "list"}, `--server-identity "registry" needs --ca-file (RINGFENCE_CA_FILE)`},
		{[]string{"audit", "list", "--since", "1m", "--until", "2h"}, `--until "2h" is not after --since "1m", so no record can match`},
		{[]string{"servers", "update", "docs", "-o", "json"}, "nothing to change: pass the settings to change, e.g. ringfence servers update docs --description TEXT"},
		{[]string{"documents", "put", "/nonexistent/expenses.pdf"}, `cannot read "/nonexistent/expenses.pdf": no such file or directory`},
		{[]string{"documents", "put", "/"}, `cannot read "/": it is a directory: give a file`},
		{[]string{"graphs", "edit", "--graph", "g", "--file", "/nonexistent/g.json"}, `cannot read "/nonexistent/g.json": no such file or directory`},
		{[]string{"audit", "export", "--out", "/nonexistent/trail.jsonl"}, `--out "/nonexistent/trail.jsonl": cannot create a file in "/nonexistent" (no such file or directory): choose a directory that exists`},
		{[]string{"audit", "list", "--limit", "many"}, `invalid argument "many" for "--limit" flag`},
		{[]string{"roles", "check", "foo"}, `"ringfence roles check" takes no arguments, got "foo"`},
		{[]string{"servers", "show"}, "usage: ringfence servers show REF"},
		{[]string{"runs", "end", "--run", "r", "--status", "done"}, `--status must be completed or failed, not "done"`},
		{[]string{"keys", "create"}, `"ringfence keys create" needs --name and --role (usage: ringfence keys create; ringfence keys create --help)`},
		{[]string{"mcp-import", "--graph", "g"}, `"ringfence mcp-import" needs --agent and --server (usage: ringfence mcp-import --server REF`},
		{[]string{"--addr", "localhost", "servers", "list"}, `--addr "localhost" has no port: give host:port`},
		{[]string{"--addr", "http://127.0.0.1:50051", "servers", "list"}, `drop "http://" (--addr 127.0.0.1:50051)`},
		{[]string{"--addr", "127.0.0.1:99999", "servers", "list"}, `port "99999" is not a number from 1 to 65535`},
		{[]string{"--addr", "pool-1:50051,pool-2", "runs", "show", "--run", "r"}, `--addr "pool-2" has no port: give host:port`},
		{[]string{"--addr", "pool-1:50051,dns:///pool-2:50051", "runs", "show", "--run", "r"}, "a list takes host:port entries only"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Execute(tc.args, nil, &stdout, &stderr)
			require.Equal(t, ExitUsage, code, stderr.String())
			require.Contains(t, stderr.String(), tc.want)
			require.NotContains(t, stderr.String(), "Usage:", "no help dump for a mistake")
		})
	}
}

// TestAGroupWithoutASubcommandPrintsItsHelp: `ringfence servers` alone is a question, not
// a mistake.
func TestAGroupWithoutASubcommandPrintsItsHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, ExitOK, Execute([]string{"servers"}, nil, &stdout, &stderr), stderr.String())
	require.Contains(t, stdout.String(), "Available Commands:")
}

func TestAddrHost(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:50051", "localhost:1", "[::1]:50051", ":50051", "dns:///ringfence.internal:443", "dns:ringfence.internal:443", "unix:///run/ringfence.sock", "unix:/run/ringfence.sock", "unix-abstract:ringfence"} {
		_, err := addrHost(ok, "--addr")
		require.NoError(t, err, ok)
	}
	for _, bad := range []string{"localhost", "127.0.0.1:", "127.0.0.1:0", "https://ringfence.example.com", "ftp://x:1", "a:b:c"} {
		_, err := addrHost(bad, "--addr")
		require.Error(t, err, bad)
	}
}

// TestAKeyInPlaintextOffLoopbackIsWarned: without --ca-file the API key crosses the network in
// clear, which the user is told before the request; to a loopback server or over a unix
// socket it is not.
func TestAKeyInPlaintextOffLoopbackIsWarned(t *testing.T) {
	t.Setenv("RINGFENCE_API_KEY", "some-key")
	const warning = "in plaintext: pass --ca-file (RINGFENCE_CA_FILE)"
	for addr, warned := range map[string]bool{
		"192.0.2.1:50051": true, "dns:///ringfence.invalid:50051": true,
		"127.0.0.1:1": false, "localhost:1": false, "[::1]:1": false, "unix:///nonexistent.sock": false,
	} {
		var stdout, stderr bytes.Buffer
		Execute([]string{"servers", "list", "--addr", addr, "--timeout", "200ms"}, nil, &stdout, &stderr)
		if warned {
			require.Contains(t, stderr.String(), "warning: the API key goes to "+strings.TrimPrefix(strings.Split(addr, ":50051")[0], "dns:///")+" "+warning, addr)
		} else {
			require.NotContains(t, stderr.String(), warning, addr)
		}
	}
}

// TestNoAPIKeyIsSaidBeforeTheRequest: with no key at all the CLI warns before it dials, and
// a README reader who exported MCP_ADMIN_KEY learns which variable the CLI reads.
func TestNoAPIKeyIsSaidBeforeTheRequest(t *testing.T) {
	t.Setenv("RINGFENCE_API_KEY", "")
	t.Setenv("MCP_ADMIN_KEY", "ringfence-demo-admin-key")
	var stdout, stderr bytes.Buffer
	code := Execute([]string{"--addr", "127.0.0.1:1", "--timeout", "2s", "servers", "list"}, nil, &stdout, &stderr)
	require.Equal(t, ExitFailure, code)
	require.Contains(t, stderr.String(), "warning: no API key: pass --api-key or set RINGFENCE_API_KEY (MCP_ADMIN_KEY is set, but the CLI reads RINGFENCE_API_KEY: export RINGFENCE_API_KEY=$MCP_ADMIN_KEY)")
	require.Contains(t, stderr.String(), "nothing answers at 127.0.0.1:1 (--addr)")
}

// TestAnAPIKeyThatCannotBeSentIsNamed: a key with a newline (read from a file) or another
// character gRPC metadata cannot carry is a usage error naming the problem, without the key,
// rather than gRPC's transport error.
func TestAnAPIKeyThatCannotBeSentIsNamed(t *testing.T) {
	for key, want := range map[string]string{
		"rf-secret-key\n": "ends with white space (a newline from a file?)",
		"rf-secret\x01k":  "has a character a key never has at byte 10",
	} {
		t.Setenv("RINGFENCE_API_KEY", key)
		var stdout, stderr bytes.Buffer
		code := Execute([]string{"--addr", "127.0.0.1:1", "--timeout", "2s", "servers", "list"}, nil, &stdout, &stderr)
		require.Equal(t, ExitUsage, code, stderr.String())
		require.Contains(t, stderr.String(), want)
		require.NotContains(t, stderr.String(), "rf-secret")
	}
}

// TestPrintErrorSaysHowToGetAPermission: a key whose role lacks a permission learns where the
// roles are listed and how a key for one is minted.
func TestPrintErrorSaysHowToGetAPermission(t *testing.T) {
	var out bytes.Buffer
	printError(&out, status.Error(codes.PermissionDenied, `auth: RegistryService.ListServers needs permission mcp:admin, which role "operator" does not hold`), connection{})
	require.Contains(t, out.String(), "hint: use a key whose role holds that permission: `ringfence roles check` lists the roles")
}

// TestHelpOnAnUnknownTopicIsAMistake: `ringfence help serverz` exits 2 naming the closest
// command, as `ringfence serverz` does; help on a real one prints it.
func TestHelpOnAnUnknownTopicIsAMistake(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, ExitUsage, Execute([]string{"help", "servers", "lsit"}, nil, &stdout, &stderr))
	require.Contains(t, stderr.String(), `unknown command "lsit" for "ringfence servers": did you mean "ringfence servers list"?`)
	stdout.Reset()
	require.Equal(t, ExitOK, Execute([]string{"help", "servers", "add"}, nil, &stdout, &stderr), stderr.String())
	require.Contains(t, stdout.String(), "Register an MCP server")
}

// closedAddrs are loopback addresses nothing listens on: each was listened on and closed.
func closedAddrs(t *testing.T, n int) []string {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addrs = append(addrs, l.Addr().String())
		require.NoError(t, l.Close())
	}
	return addrs
}

// TestUnreachableAddressesSayWhatToFix: grpc-go's own words for a host that does not resolve
// under round-robin ("no children to pick from") and for a list of replicas none of which
// answered ("latest balancer error") come with the hint that fits, and a call whose request
// never left the CLI is not reported as one whose outcome is unknown.
func TestUnreachableAddressesSayWhatToFix(t *testing.T) {
	t.Setenv("RINGFENCE_API_KEY", "some-key")
	list := strings.Join(closedAddrs(t, 2), ",")
	for _, tc := range []struct {
		name string
		args []string
		hint string
	}{
		{"a host that does not resolve", []string{"--addr", "ringfence-nosuchhost.invalid:50051", "servers", "list"},
			"hint: the host of ringfence-nosuchhost.invalid:50051 (--addr) does not resolve"},
		{"a list of replicas, none up", []string{"--addr", list, "--timeout", "1s", "servers", "list"},
			"hint: no address of " + list + " (--addr) answered within --timeout 1s, so the request was never sent"},
		{"a call to a list of replicas, none up", []string{"--addr", list, "--timeout", "1s", "runs", "call", "--run", "r", "--agent", "a", "--tool", "t"},
			"hint: no address of " + list + " (--addr) answered within --timeout 1s, so the request was never sent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Execute(tc.args, nil, &stdout, &stderr)
			require.Equal(t, ExitFailure, code, stderr.String())
			require.Contains(t, stderr.String(), tc.hint)
			require.Equal(t, 1, strings.Count(stderr.String(), "hint:"), stderr.String())
			require.NotContains(t, stderr.String(), "outcome is unknown")
		})
	}
}

// TestAServerThatFailedToStartIsNotAPeer: an MCP server that did not start is named by its
// failure class and stderr; the hint about peer services would send the user the wrong way.
func TestAServerThatFailedToStartIsNotAPeer(t *testing.T) {
	st, err := status.New(codes.Unavailable, `could not list the server's tools: command_not_found: command "nosuchbinary" was not found (exit status 127): it must be on the image's PATH`).
		WithDetails(&typesv1.ServerFailure{Class: "command_not_found", StderrTail: "exec nosuchbinary failed: No such file or directory"})
	require.NoError(t, err)
	var out bytes.Buffer
	printError(&out, st.Err(), connection{addr: "127.0.0.1:1", addrFrom: "--addr"})
	require.Contains(t, out.String(), "failure class: command_not_found")
	require.NotContains(t, out.String(), "hint:")
}

// TestADeadlineSaysWhatToChange: the CLI's own deadline, with or without a connection ready,
// names --timeout; a server's deadline message is left as the server wrote it.
func TestADeadlineSaysWhatToChange(t *testing.T) {
	for _, tc := range []struct{ msg, hint string }{
		{"context deadline exceeded", "hint: the server did not answer within --timeout 2s: a longer --timeout waits longer"},
		{"context deadline exceeded while waiting for connections to become ready", "hint: no connection to 127.0.0.1:1 (--addr) was ready within --timeout 2s, so the request was never sent"},
		{"pool: the server did not answer within call_timeout", ""},
	} {
		var out bytes.Buffer
		printError(&out, status.Error(codes.DeadlineExceeded, tc.msg), connection{addr: "127.0.0.1:1", addrFrom: "--addr", timeout: 2 * time.Second})
		if tc.hint == "" {
			require.NotContains(t, out.String(), "hint:")
			continue
		}
		require.Contains(t, out.String(), tc.hint)
	}
}

// TestServersUpdateWithAFlagIsNotNothing: any update flag, a false boolean included, is a
// change to make: the command dials the server (here nothing listens) instead of refusing.
func TestServersUpdateWithAFlagIsNotNothing(t *testing.T) {
	t.Setenv("RINGFENCE_API_KEY", "some-key")
	for _, flag := range []string{"--strict-inputs=false", "--clear-env", "--description="} {
		var stdout, stderr bytes.Buffer
		code := Execute([]string{"--addr", closedAddrs(t, 1)[0], "servers", "update", "docs", flag}, nil, &stdout, &stderr)
		require.Equal(t, ExitFailure, code, stderr.String())
		require.Contains(t, stderr.String(), "hint: is the server running?", flag)
	}
}

// TestHelpExamplesParse: every ringfence command line in a command's --help examples names a
// command that exists, with flags it takes and the arguments it accepts, so an example cannot
// drift from the flags it shows.
func TestHelpExamplesParse(t *testing.T) {
	seen := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		for _, line := range strings.Split(strings.ReplaceAll(c.Example, "\\\n", " "), "\n") {
			if line = strings.TrimSpace(line); strings.HasPrefix(line, "ringfence ") {
				requireCommandLineParses(t, line)
				seen++
			}
		}
	}
	walk(newRoot(&globals{stdout: io.Discard, stderr: io.Discard}))
	require.Greater(t, seen, 10, "the walk finds the examples")
}

// TestREADMECommandLinesParse: the same for every ./bin/ringfence line of README.md's shell
// blocks, which a new user pastes as they are.
func TestREADMECommandLinesParse(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	seen := 0
	inShell := false
	for _, line := range strings.Split(strings.ReplaceAll(string(readme), "\\\n", " "), "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			inShell = line == "```sh"
			continue
		case !inShell:
			continue
		}
		_, cli, ok := strings.Cut(line, "./bin/ringfence ")
		if !ok || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		cli, _, _ = strings.Cut(cli, " # ") // a comment after the command
		cli = strings.TrimSuffix(strings.TrimSpace(cli), ")")
		requireCommandLineParses(t, "ringfence "+cli)
		seen++
	}
	require.Greater(t, seen, 40, "the walk finds README's command lines")
}

// requireCommandLineParses fails unless line (ringfence ...) names a command that runs, with
// flags it takes and arguments it accepts.
func requireCommandLineParses(t *testing.T, line string) {
	t.Helper()
	line, _, _ = strings.Cut(line, " > ") // a redirection is the shell's
	words, err := shlex.Split(line)
	require.NoError(t, err, line)
	root := newRoot(&globals{stdout: io.Discard, stderr: io.Discard})
	cmd, rest, err := root.Find(words[1:])
	require.NoError(t, err, line)
	require.True(t, cmd.Runnable(), "%q names no command that runs", line)
	require.NoError(t, cmd.ParseFlags(rest), line)
	require.NoError(t, cmd.ValidateArgs(cmd.Flags().Args()), line)
}
