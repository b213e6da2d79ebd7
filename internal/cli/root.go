// Package cli is the ringfence command: an operator's and author's client for every Ringfence
// service over gRPC. Tables by default, -o json for scripts; errors say what to fix.
package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/grpcserver"
	"github.com/ringfence/ringfence/internal/mtls"
	"github.com/ringfence/ringfence/internal/version"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// globals are the connection and output settings every command shares.
type globals struct {
	addr       string
	apiKey     string
	caFile     string
	serverName string
	serverID   string
	output     string
	timeout    time.Duration
	// addrFrom says where addr came from (--addr, RINGFENCE_ADDR or the default), for
	// messages about it.
	addrFrom string
	// requestID goes with every request of this invocation (x-request-id): the server logs it
	// on its line of each, and a refusal prints it, so an operator finds that line.
	requestID string

	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// stderrTTY says a person watches stderr: long waits are announced there (waitNote).
	stderrTTY bool
	conn      *grpc.ClientConn
}

// Execute runs the CLI with args and returns the process exit code.
// Everything it prints passes through escapeText (safe.go), whoever wrote the text.
func Execute(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	f, isFile := stderr.(*os.File)
	tty := isFile && term.IsTerminal(int(f.Fd()))
	safeOut, safeErr := newSafeWriter(stdout), newSafeWriter(stderr)
	defer safeOut.Flush()
	defer safeErr.Flush()
	stdout, stderr = safeOut, safeErr
	g := &globals{stdin: stdin, stdout: stdout, stderr: stderr, stderrTTY: tty, requestID: newRequestID()}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	err = explainRequired(cmd, err)
	if g.conn != nil {
		g.conn.Close()
	}
	if err == nil {
		return ExitOK
	}
	var exit *exitError
	if errors.As(err, &exit) {
		if exit.msg != "" {
			fmt.Fprintln(stderr, exit.msg)
		}
		return exit.code
	}
	printError(stderr, err, connection{addr: g.addr, addrFrom: g.addrFrom, usedTLS: g.caFile != "", timeout: g.timeout, requestID: g.requestID})
	if isUsage(err) {
		return ExitUsage
	}
	return ExitFailure
}

// exitError ends the command with a specific exit code after it printed its own output.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// isUsage says whether err is a mistake on the command line: a usageError, or one of cobra's
// own (recognized by their words). A server's answer never is, whatever its message says
// ("nothing accepts connections at …" is not cobra's "accepts 1 arg(s)").
func isUsage(err error) bool {
	var u usageError
	if errors.As(err, &u) {
		return true
	}
	if _, ok := status.FromError(err); ok {
		return false
	}
	return strings.Contains(err.Error(), "unknown flag") || strings.Contains(err.Error(), "unknown command") ||
		strings.Contains(err.Error(), "accepts ") || strings.Contains(err.Error(), "required flag")
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "ringfence",
		Short: "Govern MCP tools: register servers, import and publish graphs, run calls, read the audit log",
		Long: `ringfence talks to a Ringfence server over gRPC.

Connection: --addr (RINGFENCE_ADDR, default 127.0.0.1:50051), --api-key (RINGFENCE_API_KEY),
and for TLS --ca-file (RINGFENCE_CA_FILE) with optional --server-name (RINGFENCE_SERVER_NAME)
and --server-identity (RINGFENCE_SERVER_IDENTITY).

Exit status: 0 done; 1 an error (the server's, or reaching it); 2 a wrong command line (nothing
changed); for tool calls, 3 refused before dispatch (nothing reached the server), 4 failed after
dispatch, or no answer within --timeout so the outcome is unknown (either way it may have taken
effect), and 5 waits for an approver (nothing reached the server yet; runs approve decides it).`,
		SilenceUsage:  true,
		Version:       version.Revision(),
		SilenceErrors: true,
	}
	root.SetVersionTemplate(version.String("ringfence") + "\n")
	pf := root.PersistentFlags()
	pf.StringVar(&g.addr, "addr", envOr("RINGFENCE_ADDR", "127.0.0.1:50051"), "gRPC address of the server (RINGFENCE_ADDR)")
	// Not defaulted from the environment: --help would print the key.
	pf.StringVar(&g.apiKey, "api-key", "", "API key (RINGFENCE_API_KEY, which keeps it out of ps: any user on the host sees a flag's value)")
	pf.StringVar(&g.caFile, "ca-file", os.Getenv("RINGFENCE_CA_FILE"), "CA bundle to verify a TLS server (RINGFENCE_CA_FILE); plaintext when empty")
	pf.StringVar(&g.serverName, "server-name", os.Getenv("RINGFENCE_SERVER_NAME"), "TLS server name to verify, when it differs from the address host (RINGFENCE_SERVER_NAME)")
	pf.StringVar(&g.serverID, "server-identity", os.Getenv("RINGFENCE_SERVER_IDENTITY"), "with --ca-file, the service the server's certificate must name (registry, publisher, pool, audit), so no other service's certificate receives the API key (RINGFENCE_SERVER_IDENTITY)")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	pf.DurationVar(&g.timeout, "timeout", 60*time.Second, "deadline for each request")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if g.apiKey == "" {
			g.apiKey = os.Getenv("RINGFENCE_API_KEY")
		}
		g.addrFrom = g.addrSource(cmd)
		if g.output != "table" && g.output != "json" {
			return usagef("--output must be table or json, not %q", g.output)
		}
		if g.timeout <= 0 {
			// Every request would fail at once, as "context deadline exceeded".
			return usagef("--timeout must be more than 0, e.g. 30s or 5m, not %s", g.timeout)
		}
		return nil
	}
	root.AddCommand(
		newServersCmd(g),
		newSecretsCmd(g),
		newKeysCmd(g),
		newRolesCmd(g),
		newCertsCmd(g),
		newImageCmd(g),
		newRunsCmd(g),
		newCallCmd(g),
		newDocumentsCmd(g),
		newAuditCmd(g),
		newGraphsCmd(g),
		newMCPImportCmd(g),
		newBackupCmd(g),
	)
	// Added now rather than at Execute, so guide reaches `completion bsh` too.
	root.InitDefaultCompletionCmd()
	guide(root)
	return root
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// waitNoteAfter is how long a request runs before waitNote says what it waits for.
const waitNoteAfter = 3 * time.Second

// waitNote says on a terminal's stderr, once a request has run waitNoteAfter, what it waits
// for and for how long at most: a tool call that takes its time looks like a hung command
// otherwise. stop, called when the answer came, keeps the note from following it.
func (g *globals) waitNote(format string, args ...any) (stop func()) {
	if !g.stderrTTY {
		return func() {}
	}
	var mu sync.Mutex
	stopped := false
	timer := time.AfterFunc(waitNoteAfter, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			writef(g.stderr, "waiting for "+format+" (up to --timeout %s)...\n", append(args, g.timeout)...)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		timer.Stop()
	}
}

// dial connects once per invocation.
// checkAPIKey refuses a key that cannot be sent as gRPC metadata (printable ASCII only), which
// gRPC would otherwise refuse with a bare transport error; a newline at its end is the common
// case, from a key read out of a file.
func checkAPIKey(key string) error {
	if strings.TrimSpace(key) != key {
		return usagef("the API key (--api-key or RINGFENCE_API_KEY) begins or ends with white space (a newline from a file?): give the key alone, e.g. RINGFENCE_API_KEY=\"$(tr -d '[:space:]' < key-file)\"")
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return usagef("the API key (--api-key or RINGFENCE_API_KEY) has a character a key never has at byte %d (keys are printable ASCII): check that the whole key, and only it, was copied", i+1)
		}
	}
	return nil
}

func (g *globals) dial() (*grpc.ClientConn, error) {
	if g.conn != nil {
		return g.conn, nil
	}
	if g.addrFrom == "" {
		g.addrFrom = "--addr"
	}
	target, opts, host, err := balancedTarget(g.addr, g.addrFrom)
	if err != nil {
		return nil, err
	}
	if g.caFile == "" && g.apiKey != "" {
		warnPlaintextKey(g.stderr, host)
	}
	if g.apiKey == "" {
		// Said before the request, so a user who forgot the key learns it here rather than
		// from a bare Unauthenticated.
		fmt.Fprintf(g.stderr, "warning: no API key: pass --api-key or set RINGFENCE_API_KEY%s; the server refuses every request without one\n", adminKeyHint())
	}
	if err := checkAPIKey(g.apiKey); err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	switch {
	case g.serverID != "" && !slices.Contains(mtls.Services, g.serverID):
		return nil, usagef("--server-identity %s (RINGFENCE_SERVER_IDENTITY) is not a service: use one of %s", sprintLine("%q", g.serverID), strings.Join(mtls.Services, ", "))
	case g.serverID != "" && g.caFile == "":
		// Without TLS no certificate names the server: the identity would go unchecked.
		return nil, usagef("--server-identity %s needs --ca-file (RINGFENCE_CA_FILE): only a TLS server's certificate can be checked for it", sprintLine("%q", g.serverID))
	case g.caFile != "":
		tlsCfg, err := mtls.CAOnlyConfig(g.caFile, g.serverName, g.serverID)
		if err != nil {
			// The file the command line (or RINGFENCE_CA_FILE) names is not a CA bundle.
			return nil, usageError{fmt.Errorf("--ca-file (RINGFENCE_CA_FILE): %w: give the CA bundle that signed the server's certificate (ringfence certs init writes ca.pem)", err)}
		}
		creds = credentials.NewTLS(tlsCfg)
	}
	conn, err := grpc.NewClient(target, append(opts, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(grpcserver.MaxResponseBytes)))...)
	if err != nil {
		return nil, fmt.Errorf("cannot reach %s: %w", g.addr, err)
	}
	g.conn = conn
	return conn, nil
}

// roundRobin spreads requests over every address a target resolves to (gRPC client-side
// balancing): the replicas behind a dns:/// name, or a static list.
const roundRobin = `{"loadBalancingConfig":[{"round_robin":{}}]}`

// balancedTarget reads --addr: one target (host:port, dns:///name:port, unix:path), or a
// comma-separated list of host:port, served by a resolver of its own. Either way requests are
// balanced round-robin over the addresses. host is the first address's host, for the
// plaintext-key warning.
func balancedTarget(addr, from string) (target string, opts []grpc.DialOption, host string, err error) {
	opts = []grpc.DialOption{grpc.WithDefaultServiceConfig(roundRobin)}
	if !strings.Contains(addr, ",") {
		host, err = addrHost(addr, from)
		return addr, opts, host, err
	}
	var state resolver.State
	for _, a := range strings.Split(addr, ",") {
		a = strings.TrimSpace(a)
		if strings.Contains(a, ":/") || strings.HasPrefix(a, "unix") {
			return "", nil, "", usagef("%s %q: a list takes host:port entries only, e.g. pool-1:50051,pool-2:50051 (or one dns:///name:port)", from, addr)
		}
		h, err := addrHost(a, from)
		if err != nil {
			return "", nil, "", err
		}
		if host == "" {
			host = h
		}
		// The certificate is checked against each address's own host.
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a, ServerName: h})
	}
	r := manual.NewBuilderWithScheme("ringfence-list")
	r.InitialState(state)
	// A request waits (within its deadline) for a replica that answers, instead of failing on
	// the first one found down.
	return r.Scheme() + ":///replicas", append(opts, grpc.WithResolvers(r), grpc.WithDefaultCallOptions(grpc.WaitForReady(true))), host, nil
}

// connect dials once and returns a request context with the API key and the deadline.
func (g *globals) connect(parent context.Context) (*grpc.ClientConn, context.Context, context.CancelFunc, error) {
	conn, err := g.dial()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := g.ctx(parent)
	return conn, ctx, cancel, nil
}

// registry is a RegistryService client and a request context.
func (g *globals) registry(parent context.Context) (registryv1.RegistryServiceClient, context.Context, context.CancelFunc, error) {
	conn, ctx, cancel, err := g.connect(parent)
	if err != nil {
		return nil, nil, nil, err
	}
	return registryv1.NewRegistryServiceClient(conn), ctx, cancel, nil
}

// keys is a KeyService client and a request context.
func (g *globals) keys(parent context.Context) (registryv1.KeyServiceClient, context.Context, context.CancelFunc, error) {
	conn, ctx, cancel, err := g.connect(parent)
	if err != nil {
		return nil, nil, nil, err
	}
	return registryv1.NewKeyServiceClient(conn), ctx, cancel, nil
}

// ctx is a request context with the API key, the request id and the deadline.
func (g *globals) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, g.timeout)
	return g.streamCtx(ctx), cancel
}

// listAll pages through a list RPC to its end and returns every item. Each page has a deadline
// of its own, so a long listing is not cut off by one --timeout for the whole. page fetches the
// page at token: its items and the next page's token ("" after the last).
func listAll[T any](g *globals, parent context.Context, page func(ctx context.Context, token string) ([]T, string, error)) ([]T, error) {
	var all []T
	for token := ""; ; {
		ctx, cancel := g.ctx(parent)
		items, next, err := page(ctx, token)
		cancel()
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		token = next
	}
}

// listPageSize is the page size a listing asks for: the servers' maximum.
const listPageSize = 1000

// streamCtx carries the API key and the request id without a deadline, for streams that run
// as long as the operator wants (audit tail, export).
func (g *globals) streamCtx(parent context.Context) context.Context {
	md := make([]string, 0, 4)
	if g.requestID != "" {
		md = append(md, grpcserver.RequestIDKey, g.requestID)
	}
	if g.apiKey != "" {
		md = append(md, auth.MetadataKey, g.apiKey)
	}
	if len(md) == 0 {
		return parent
	}
	return metadata.AppendToOutgoingContext(parent, md...)
}

// newRequestID is an invocation's request id: cli- and 12 hex digits.
func newRequestID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "cli-" + hex.EncodeToString(b)
}

// serviceForCommands says which binary of a split deployment serves which commands.
const serviceForCommands = "servers, secrets, keys and roles: ringfence-registry; graphs and mcp-import: ringfence-publisher; runs, call and documents: ringfence-pool; audit: ringfence-audit; backup: each binary, for its own files"

// unservedService names the gRPC service a server said it does not serve: in a split
// deployment, the CLI asked the wrong binary. A Ringfence listener says so in an ErrorInfo
// (reason SERVICE_NOT_SERVED, the service in its metadata); any other gRPC server, as grpc-go
// does, in the message "unknown service <name>", which no Ringfence handler writes.
func unservedService(st *status.Status) (string, bool) {
	if st.Code() != codes.Unimplemented {
		return "", false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "SERVICE_NOT_SERVED" {
			return info.GetMetadata()["service"], true
		}
	}
	return strings.CutPrefix(st.Message(), "unknown service ")
}

// hintedError is a server's error with what the command that got it knows to do about it.
type hintedError struct {
	err  error
	hint string
}

func (e *hintedError) Error() string { return e.err.Error() }
func (e *hintedError) Unwrap() error { return e.err }

// withHint attaches hint to err when the server answered with code.
func withHint(err error, code codes.Code, hint string) error {
	if status.Code(err) != code {
		return err
	}
	return &hintedError{err: err, hint: hint}
}

// connection is what printError needs to know of the attempt: where the CLI dialed, where
// that address came from, and whether --ca-file was set.
type connection struct {
	addr, addrFrom string
	usedTLS        bool
	timeout        time.Duration
	requestID      string
}

// adminKeyHint points a user who followed the README (which exports MCP_ADMIN_KEY for curl)
// at the variable the CLI reads.
func adminKeyHint() string {
	if os.Getenv("MCP_ADMIN_KEY") != "" && os.Getenv("RINGFENCE_API_KEY") == "" {
		return " (MCP_ADMIN_KEY is set, but the CLI reads RINGFENCE_API_KEY: export RINGFENCE_API_KEY=$MCP_ADMIN_KEY)"
	}
	return " (`make run` prints its admin key, ringfence-demo-admin-key)"
}

// printError renders an error for a person: the server's message, the field it names, and a
// hint for the common connection and credential mistakes.
func printError(w io.Writer, err error, c connection) {
	printStatus(w, err, c)
	// Last, under the hints: the id the server logged the request under.
	if st, ok := status.FromError(err); ok && answeredByServer(st) && c.requestID != "" && !strings.Contains(st.Message(), "request id") {
		fmt.Fprintf(w, "  request id: %s (the server's log line of the request has request_id=%s)\n", c.requestID, c.requestID)
	}
}

// answeredByServer says st is a server's answer rather than grpc-go's on this side (no
// connection, the CLI's own deadline or cancellation), so the server logged the request.
// Unavailable is left out whole: most of it is the connection's.
func answeredByServer(st *status.Status) bool {
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return false
	}
	return true
}

// printStatus is printError but for the request id.
func printStatus(w io.Writer, err error, c connection) {
	usedTLS := c.usedTLS
	var h *hintedError
	if errors.As(err, &h) {
		err = h.err
		defer fmt.Fprintf(w, "  hint: %s\n", h.hint)
	}
	st, ok := status.FromError(err)
	if !ok {
		// Multi-line on purpose (a usage line, an example), and written by the CLI; the
		// caller's text in it is escaped by the writer.
		fmt.Fprintf(w, "ringfence: %v\n", err)
		return
	}
	fmt.Fprintf(w, "ringfence: %s (%s)\n", oneLine(st.Message()), st.Code())
	serverFailed := false
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *typesv1.ServerFailure:
			serverFailed = true
			fmt.Fprintf(w, "  failure class: %s\n", oneLine(d.GetClass()))
			printTail(w, "  ", d.GetStderrTail())
		}
	}
	if svc, ok := unservedService(st); ok {
		fmt.Fprintf(w, "  hint: the server at --addr does not serve %s; in a split deployment point --addr at the service that does: %s\n", oneLine(svc), serviceForCommands)
	}
	switch st.Code() {
	case codes.Unavailable:
		// grpc-go's own "connection error" is about reaching --addr; any other message came
		// from the server, which is up and could not reach something behind it.
		switch msg := st.Message(); {
		// An MCP server that did not start or answer: its failure class, stderr and the
		// message above say what to change in its registration; no peer service is involved.
		case serverFailed:
		// grpc-go's resolver, before any connection: the host name does not resolve. (A
		// server that could not resolve a peer says so after a prefix of its own.) Under
		// round-robin balancing, which the CLI configures, a resolver that never produced an
		// address leaves the balancer with "no children to pick from".
		case strings.HasPrefix(msg, "name resolver error") || strings.HasPrefix(msg, "last resolver error") || msg == "no children to pick from":
			fmt.Fprintf(w, "  hint: the host of %s (%s) does not resolve: check its spelling, or point --addr or RINGFENCE_ADDR at the server's gRPC address\n", c.addr, c.addrFrom)
		case !strings.HasPrefix(msg, "connection error"):
			fmt.Fprintln(w, "  hint: the server at --addr answered; what it could not reach is named above: an MCP server or its authorization server (check the registration), or a peer service (check it and this server's peers.* settings)")
		// An HTTP/1 server (the REST port, most often) answers the HTTP/2 preface with an
		// HTTP/1 status line, which grpc-go reads as a frame header.
		case strings.Contains(msg, "looked like an HTTP/1.1 header"):
			fmt.Fprintf(w, "  hint: an HTTP/1 server answers at %s (%s), the REST port perhaps: the CLI speaks gRPC; point --addr or RINGFENCE_ADDR at the gRPC address (RINGFENCE_GRPC_ADDR, 127.0.0.1:50051 by default)\n", c.addr, c.addrFrom)
		// A TLS server closes the connection on a plaintext client's HTTP/2 preface, and a
		// plaintext server answers a TLS handshake with HTTP/2: neither is a server that is down.
		case !usedTLS && strings.Contains(msg, "error reading server preface"):
			fmt.Fprintln(w, "  hint: the server speaks TLS: pass --ca-file (RINGFENCE_CA_FILE) with the CA that signed its certificate")
		case usedTLS && strings.Contains(msg, "does not look like a TLS handshake"):
			fmt.Fprintln(w, "  hint: the server speaks plaintext: drop --ca-file (RINGFENCE_CA_FILE), or give the server a certificate")
		case strings.Contains(msg, "x509:"):
			fmt.Fprintln(w, "  hint: the server's certificate does not verify: --ca-file must be the CA that signed it, and --addr's host (or --server-name) one of the names it carries")
		case strings.Contains(msg, "ResumeRun then re-homes"):
			// The pool host that answered says which other host does not, and what to do.
		// A split binary's internal listener (RINGFENCE_INTERNAL_ADDR) takes services'
		// certificates only, never an API key: its TLS asks for a client certificate.
		case strings.Contains(msg, "certificate required"):
			fmt.Fprintf(w, "  hint: %s (%s) is a split binary's internal listener (RINGFENCE_INTERNAL_ADDR, for the other services, mutual TLS only): point --addr or RINGFENCE_ADDR at its gRPC address (RINGFENCE_GRPC_ADDR)\n", c.addr, c.addrFrom)
		case strings.Contains(msg, "expected peer identity"):
			fmt.Fprintln(w, "  hint: another service answers at --addr than --server-identity names: point --addr at that service, or fix --server-identity")
		default:
			fmt.Fprintf(w, "  hint: is the server running? nothing answers at %s (%s); start it (make run), or point --addr or RINGFENCE_ADDR at its gRPC address\n", c.addr, c.addrFrom)
		}
	case codes.DeadlineExceeded:
		switch {
		// grpc-go names the last connection error when there was one: nothing answered.
		case neverSent(st) && strings.HasPrefix(st.Message(), "latest balancer error: "):
			fmt.Fprintf(w, "  hint: no address of %s (%s) answered within --timeout %s, so the request was never sent: is the server running? start it (make run), or point --addr or RINGFENCE_ADDR at its gRPC address\n", c.addr, c.addrFrom, c.timeout)
		case neverSent(st):
			fmt.Fprintf(w, "  hint: no connection to %s (%s) was ready within --timeout %s, so the request was never sent: a longer --timeout waits longer\n", c.addr, c.addrFrom, c.timeout)
		// The CLI's own deadline (a server's deadline says more than this).
		case st.Message() == "context deadline exceeded" && c.timeout > 0:
			fmt.Fprintf(w, "  hint: the server did not answer within --timeout %s: a longer --timeout waits longer\n", c.timeout)
		}
	case codes.PermissionDenied:
		if strings.Contains(st.Message(), "which role") {
			fmt.Fprintln(w, "  hint: use a key whose role holds that permission: `ringfence roles check` lists the roles and their permissions, and an admin mints a key with `ringfence keys create --name NAME --role ROLE`")
		}
	case codes.Unauthenticated:
		if strings.Contains(st.Message(), "missing") {
			fmt.Fprintf(w, "  hint: pass --api-key or set RINGFENCE_API_KEY%s\n", adminKeyHint())
		} else {
			fmt.Fprintln(w, "  hint: the key is unknown or revoked: check --api-key or RINGFENCE_API_KEY (`make run` prints its admin key); `ringfence keys list` (as an admin) shows active keys")
		}
	}
}

// neverSent says whether a request's deadline expired in grpc-go's picker, before any
// connection was ready to carry it: with a list of addresses (--addr a:1,b:2) the CLI waits
// for a replica that answers, and when none does within --timeout, nothing reached a server.
func neverSent(st *status.Status) bool {
	msg := st.Message()
	return st.Code() == codes.DeadlineExceeded &&
		(strings.HasPrefix(msg, "latest balancer error: ") || strings.HasSuffix(msg, " while waiting for connections to become ready"))
}

// printTail prints a server's stderr tail, indented under its heading, one escaped line per
// line the server wrote.
func printTail(w io.Writer, indent, tail string) {
	tail = strings.TrimSpace(tail)
	if tail == "" {
		return
	}
	fmt.Fprintf(w, "%sserver stderr (tail, secrets redacted):\n", indent)
	for _, line := range strings.Split(tail, "\n") {
		fmt.Fprintf(w, "%s  %s\n", indent, oneLine(line))
	}
}
