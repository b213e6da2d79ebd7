package cli

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc/codes"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
)

func newSecretsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "secrets",
		Aliases: []string{"secret"},
		Short:   "Manage named secrets that remote servers' headers reference (needs mcp:admin)",
	}
	var fromEnv string
	set := &cobra.Command{
		Use:   "set NAME",
		Short: "Store a secret; the value comes from stdin (or a prompt, or --from-env), never from the command line",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			value, err := g.readSecret(fromEnv)
			if err != nil {
				return err
			}
			client, ctx, cancel, err := g.registry(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: args[0], Value: value})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp.GetSecret())
			}
			_, err = linef(g.stdout, "stored secret %s\n", resp.GetSecret().GetName())
			return err
		},
	}
	set.Flags().StringVar(&fromEnv, "from-env", "", "read the value from this environment variable")
	list := &cobra.Command{
		Use:   "list",
		Short: "List secret names (never values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.registry(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.ListSecrets(ctx, &registryv1.ListSecretsRequest{})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp)
			}
			t := newTable(g.stdout, "NAME", "UPDATED")
			for _, s := range resp.GetSecrets() {
				t.row(s.GetName(), ts(s.GetUpdateTime()))
			}
			return t.flush()
		},
	}
	remove := &cobra.Command{
		Use:     "remove NAME",
		Aliases: []string{"rm", "delete"},
		Short:   "Remove a secret",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, cancel, err := g.registry(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.DeleteSecret(ctx, &registryv1.DeleteSecretRequest{Name: args[0]})
			if err != nil {
				return withHint(err, codes.NotFound, "`ringfence secrets list` shows the secrets' names")
			}
			printWarnings(g.stderr, resp.GetWarnings()) // as servers add|update warn
			if g.output == "json" {
				return printFields(g.stdout, "removed", args[0])
			}
			_, err = linef(g.stdout, "removed secret %s\n", args[0])
			return err
		},
	}
	cmd.AddCommand(set, list, remove)
	return cmd
}

func (g *globals) readSecret(fromEnv string) (string, error) {
	if fromEnv != "" {
		v, ok := os.LookupEnv(fromEnv)
		if !ok || v == "" {
			return "", usagef("--from-env %s: the variable is unset or empty", fromEnv)
		}
		return v, nil
	}
	if f, ok := g.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(g.stderr, "secret value (not echoed): ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(g.stderr)
		if err != nil {
			return "", err
		}
		return string(b), nil
	}
	b, err := io.ReadAll(io.LimitReader(g.stdin, 1<<20))
	if err != nil {
		return "", err
	}
	v := strings.TrimRight(string(b), "\r\n")
	if v == "" {
		return "", usagef("no secret value on stdin: pipe it in, e.g. `printf %%s \"$TOKEN\" | ringfence secrets set NAME`")
	}
	return v, nil
}
