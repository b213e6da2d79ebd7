package cli

import (
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
)

// inspectorPackage is the MCP Inspector runs connect prints a command line for: the version
// scripts/mcp-clients.sh pins and the front door's tests drive. Without a version, npx runs
// whichever version its cache already holds, and an old one (0.x) refuses the line
// ("Arguments cannot be passed to a URL-based MCP server").
const inspectorPackage = "@modelcontextprotocol/inspector@2.12.0"

// newRunsConnectCmd mints an agent token and prints how an MCP client connects with it.
func newRunsConnectCmd(g *globals) *cobra.Command {
	var runID, agent, tenant string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "connect --run ID --agent A [--ttl D]",
		Short: "Connect an MCP client to an agent of a run: mint an agent token and print the front door's URL and a client configuration",
		Long: `connect mints a bearer token for the MCP front door (/mcp on the server's HTTP listener) and
prints the URL, the token and a client configuration ready to paste (the mcpServers block that
Claude Code's .mcp.json, Cursor's mcp.json and other clients read), and the MCP Inspector's
command line. The client then sees exactly the agent's tools, and every call passes every gate
and lands in the audit log, naming the token by its id.

The token is shown once: the server keeps only its hash. It expires after --ttl (default
frontdoor.token_ttl, 1h), dies with the run, and is revoked with runs disconnect. -o json
prints the same as one object, for scripts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			req := &poolv1.CreateAgentTokenRequest{RunId: runID, Agent: agent, Tenant: tenant}
			if ttl != 0 {
				req.Ttl = durationpb.New(ttl)
			}
			resp, err := client.CreateAgentToken(ctx, req)
			if err != nil {
				return err
			}
			return g.printConnection(resp, tenant)
		},
	}
	cmd.Flags().StringVar(&runID, "run", "", "run id")
	cmd.Flags().StringVar(&agent, "agent", "", "the agent node's id")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "the token's lifetime, 1m to frontdoor.token_max_ttl (default frontdoor.token_ttl)")
	cmd.Flags().StringVar(&tenant, "tenant", "", tenantUsage)
	_ = cmd.MarkFlagRequired("run")
	_ = cmd.MarkFlagRequired("agent")
	return cmd
}

// notConfigName is what a client configuration's server name may not hold.
var notConfigName = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// clientConfig is the mcpServers block of a client configuration: the front door over
// streamable HTTP, with the token in the Authorization header.
func clientConfig(resp *poolv1.CreateAgentTokenResponse) map[string]any {
	t := resp.GetToken()
	name := notConfigName.ReplaceAllString("ringfence-"+t.GetRunId()+"-"+t.GetAgent(), "-")
	return map[string]any{"mcpServers": map[string]any{name: map[string]any{
		"type":    "http",
		"url":     resp.GetUrl(),
		"headers": map[string]string{"Authorization": "Bearer " + resp.GetSecret()},
	}}}
}

// printConnection prints a minted token: the URL, the token, a client configuration and the
// Inspector's command line, or all of it as one JSON object.
func (g *globals) printConnection(resp *poolv1.CreateAgentTokenResponse, tenant string) error {
	t := resp.GetToken()
	config := clientConfig(resp)
	if g.output == "json" {
		b, err := json.MarshalIndent(map[string]any{
			"token_id": t.GetTokenId(), "run_id": t.GetRunId(), "tenant": t.GetTenant(), "agent": t.GetAgent(),
			"expire_time": t.GetExpireTime().AsTime().UTC().Format(time.RFC3339), "url": resp.GetUrl(), "token": resp.GetSecret(),
			"client_config": config,
		}, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(g.stdout, string(b))
		return err
	}
	b, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return err
	}
	w := g.stdout
	writef(w, "MCP front door of agent %s in run %s (token %s, expires %s):\n\n", t.GetAgent(), t.GetRunId(), t.GetTokenId(), ts(t.GetExpireTime()))
	writef(w, "  url:   %s\n  token: %s\n\n", resp.GetUrl(), resp.GetSecret())
	// JSON escapes every control character the server's text could hold.
	writef(w, "Client configuration (.mcp.json, mcp.json):\n")
	fmt.Fprintf(w, "%s\n\n", b)
	writef(w, "MCP Inspector:\n  npx %s --cli %s --transport http --header \"Authorization: Bearer %s\" --method tools/list\n\n",
		inspectorPackage, resp.GetUrl(), resp.GetSecret())
	_, err = linef(w, "The token is shown once. Revoke it with: ringfence runs disconnect --run %s%s --token %s\n", t.GetRunId(), tenantArg(tenant), t.GetTokenId())
	return err
}

// newRunsDisconnectCmd revokes an agent token.
func newRunsDisconnectCmd(g *globals) *cobra.Command {
	var runID, tokenID, tenant string
	cmd := &cobra.Command{
		Use:   "disconnect --run ID --token TOKEN_ID",
		Short: "Revoke an agent token: its MCP client is refused from the next request on",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.RevokeAgentToken(ctx, &poolv1.RevokeAgentTokenRequest{RunId: runID, TokenId: tokenID, Tenant: tenant})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp.GetToken())
			}
			_, err = linef(g.stdout, "revoked token %s of agent %s in run %s\n", resp.GetToken().GetTokenId(), resp.GetToken().GetAgent(), runID)
			return err
		},
	}
	cmd.Flags().StringVar(&runID, "run", "", "run id")
	cmd.Flags().StringVar(&tokenID, "token", "", "the token's id (tok-…), as runs connect and runs connections print it")
	cmd.Flags().StringVar(&tenant, "tenant", "", tenantUsage)
	_ = cmd.MarkFlagRequired("run")
	_ = cmd.MarkFlagRequired("token")
	return cmd
}

// newRunsConnectionsCmd lists a run's agent tokens.
func newRunsConnectionsCmd(g *globals) *cobra.Command {
	var runID, tenant string
	cmd := &cobra.Command{
		Use:   "connections --run ID",
		Short: "List a run's agent tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.ListAgentTokens(ctx, &poolv1.ListAgentTokensRequest{RunId: runID, Tenant: tenant})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp)
			}
			if len(resp.GetTokens()) == 0 {
				_, err := linef(g.stdout, "run %s has no agent token: mint one with ringfence runs connect --run %s --agent A\n", runID, runID)
				return err
			}
			t := newTable(g.stdout, "TOKEN", "AGENT", "CREATED", "EXPIRES", "BY")
			for _, tok := range resp.GetTokens() {
				t.row(tok.GetTokenId(), tok.GetAgent(), ts(tok.GetCreateTime()), ts(tok.GetExpireTime()), orDash(tok.GetCreatedBy()))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&runID, "run", "", "run id")
	cmd.Flags().StringVar(&tenant, "tenant", "", tenantUsage)
	_ = cmd.MarkFlagRequired("run")
	return cmd
}
