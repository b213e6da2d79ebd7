package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/shlex"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/config"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate/capability"
)

// serverFlags are the registration flags of `servers add` and `servers update` (the seed's
// flags, plus env, grants and filters).
type serverFlags struct {
	transport      string
	command        string
	args           []string
	url            string
	description    string
	headerSecrets  []string
	env            []string
	clearEnv       bool
	clearHeaders   bool
	grants         []string
	includeTools   []string
	excludeTools   []string
	toolPerms      []string
	sessionTimeout time.Duration
	callTimeout    time.Duration
	keepMarkup     bool
	strictInputs   bool
	prewarm        int
	maxResult      string
	// Sign-in (oauth): the client, its secret's name, the scopes, the authorization server.
	oauthOn        bool
	oauthClientID  string
	oauthSecretRef string
	oauthScopes    []string
	oauthIssuer    string
	clearOAuth     bool
}

func (f *serverFlags) register(cmd *cobra.Command, update bool) {
	fl := cmd.Flags()
	transportHelp, urlHelp := "stdio, streamable_http (or http, streamable-http) or sse (or http-sse)", "server URL, for streamable_http and sse: https (http only to loopback); shown with query values masked"
	if !update {
		transportHelp, urlHelp = addTransportHelp, urlHelp+"; needs --transport"
	}
	fl.StringVarP(&f.transport, "transport", "t", "", transportHelp)
	fl.StringVar(&f.command, "command", "", `command to run inside the isolation image, split as a shell would, e.g. "mcp-server-filesystem /srv/docs"`)
	fl.StringArrayVar(&f.args, "arg", nil, "one more argument, appended after those in --command (repeatable)")
	fl.StringVar(&f.url, "url", "", urlHelp)
	fl.StringVar(&f.description, "description", "", "what the server is for")
	fl.StringArrayVar(&f.headerSecrets, "header-secret", nil, "HEADER=SECRET: send HEADER with the value of the registry secret SECRET (repeatable)")
	fl.StringArrayVar(&f.env, "env", nil, "KEY=VALUE for the server's environment, or KEY alone to take the value from this shell's $KEY (keeps secrets out of ps and history); KEY must be on the operator's allowlist (repeatable)")
	fl.StringArrayVar(&f.grants, "grant", nil, "a capability graphs may declare on this server's tools, e.g. process_spawn (repeatable)")
	fl.StringArrayVar(&f.includeTools, "include-tool", nil, "expose only these tools (repeatable)")
	fl.StringArrayVar(&f.excludeTools, "exclude-tool", nil, "never expose this tool; wins over --include-tool (repeatable)")
	fl.StringArrayVar(&f.toolPerms, "tool-permission", nil, `TOOL=CAPABILITY an agent must hold to call TOOL, scoped by an argument, e.g. "read_file=fs.read:{path}" (repeatable)`)
	fl.DurationVar(&f.sessionTimeout, "session-timeout", 0, "bound on MCP client setup: initialize and the first tools/list (default 2s)")
	fl.DurationVar(&f.callTimeout, "call-timeout", 0, "bound on one tool call (default 30s)")
	fl.BoolVar(&f.keepMarkup, "keep-markup", false, "do not HTML-escape the server's tool results")
	fl.BoolVar(&f.strictInputs, "strict-inputs", false, "refuse arguments a tool's input schema does not declare, even where the schema would allow them")
	fl.IntVar(&f.prewarm, "prewarm", 0, fmt.Sprintf("warm containers the pool keeps ready for this server's next runs, each serving one run (stdio only, 0 to %d; the pool caps them all with pool.max_warm)", mcpserver.MaxPrewarm))
	fl.StringVar(&f.maxResult, "max-result-bytes", "", "bound on one tool result as the server writes it, e.g. 4MiB (1KiB to 32MiB; 0 or omitted: 16MiB); a larger result fails its call as result_too_large")
	fl.BoolVar(&f.oauthOn, "oauth", false, "sign each user in with OAuth (remote servers); without --oauth-client-id the pool uses its client ID metadata document where the authorization server accepts one, else registers itself there (RFC 7591); any --oauth-* flag implies it")
	fl.StringVar(&f.oauthClientID, "oauth-client-id", "", "a client the authorization server's operator registered for Ringfence, whose redirect URI is the pool's /v1/oauth/callback (empty on update: the pool's own client instead)")
	fl.StringVar(&f.oauthSecretRef, "oauth-client-secret-ref", "", "the registry secret holding that client's secret (never the secret itself; omit for a public client; needs --oauth-client-id and --oauth-authorization-server)")
	fl.StringArrayVar(&f.oauthScopes, "oauth-scope", nil, "a scope asked for at sign-in (repeatable; none: those the server's metadata names)")
	fl.StringVar(&f.oauthIssuer, "oauth-authorization-server", "", "the authorization server's issuer URL (default: discovered from the server's protected resource metadata)")
	if update {
		fl.BoolVar(&f.clearOAuth, "clear-oauth", false, "stop signing users in (drops every user's connection)")
		fl.BoolVar(&f.clearEnv, "clear-env", false, "remove every env value (without --env and --clear-env the stored env is kept)")
		fl.BoolVar(&f.clearHeaders, "clear-headers", false, "remove every header (--header-secret replaces them all)")
	}
}

const addTransportHelp = "stdio, streamable_http (or http, streamable-http) or sse (or http-sse); stdio when omitted, except that --url requires it"

// transportFor is the transport the flags name. --url with the stdio default would be refused
// for a missing command, which hides the mistake, so --url requires an explicit --transport
// rather than picking one of the two remote transports for the user.
func (f *serverFlags) transportFor() (string, error) {
	switch {
	case f.transport != "":
		return mcpserver.NormalizeTransport(f.transport), nil
	case f.url != "":
		return "", usagef("--url needs --transport streamable_http (or sse): without --transport the server is stdio, run from --command")
	}
	return "stdio", nil
}

// createRequest is the registration the flags describe.
func (f *serverFlags) createRequest(ref string) (*registryv1.CreateServerRequest, error) {
	transport, err := f.transportFor()
	if err != nil {
		return nil, err
	}
	if f.prewarm < 0 || f.prewarm > mcpserver.MaxPrewarm {
		return nil, usagef("--prewarm must be between 0 and %d", mcpserver.MaxPrewarm)
	}
	req := &registryv1.CreateServerRequest{Ref: ref, Transport: transport, Url: f.url, Description: f.description, KeepMarkup: f.keepMarkup,
		StrictInputs: f.strictInputs, Prewarm: int32(f.prewarm)}
	if req.Command, req.Args, err = splitCommand(f.command, f.args); err != nil {
		return nil, err
	}
	if req.Headers, err = parsePairs("--header-secret", f.headerSecrets, nil); err != nil {
		return nil, err
	}
	if req.Env, err = envStruct(f.env); err != nil {
		return nil, err
	}
	req.Grants = f.grants
	req.ToolFilter = &registryv1.ToolFilter{Include: f.includeTools, Exclude: f.excludeTools}
	if req.ToolPermissions, err = toolPermissions(f.toolPerms); err != nil {
		return nil, err
	}
	req.ClientSessionTimeout = optDuration(f.sessionTimeout)
	req.ToolCallTimeout = optDuration(f.callTimeout)
	if req.MaxResultBytes, err = f.maxResultBytes(); err != nil {
		return nil, err
	}
	req.Oauth = f.oauth(nil, f.oauthGiven)
	return req, nil
}

// oauthGiven says whether the --oauth-* flag name has a value (a new registration's flags).
func (f *serverFlags) oauthGiven(name string) bool {
	switch name {
	case "oauth-client-id":
		return f.oauthClientID != ""
	case "oauth-client-secret-ref":
		return f.oauthSecretRef != ""
	case "oauth-scope":
		return len(f.oauthScopes) > 0
	case "oauth-authorization-server":
		return f.oauthIssuer != ""
	}
	return false
}

// oauth is the sign-in the flags describe over cur (the stored one, on update), taking the
// flags changed says were given; nil when there is none.
func (f *serverFlags) oauth(cur *registryv1.OAuthSignIn, changed func(string) bool) *registryv1.OAuthSignIn {
	if f.clearOAuth {
		return nil
	}
	if cur == nil && !f.oauthOn && !slices.ContainsFunc([]string{"oauth-client-id", "oauth-client-secret-ref", "oauth-scope", "oauth-authorization-server"}, changed) {
		return nil
	}
	out := &registryv1.OAuthSignIn{}
	if cur != nil {
		out = &registryv1.OAuthSignIn{AuthorizationServer: cur.GetAuthorizationServer(), ClientId: cur.GetClientId(),
			ClientSecretRef: cur.GetClientSecretRef(), Scopes: cur.GetScopes()}
	}
	if changed("oauth-client-id") {
		out.ClientId = f.oauthClientID
	}
	if changed("oauth-client-secret-ref") {
		out.ClientSecretRef = f.oauthSecretRef
	}
	if changed("oauth-scope") {
		out.Scopes = f.oauthScopes
	}
	if changed("oauth-authorization-server") {
		out.AuthorizationServer = f.oauthIssuer
	}
	return out
}

// maxResultBytes is --max-result-bytes in bytes (0 when omitted: the default).
func (f *serverFlags) maxResultBytes() (int64, error) {
	if f.maxResult == "" {
		return 0, nil
	}
	n, err := config.ParseByteSize(f.maxResult)
	if err != nil {
		return 0, usagef("--max-result-bytes %q: %v", f.maxResult, err)
	}
	return int64(n), nil
}

// registerAdhoc registers the flags that describe a server to explore without registering it.
func (f *serverFlags) registerAdhoc(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVarP(&f.transport, "transport", "t", "", addTransportHelp)
	fl.StringVar(&f.command, "command", "", `explore an ad-hoc server running this command inside the isolation image, split as a shell would`)
	fl.StringArrayVar(&f.args, "arg", nil, "one more argument, appended after those in --command (repeatable)")
	fl.StringVar(&f.url, "url", "", "explore an ad-hoc server at this URL (streamable_http or sse); needs --transport")
	fl.StringArrayVar(&f.headerSecrets, "header-secret", nil, "HEADER=SECRET for the ad-hoc server (repeatable)")
	fl.StringArrayVar(&f.env, "env", nil, "KEY=VALUE for the ad-hoc server's environment, or KEY alone to take the value from this shell's $KEY; KEY must be on the allowlist (repeatable)")
	fl.DurationVar(&f.sessionTimeout, "session-timeout", 0, "bound on MCP client setup: initialize and the first tools/list (default 2s)")
	fl.DurationVar(&f.callTimeout, "call-timeout", 0, "bound on the call (default 30s)")
	fl.BoolVar(&f.keepMarkup, "keep-markup", false, "do not HTML-escape the call's result")
	fl.BoolVar(&f.strictInputs, "strict-inputs", false, "refuse call arguments the tool's input schema does not declare")
}

func newServersCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "servers",
		Aliases: []string{"server", "mcp-servers"},
		Short:   "Register and inspect MCP servers (needs mcp:admin)",
	}
	cmd.AddCommand(newServersAddCmd(g), newServersUpdateCmd(g), newServersListCmd(g), newServersConnectCmd(g),
		newServersShowCmd(g), newServersRemoveCmd(g), newServersToolsCmd(g), newServersExploreCmd(g))
	return cmd
}

func newServersAddCmd(g *globals) *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "add [REF]",
		Short: "Register an MCP server (spawns nothing)",
		Example: `  ringfence servers add docs-search --command "mcp-server-filesystem /srv/docs" \
      --grant process_spawn --grant external_api_call
  ringfence servers add tickets --transport http --url https://mcp.example.com/mcp \
      --description "The support team's ticket system" --header-secret Authorization=tickets-token \
      --grant process_spawn --grant external_api_call`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref := ""
			if len(args) == 1 {
				ref = args[0]
			}
			var err error
			if ref == "" {
				if ref, err = g.prompt("server ref (e.g. docs-search)", "pass it first: ringfence servers add REF ..."); err != nil {
					return err
				}
			}
			transport, err := f.transportFor()
			if err != nil {
				return err
			}
			if transport == "stdio" && f.command == "" {
				if f.command, err = g.prompt("command to run inside the isolation image", "pass --command, e.g. --command 'docs-mcp --root /srv/docs'; a remote server takes --transport http --url URL instead"); err != nil {
					return err
				}
			}
			req, err := f.createRequest(ref)
			if err != nil {
				return err
			}
			warnGrantTypos(g.stderr, f.grants)

			client, ctx, cancel, err := g.registry(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.CreateServer(ctx, req)
			if err != nil {
				return withHint(err, codes.AlreadyExists, fmt.Sprintf("%q is already registered: `ringfence servers update %s` changes it (flags you do not pass keep their values); `ringfence servers show %s` shows it", ref, ref, ref))
			}
			if err := g.printServer(resp.GetServer()); err != nil {
				return err
			}
			// Only once registered: a refused add changed nothing to warn about.
			warnBelowFloor(g.stderr, ref, resp.GetServer().GetTransport(), resp.GetServer().GetGrants())
			return nil
		},
	}
	f.register(cmd, false)
	return cmd
}

func newServersUpdateCmd(g *globals) *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "update REF",
		Short: "Change a registration; flags you do not pass keep their stored values",
		Long: `update reads the registration, applies the flags you pass, and writes it back with its
revision, so a concurrent change is refused rather than overwritten. Repeatable flags you pass
replace the stored list. Without --env or --clear-env the stored env is kept.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Without a flag the update would only write a new revision (and an audit record)
			// of what is stored.
			passed := false
			cmd.LocalNonPersistentFlags().VisitAll(func(fl *pflag.Flag) { passed = passed || fl.Changed })
			if !passed {
				return usagef("nothing to change: pass the settings to change, e.g. ringfence servers update %s --description TEXT (ringfence servers update --help lists them; ringfence servers show %[1]s shows the registration)", oneLine(args[0]))
			}
			client, ctx, cancel, err := g.registry(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			cur, err := client.GetServer(ctx, &registryv1.GetServerRequest{Ref: args[0]})
			if err != nil {
				return err
			}
			s := cur.GetServer()
			req := &registryv1.UpdateServerRequest{
				Ref: s.GetRef(), Description: s.GetDescription(), Transport: s.GetTransport(),
				Command: s.GetCommand(), Args: s.GetArgs(), Url: s.GetUrl(), Headers: s.GetHeaders(),
				Grants: s.GetGrants(), ToolFilter: s.GetToolFilter(), ToolPermissions: s.GetToolPermissions(),
				ClientSessionTimeout: s.GetClientSessionTimeout(), ToolCallTimeout: s.GetToolCallTimeout(),
				KeepMarkup: s.GetKeepMarkup(), StrictInputs: s.GetStrictInputs(), Prewarm: s.GetPrewarm(), MaxResultBytes: s.GetMaxResultBytes(),
				Revision: s.GetRevision(),
			}
			changed := cmd.Flags().Changed
			// The stored sign-in is kept unless a flag changes it: an update that forgot it would
			// drop every user's connection.
			req.Oauth = f.oauth(s.GetOauth(), changed)
			if changed("transport") {
				req.Transport = mcpserver.NormalizeTransport(f.transport)
				// What only the other kind of transport takes is dropped, so one update
				// switches a server over; flags passed below set the new side's fields.
				isStdio := func(t string) bool { return t == "" || t == "stdio" }
				switch {
				case isStdio(req.Transport) && !isStdio(s.GetTransport()):
					req.Url, req.Headers = "", nil
				case !isStdio(req.Transport) && isStdio(s.GetTransport()):
					req.Command, req.Args = "", nil
					req.Env = &structpb.Struct{Fields: map[string]*structpb.Value{}}
				}
			}
			if changed("command") || changed("arg") {
				if req.Command, req.Args, err = splitCommand(f.command, f.args); err != nil {
					return err
				}
			}
			if changed("url") {
				req.Url = f.url
			}
			if changed("description") {
				req.Description = f.description
			}
			switch {
			case changed("header-secret") && f.clearHeaders:
				return usagef("--header-secret and --clear-headers contradict each other")
			case changed("header-secret"):
				if req.Headers, err = parsePairs("--header-secret", f.headerSecrets, nil); err != nil {
					return err
				}
			case f.clearHeaders:
				req.Headers = nil
			}
			switch {
			case changed("env") && f.clearEnv:
				return usagef("--env and --clear-env contradict each other")
			case changed("env"):
				if req.Env, err = envStruct(f.env); err != nil {
					return err
				}
			case f.clearEnv:
				req.Env = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			}
			if changed("grant") {
				req.Grants = f.grants
				warnGrantTypos(g.stderr, f.grants)
			}
			if changed("include-tool") || changed("exclude-tool") {
				req.ToolFilter = &registryv1.ToolFilter{Include: req.GetToolFilter().GetInclude(), Exclude: req.GetToolFilter().GetExclude()}
				if changed("include-tool") {
					req.ToolFilter.Include = f.includeTools
				}
				if changed("exclude-tool") {
					req.ToolFilter.Exclude = f.excludeTools
				}
			}
			if changed("tool-permission") {
				if req.ToolPermissions, err = toolPermissions(f.toolPerms); err != nil {
					return err
				}
			}
			if changed("session-timeout") {
				req.ClientSessionTimeout = optDuration(f.sessionTimeout)
			}
			if changed("call-timeout") {
				req.ToolCallTimeout = optDuration(f.callTimeout)
			}
			if changed("keep-markup") {
				req.KeepMarkup = f.keepMarkup
			}
			if changed("strict-inputs") {
				req.StrictInputs = f.strictInputs
			}
			if changed("prewarm") {
				if f.prewarm < 0 || f.prewarm > mcpserver.MaxPrewarm {
					return usagef("--prewarm must be between 0 and %d", mcpserver.MaxPrewarm)
				}
				req.Prewarm = int32(f.prewarm)
			}
			if changed("max-result-bytes") {
				if req.MaxResultBytes, err = f.maxResultBytes(); err != nil {
					return err
				}
			}
			resp, err := client.UpdateServer(ctx, req)
			if err != nil {
				return err
			}
			for _, w := range resp.GetWarnings() {
				writef(g.stderr, "warning: %s\n", w)
			}
			return g.printServer(resp.GetServer())
		},
	}
	f.register(cmd, true)
	return cmd
}

func newServersListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List registered servers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.dial()
			if err != nil {
				return err
			}
			client := registryv1.NewRegistryServiceClient(conn)
			servers, err := listAll(g, cmd.Context(), func(ctx context.Context, token string) ([]*registryv1.Server, string, error) {
				resp, err := client.ListServers(ctx, &registryv1.ListServersRequest{PageToken: token, PageSize: listPageSize})
				return resp.GetServers(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			all := &registryv1.ListServersResponse{Servers: servers}
			for i, s := range all.Servers {
				all.Servers[i] = maskedServer(s)
			}
			if g.output == "json" {
				return printJSON(g.stdout, all)
			}
			t := newTable(g.stdout, "REF", "TRANSPORT", "TARGET", "GRANTS", "ENV", "WARM", "REVISION")
			for _, s := range all.GetServers() {
				t.row(s.GetRef(), s.GetTransport(), truncate(target(s), 48), orDash(strings.Join(s.GetGrants(), ",")),
					orDash(strings.Join(slices.Sorted(maps.Keys(s.GetEnv())), ",")), warmColumn(s), fmt.Sprint(s.GetRevision()))
			}
			return t.flush()
		},
	}
}

func newServersShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show REF",
		Short: "Show one registration (env values masked)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, cancel, err := g.registry(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.GetServer(ctx, &registryv1.GetServerRequest{Ref: args[0]})
			if err != nil {
				return err
			}
			return g.printServer(resp.GetServer())
		},
	}
}

func newServersRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "remove REF",
		Aliases: []string{"rm", "delete"},
		Short:   "Remove a registration; graphs that reference it fail closed at run time",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, cancel, err := g.registry(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			if _, err := client.DeleteServer(ctx, &registryv1.DeleteServerRequest{Ref: args[0]}); err != nil {
				return err
			}
			if g.output == "json" {
				return printFields(g.stdout, "removed", args[0])
			}
			_, err = linef(g.stdout, "removed %s\n", args[0])
			return err
		},
	}
}

func newServersToolsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "tools REF",
		Short: "Start the server in isolation, list its tools with their pins and screen findings, stop it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, cancel, err := g.registry(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			stop := g.waitNote("%s to start and list its tools", args[0])
			resp, err := client.ListServerTools(ctx, &registryv1.ListServerToolsRequest{Ref: args[0]})
			stop()
			if err != nil {
				return err
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp)
			}
			t := newTable(g.stdout, "TOOL", "SCHEMA HASH", "FINDINGS", "REQUIRES", "DESCRIPTION")
			for _, tool := range resp.GetTools() {
				name := tool.GetName()
				if tool.GetExcluded() {
					name += " (excluded)"
				}
				var codes []string
				for _, f := range tool.GetFindings() {
					codes = append(codes, f.GetCode())
				}
				t.row(name, tool.GetSchemaHash(), orDash(strings.Join(codes, ",")),
					orDash(strings.Join(tool.GetRequiredCapabilities(), ",")), truncate(tool.GetDescription(), 60))
			}
			if err := t.flush(); err != nil {
				return err
			}
			for _, f := range resp.GetListingFindings() {
				writef(g.stdout, "listing %s: %s: %s\n", f.GetSeverity(), f.GetCode(), oneLine(f.GetMessage()))
			}
			return nil
		},
	}
}

func newServersExploreCmd(g *globals) *cobra.Command {
	var callTool, callArgs string
	var adhoc serverFlags
	cmd := &cobra.Command{
		Use:   "explore [REF] [--command CMD | --url URL] [--call TOOL --args JSON]",
		Short: "Start a registered server (or an ad-hoc one: --command or --url) in isolation and print each tool in full; --call then calls one tool (exit 3 when refused, 4 when it failed). Nothing is stored",
		Example: `  ringfence servers explore docs-search
  ringfence servers explore docs-search --call search_docs --args '{"query":"leave"}'
  ringfence servers explore --command "mcp-server-filesystem /srv/docs" --call list_directory --args '{"path":"/srv/docs"}'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			isAdhoc := adhoc.command != "" || adhoc.url != ""
			ref := "adhoc"
			switch {
			case len(args) == 1:
				ref = args[0]
			case !isAdhoc:
				return usagef("name a registered server (REF), or describe an ad-hoc one with --command or --url")
			}
			req := &registryv1.ExploreServerRequest{Ref: ref}
			if isAdhoc {
				spec, err := adhoc.createRequest("")
				if err != nil {
					return err
				}
				req.Server = spec
			}
			if callTool != "" {
				st, err := parseArgs(callArgs)
				if err != nil {
					return err
				}
				// The call's id is chosen here rather than by the pool, so a call that gets no
				// answer can still be named: it is how its records are found in the audit log.
				req.Call = &typesv1.ExploreCall{Tool: callTool, Arguments: st, CallId: newID("call-")}
			} else if cmd.Flags().Changed("args") {
				return usagef("--args needs --call TOOL")
			}
			client, ctx, cancel, err := g.registry(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			stop := g.waitNote("the server to start and answer")
			resp, err := client.ExploreServer(ctx, req)
			stop()
			if err != nil && req.Call != nil && status.Code(err) == codes.DeadlineExceeded && !neverSent(status.Convert(err)) {
				return &exitError{code: ExitFailed, msg: g.unknownExploreOutcome(ref, req.Call)}
			}
			if err != nil {
				return err
			}
			if g.output == "json" {
				if err := printJSON(g.stdout, resp); err != nil {
					return err
				}
			} else {
				g.printExplored(resp)
			}
			return exploreCallExit(resp.GetCall())
		},
	}
	cmd.Flags().StringVar(&callTool, "call", "", "after listing, call this tool (the server's own name for it)")
	cmd.Flags().StringVar(&callArgs, "args", "{}", "the call's arguments as a JSON object")
	adhoc.registerAdhoc(cmd)
	return cmd
}

func (g *globals) printExplored(resp *registryv1.ExploreServerResponse) {
	for i, tool := range resp.GetTools() {
		if i > 0 {
			fmt.Fprintln(g.stdout)
		}
		name := tool.GetName()
		if tool.GetExcluded() {
			name += " (excluded by the registration's tool_filter)"
		}
		writef(g.stdout, "%s\n  pin: %s\n", oneLine(name), tool.GetSchemaHash())
		if tool.GetTitle() != "" {
			writef(g.stdout, "  title: %s\n", oneLine(tool.GetTitle()))
		}
		writef(g.stdout, "  description: %s\n", oneLine(tool.GetDescription()))
		printStruct(g, "input schema", tool.GetInputSchema())
		printStruct(g, "output schema", tool.GetOutputSchema())
		printStruct(g, "annotations", tool.GetAnnotations())
		for _, f := range tool.GetFindings() {
			writef(g.stdout, "  %s %s at %s: %s\n", f.GetSeverity(), f.GetCode(), oneLine(f.GetLocation()), oneLine(f.GetMessage()))
		}
	}
	for _, f := range resp.GetListingFindings() {
		writef(g.stdout, "listing %s: %s: %s\n", f.GetSeverity(), f.GetCode(), oneLine(f.GetMessage()))
	}
	c := resp.GetCall()
	if c == nil || c.GetOutcome() != "dispatched" {
		return
	}
	writef(g.stdout, "\ncall %s: dispatched: %s\n", c.GetCallId(), c.GetResult())
	g.printToolResult(c.GetContent(), c.GetStructuredContent())
}

// unknownExploreOutcome says what an explore call that got no answer within --timeout may
// have done, as unknownOutcome does for a run's call. The pool makes the call's run
// (explore-…) and only its answer names it, but the call's id is the one the CLI sent
// (ExploreCall.call_id), which finds the call's records: random as generated call ids are, it
// is no other call's, in any run.
func (g *globals) unknownExploreOutcome(ref string, call *typesv1.ExploreCall) string {
	server := ref
	if server == "" {
		server = "the ad-hoc server"
	}
	id := oneLine(call.GetCallId())
	return fmt.Sprintf(`the explore call's outcome is unknown: no answer within --timeout %s
if %s was listed in time, the call to %s may have reached it and taken effect
look up call %s before calling again: ringfence audit list --call %s (needs audit:read)
%s
a longer --timeout waits for a slow start or a slow tool`, g.timeout, oneLine(server), oneLine(call.GetTool()), id, id, attemptLegend)
}

// exploreCallExit turns an explore call's outcome into the exit codes of `runs call`.
func exploreCallExit(c *typesv1.ExploreCallResult) error {
	switch {
	case c == nil:
		return nil
	case c.GetOutcome() == "refused_before_dispatch":
		return &exitError{code: ExitRefused, msg: sprintLine("call %s refused before dispatch (%s): %s\nnothing reached the server (its record: ringfence audit list --call %s)", c.GetCallId(), c.GetReason(), c.GetMessage(), c.GetCallId())}
	case c.GetResult() == "failed":
		msg := c.GetMessage()
		if msg == "" {
			msg = "the tool reported an error"
		}
		return &exitError{code: ExitFailed, msg: sprintLine("call %s dispatched and failed (%s): %s\nthe call reached the server and may have taken effect (its records: ringfence audit list --call %s)", c.GetCallId(), c.GetFailureClass(), msg, c.GetCallId())}
	}
	return nil
}

func printStruct(g *globals, label string, s *structpb.Struct) {
	if s == nil {
		return
	}
	b, err := json.MarshalIndent(s.AsMap(), "    ", "  ")
	if err != nil {
		return
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		lines[i] = oneLine(l) // JSON escapes C0 itself, but not C1 or format characters
	}
	fmt.Fprintf(g.stdout, "  %s:\n    %s\n", label, strings.Join(lines, "\n"))
}

// signInLine says how a server signs its users in, naming the client's secret, never holding it.
func signInLine(o *registryv1.OAuthSignIn) string {
	if o == nil {
		return "-"
	}
	parts := []string{"oauth client " + o.GetClientId()}
	if o.GetClientId() == "" {
		parts[0] = "oauth client of the pool's own (its client ID metadata document, or registered dynamically)"
	}
	if o.GetClientSecretRef() != "" {
		parts = append(parts, "secret <- secret "+o.GetClientSecretRef())
	}
	if len(o.GetScopes()) > 0 {
		parts = append(parts, "scopes "+strings.Join(o.GetScopes(), " "))
	}
	if o.GetAuthorizationServer() != "" {
		parts = append(parts, "authorization server "+o.GetAuthorizationServer())
	}
	if o.GetCallbackUrl() != "" {
		parts = append(parts, "callback "+o.GetCallbackUrl())
	}
	return strings.Join(parts, "; ")
}

func (g *globals) printServer(s *registryv1.Server) error {
	s = maskedServer(s)
	if g.output == "json" {
		return printJSON(g.stdout, s)
	}
	env := make([]string, 0, len(s.GetEnv()))
	for _, k := range slices.Sorted(maps.Keys(s.GetEnv())) {
		env = append(env, k+"="+s.GetEnv()[k])
	}
	headers := make([]string, 0, len(s.GetHeaders()))
	for _, k := range slices.Sorted(maps.Keys(s.GetHeaders())) {
		headers = append(headers, k+" <- secret "+s.GetHeaders()[k])
	}
	perms := make([]string, 0, len(s.GetToolPermissions()))
	for _, k := range slices.Sorted(maps.Keys(s.GetToolPermissions())) {
		perms = append(perms, k+": "+strings.Join(s.GetToolPermissions()[k].GetRequired(), ","))
	}
	return kv(g.stdout,
		"ref", s.GetRef(),
		"description", orDash(s.GetDescription()),
		"transport", s.GetTransport(),
		"target", orDash(target(s)),
		"env", orDash(strings.Join(env, " ")),
		"headers", orDash(strings.Join(headers, "; ")),
		"grants", orDash(strings.Join(s.GetGrants(), ", ")),
		"include tools", orDash(strings.Join(s.GetToolFilter().GetInclude(), ", ")),
		"exclude tools", orDash(strings.Join(s.GetToolFilter().GetExclude(), ", ")),
		"tool permissions", orDash(strings.Join(perms, "; ")),
		"sign-in", signInLine(s.GetOauth()),
		"strict inputs", fmt.Sprint(s.GetStrictInputs()),
		"keep markup", fmt.Sprint(s.GetKeepMarkup()),
		"session timeout", timeoutLine(s.GetClientSessionTimeout(), mcpserver.DefaultClientSessionTimeout),
		"call timeout", timeoutLine(s.GetToolCallTimeout(), mcpserver.DefaultToolCallTimeout),
		"prewarm", warmLine(s),
		"max result", maxResult(s.GetMaxResultBytes()),
		"revision", fmt.Sprint(s.GetRevision()),
		"updated", ts(s.GetUpdateTime()),
	)
}

// warmLine says how many warm containers a registration asks for and, when the registry could
// ask the pool, how many are ready and starting.
func warmLine(s *registryv1.Server) string {
	switch {
	case s.GetPrewarm() == 0:
		return "0"
	case s.GetWarm() == nil:
		return fmt.Sprintf("%d (the pool's warm containers are unknown: it could not be asked)", s.GetPrewarm())
	}
	return fmt.Sprintf("%d (ready %d, starting %d)", s.GetPrewarm(), s.GetWarm().GetReady(), s.GetWarm().GetStarting())
}

// warmColumn is a registration's warm containers in a listing: ready/prewarm, ?/prewarm when
// the pool could not be asked, - when it asks for none.
func warmColumn(s *registryv1.Server) string {
	switch {
	case s.GetPrewarm() == 0:
		return "-"
	case s.GetWarm() == nil:
		return fmt.Sprintf("?/%d", s.GetPrewarm())
	}
	return fmt.Sprintf("%d/%d", s.GetWarm().GetReady(), s.GetPrewarm())
}

// timeoutLine renders a registration's timeout: unset is the default, named as such.
func timeoutLine(d *durationpb.Duration, def time.Duration) string {
	if d == nil || d.AsDuration() == 0 {
		return def.String() + " (default)"
	}
	return d.AsDuration().String()
}

// maxResult renders a registration's max_result_bytes.
func maxResult(n int64) string {
	if n == 0 {
		return config.ByteSize(mcpserver.DefaultMaxResultBytes).String() + " (default)"
	}
	return config.ByteSize(n).String()
}

// maskedServer is s with its URL's query values masked. The registry already masks them; the
// CLI masks again so that a registry from before URL masking cannot put a credential on a
// terminal or in a script's output. s is not modified.
func maskedServer(s *registryv1.Server) *registryv1.Server {
	if masked := mcpserver.MaskURL(s.GetUrl()); masked != s.GetUrl() {
		s = proto.CloneOf(s)
		s.Url = masked
	}
	return s
}

func target(s *registryv1.Server) string {
	if s.GetTransport() == "stdio" || s.GetTransport() == "" {
		return strings.TrimSpace(s.GetCommand() + " " + strings.Join(s.GetArgs(), " "))
	}
	return s.GetUrl()
}

// warnGrantTypos warns about grants within edit distance 2 of a floor capability. Grants are
// free-form, so "proces_spawn" is stored as written; without a word here the mistake surfaces
// only later, as an import or publish refused for the missing floor.
func warnGrantTypos(w io.Writer, grants []string) {
	for _, grant := range grants {
		if floor, ok := capability.NearFloor(grant); ok {
			writef(w, "warning: --grant %s is not a floor capability; did you mean %s? (granted as written)\n", grant, floor)
		}
	}
}

// warnBelowFloor says, when a registration is added, that grants short of the floor make
// every later mcp-import of it refuse: registering works, and the surprise would come later.
// A remote server is told why the floor applies to it too.
func warnBelowFloor(w io.Writer, ref, transport string, grants []string) {
	var missing []string
	for _, f := range capability.Floor {
		if !slices.Contains(grants, f) {
			missing = append(missing, f)
		}
	}
	if len(missing) == 0 {
		return
	}
	// update replaces the list it is given, so the later fix names every grant.
	all := ""
	for _, g := range append(slices.Clone(grants), missing...) {
		all += " --grant " + g
	}
	why := ""
	if transport != "" && transport != "stdio" {
		why = remoteFloor
	}
	writef(w, "warning: %s does not grant %s, which every imported tool needs: mcp-import will refuse it until it does (ringfence servers update %s%s)%s\n",
		ref, strings.Join(missing, " and "), ref, all, why)
}

// remoteFloor says why a remote server needs the floor's grants, which read as if they were
// about a local process.
const remoteFloor = "; the floor is the same for a remote server: process_spawn stands for code running outside Ringfence, which a remote tool runs on its own host, external_api_call for reaching a system outside, and a registration can change transport under published graphs without their nodes changing"

// splitCommand splits --command as a shell would; --arg values follow.
func splitCommand(command string, extra []string) (string, []string, error) {
	if command == "" {
		if len(extra) > 0 {
			return "", nil, usagef("--arg needs --command")
		}
		return "", nil, nil
	}
	words, err := shlex.Split(command)
	if err != nil {
		return "", nil, usagef("--command %q cannot be split: %v", command, err)
	}
	if len(words) == 0 {
		return "", nil, usagef("--command is empty")
	}
	return words[0], append(words[1:], extra...), nil
}

// parsePairs reads KEY=VALUE entries. An entry without "=" is resolved by fromKey, when
// given. Errors never quote an entry: it may be a secret typed in the wrong place.
func parsePairs(flag string, pairs []string, fromKey func(i int, key string) (string, error)) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(pairs))
	for i, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		switch {
		case ok && k != "":
		case !ok && fromKey != nil && p != "":
			var err error
			if v, err = fromKey(i, p); err != nil {
				return nil, err
			}
		default:
			if flag == "--header-secret" {
				return nil, usagef("--header-secret entry %d must be HEADER=SECRET_NAME, e.g. --header-secret Authorization=tickets-token", i+1)
			}
			return nil, usagef("%s entry %d must be KEY=VALUE, e.g. %s REGION=eu-west-1", flag, i+1, flag)
		}
		out[k] = v
	}
	return out, nil
}

// envStruct reads --env entries. "--env KEY" takes the value from this process's environment
// variable KEY, so a secret need not appear in the command line (ps, shell history).
func envStruct(pairs []string) (*structpb.Struct, error) {
	m, err := parsePairs("--env", pairs, func(i int, key string) (string, error) {
		if !mcpserver.IsEnvKeyName(key) {
			// Not a name, so perhaps a value typed without its KEY=: never echoed.
			return "", usagef("--env entry %d must be KEY=VALUE, or a variable name alone to take its value from this shell's environment; it is neither (not shown, in case it is a secret)", i+1)
		}
		v, ok := os.LookupEnv(key)
		if !ok {
			return "", usagef("--env %s has no value and the environment variable %s is not set: export it, or write %s=VALUE", key, key, key)
		}
		return v, nil
	})
	if err != nil || m == nil {
		return nil, err
	}
	s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(m))}
	for k, v := range m {
		s.Fields[k] = structpb.NewStringValue(v)
	}
	return s, nil
}

func toolPermissions(pairs []string) (map[string]*registryv1.ToolPermissions, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	out := make(map[string]*registryv1.ToolPermissions)
	for _, p := range pairs {
		tool, req, ok := strings.Cut(p, "=")
		if !ok || tool == "" || req == "" {
			return nil, usagef("--tool-permission %q must be TOOL=CAPABILITY, e.g. --tool-permission 'read_doc=docs.read:{path}' ({path} is the call's path argument)", p)
		}
		if out[tool] == nil {
			out[tool] = &registryv1.ToolPermissions{}
		}
		out[tool].Required = append(out[tool].Required, req)
	}
	return out, nil
}

func optDuration(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// prompt asks for a missing value when stdin is a terminal; scripts get a usage error instead
// of a hang.
func (g *globals) prompt(label, how string) (string, error) {
	f, ok := g.stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return "", usagef("missing %s: %s", label, how)
	}
	writef(g.stderr, "%s: ", label)
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSpace(line)
	if line == "" {
		return "", usagef("missing %s", label)
	}
	return line, nil
}
