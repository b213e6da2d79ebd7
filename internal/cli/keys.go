package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
)

func newKeysCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "keys",
		Aliases: []string{"key"},
		Short:   "Manage API keys (needs keys:admin)",
	}
	var name, role, tenant string
	create := &cobra.Command{
		Use:   "create",
		Short: "Mint an API key; the secret is printed once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.keys(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.CreateKey(ctx, &registryv1.CreateKeyRequest{Name: name, Role: role, Tenant: tenant})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp)
			}
			k := resp.GetKey()
			if err := kv(g.stdout, "id", k.GetId(), "name", k.GetName(), "role", k.GetRole(), "tenant", orDash(k.GetTenant()), "secret", resp.GetSecret()); err != nil {
				return err
			}
			_, err = fmt.Fprintln(g.stderr, "store the secret now: it is not shown again")
			return err
		},
	}
	create.Flags().StringVar(&name, "name", "", "a name for the key, e.g. ci-runner")
	create.Flags().StringVar(&role, "role", "", strings.Join(auth.BuiltinRoleNames(), ", ")+" or a custom role")
	create.Flags().StringVar(&tenant, "tenant", "", "bind the key to one tenant")
	_ = create.MarkFlagRequired("name")
	_ = create.MarkFlagRequired("role")

	list := &cobra.Command{
		Use:   "list",
		Short: "List keys (never secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.dial()
			if err != nil {
				return err
			}
			client := registryv1.NewKeyServiceClient(conn)
			keys, err := listAll(g, cmd.Context(), func(ctx context.Context, token string) ([]*registryv1.ApiKey, string, error) {
				resp, err := client.ListKeys(ctx, &registryv1.ListKeysRequest{PageToken: token, PageSize: listPageSize})
				return resp.GetKeys(), resp.GetNextPageToken(), err
			})
			if err != nil {
				return err
			}
			all := &registryv1.ListKeysResponse{Keys: keys}
			if g.output == "json" {
				return printJSON(g.stdout, all)
			}
			t := newTable(g.stdout, "ID", "NAME", "ROLE", "TENANT", "CREATED", "LAST USED", "STATE")
			for _, k := range all.GetKeys() {
				state := "active"
				if k.GetRevoked() {
					state = "revoked"
				}
				t.row(k.GetId(), k.GetName(), k.GetRole(), orDash(k.GetTenant()), ts(k.GetCreateTime()), ts(k.GetLastUsedTime()), state)
			}
			return t.flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a key at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, cancel, err := g.keys(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.RevokeKey(ctx, &registryv1.RevokeKeyRequest{Id: args[0]})
			if err != nil {
				return withHint(err, codes.NotFound, "`ringfence keys list` shows the keys and their ids (key_…)")
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp.GetKey())
			}
			_, err = linef(g.stdout, "revoked %s (%s)\n", resp.GetKey().GetId(), resp.GetKey().GetName())
			return err
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

func newRolesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "roles", Short: "Inspect roles (needs keys:admin)"}
	check := &cobra.Command{
		Use:   "check",
		Short: "List the server's roles; exit 1 when a custom role pairs mcp:admin with graph authoring (workflow:write or workflow:admin), or run:execute with run:approve",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ctx, cancel, err := g.keys(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			resp, err := client.ListRoles(ctx, &registryv1.ListRolesRequest{})
			if err != nil {
				return err
			}
			var warnings []string
			for _, r := range resp.GetRoles() {
				for _, w := range r.GetWarnings() {
					warnings = append(warnings, oneLine(w))
				}
			}
			if g.output == "json" {
				if err := printJSON(g.stdout, resp); err != nil {
					return err
				}
			} else {
				t := newTable(g.stdout, "ROLE", "KIND", "PERMISSIONS")
				for _, r := range resp.GetRoles() {
					kind := "custom"
					if r.GetBuiltin() {
						kind = "built-in"
					}
					t.row(r.GetName(), kind, strings.Join(r.GetPermissions(), ", "))
				}
				if err := t.flush(); err != nil {
					return err
				}
			}
			if len(warnings) > 0 {
				return &exitError{code: ExitFailure, msg: fmt.Sprintf("roles check failed: %d problem(s)\n  %s\nfix: split each role named above in two, in RINGFENCE_SERVICE_ROLES_JSON: one with mcp:admin and one with the workflow permissions; one with run:execute and one with run:approve (docs/security.md)",
					len(warnings), strings.Join(warnings, "\n  "))}
			}
			if g.output != "json" {
				fmt.Fprintln(g.stdout, "ok: no custom role pairs mcp:admin with workflow:write or workflow:admin, or run:execute with run:approve (only the built-in admin holds them all)")
			}
			return nil
		},
	}
	cmd.AddCommand(check)
	return cmd
}

func ts(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().Local().Format(time.DateTime)
}
