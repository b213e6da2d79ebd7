package cli

import (
	"errors"
	"strings"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
)

// errNotConnected ends `servers connect` with a failing status while the user has not signed in.
var errNotConnected = errors.New("not connected yet: the user signs in first")

// connectPoll is how often `servers connect --wait` asks again whether the user signed in.
const connectPoll = 2 * time.Second

// newServersConnectCmd connects a server that signs each user in, for one user.
func newServersConnectCmd(g *globals) *cobra.Command {
	var user, tenant string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "connect REF --user U [--wait 5m]",
		Short: "Connect a server that signs each user in, for one user, and store its tool listing",
		Long: `connect connects a server whose registration signs each user in (oauth) for user U, and
stores the tools the server declares to that user: U's runs offer them from then on (before, the
server shows as its connect tool, mcp_oauth_connect_<server>). Without a token for U it prints
the authorization URL U opens to sign in; run the command again afterwards, or pass --wait to
wait (up to the duration given) until U has signed in. Needs run:execute: the key asserts U
(docs/oauth.md).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			deadline := time.Now().Add(wait)
			// The first request begins the user's sign-in; the polls that follow only ask
			// whether the user has signed in (no_new_sign_in), since a new sign-in would
			// replace the one whose URL the user is given.
			var first *poolv1.ConnectServerResponse
			for {
				client, ctx, cancel, err := g.pool(cmd.Context())
				if err != nil {
					return err
				}
				resp, err := client.ConnectServer(ctx, &poolv1.ConnectServerRequest{Ref: args[0], User: user, Tenant: tenant, NoNewSignIn: first != nil})
				cancel()
				if err != nil {
					return err
				}
				if first == nil {
					first = resp
				}
				if resp.GetState() != "sign_in_required" || wait <= 0 || !time.Now().Before(deadline) {
					if resp.GetState() == "sign_in_required" {
						resp = first // the URL the user was given
					}
					return g.printServerConnection(args[0], user, resp)
				}
				if resp == first {
					writef(g.stderr, "%s must sign in to %s: open\n  %s\nwaiting until %s...\n", user, args[0], resp.GetAuthorizationUrl(), deadline.Format(time.TimeOnly))
				}
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(connectPoll):
				}
			}
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "the user to connect the server for")
	cmd.Flags().StringVar(&tenant, "tenant", "", tenantUsage)
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the user to sign in (0: print the authorization URL and return)")
	_ = cmd.MarkFlagRequired("user")
	return cmd
}

func (g *globals) printServerConnection(ref, user string, resp *poolv1.ConnectServerResponse) error {
	if g.output == "json" {
		return printJSON(g.stdout, resp)
	}
	if resp.GetState() == "connected" {
		_, err := linef(g.stdout, "connected %s for %s: %s\n", ref, user, strings.Join(resp.GetTools(), ", "))
		return err
	}
	_, err := linef(g.stdout, "%s must sign in to %s first: open\n  %s\n(good once, until %s), then run this command again\n",
		user, ref, resp.GetAuthorizationUrl(), ts(resp.GetExpireTime()))
	if err == nil {
		err = errNotConnected
	}
	return err
}
